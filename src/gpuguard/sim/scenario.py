"""The scenario: fleet, failures, detection, actions and workload, as validated data.

Every default is a published figure or a stated assumption; docs/simulator.md gives the
source of each. Errors name the file and the key, like the rest of gpuguard's configuration.
The detection sections are in ``scenario_detection``.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuguard.config import describe_invalid, read_yaml_mapping
from gpuguard.errors import ConfigError
from gpuguard.sim.scenario_detection import Attribution, DeepChecks, Detection, InJob
from gpuguard.sim.scenario_gpu import GpuQuarantine, Preflight
from gpuguard.sim.scenario_types import NonNegative, Positive, Share, Strict

# Warm spares per pool of the gpuguard run unless the scenario sets ``fleet.spares_per_pool``.
GPUGUARD_SPARES_PER_POOL = 2


class Fleet(Strict):
    nodes: int = Field(default=256, ge=1, le=200_000, description="GPU-node slots in service")
    pools: int = Field(default=2, ge=1, description="Node pools (budgets are per pool)")
    nodes_per_rack: int = Field(default=16, ge=1, description="Nodes behind one leaf switch")
    spare_nodes: int = Field(default=6, ge=0, description="Hot spares, healthy and idle")
    replace_from_spare_min: Positive = 5.0
    new_capacity_h: Positive = Field(
        default=0.5, description="Wait for a new machine when no spare is left"
    )
    repair_days: Positive = Field(
        default=7.0, description="A replaced machine's repair round trip, then it is a spare"
    )
    age_days: NonNegative = Field(
        default=365.0,
        description="Days the fleet has been in service: the hidden faults it carries at t=0",
    )
    spares_per_pool: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Idle nodes per pool held for interrupted jobs (placeholder pods); null: the"
            " gpuguard run keeps GPUGUARD_SPARES_PER_POOL, the baselines none"
        ),
    )

    def warm_spares(self, gpuguard: bool) -> int:
        """Nodes of the fleet held idle for interrupted jobs in this run."""
        per_pool = self.spares_per_pool
        if per_pool is None:
            per_pool = GPUGUARD_SPARES_PER_POOL if gpuguard else 0
        return per_pool * self.pools


class Fix(Strict):
    """What clears a fault, as shares of its class (they must add up to 1)."""

    restart: Share = 0.0  # the job's restart: the node was never at fault
    reset: Share = 0.0  # a GPU reset
    reboot: Share = 0.0
    replace: Share = 0.0  # hardware repair: only a replacement brings the slot back
    self_clears: Share = Field(default=0.0, alias="self")  # ends by itself (switch repaired)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _adds_up(self) -> Fix:
        total = self.restart + self.reset + self.reboot + self.replace + self.self_clears
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"fix shares must add up to 1, they add up to {total:g}")
        return self

    def shares(self) -> tuple[float, float, float, float, float]:
        return (self.restart, self.reset, self.reboot, self.replace, self.self_clears)


class FaultClass(Strict):
    rate: NonNegative = Field(description="Faults per 1,000 node-days")
    fix: Fix
    self_clear_h: Positive = Field(default=4.0, description="How long a self-clearing fault lasts")


def _fc(rate: float, self_clear_h: float = 4.0, **fix: float) -> FaultClass:
    return FaultClass(rate=rate, fix=Fix.model_validate(fix), self_clear_h=self_clear_h)


class FaultClasses(Strict):
    """Rates per 1,000 node-days by class (Llama 3 405B, 54 days on 16,384 H100)."""

    gpu: FaultClass = _fc(0.80, reboot=0.35, replace=0.65)
    nvlink: FaultClass = _fc(0.34, reset=0.4, reboot=0.2, replace=0.4)
    pcie: FaultClass = _fc(0.20, reboot=0.4, replace=0.6)
    hbm: FaultClass = _fc(0.651, reset=0.5, replace=0.5)
    sram: FaultClass = _fc(0.172, reset=0.3, replace=0.7)
    gsp: FaultClass = _fc(0.154, reset=0.6, reboot=0.3, replace=0.1)
    application: FaultClass = _fc(0.366, restart=1.0)
    kernel_driver: FaultClass = _fc(0.122, reboot=0.9, replace=0.1)
    nccl_hang: FaultClass = _fc(0.063, restart=1.0)
    host: FaultClass = _fc(0.434, 4.0, self=0.7, replace=0.3)
    nic: FaultClass = _fc(0.063, reboot=0.4, replace=0.6)
    fabric: FaultClass = _fc(0.316, 2.0, self=1.0)
    thermal: FaultClass = _fc(0.054, replace=1.0)
    sdc: FaultClass = _fc(0.054, replace=1.0)


class Failures(Strict):
    rate_multiplier: NonNegative = Field(default=1.0, description="Scales every class's rate")
    classes: FaultClasses = FaultClasses()
    lemon_share: Share = Field(default=0.02, description="Share of machines that are lemons")
    lemon_multiplier: float = Field(default=10.0, ge=1, description="A lemon's rate vs others")
    fail_slow_per_1000_node_days: NonNegative = 1.0
    fail_slow_factor: tuple[Share, Share] = (0.5, 0.95)
    fail_slow_duration_s: tuple[Positive, Positive] = (10.0, 36_000.0)
    fail_slow_persistent_share: Share = Field(
        default=0.25, description="Fail-slow that lasts until repaired, with no NVML signal"
    )
    fail_slow_persistent_fix: Fix = Fix(reset=0.3, reboot=0.2, replace=0.5)
    sdc_fails_job: bool = Field(
        default=False, description="A job found to have computed on a corrupting GPU fails"
    )
    unattributed_per_1000_node_days: NonNegative = Field(
        default=0.0,
        description="Job interruptions with no node signal (software, mounts, NCCL timeouts)",
    )
    silent_machine_share: Share = Field(
        default=0.01, description="Share of machines that crash jobs with no node signal"
    )
    unattributed_machine_share: Share = Field(
        default=0.25,
        description="Share of the unattributed interruptions that come from those machines",
    )
    benign_signals_per_node_day: NonNegative = Field(
        default=0.013, description="Signals an aggressive rule takes for a fault"
    )


class Actions(Strict):
    drain_min: NonNegative = 1.5
    gpu_reset_s: Positive = 70.0
    reboot_min: Positive = 10.0
    failure_probability: Share = Field(default=0.02, description="An action itself fails")


class JobSize(Strict):
    nodes: int = Field(ge=1)
    share: Positive = Field(description="Share of the node-hours (normalised over the mix)")
    hours: tuple[Positive, Positive] = Field(description="Work, log-uniform between the two")

    @model_validator(mode="after")
    def _ordered(self) -> JobSize:
        if self.hours[0] > self.hours[1]:
            raise ValueError("hours: the first bound must not exceed the second")
        return self


DEFAULT_MIX = (
    JobSize(nodes=1, share=0.15, hours=(2, 48)),
    JobSize(nodes=4, share=0.15, hours=(6, 72)),
    JobSize(nodes=16, share=0.25, hours=(24, 168)),
    JobSize(nodes=64, share=0.30, hours=(48, 336)),
    JobSize(nodes=128, share=0.15, hours=(72, 336)),
)


class Jobs(Strict):
    utilisation: Share = Field(default=0.85, description="Share of slots the workload asks for")
    mix: tuple[JobSize, ...] = Field(default=DEFAULT_MIX, min_length=1)
    checkpoint_interval_min: Positive = 60.0
    checkpoint_cost_s: NonNegative = 6.0
    restart_overhead_min: NonNegative = 15.0
    requeue_delay_s: NonNegative = Field(
        default=10.0, description="Before a failed job's pods are created again"
    )
    retry_budget: int = Field(default=5, ge=0, description="Restarts before the job fails")
    capacity_timeout_h: Positive = Field(
        default=12.0,
        description="Under first_fit, a restarting job waiting longer than this fails",
    )
    sub_node_share: Share = Field(
        default=0.0,
        description="Share of the 1-node jobs that ask for 1-7 of its GPUs (uniform)",
    )
    restart_scheduling: Literal["gang", "first_fit"] = Field(
        default="gang",
        description=(
            "gang: an interrupted job keeps its quota (Kueue, JobSet) and waits as long as"
            " it takes; first_fit: its nodes go to whichever job fits first"
        ),
    )


class Scenario(Strict):
    name: str = "custom"
    days: Positive = Field(default=365.0, description="Simulated days that are measured")
    warmup_days: NonNegative = Field(
        default=30.0,
        description="Days run before the measured ones and discarded (the fleet settles)",
    )
    seed: int = 1
    fleet: Fleet = Fleet()
    failures: Failures = Failures()
    detection: Detection = Detection()
    deep_checks: DeepChecks = DeepChecks()
    in_job: InJob = InJob()
    attribution: Attribution = Attribution()
    actions: Actions = Actions()
    jobs: Jobs = Jobs()
    gpu_quarantine: GpuQuarantine = GpuQuarantine()
    preflight: Preflight = Preflight()
    # Validated as a remediation policy when the gpuguard run starts (``run.remediation_policy``).
    gpuguard_policy: dict[str, object] = Field(
        default_factory=dict, description="Remediation policy for the gpuguard run"
    )

    @model_validator(mode="after")
    def _jobs_fit(self) -> Scenario:
        largest = max(size.nodes for size in self.jobs.mix)
        if largest > self.fleet.nodes:
            raise ValueError(
                f"jobs.mix: a job of {largest} nodes cannot fit a fleet of {self.fleet.nodes}"
            )
        return self

    @property
    def span_days(self) -> float:
        """Days the run simulates: the warm-up, then the measured days."""
        return self.warmup_days + self.days

    def with_overrides(
        self,
        *,
        seed: int | None = None,
        days: float | None = None,
        warmup_days: float | None = None,
        nodes: int | None = None,
    ) -> Scenario:
        """A copy with ``seed``, ``days``, ``warmup_days`` or ``nodes`` replaced (None: kept)."""
        data = self.model_dump(by_alias=True)
        top = {"seed": seed, "days": days, "warmup_days": warmup_days}
        data.update({key: value for key, value in top.items() if value is not None})
        if nodes is not None:
            data["fleet"]["nodes"] = nodes
            mix = _mix_for_fleet(self.jobs.mix, nodes)
            data["jobs"]["mix"] = [size.model_dump(by_alias=True) for size in mix]
        return build_scenario(data, origin="command line")

    def mix_summary(self) -> str:
        """The job sizes of the mix, for a note: "1, 4, 16, 64, 128 nodes"."""
        return ", ".join(str(size.nodes) for size in self.jobs.mix) + " nodes"

    def with_in_job(self, enabled: bool) -> Scenario:
        """A copy with the in-job path on or off (``--no-in-job``, the side-by-side run)."""
        return self.model_copy(
            update={"in_job": self.in_job.model_copy(update={"enabled": enabled})}
        )

    def with_section(self, section: str, **keys: object) -> Scenario:
        """A copy with keys of one section set (the command line's options, the variants)."""
        part = getattr(self, section).model_copy(update=keys)
        return self.model_copy(update={section: part})


def _mix_for_fleet(mix: tuple[JobSize, ...], nodes: int) -> tuple[JobSize, ...]:
    """The mix scaled to a fleet of ``nodes`` when its largest job would take more than half
    of it (a gang job of the whole fleet never runs while a node is out): every size by
    the same factor, so the mix keeps its shape relative to the fleet."""
    largest = max(size.nodes for size in mix)
    if nodes < 1 or largest <= max(1, nodes // 2):
        return mix
    factor = max(1, nodes // 2) / largest
    return tuple(
        size.model_copy(update={"nodes": max(1, int(size.nodes * factor))}) for size in mix
    )


_SECTIONS: dict[str, type[BaseModel]] = {
    "fleet": Fleet,
    "failures": Failures,
    "detection": Detection,
    "deep_checks": DeepChecks,
    "in_job": InJob,
    "attribution": Attribution,
    "actions": Actions,
    "jobs": Jobs,
    "gpu_quarantine": GpuQuarantine,
    "preflight": Preflight,
}


def _model_at(loc: list[str]) -> type[BaseModel]:
    if len(loc) <= 1:
        return Scenario
    if loc[:2] == ["failures", "classes"]:
        if len(loc) == 3:
            return FaultClasses
        return Fix if len(loc) > 4 and loc[3] == "fix" else FaultClass
    if loc[:2] == ["failures", "fail_slow_persistent_fix"] and len(loc) > 2:
        return Fix
    if loc[0] == "jobs" and loc[1] == "mix" and len(loc) > 3:
        return JobSize
    return _SECTIONS.get(loc[0], Scenario)


def build_scenario(data: Mapping[str, object], origin: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_invalid(exc, origin, "scenario", _model_at)) from None


def load_scenario(path: Path | None = None) -> Scenario:
    """Read and validate a scenario file; ``None`` gives the packaged default scenario."""
    if path is None:
        return bundled_scenario("default")
    return build_scenario(read_yaml_mapping(Path(path), "scenario"), origin=str(path))


def bundled_scenario(name: str) -> Scenario:
    """One of the scenarios shipped in ``gpuguard/data/scenarios``."""
    resource = resources.files("gpuguard").joinpath(f"data/scenarios/{name}.yaml")
    with resources.as_file(resource) as path:
        return load_scenario(path)
