"""Per-GPU quarantine in the gpuguard run: a GPU-local fault's GPU out alone.

With ``gpu_quarantine.enabled`` the reconciler's taint of a node whose findings (the
agent's report, as the controller reads it) are all the GPU layer's, name GPUs and
recommend no more than a GPU reset (``gpu_quarantine.up_to``) becomes a device taint on
those GPUs: the node keeps serving jobs that fit its other GPUs
(``gpu_slots``). Its job is stopped only if it was running on them, and a reset of those
GPUs leaves the node and a job on its other GPUs alone. The quarantine goes to the node
when a finding of the node shows, or when the ladder climbs past the GPU reset (a reboot,
a cordon, a replacement): the device taint did not help. Whether the node's other GPUs
really are fine is the fault's (``Fault.gpu_local``), not the finding's: the accounting
and the jobs on the other GPUs go by that.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action, Layer
from gpuguard.remediation.model import DecisionKind
from gpuguard.sim.engine import Engine
from gpuguard.sim.faults import GPU_BUS
from gpuguard.sim.slot import Slot

GPU_INDEX = {f"0000:{bus}:00.0": index for index, bus in enumerate(GPU_BUS)}


def reported_gpus(
    layers: Mapping[str, LayerReport], up_to: Action = Action.RESET_GPU
) -> set[int] | None:
    """The GPUs the node's findings name, when every finding is the GPU layer's, names
    GPUs and recommends no rung above ``up_to`` (empty: nothing wrong reported); None: a
    finding of the node (another layer, a GPU-layer finding naming none or recommending
    more, the agent silent)."""
    gpus: set[int] = set()
    for name, layer in layers.items():
        if layer.status == "True" and layer.action is Action.NONE:
            continue
        if name != Layer.GPU or not layer.gpus or layer.action > up_to:
            return None
        gpus |= {GPU_INDEX[bus] for bus in layer.gpus if bus in GPU_INDEX}
    return gpus


class GpuQuarantine:
    """The device taints of one run: taken, widened, escalated, lifted."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        up_to = engine.scenario.gpu_quarantine.up_to
        self.up_to = Action.REPLACE if up_to == "replace" else Action.RESET_GPU

    @staticmethod
    def holds(slot: Slot) -> bool:
        """The node is under a device taint alone (no node taint)."""
        return bool(slot.gpus_out) and not slot.tainted

    def taint(self, slot: Slot, layers: Mapping[str, LayerReport]) -> bool:
        """The reconciler's taint as a device taint when the findings name GPUs alone
        (True); False: the node's taint is for the caller to set."""
        scope = reported_gpus(layers, self.up_to)
        if not scope or slot.tainted:
            return False
        self._take_out(slot, scope)
        return True

    def _take_out(self, slot: Slot, gpus: set[int]) -> None:
        new = gpus - slot.gpus_out
        if not new:
            return
        if not slot.gpus_out:
            slot.gpus_out_since = self.engine.now
        slot.gpus_out |= new
        self.engine.stats.gpus_quarantined += len(new)
        self.engine.fleet.refresh(slot)

    def follow(self, slot: Slot, layers: Mapping[str, LayerReport]) -> None:
        """A report changed: a finding on another GPU takes it out too; a finding of the
        node takes the node."""
        if not self.holds(slot):
            return
        scope = reported_gpus(layers, self.up_to)
        if scope is None:
            self.escalate(slot)
        else:
            self._take_out(slot, scope)

    def escalate(self, slot: Slot) -> None:
        """The node's taint replaces the device taint."""
        if not self.holds(slot):
            return
        self.engine.stats.gpu_escalations += 1
        slot.gpus_out.clear()
        self.engine.set_flags(slot, tainted=True)

    def lift(self, slot: Slot) -> None:
        slot.gpus_out.clear()
        self.engine.set_flags(slot, tainted=False)

    def apply(self, kind: DecisionKind, slot: Slot, layers: Mapping[str, LayerReport]) -> bool:
        """The reconciler's decision as the device taint carries it out (True: done);
        False: the caller carries it out on the node, escalated first where it must be."""
        if kind is DecisionKind.TAINT:
            return self.taint(slot, layers)
        if kind is DecisionKind.UNTAINT and slot.gpus_out:
            self.lift(slot)
            return True
        if kind is DecisionKind.KILL_PODS or kind is DecisionKind.EVICT_PODS:
            return self.spares_job(slot)  # nothing of the job's on those GPUs
        if kind is DecisionKind.CORDON or kind is DecisionKind.REPLACE:
            self.escalate(slot)
        return False

    def repair(self, slot: Slot, what: str, gpus: tuple[int, ...]) -> None:
        """The ladder's reset of the GPUs out alone keeps the node; anything more holds
        the node: the quarantine goes to it first."""
        if what == "reset" and self.reset(slot, gpus):
            return
        self.escalate(slot)
        self.engine.repair(slot, what, gpus=gpus)

    def spares_job(self, slot: Slot) -> bool:
        """Under a device taint alone, the node's job runs on other GPUs (placed after
        they went out): a kill or a drain of the GPUs' pods leaves it."""
        job = slot.job
        return self.holds(slot) and job is not None and job.placed_at >= slot.gpus_out_since

    def reset(self, slot: Slot, gpus: tuple[int, ...]) -> bool:
        """A reset of GPUs under a device taint alone: the node stays in service for the
        rest (True). False: not such a reset; the caller holds the node for it."""
        if not self.holds(slot) or not gpus or not set(gpus) <= slot.gpus_out:
            return False
        engine = self.engine
        engine.stats.actions["reset"] += 1
        if not self.spares_job(slot):
            engine.interrupt_job(slot, cause="platform")
        duration = engine.scenario.actions.gpu_reset_s
        engine.at(engine.now + duration, self._reset_done, slot, slot.machine, gpus)
        return True

    def _reset_done(self, slot: Slot, machine: int | None, gpus: tuple[int, ...]) -> None:
        if slot.machine == machine:
            self.engine.fleet.finish_repair(slot, "reset", gpus)
