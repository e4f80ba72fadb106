"""The synthetic generator against the StepFun trace, figure by figure (out of sample: no
default was fitted to this trace). Each figure is printed (pytest -s) for
docs/simulator.md's calibration table; the assertions are the tolerances stated there.

Two kinds of assertion, kept apart: out-of-sample matches (the event rate, set from
Llama 3; the lemons' share, set from the literature's "2 % of nodes, x10"), which a change
to the generator can break; and known mismatches (node incidents, blast radius,
simultaneity), asserted as findings so that docs/simulator.md cannot go on stating one
that no longer holds. The calibration scenarios' own figures, which their rates were fitted
to, are test_sim_calibration.py's plumbing checks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpuguard.sim.fault_stream import generate_faults
from gpuguard.sim.faults import Fault
from gpuguard.sim.run import replay_scenario
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.trace import TRACE_CLASSES
from gpuguard.sim.trace_files import load_trace

# Classes whose faults take a node out (benign signals and transient fail-slow do not).
NOT_A_FAULT = ("benign",)


def _figures(starts: list[tuple[float, int, str]], nodes: int, days: float) -> dict[str, float]:
    per_node = Counter(node for _, node, _ in starts)
    top = sorted(per_node.values(), reverse=True)[: max(1, round(0.02 * nodes))]
    at_once = Counter(round(t, 6) for t, _, _ in starts)
    return {
        "per_1000_node_days": 1000 * len(starts) / (nodes * days),
        "top_2pct_share": sum(top) / len(starts),
        "max_starting_together": max(at_once.values()),
    }


def _generated() -> tuple[list[Fault], int, float]:
    trace = load_trace("infinitehbd")
    scenario = replay_scenario(load_scenario(), trace)  # its fleet and days, no warm-up
    faults = generate_faults(scenario, np.random.default_rng([1, 0]))
    return faults, trace.nodes, trace.days


def test_generator_and_trace_figure_by_figure():
    trace = load_trace("infinitehbd")
    slots = trace.node_index()
    recorded = [(r.start_days, slots[r.node], TRACE_CLASSES[r.cls][0]) for r in trace.records]
    faults, nodes, days = _generated()
    hidden_at_start = [f for f in faults if f.start == 0.0]
    drawn = [
        (f.start / 86400, f.slot, f.cls)
        for f in faults
        if f.cls not in NOT_A_FAULT and f.start > 0 and not (f.cls == "fail_slow" and f.end)
    ]
    ours, theirs = _figures(drawn, nodes, days), _figures(recorded, trace.nodes, trace.days)
    seen: set[int] = set()
    events = [f for f in faults if f.group < 0 or not (f.group in seen or seen.add(f.group))]
    ours["events_per_1000_node_days"] = (
        1000
        * sum(
            1
            for f in events
            if f.cls not in NOT_A_FAULT and f.start > 0 and not (f.cls == "fail_slow" and f.end)
        )
        / (nodes * days)
    )
    theirs["events_per_1000_node_days"] = theirs["per_1000_node_days"]
    for name in ours:
        print(f"{name}: generator {ours[name]:.3f}, trace {theirs[name]:.3f}")
    mix_ours = Counter(c for _, _, c in drawn)
    mix_theirs = Counter(c for _, _, c in recorded)
    for cls in sorted(set(mix_ours) | set(mix_theirs)):
        print(
            f"class {cls}: generator {mix_ours[cls] / len(drawn):.3f},"
            f" trace {mix_theirs[cls] / len(recorded):.3f}"
        )
    groups = Counter(f.group for f in faults if f.group >= 0)
    print(f"blast radius (nodes per event): generator max {max(groups.values(), default=1)},")
    print("trace 1 (every record is one node)")
    print(f"hidden faults present at t=0: {len(hidden_at_start)}")
    # Events: within 40 % (the trace counts node faults, the generator's rates are Llama 3's
    # job interruptions). Node incidents are twice the trace's: the racks below.
    assert ours["events_per_1000_node_days"] == pytest.approx(theirs["per_1000_node_days"], rel=0.4)
    assert ours["per_1000_node_days"] > 1.5 * theirs["per_1000_node_days"]
    # Lemons: the top 2 % of nodes hold a share within a factor of two of the trace's.
    assert 0.5 < ours["top_2pct_share"] / theirs["top_2pct_share"] < 2.0
    # Simultaneity and blast radius do not match: a generated switch fault takes a rack of
    # fleet.nodes_per_rack (16) at once, the trace never more than one node per record.
    # Stated in docs/simulator.md; this guards the finding.
    assert ours["max_starting_together"] >= load_scenario().fleet.nodes_per_rack
    assert theirs["max_starting_together"] <= 14
