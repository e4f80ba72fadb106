"""Fleet simulator speed: one seed of all three policies, as ``gpuguard simulate`` runs it.

Goals (issue 16): 1,000 nodes x 90 days, none + reactive + gpuguard, one seed, in under
10 s on one core; 10,000 nodes x 365 days in under 5 minutes and 1 GB. A verdict goes by
CPU time (user + system of this process), which other load on a shared machine does not
inflate; the wall time is printed beside it. Each run is one ``simulate`` call, the
workload and failure stream drawn once for the three policies, as on the command line.
Next to each policy, the time of its engine run, and for gpuguard the share spent inside
the remediation policy core (``decide``) and in the ``remediation.Reconciler`` passes
around it (the same driver the controller runs), so a slow run says whether the engine
or the policy is the cost.

    .venv/bin/python bench/simulate.py            # both runs (the large one: minutes)
    .venv/bin/python bench/simulate.py --quick    # 1,000 x 90 only (make bench)
    .venv/bin/python bench/simulate.py --large    # 10,000 x 365 only
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass
from typing import Any

import gpuguard.remediation.reconciler as reconciler
from gpuguard.sim.engine import Engine
from gpuguard.sim.run import POLICIES, simulate
from gpuguard.sim.scenario import load_scenario


@dataclass(frozen=True)
class Case:
    nodes: int
    days: float
    cpu_goal_s: float
    rss_goal_mib: float | None = None


QUICK = Case(1_000, 90.0, cpu_goal_s=10.0)
LARGE = Case(10_000, 365.0, cpu_goal_s=300.0, rss_goal_mib=1024.0)


class _Timer:
    """Replaces ``owner.name`` by a wrapper that adds up its CPU time, until ``restore``;
    ``by`` names the bucket of each call (default: one)."""

    def __init__(self, owner: Any, name: str, by: Any = None) -> None:
        self.owner, self.name, self.by = owner, name, by
        self.seconds: dict[Any, float] = {}
        self.calls = 0
        self._wrapped = getattr(owner, name)
        setattr(owner, name, self)

    def __get__(self, instance: Any, _owner: Any = None) -> Any:  # as a method, too
        return self if instance is None else (lambda *a, **k: self(instance, *a, **k))

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.process_time()
        try:
            return self._wrapped(*args, **kwargs)
        finally:
            key = self.by(*args) if self.by is not None else None
            self.seconds[key] = self.seconds.get(key, 0.0) + time.process_time() - started
            self.calls += 1

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def restore(self) -> None:
        setattr(self.owner, self.name, self._wrapped)


def measure(case: Case) -> bool:
    """Run the case, print its figures; True when it met its goals."""
    # The goals are per simulated day: no warm-up, the case's days are all it runs.
    scenario = load_scenario().with_overrides(nodes=case.nodes, days=case.days, warmup_days=0.0)
    runs = _Timer(Engine, "run", by=lambda engine: engine.driver.name)
    decide = _Timer(reconciler, "decide")  # the name the Reconciler calls
    passes = _Timer(reconciler.Reconciler, "reconcile")
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        results = simulate(scenario, seeds=1).results
    finally:
        for timer in (runs, decide, passes):
            timer.restore()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n{case.nodes:,} nodes x {case.days:g} days x {len(POLICIES)} policies x 1 seed")
    print("| policy | engine CPU s | node-days/s | faults | job interruptions |")
    print("|---|---:|---:|---:|---:|")
    for name in POLICIES:
        seconds, result = runs.seconds[name], results[name]
        print(
            f"| {name} | {seconds:.1f} | {case.nodes * case.days / seconds:,.0f}"
            f" | {result.faults:,} | {result.interruptions:,} |"
        )
    node_days = case.nodes * case.days * len(POLICIES)
    print(f"| whole run (workload, faults, reports too) | {cpu:.1f} | {node_days / cpu:,.0f} | | |")
    gpuguard_s = runs.seconds["gpuguard"]
    print(
        f"policy core: {decide.calls:,} decide calls, {decide.total:.1f} s"
        f" ({100 * decide.total / gpuguard_s:.0f} % of the gpuguard run); Reconciler passes"
        f" around them {passes.total:.1f} s ({100 * passes.total / gpuguard_s:.0f} %)"
    )
    met = cpu < case.cpu_goal_s
    verdict = [f"CPU {cpu:.1f} s (goal < {case.cpu_goal_s:g} s: {_met(met)})"]
    if case.rss_goal_mib is not None:
        fits = peak_mib < case.rss_goal_mib
        verdict.append(f"peak RSS {peak_mib:,.0f} MiB (goal < {case.rss_goal_mib:g}: {_met(fits)})")
        met = met and fits
    else:
        verdict.append(f"peak RSS {peak_mib:,.0f} MiB")
    print(f"wall {wall:.1f} s; " + "; ".join(verdict))
    return met


def _met(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only 1,000 nodes x 90 days")
    which.add_argument("--large", action="store_true", help="only 10,000 nodes x 365 days")
    args = parser.parse_args()
    cases = [QUICK] if args.quick else [LARGE] if args.large else [QUICK, LARGE]
    met = [measure(case) for case in cases]
    print(f"\ngoals: {'all met' if all(met) else 'MISSED'}")


if __name__ == "__main__":
    main()
