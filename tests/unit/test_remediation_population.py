"""Deciding over only the nodes that can need a decision gives the fleet-wide plan."""

from __future__ import annotations

from collections import Counter

from gpuguard.remediation.decide import decide
from gpuguard.remediation.model import BreakerState
from gpuguard.remediation.policy import Policy
from tests.unit.remediation_builders import T0, bad, fleet, node


def test_filtered_nodes_with_population_decide_like_the_whole_fleet():
    whole = fleet(
        *(node(f"ok-{i}", pool="a") for i in range(40)),
        *(node(f"bad-{i}", bad(), pool="a") for i in range(6)),
        *(node(f"b-{i}", pool="b") for i in range(10)),
    )
    policy = Policy(tolerance_s=0, budget={"max_unavailable": 10, "max_unavailable_percent": 10})
    full = decide(whole, {}, (), BreakerState(), policy, T0)
    interesting = {n: o for n, o in whole.items() if n.startswith("bad")}
    population = Counter(o.pool for o in whole.values())
    partial = decide(interesting, {}, (), BreakerState(), policy, T0, population=population)
    assert partial.decisions == full.decisions
    assert partial.breaker == full.breaker
    # Without the population the 6 bad nodes would be the whole fleet: breaker and budget
    # would be sized wrongly.
    alone = decide(interesting, {}, (), BreakerState(), policy, T0)
    assert alone.breaker != full.breaker or alone.decisions != full.decisions
