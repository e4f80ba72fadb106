"""Fleet simulator speed: simulated node-days per second, all three policies.

Goal (issue 16): 1,000 nodes x 90 days, none + reactive + gpuguard, one seed, in under
10 s on one core; 10,000 nodes x 365 days in under 5 minutes and 1 GB. The CPU time is
printed beside the wall time: on a shared machine the wall time also counts other load.
Next to each run, the share of the time spent inside the remediation policy core
(``decide``) and in the ``remediation.Reconciler`` passes around it (the same driver the
controller runs), measured in the same run, so a slow run says whether the engine or the
policy is the cost.

    .venv/bin/python bench/simulate.py            # both runs
    .venv/bin/python bench/simulate.py --quick    # 1,000 x 90 only
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

import gpuguard.remediation.reconciler as reconciler
from gpuguard.sim.run import POLICIES, simulate
from gpuguard.sim.scenario import load_scenario

RUNS = ((1_000, 90.0), (10_000, 365.0))


class _Timer:
    """Replaces ``owner.name`` by a wrapper that times it, until ``restore``."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self.seconds = 0.0
        self.calls = 0
        self._wrapped = getattr(owner, name)
        setattr(owner, name, self)

    def __get__(self, instance: Any, _owner: Any = None) -> Any:  # as a method, too
        return self if instance is None else (lambda *a, **k: self(instance, *a, **k))

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return self._wrapped(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1

    def restore(self) -> None:
        setattr(self.owner, self.name, self._wrapped)


def measure(nodes: int, days: float) -> None:
    scenario = load_scenario().with_overrides(nodes=nodes, days=days)
    decide = _Timer(reconciler, "decide")  # the name the Reconciler calls
    passes = _Timer(reconciler.Reconciler, "reconcile")
    per_policy = {}
    total = 0.0
    try:
        for name in POLICIES:
            started = time.perf_counter()
            result = simulate(scenario, policies=(name,)).results[name]
            per_policy[name] = (time.perf_counter() - started, result)
            total += per_policy[name][0]
    finally:
        decide.restore()
        passes.restore()
    node_days = nodes * days * len(POLICIES)
    print(f"\n{nodes:,} nodes x {days:g} days x {len(POLICIES)} policies")
    print("| policy | seconds | node-days/s | faults | job interruptions |")
    print("|---|---:|---:|---:|---:|")
    for name, (seconds, result) in per_policy.items():
        print(
            f"| {name} | {seconds:.1f} | {nodes * days / seconds:,.0f} | {result.faults:,}"
            f" | {result.interruptions:,} |"
        )
    print(f"| all three | {total:.1f} | {node_days / total:,.0f} | | |")
    gpuguard_s = per_policy["gpuguard"][0]
    print(
        f"policy core: {decide.calls:,} decide calls, {decide.seconds:.1f} s"
        f" ({100 * decide.seconds / gpuguard_s:.0f} % of the gpuguard run); Reconciler passes"
        f" around them {passes.seconds:.1f} s ({100 * passes.seconds / gpuguard_s:.0f} %)"
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU time so far (user): {usage.ru_utime:.1f} s")
    print(f"peak resident memory so far: {usage.ru_maxrss / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only 1,000 nodes x 90 days")
    args = parser.parse_args()
    for nodes, days in RUNS[:1] if args.quick else RUNS:
        measure(nodes, days)


if __name__ == "__main__":
    main()
