"""One simulation: the same failures and jobs, every policy in turn, over one or more seeds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuguard.remediation.policy import Policy, build_policy, load_policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Driver, Engine
from gpuguard.sim.fault_stream import generate_faults
from gpuguard.sim.faults import Fault
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.jobs import Workload, generate_jobs
from gpuguard.sim.policies import NoPolicy, ReactivePolicy
from gpuguard.sim.results import PolicyResult
from gpuguard.sim.scenario import Scenario
from gpuguard.sim.summary import summarise
from gpuguard.sim.sweep import Interval, intervals
from gpuguard.sim.trace import Trace

POLICIES = ("none", "reactive", "gpuguard")
# gpuguard on the same failures and jobs with the in-job path off: what the path gains.
WITHOUT_IN_JOB = "gpuguard-no-in-job"
# gpuguard with per-GPU quarantine on, and with the preflight gate on (``--compare-gpu``).
PER_GPU = "gpuguard-per-gpu"
PREFLIGHT = "gpuguard-preflight"
# reactive with the Jobs' podFailurePolicy on DisruptionTarget: its drains cost no retry.
REACTIVE_PFP = "reactive-pfp"


@dataclass
class Simulation:
    """One seed: every policy's result. ``runs`` holds the further seeds of a sweep (the
    first seed's are the top-level ``results``); ``trace`` is the replayed trace."""

    scenario: Scenario
    policy: Policy
    results: dict[str, PolicyResult]
    runs: list[dict[str, PolicyResult]] = field(default_factory=list)
    trace: Trace | None = None

    @property
    def seeds(self) -> list[int]:
        return [self.scenario.seed + i for i in range(1 + len(self.runs))]

    def every_seed(self, name: str) -> list[PolicyResult]:
        """One policy's result at each seed, in seed order."""
        return [self.results[name], *(run[name] for run in self.runs)]

    def over_seeds(self, name: str) -> dict[str, Interval | None]:
        return intervals(self.every_seed(name))


def remediation_policy(scenario: Scenario, policy_file: Path | None) -> Policy:
    """The policy file when given, else the scenario's ``gpuguard_policy`` section."""
    if policy_file is not None:
        return load_policy(policy_file)
    return build_policy(scenario.gpuguard_policy, origin="scenario gpuguard_policy")


def replay_scenario(scenario: Scenario, trace: Trace) -> Scenario:
    """The scenario sized to the trace's fleet and span, every recorded day measured."""
    return scenario.with_overrides(nodes=trace.nodes, days=trace.days, warmup_days=0.0)


def simulate(
    scenario: Scenario,
    policy: Policy | None = None,
    *,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str, float], None] | None = None,
    seeds: int = 1,
    trace: Trace | None = None,
) -> Simulation:
    """Run every policy on the same failure stream and workload (both drawn from the seed
    before any policy runs), for ``seeds`` seeds from the scenario's. With a ``trace``
    the failures are the trace's (the scenario sized to it); the seed still draws the
    workload and what clears each fault."""
    policy = policy or remediation_policy(scenario, None)
    if trace is not None:
        scenario = replay_scenario(scenario, trace)
    view = AgentView()
    runs = []
    for offset in range(seeds):
        seeded = scenario.with_overrides(seed=scenario.seed + offset) if offset else scenario
        runs.append(_one_seed(seeded, policy, policies, progress, view, trace))
    return Simulation(scenario, policy, runs[0], runs[1:], trace)


def _one_seed(
    scenario: Scenario,
    policy: Policy,
    policies: Sequence[str],
    progress: Callable[[str, float], None] | None,
    view: AgentView,
    trace: Trace | None,
) -> dict[str, PolicyResult]:
    rng = np.random.default_rng([scenario.seed, 0])
    with _without_cycle_collector():  # a million jobs drawn, none of them in a cycle
        faults = (
            trace.faults(scenario, rng) if trace is not None else generate_faults(scenario, rng)
        )
        workload = Workload.of(generate_jobs(scenario, np.random.default_rng([scenario.seed, 1])))
    results = {}
    for name in policies:
        label = f"{name} s{scenario.seed}"
        report = (lambda f, n=label: progress(n, f)) if progress is not None else None
        run_scenario = _variant(scenario, name)
        # Around the call, the driver made in it: nothing here holds the engine at the end.
        with _without_cycle_collector():
            driver = _driver(name, policy)
            results[name] = _run(run_scenario, faults, workload, driver, view, report)
            del driver
    return results


def _run(
    scenario: Scenario,
    faults: list[Fault],
    workload: Workload,
    driver: Driver,
    view: AgentView,
    progress: Callable[[float], None] | None,
) -> PolicyResult:
    """One policy's run on its own jobs, which are gone once it is summed up (a large run's
    jobs take hundreds of MB: two policies' at once would double the peak)."""
    engine = Engine(
        scenario, faults, workload.jobs(), driver, view, seed=scenario.seed, progress=progress
    )
    engine.run()
    return summarise(engine)


@contextlib.contextmanager
def _without_cycle_collector() -> Iterator[None]:
    """A run, or drawing its workload, allocates millions of objects (jobs, events,
    episodes), each freed by its reference count (a collection during a run finds nothing
    to free), and each of the collector's full passes walks every one still alive: a
    tenth of a large run's time. Off meanwhile; a collection after it frees the engine,
    whose parts refer to one another (nothing may hold it then: it would live on through
    the next run)."""
    enabled = gc.isenabled()
    gc.collect()  # what the caller left, not the run's
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect()


def _variant(scenario: Scenario, name: str) -> Scenario:
    """The scenario a side-by-side run of gpuguard changes (the others: as it is)."""
    if name == WITHOUT_IN_JOB:
        return scenario.with_in_job(False)
    if name in (PER_GPU, PREFLIGHT):
        key = "gpu_quarantine" if name == PER_GPU else "preflight"
        return scenario.with_section(key, enabled=True)
    return scenario


def _driver(name: str, policy: Policy) -> Driver:
    if name == "none":
        return NoPolicy()
    if name in ("reactive", REACTIVE_PFP):
        return ReactivePolicy(pod_failure_policy=name == REACTIVE_PFP)
    if name in ("gpuguard", WITHOUT_IN_JOB, PER_GPU, PREFLIGHT):
        driver = GpuguardPolicy(policy)
        driver.name = name
        return driver
    known = ", ".join((*POLICIES, WITHOUT_IN_JOB, REACTIVE_PFP, PER_GPU, PREFLIGHT))
    raise ValueError(f"unknown policy {name!r} (policies: {known})")
