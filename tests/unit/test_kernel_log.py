"""Kernel log scanning on real captured logs: every fixture gets an asserted verdict."""

from __future__ import annotations

import pytest

from gpuguard.kernel_log.check import classify_log, scan
from gpuguard.kernel_log.incidents import SAMPLE_CHARS
from gpuguard.kernel_log.messages import parse_line
from gpuguard.kernel_log.state import KernelState
from gpuguard.kernel_log.tally import MAX_INCIDENTS, IncidentTally
from gpuguard.model import Action, Layer, Severity
from tests.conftest import read_data
from tests.support.clock import FakeClock


def codes(findings):
    return [f.code for f in findings]


def test_xid13_43_burst_is_one_application_incident_that_never_drains():
    findings = classify_log(read_data("dmesg_decode_iso_xid13_43_app_fault.log"))
    assert codes(findings) == ["XID_13"]
    (incident,) = findings
    assert incident.action <= Action.KILL_JOB
    assert incident.component.id == "0000:38:00.0"
    assert "120 line(s)" in incident.message
    assert "followed by Xid 43" in incident.message


def test_xid79_recommends_at_least_reboot_and_names_the_gpu():
    findings = classify_log(read_data("kmsg_xid79_fallen_off_bus_with_sxid20034.log"))
    xid79 = next(f for f in findings if f.code == "XID_79")
    assert xid79.action >= Action.REBOOT
    assert xid79.severity is Severity.CRITICAL
    assert xid79.component.id == "0000:91:00.0"
    # The "fallen off the bus" line repeats the Xid 79 and must not be counted twice.
    assert "GPU_FALLEN_OFF_BUS" not in codes(findings)


def test_sxid_fatal_lines_are_one_finding_per_switch():
    findings = classify_log(read_data("kmsg_xid79_fallen_off_bus_with_sxid20034.log"))
    sxids = [f for f in findings if f.code == "SXID_20034"]
    assert sorted(f.component.id for f in sxids) == ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0"]
    assert all(f.severity is Severity.CRITICAL for f in sxids)
    switch0 = next(f for f in sxids if f.component.id == "0000:05:00.0")
    assert "Link 62" in switch0.message and "Link 63" in switch0.message


def test_fallen_off_bus_without_xid_is_still_caught():
    line = "[  12.5] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
    (finding,) = classify_log(line)
    assert finding.code == "GPU_FALLEN_OFF_BUS"
    assert finding.action is Action.REBOOT
    assert finding.component.id == "0000:18:00.0"


def test_dbe_gives_gpu_reset_and_contained_error_kills_only_the_job():
    findings = {
        f.code: f for f in classify_log(read_data("dmesg_iso_xid48_63_94_dbe_rowremap.log"))
    }
    assert findings["XID_48"].action is Action.RESET_GPU
    assert findings["XID_48"].severity is Severity.CRITICAL
    assert findings["XID_94"].action is Action.KILL_JOB
    assert findings["XID_63"].severity is Severity.INFO


def test_gsp_timeout_repeats_are_one_finding_needing_reset():
    findings = classify_log(read_data("dmesg_xid119_gsp_rpc_timeout_h100.log"))
    assert codes(findings) == ["XID_119"]
    assert findings[0].action is Action.RESET_GPU
    assert findings[0].component.id == "0000:9b:00.0"


def test_ctime_prefixed_log_separates_app_fault_from_ctx_switch_timeout():
    findings = {
        f.code: f
        for f in classify_log(read_data("dmesg_ctime_xid13_xid109_ctx_switch_timeout.log"))
    }
    assert set(findings) == {"XID_13", "XID_109"}
    assert findings["XID_13"].action is Action.KILL_JOB
    assert findings["XID_109"].action is Action.RESET_GPU


def test_xid154_text_is_the_drivers_verdict():
    findings = classify_log(read_data("kmsg_gb200_xid149_nvlink5_and_xid154_recovery_action.log"))
    xid154 = {f.component.id: f for f in findings if f.code == "XID_154"}
    assert set(xid154) == {"0009:01:00.0", "0019:01:00.0", "0018:01:00.0", "0008:01:00.0"}
    assert all(f.action is Action.RESET_GPU for f in xid154.values())
    assert "Drain and Reset" in xid154["0009:01:00.0"].message


