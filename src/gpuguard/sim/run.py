"""One simulation: the same failures and jobs, every policy in turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuguard.remediation.policy import Policy, build_policy, load_policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Driver, Engine
from gpuguard.sim.faults import generate_faults
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.jobs import generate_jobs
from gpuguard.sim.policies import NoPolicy, ReactivePolicy
from gpuguard.sim.results import PolicyResult, summarise
from gpuguard.sim.scenario import Scenario

POLICIES = ("none", "reactive", "gpuguard")


@dataclass
class Simulation:
    scenario: Scenario
    policy: Policy
    results: dict[str, PolicyResult]


def remediation_policy(scenario: Scenario, policy_file: Path | None) -> Policy:
    """The policy file when given, else the scenario's ``gpuguard_policy`` section."""
    if policy_file is not None:
        return load_policy(policy_file)
    return build_policy(scenario.gpuguard_policy, origin="scenario gpuguard_policy")


def simulate(
    scenario: Scenario,
    policy: Policy | None = None,
    *,
    policies: Sequence[str] = POLICIES,
    progress: Callable[[str, float], None] | None = None,
) -> Simulation:
    """Run every policy on the same failure stream and workload (both drawn from the seed
    before any policy runs)."""
    policy = policy or remediation_policy(scenario, None)
    faults = generate_faults(scenario, np.random.default_rng([scenario.seed, 0]))
    view = AgentView()
    results = {}
    for name in policies:
        jobs = generate_jobs(scenario, np.random.default_rng([scenario.seed, 1]))
        driver = _driver(name, policy)
        report = (lambda f, n=name: progress(n, f)) if progress is not None else None
        engine = Engine(scenario, faults, jobs, driver, view, seed=scenario.seed, progress=report)
        engine.run()
        results[name] = summarise(engine)
    return Simulation(scenario, policy, results)


def _driver(name: str, policy: Policy) -> Driver:
    if name == "none":
        return NoPolicy()
    if name == "reactive":
        return ReactivePolicy()
    if name == "gpuguard":
        return GpuguardPolicy(policy)
    raise ValueError(f"unknown policy {name!r} (policies: {', '.join(POLICIES)})")
