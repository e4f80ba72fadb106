"""What a run counts: actions and faults (``Stats``) and time in service (``ServiceBooks``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from gpuguard.sim.faults import GPUS_PER_NODE, HOUR, Fault, Fix, Locus
from gpuguard.sli import TimeShare

BIN_S = HOUR  # resolution of the availability time series


@dataclass
class FaultTimes:
    detected: float | None = None
    quarantined: float | None = None
    repaired: float | None = None


@dataclass
class HiddenTimes:
    """A fault no periodic check reads (SDC, fail-slow): who found it, when it left."""

    by_checks: float | None = None  # a deep run named it
    by_job: float | None = None  # a job's owners traced bad results to it
    in_job: float | None = None  # a running job's ranks named it (``sim/in_job.py``)
    passive: float | None = None  # the agent's clock sampling under load named it
    removed: float | None = None  # repaired or replaced away (not ended by itself)


@dataclass
class Stats:
    actions: Counter[str] = field(default_factory=Counter)
    false_drains: int = 0
    breaker_trips: int = 0
    dropped_faults: int = 0
    decide_calls: int = 0
    false_verdicts: int = 0  # in-job verdicts naming a healthy GPU
    # Fault interruptions of jobs as the attribution judged them (``sim/attribution.py``).
    attribution: Counter[str] = field(default_factory=Counter)
    suspicions: int = 0  # crash memory's suspicions
    false_suspicions: int = 0  # of them, on a machine with nothing wrong
    spares_taken: int = 0  # warm spares an interrupted job took
    gpus_quarantined: int = 0  # a GPU-local fault's GPU taken out alone (per-GPU quarantine)
    gpu_escalations: int = 0  # of them, taken to the node (node-wide finding, or a reboot)
    preflight_checks: int = 0  # node checks the gate ran
    preflight_caught: Counter[str] = field(default_factory=Counter)  # by class: faults
    # present at a start, not yet read by the agent, that the check caught
    preflight_false: int = 0  # healthy nodes it failed
    preflight_blocked: int = 0  # starts it failed (the job placed again)
    preflight_node_s: float = 0.0  # node-seconds the checks held starts
    fault_times: dict[int, FaultTimes] = field(default_factory=dict)
    hidden: dict[int, HiddenTimes] = field(default_factory=dict)
    deep_runs: Counter[str] = field(default_factory=Counter)  # by trigger
    availability_bins: list[float] = field(default_factory=list)  # in-service slot-seconds
    # Faults of the machine itself that were on a node during the run (benign signals are
    # no fault), and those of them that only new hardware clears (``started``).
    machine_faults: int = 0
    machine_faults_replace: int = 0
    # When each slot's machine was replaced automatically (not by people), by slot.
    replaced_at: defaultdict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    def counts(self) -> Stats:
        """A copy of the counters alone (ints and Counters), to subtract later."""
        copy = Stats()
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float | Counter):
                setattr(copy, f.name, Counter(value) if isinstance(value, Counter) else value)
        return copy

    def since(self, before: Stats, start: float, fault_starts: Mapping[int, float]) -> Stats:
        """What happened from ``start`` on: the counters less ``before`` (taken then), the
        faults that began from then, the replacements and hourly bins from then."""
        measured = Stats()
        for f in fields(self):
            value, earlier = getattr(self, f.name), getattr(before, f.name)
            if isinstance(value, int | float | Counter):
                setattr(measured, f.name, value - earlier)
        measured.fault_times = {
            i: t for i, t in self.fault_times.items() if fault_starts[i] >= start
        }
        measured.hidden = {i: t for i, t in self.hidden.items() if fault_starts[i] >= start}
        measured.availability_bins = self.availability_bins[int(start // BIN_S) :]
        for slot, times in self.replaced_at.items():
            measured.replaced_at[slot] = [t for t in times if t >= start]
        return measured

    def started(self, fault: Fault) -> None:
        """A fault is on a node (not dropped)."""
        if fault.locus is Locus.MACHINE and fault.cls != "benign":
            self.machine_faults += 1
            self.machine_faults_replace += fault.fix is Fix.REPLACE

    # Each moment below is noted once: the first time it happens.

    def detected(self, faults: Iterable[Fault], now: float) -> None:
        for fault in faults:
            times = self.fault_times.get(fault.id)
            if times is not None and times.detected is None:
                times.detected = now

    def quarantined(self, fault_ids: Iterable[int], now: float) -> None:
        for fault_id in fault_ids:
            times = self.fault_times[fault_id]
            if times.quarantined is None:
                times.quarantined = now

    def repaired(self, fault_ids: Iterable[int], now: float) -> None:
        for fault_id in fault_ids:
            self.fault_times[fault_id].repaired = now

    def found_by_checks(self, faults: Iterable[Fault], now: float) -> None:
        for fault in faults:
            times = self.hidden.get(fault.id)
            if times is not None and times.by_checks is None:
                times.by_checks = now

    def found_by_job(self, fault: Fault, now: float) -> None:
        times = self.hidden.get(fault.id)
        if times is not None and times.by_job is None:
            times.by_job = now

    def removed(self, faults: Iterable[Fault], now: float) -> None:
        for fault in faults:
            times = self.hidden.get(fault.id)
            if times is not None and times.removed is None:
                times.removed = now


class ServiceBooks:
    """Slots in service over time: the availability shares and their hourly bins.

    Machines are counted apart from slots: a machine in repair still counts against
    GPU-node availability while a spare fills its slot.
    """

    def __init__(self, stats: Stats, *, slots: int, horizon: float) -> None:
        self.bins = stats.availability_bins = [0.0] * (int(horizon // BIN_S) + 1)
        self.slots = slots
        self.slot_share = TimeShare(0.0)
        self.machine_share = TimeShare(0.0)
        self.in_service = 0
        # GPU slots: every node's GPUs in service (``Fleet.refresh`` says how many).
        self.gpu_share = TimeShare(0.0)
        self.gpus_in_service = 0
        self.gpus_per_slot = GPUS_PER_NODE
        self.occupied = slots  # slots with a machine in them
        self.repairing = 0  # machines away for repair
        self._bin_since = 0.0

    def account(self, now: float) -> None:
        """Book the time since the last call at the counts as they were."""
        bins = self.bins
        t = self._bin_since
        while t < now:
            index = int(t // BIN_S)
            end = min(now, (index + 1) * BIN_S)
            bins[min(index, len(bins) - 1)] += self.in_service * (end - t)
            t = end
        self._bin_since = now
        self.slot_share.set(now, up=self.in_service, total=self.slots)
        self.machine_share.set(now, up=self.in_service, total=self.occupied + self.repairing)
        self.gpu_share.set(now, up=self.gpus_in_service, total=self.slots * self.gpus_per_slot)

    def start_measuring(self, now: float) -> None:
        """Forget the time in service booked so far (the warm-up); keep the hourly bins."""
        self.account(now)
        self.slot_share = TimeShare(now, up=self.in_service, total=self.slots)
        self.machine_share = TimeShare(
            now, up=self.in_service, total=self.occupied + self.repairing
        )
        self.gpu_share = TimeShare(
            now, up=self.gpus_in_service, total=self.slots * self.gpus_per_slot
        )

    def service_changed(self, now: float, *, nodes: int = 0, gpus: int = 0) -> None:
        """``nodes`` more nodes and ``gpus`` more GPUs in service (fewer when negative)."""
        self.account(now)
        self.in_service += nodes
        self.gpus_in_service += gpus
        self.slot_share.up = self.machine_share.up = self.in_service
        self.gpu_share.up = self.gpus_in_service