def test_xid154_node_reboot_text_asks_for_reboot():
    line = "NVRM: Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    (finding,) = classify_log(line)
    assert finding.action is Action.REBOOT


def test_nvlink5_fatal_xid149_needs_reset_nonfatal_does_not():
    fatal = "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000)"
    nonfatal = (
        "NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Nonfatal   XC0 i0 Link 01 (0x0 0x0)"
    )
    assert classify_log(fatal)[0].action is Action.RESET_GPU
    assert classify_log(nonfatal)[0].action is Action.NONE


def test_xid45_follows_the_xid_it_names():
    findings = classify_log(read_data("kmsg_xid45_caused_by_previous_xid145_149_nvlink.log"))
    assert codes(findings) == ["XID_45"] * 4  # one per GPU, not one per line
    assert all("caused by Xid 14" in f.message for f in findings)
    with_cause = (
        "NVRM: Xid (PCI:0000:dc:00): 48, pid=1, name=python3, DBE\n"
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 48\n"
    )
    assert codes(classify_log(with_cause)) == ["XID_48"]


def test_efa_driver_errors_are_network_findings_and_ena_lines_are_not():
    findings = classify_log(read_data("kmsg_efa_driver_error_lines_testvectors.log"))
    assert all(f.layer is Layer.NETWORK for f in findings)
    devices = {f.component.id for f in findings}
    assert devices == {"rdmap0s6", "rdmap16s27", "efa_0", "0000:00:06.0"}
    assert "0000:00:05.0" not in devices  # the ena (Ethernet) driver prints the same words
    by_code = {f.code: f for f in findings}
    assert by_code["EFA_ADMIN_TIMEOUT"].action is Action.REPLACE
    assert by_code["EFA_COMMAND_FAILED"].severity is Severity.WARNING


@pytest.mark.parametrize(
    ("line", "device", "code", "gi"),
    [
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14, None),
        (
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9).",
            "0000:01:00",
            94,
            5,
        ),
        (
            "6,3964,206764307,-;NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, DBE",
            "0000:19:00",
            48,
            None,
        ),
        (
            "Sep  4 10:00:00 host kernel: NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus.",
            "0000:19:00",
            79,
            None,
        ),
    ],
)
def test_xid_line_formats(line, device, code, gi):
    event = parse_line(line)
    assert event is not None
    assert (event.kind, event.device, event.code, event.gpu_instance) == ("xid", device, code, gi)


def test_unknown_xid_gets_explicit_default_not_fatal():
    (finding,) = classify_log("NVRM: Xid (PCI:0000:19:00): 999, something new")
    assert finding.severity is Severity.WARNING
    assert finding.action is Action.NONE
    assert "no resolution" in finding.message


def test_kernel_layer_faults():
    log = (
        "[ 100.1] watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python:1234]\n"
        "[ 101.0] NVRM: API mismatch: the client has the version 535.1, but this kernel module has 550.2\n"
    )
    findings = {f.code: f for f in classify_log(log)}
    assert findings["KERNEL_SOFT_LOCKUP"].layer is Layer.KERNEL
    assert findings["NVIDIA_DRIVER_MISMATCH"].action is Action.REBOOT


def test_non_nvidia_noise_yields_nothing():
    log = read_data("dmesg_iso_xid48_63_94_dbe_rowremap.log").splitlines()
    noise = "\n".join(line for line in log if "NVRM" not in line)
    assert noise  # the fixture has peermem chatter
    assert scan(noise) == []


def test_incidents_are_bounded_and_a_fatal_xid_is_never_pushed_out():
    tally = IncidentTally()
    for n in range(3 * MAX_INCIDENTS):  # job faults on ever new addresses (junk, say)
        tally.add(parse_line(f"NVRM: Xid (PCI:0000:{n // 256:02x}:{n % 256:02x}): 13, x"), n)
    tally.add(parse_line("NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus."), 1e6)
    assert len(tally) <= MAX_INCIDENTS
    assert "XID_79" in codes(tally.findings("kernel-log"))
    for n in range(2 * MAX_INCIDENTS):  # fatal ones fill it: the newest are only counted
        tally.add(parse_line(f"NVRM: Xid (PCI:0001:{n // 256:02x}:{n % 256:02x}): 79, x"), 2e6)
    assert len(tally) == MAX_INCIDENTS and tally.dropped > 0
    found = tally.findings("kernel-log")
    assert ("XID_79", "0000:91:00.0") in {(f.code, f.component.id) for f in found}
    assert all(f.severity is Severity.CRITICAL for f in found)


