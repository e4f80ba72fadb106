"""Layer health to Node conditions, and the writes that keep lastTransitionTime honest."""

from __future__ import annotations

from gpuguard.agent.conditions import plan_write
from gpuguard.contract.conditions import (
    MESSAGE_LIMIT,
    OWNED_TYPES,
    Desired,
    camel_case,
    desired_conditions,
)
from gpuguard.model import (
    Action,
    Finding,
    Layer,
    Severity,
    assess_layer,
    gpu,
)


def finding(code: str, severity: Severity = Severity.CRITICAL, bus: str = "0000:91:00") -> Finding:
    return Finding(Layer.GPU, code, severity, Action.REBOOT, gpu(bus), "test", f"{code} seen")


def layers(*findings: Finding, answered: bool = True):
    return {
        Layer.GPU: assess_layer(Layer.GPU, findings, ["nvml"] if answered else [], []),
    }


def test_reason_is_camel_case_of_the_worst_finding():
    assert camel_case("XID_79") == "Xid79"
    assert camel_case("ROW_REMAP_PENDING") == "RowRemapPending"
    (gpu_condition,) = desired_conditions(
        layers(finding("XID_79"), finding("CLOCK_HW_SLOWDOWN", Severity.WARNING)), "gpuguard"
    )
    assert (gpu_condition.type, gpu_condition.status, gpu_condition.reason) == (
        "GpuguardGPUHealthy",
        "False",
        "Xid79",
    )
    assert gpu_condition.message.startswith("XID_79 gpu 0000:91:00.0")


def test_degraded_stays_true_with_a_degraded_reason():
    (condition,) = desired_conditions(layers(finding("ROW_REMAP_PENDING", Severity.WARNING)), "eks")
    assert (condition.type, condition.status, condition.reason) == (
        "AcceleratedHardwareReady",
        "True",
        "DegradedRowRemapPending",
    )


def test_no_source_answered_is_false_under_fail_closed():
    (condition,) = desired_conditions(layers(answered=False), "gpuguard")
    assert (condition.status, condition.reason) == ("False", "NoSourceAnswered")


def test_message_is_short_and_counts_the_rest():
    many = [finding("XID_79", bus=f"0000:{n:02x}:00") for n in range(40)]
    (condition,) = desired_conditions(layers(*many), "gpuguard")
    assert len(condition.message) <= MESSAGE_LIMIT
    assert condition.message.endswith("more)")


def test_healthy_names_the_sources():
    (condition,) = desired_conditions(layers(), "gpuguard")
    assert (condition.status, condition.reason, condition.message) == (
        "True",
        "Healthy",
        "checked by nvml",
    )


WANT_OK = Desired("GpuguardGPUHealthy", "True", "Healthy", "checked by nvml")
WANT_BAD = Desired("GpuguardGPUHealthy", "False", "Xid79", "XID_79 gpu 0000:91:00.0")


def current(desired: Desired, transition: str = "2026-01-01T00:00:00Z"):
    return {
        desired.type: {
            "type": desired.type,
            "status": desired.status,
            "reason": desired.reason,
            "message": desired.message,
            "lastTransitionTime": transition,
            "lastHeartbeatTime": transition,
        }
    }


def test_unchanged_condition_is_not_rewritten_until_the_heartbeat():
    now = "2026-01-01T00:05:00Z"
    assert plan_write([WANT_OK], current(WANT_OK), now, heartbeat_due=False).empty
    write = plan_write([WANT_OK], current(WANT_OK), now, heartbeat_due=True)
    (condition,) = write.conditions
    assert condition["lastHeartbeatTime"] == now
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert write.transitions == []


def test_status_change_moves_last_transition_time_and_is_a_transition():
    now = "2026-01-01T00:05:00Z"
    write = plan_write([WANT_BAD], current(WANT_OK), now, heartbeat_due=False)
    (condition,) = write.conditions
    assert condition["lastTransitionTime"] == now
    assert write.transitions == [(WANT_BAD, "True")]


def test_reason_change_without_status_change_keeps_last_transition_time():
    other = Desired(WANT_BAD.type, "False", "Sxid20034", "SXID_20034 nvswitch 0000:05:00.0")
    write = plan_write([other], current(WANT_BAD), "2026-01-01T00:05:00Z", heartbeat_due=False)
    (condition,) = write.conditions
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert write.transitions == []


def test_owned_types_no_longer_reported_are_removed_and_others_left_alone():
    existing = {
        **current(WANT_OK),
        "NetworkingReady": {"type": "NetworkingReady", "status": "True"},
        "Ready": {"type": "Ready", "status": "True"},
    }
    write = plan_write([WANT_OK], existing, "2026-01-01T00:05:00Z", heartbeat_due=False)
    assert write.remove == ["NetworkingReady"]
    assert "Ready" not in OWNED_TYPES
