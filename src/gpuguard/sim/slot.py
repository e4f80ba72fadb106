"""A GPU-node slot of the simulated fleet: where a node is in the cluster, and the state
of the machine in it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuguard.sim.agent_view import DeepFinding
from gpuguard.sim.faults import Effect, Fault, Signal
from gpuguard.sim.in_job_findings import InJobFinding
from gpuguard.sim.jobs import Job


@dataclass
class Slot:
    """One GPU-node slot of the fleet and the machine in it."""

    index: int
    pool: str
    machine: int | None
    generation: int = 0
    original: bool = True  # still the first machine (a lemon's extra faults apply to it)
    silent: bool = False  # the machine crashes jobs with no node signal (a hidden lemon)
    faults: dict[int, Fault] = field(default_factory=dict)
    kernel: list[tuple[int, str, float, bool]] = field(default_factory=list)
    # What the agent's periodic checks read, by fault: (signal, GPU or NIC index).
    checked: dict[int, tuple[Signal, int]] = field(default_factory=dict)
    job: Job | None = None
    down: str = ""  # "reset", "reboot", "manual": an action holds the node
    testing: bool = False  # the deep suite is loading every GPU
    test_ends: float = 0.0  # when the current deep run ends (a job placed meanwhile waits)
    deep: tuple[DeepFinding, ...] = ()  # what the last deep run found (in the GPU layer)
    in_job: tuple[InJobFinding, ...] = ()  # in-job verdicts and passive findings (in_job.py)
    notready: bool = False
    tainted: bool = False
    cordoned: bool = False
    gpu_withdrawn: bool = False  # the device plugin marked a GPU Unhealthy until it restarts
    # GPUs taken out alone (per-GPU quarantine: a device taint), and since when: a job
    # placed since runs on the others and a fault of those GPUs is not its.
    gpus_out: set[int] = field(default_factory=set)
    gpus_out_since: float = 0.0
    gpus_up: int = 0  # of its GPUs, those in service (``Fleet.refresh``)
    drain_until: float = 0.0
    human_pending: bool = False
    human_for: int | None = None  # the machine the pending visit is for
    schedulable: bool = False
    in_service: bool = False
    incidents: list[int] = field(default_factory=list)  # disabling faults not yet repaired
    # The Node's name, kept rather than formatted: the policy reads it at every step.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = _node_name(self.index, self.generation)

    def refill(self, machine: int) -> None:
        """Another machine takes the slot: a new Node, under a new name."""
        self.machine = machine
        self.generation += 1
        self.original = False
        self.silent = False
        self.name = _node_name(self.index, self.generation)

    def speed(self) -> float:
        pace = 1.0
        for fault in self.faults.values():
            if self.spares(fault):
                continue
            if fault.effect is Effect.HANG:
                return 0.0
            if fault.effect is Effect.SLOW:
                pace = min(pace, fault.slowdown)
        return pace

    def spares(self, fault: Fault) -> bool:
        """The fault is on a GPU out alone, which the job on the node does not use (it was
        placed after the GPU went out)."""
        return (
            fault.gpu in self.gpus_out
            and fault.gpu_local
            and self.job is not None
            and self.job.placed_at >= self.gpus_out_since
        )


def _node_name(index: int, generation: int) -> str:
    return f"gpu-node-{index:05d}" + (f"-r{generation}" if generation else "")