def test_an_incident_keeps_one_bounded_sample_and_a_bounded_list_of_processes():
    tally = IncidentTally()
    for pid in range(100):
        line = f"NVRM: Xid (PCI:0000:38:00): 13, pid={pid}, name=job{pid}, " + "E" * 10_000
        tally.add(parse_line(line), 0.0)
    (finding,) = tally.findings("kernel-log")
    assert len(finding.evidence) <= SAMPLE_CHARS
    assert "100 line(s) on 1 GPU(s)" in finding.message
    assert finding.message.endswith("job7 (pid 7) and more")


# Error containment lines as the driver prints them (open-gpu-kernel-modules,
# _gpuGenerateErrorLog_GA100: "%s: %s (0x%x). RST: %s, D-RST: %s", the flags being the GPU
# marked for a reset and for a drain and reset). The first is the driver's own example in
# that function's comment; the others set its flags.
CONTAINED = "[ 9.0] NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9)."


@pytest.mark.parametrize(
    ("flags", "severity", "action", "deferred"),
    [
        ("RST: No, D-RST: No", Severity.WARNING, Action.KILL_JOB, False),
        ("RST: No, D-RST: Yes", Severity.CRITICAL, Action.RESET_GPU, True),
        ("RST: Yes, D-RST: No", Severity.CRITICAL, Action.RESET_GPU, False),
    ],
)
def test_a_contained_error_follows_the_reset_the_driver_marks(flags, severity, action, deferred):
    (finding,) = classify_log(f"{CONTAINED} {flags}")
    assert finding.code == "XID_94"
    assert (finding.severity, finding.action, finding.deferred) == (severity, action, deferred)


def test_a_gpu_marked_for_drain_and_reset_is_a_lasting_fault_not_a_job_s():
    # The job's own Xid 94 ages out with the job; one the driver marks for a drain and
    # reset is the GPU's and stays until the reset.
    for flags, lasts in (("RST: No, D-RST: No", False), ("RST: No, D-RST: Yes", True)):
        clock = FakeClock()
        state = KernelState(application_ttl_s=60, boot_id=lambda: "b", clock=clock)
        state.add_lines([f"{CONTAINED} {flags}"], reset=True)
        clock.set(3600.0)
        assert bool(state.findings()) is lasts, flags


# The PCIe core's AER report for a device the NVIDIA driver holds (drivers/pci/pcie/aer.c,
# aer_print_error, with dev_fmt's "AER: " since 5.1; err.c for "can't recover").
AER_FATAL = (
    "[ 812.101] nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal),"
    " type=Transaction Layer, (Requester ID)"
)


@pytest.mark.parametrize(
    "line",
    [
        AER_FATAL,
        AER_FATAL.replace("AER: ", "").replace("Uncorrected", "Uncorrectable"),  # before 5.1
        "[ 812.102] nvidia 0000:3b:00.0: AER: can't recover (no error_detected callback)",
    ],
)
def test_a_fatal_pcie_error_on_a_gpu_is_a_reboot_of_that_gpu_s_node(line):
    (finding,) = classify_log(line)
    assert (finding.code, finding.severity, finding.action) == (
        "GPU_PCIE_FATAL",
        Severity.CRITICAL,
        Action.REBOOT,
    )
    assert finding.component.id == "0000:3b:00.0"


def test_corrected_errors_are_nothing_and_another_device_s_fatal_error_is_no_gpu_s():
    corrected = AER_FATAL.replace("Uncorrected (Fatal)", "Corrected").replace(
        "Transaction", "Physical"
    )
    bridge = AER_FATAL.replace("nvidia 0000:3b", "pcieport 0000:3a")
    assert classify_log(corrected) == []
    # No boot line says what is below 0000:3a: the node is held, no GPU is named.
    assert [(f.code, f.component.kind) for f in classify_log(bridge)] == [("PCIE_FATAL", "node")]


def test_the_xid_79_that_follows_speaks_for_the_pcie_error():
    xid = "[ 812.2] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert codes(classify_log(f"{AER_FATAL}\n{xid}\n")) == ["XID_79"]
