"""The two baselines the gpuguard policy is compared with, on the same failures.

- ``none``: Kubernetes defaults: the NVIDIA device plugin's own health check and nothing
  else. The plugin marks a GPU Unhealthy on any critical Xid but the application errors it
  skips (``DEVICE_PLUGIN_SKIPPED_XIDS``) and stops offering it until it restarts (a reboot),
  so the node no longer takes a whole-node job; operators get a ticket for such a node.
  Nothing else reads GPU signals: a node is dealt with when it stops answering, a GPU fault
  kills the job (retried by its own budget), and people chase the nodes that keep killing
  jobs.
- ``reactive``: node-problem-detector plus a drain controller and reboots. Every kernel log
  line its rules match (any Xid, as the usual custom rule ``NVRM: Xid`` does) cordons,
  drains and reboots the node; the condition clears with the new boot. It reads no GPU
  facts and no RDMA ports, runs no deep or load checks, and its drains cost the jobs a
  retry (no job-aware recovery).
- ``reactive-pfp``: ``reactive`` as a careful operator runs it, with the Jobs'
  ``podFailurePolicy`` ignoring pods with ``DisruptionTarget`` (which Kubernetes sets on an
  eviction): its own drains cost no retry; every crash still does.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from gpuguard.kernel_log.messages import parse_line
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import DAY, Fault
from gpuguard.sim.jobs import Job

REPEAT_WINDOW_S = 7 * DAY  # a second drain within this window gets a person's attention
# NVIDIA k8s-device-plugin, internal/rm/health.go (getDisabledHealthCheckXids): the
# application errors it never counts against a GPU ("the GPU should still be healthy").
DEVICE_PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def device_plugin_marks(lines: list[str]) -> bool:
    """Whether the device plugin's Xid health check marks a GPU Unhealthy on these lines."""
    return any(map(_marks, lines))


@functools.cache  # a run shows the same few lines on every node, over and over
def _marks(line: str) -> bool:
    e = parse_line(line)
    return e is not None and e.kind == "xid" and e.code not in (None, *DEVICE_PLUGIN_SKIPPED_XIDS)


class NoPolicy:
    name = "none"
    warm_spares = False

    def charges(self, job: Job, cause: str, fault: Fault | None) -> bool:
        """Every interruption uses up a retry (a Job's default backoffLimit)."""
        return True

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.health_check = engine.scenario.detection.device_plugin_health_check

    def signals_changed(self, slot: Slot) -> None:
        """Only the device plugin reads the node, and only its Xids."""
        if not self.health_check or slot.gpu_withdrawn or slot.machine is None:
            return
        if device_plugin_marks([line for _, line, _, _ in slot.kernel]):
            self.engine.fleet.withdraw_gpu(slot)

    def node_replaced(self, slot: Slot) -> None:
        """A new machine needs nothing from us."""

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        """Only people act, and they need no answer."""


class ReactivePolicy:
    name = "reactive"
    warm_spares = False

    def __init__(self, pod_failure_policy: bool = False) -> None:
        self.pod_failure_policy = pod_failure_policy
        if pod_failure_policy:
            self.name = "reactive-pfp"

    def charges(self, job: Job, cause: str, fault: Fault | None) -> bool:
        """With ``podFailurePolicy`` on ``DisruptionTarget`` its own drains are not counted."""
        return not (self.pod_failure_policy and cause == "platform")

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.busy: set[int] = set()
        self.drains: dict[int, list[float]] = defaultdict(list)

    def signals_changed(self, slot: Slot) -> None:
        engine = self.engine
        if slot.index in self.busy or slot.machine is None or slot.down:
            return
        if not engine.view.kernel_events(line for _, line, _, _ in slot.kernel):
            return
        # A node condition is set; the drain controller cordons and drains at once.
        now = engine.now
        engine.detected(slot)
        self.busy.add(slot.index)
        if not engine.has_node_fault(slot):
            engine.stats.false_drains += 1
        engine.stats.actions["drain"] += 1
        engine.set_flags(slot, cordoned=True)
        engine.interrupt_job(slot, cause="platform")
        recent = [t for t in self.drains[slot.index] if now - t < REPEAT_WINDOW_S]
        self.drains[slot.index] = [*recent, now]
        if recent:
            engine.request_human(slot)
        drain = engine.scenario.actions.drain_min * 60.0
        engine.at(now + drain, self._reboot, slot, slot.machine)

    def _reboot(self, slot: Slot, machine: int | None) -> None:
        if slot.machine != machine or slot.down:
            self.busy.discard(slot.index)
            return
        self.engine.repair(slot, "reboot")

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        # The new boot clears the kernel-log condition; the drain controller uncordons.
        self.busy.discard(slot.index)
        self.engine.set_flags(slot, cordoned=False)
        self.signals_changed(slot)

    def node_replaced(self, slot: Slot) -> None:
        self.busy.discard(slot.index)
        self.drains.pop(slot.index, None)
