"""Positions as the controller reads them: from labels, shared between live Nodes, and what
it says about those it cannot read."""

from __future__ import annotations

import random

from gpuguard.contract.conditions import POSITION_CONDITION
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.observe import (
    INCOMPLETE,
    TOO_LONG,
    UNLABELLED,
    PositionReading,
    project_node,
    read_position,
)
from gpuguard.controller.position_faults import condition_status, message
from gpuguard.controller.positions import (
    MOST_NOTICES,
    POSITION_SHARED,
    POSITION_UNKNOWN,
    Positions,
)
from gpuguard.remediation.model import Episode
from gpuguard.remediation.policy_sections import DEFAULT_POSITION_LABELS
from tests.support.metrics import sample

GKE = DEFAULT_POSITION_LABELS[1]


def test_the_first_complete_label_set_names_the_position_in_its_order():
    labels = {"position": "u1", "rack": "r1", GKE[0]: "b", GKE[1]: "s", GKE[2]: "h"}
    assert read_position(labels, DEFAULT_POSITION_LABELS) == PositionReading("rack=r1,position=u1")
    gke = {GKE[2]: "h", GKE[0]: "b", GKE[1]: "s"}
    assert read_position(gke, DEFAULT_POSITION_LABELS).position == (
        f"{GKE[0]}=b,{GKE[1]}=s,{GKE[2]}=h"
    )


def test_a_complete_set_wins_over_a_partial_one():
    labels = {"rack": "r1", GKE[0]: "b", GKE[1]: "s", GKE[2]: "h"}
    reading = read_position(labels, DEFAULT_POSITION_LABELS)
    assert reading.position.startswith(GKE[0]) and not reading.problem


def test_without_labels_the_node_is_unlabelled_and_told_which_sets_would_name_it():
    reading = read_position({"karpenter.sh/nodepool": "gpu"}, DEFAULT_POSITION_LABELS)
    assert (reading.position, reading.problem) == ("", UNLABELLED)
    assert reading.missing[0] == "rack + position"
    assert "none of the position label sets" in reading.describe()


def test_a_set_present_in_part_names_the_missing_labels():
    for labels in ({"rack": "r1"}, {"rack": "r1", "position": ""}):
        reading = read_position(labels, DEFAULT_POSITION_LABELS)
        assert (reading.position, reading.problem, reading.missing) == (
            "",
            INCOMPLETE,
            ("position",),
        )
        assert "missing: position" in reading.describe()


def test_no_label_sets_configured_means_positions_are_not_used():
    assert read_position({}, []) == PositionReading()


def test_a_position_too_long_for_the_episode_is_refused():
    small = [[f"l{i}" for i in range(8)]]
    big = [[f"example.com/{'x' * 60}{i}" for i in range(10)]]
    for sets, fits in ((small, True), (big, False)):
        labels = {name: "v" * 63 for name in sets[0]}
        reading = read_position(labels, sets)
        assert bool(reading.position) is fits and (reading.problem == TOO_LONG) is not fits


def raw(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels, "annotations": {}}}


def test_projection_carries_the_position_and_a_persons_mark():
    node = raw("gpu-1", rack="r1", position="u1")
    node["metadata"]["annotations"]["gpuguard.io/position-fixed"] = "ticket-1"
    reading = read_position(node["metadata"]["labels"], DEFAULT_POSITION_LABELS)
    observed = project_node(node, "pool", "", reading.position)
    assert (observed.position, observed.position_fixed) == ("rack=r1,position=u1", "ticket-1")
    node["metadata"]["annotations"]["gpuguard.io/position-fixed"] = " "
    assert project_node(node, "pool").position_fixed == "(no ticket)"
    assert read_position(raw("gpu-2")["metadata"]["labels"], DEFAULT_POSITION_LABELS).position == ""


def test_two_live_nodes_share_a_position_until_one_leaves():
    positions = Positions()
    here = PositionReading("rack=r1,position=u1")
    assert positions.put("a", here, reporting=True) == set()
    assert positions.put("b", here, reporting=True) == {"a"}
    assert positions.shared_with("a") == ("b",) and positions.shared_with("b") == ("a",)
    metrics = ControllerMetrics()
    (notice,) = positions.untold(metrics)
    assert (notice.node, notice.reason) == ("a", POSITION_SHARED)
    assert "a, b" in notice.note
    assert sample(metrics.registry, "gpuguard_controller_shared_positions") == 1
    assert positions.untold(metrics) == []  # once per run
    # b is relabelled (no position labels left): it no longer claims the position.
    assert positions.put("b", PositionReading(), reporting=True) == {"a"}
    assert positions.shared_with("a") == ()
    positions.untold(metrics)
    assert sample(metrics.registry, "gpuguard_controller_shared_positions") == 0
    positions.put("c", here, reporting=True)
    assert [n.reason for n in positions.untold(metrics)] == [POSITION_SHARED]  # a new sharing
    assert positions.drop("c") == {"a"} and positions.shared_with("a") == ()


def test_relabelling_moves_a_node_to_its_new_position():
    positions = Positions()
    positions.put("a", PositionReading("p1"), reporting=True)
    positions.put("b", PositionReading("p1"), reporting=True)
    assert positions.put("b", PositionReading("p2"), reporting=True) == {"a"}
    assert positions.shared_with("a") == positions.shared_with("b") == ()


def test_unknown_positions_are_counted_by_reason_and_told_once_per_node():
    positions = Positions()
    unlabelled = read_position({}, DEFAULT_POSITION_LABELS)
    incomplete = read_position({"rack": "r1"}, DEFAULT_POSITION_LABELS)
    positions.put("placed", PositionReading("rack=r1,position=u9"), reporting=True)
    positions.put("a", unlabelled, reporting=True)
    positions.put("b", incomplete, reporting=True)
    positions.put("cpu", unlabelled, reporting=False)  # no agent: not ours
    metrics = ControllerMetrics()
    notices = positions.untold(metrics)
    assert [(n.node, n.reason) for n in notices] == [
        ("a", POSITION_UNKNOWN),
        ("b", POSITION_UNKNOWN),
    ]
    assert "missing: position" in notices[1].note
    for reason, count in ((UNLABELLED, 1), (INCOMPLETE, 1), (TOO_LONG, 0)):
        assert (
            sample(metrics.registry, "gpuguard_controller_nodes_without_position", reason=reason)
            == count
        )
    assert positions.untold(metrics) == []
    positions.put("b", PositionReading("rack=r1,position=u1"), reporting=True)
    positions.untold(metrics)
    assert (
        sample(metrics.registry, "gpuguard_controller_nodes_without_position", reason=INCOMPLETE)
        == 0
    )


def test_the_condition_message_names_the_position_and_the_evidence_once():
    evidence = "position rack=r1,position=u1: gpu-a was replaced there ... shows it again"
    episode = Episode(node="gpu-b", opened_at=0, phase_since=0, position="rack=r1,position=u1")
    episode.position_fault = evidence
    assert message(episode) == evidence
    episode.position_fault = "x" * 5000
    assert message(episode).startswith("position rack=r1,position=u1: x")
    assert len(message(episode)) <= 1024
    node = {"status": {"conditions": [{"type": POSITION_CONDITION, "status": "False"}]}}
    assert condition_status(node) == "False" and condition_status({"status": {}}) == ""


def test_a_fleet_without_position_labels_is_counted_not_told_node_by_node():
    """An EKS fleet carries none of the position labels: the nodes' names are its
    positions, as configured. Each node is counted; none gets an Event for it (100,000 at
    every start would hold up the first pass). A half-labelled node is still told."""
    positions = Positions()
    unlabelled = read_position({}, DEFAULT_POSITION_LABELS)
    for i in range(1000):
        positions.put(f"n{i}", unlabelled, reporting=True)
    positions.put("half", read_position({"rack": "r1"}, DEFAULT_POSITION_LABELS), reporting=True)
    metrics = ControllerMetrics()
    assert [(n.node, n.reason) for n in positions.untold(metrics)] == [("half", POSITION_UNKNOWN)]
    assert (
        sample(metrics.registry, "gpuguard_controller_nodes_without_position", reason=UNLABELLED)
        == 1000
    )
    # Once one node has a position, the fleet uses them: the unlabelled are told, a pass
    # at a time.
    positions.put("placed", PositionReading("rack=r1,position=u1"), reporting=True)
    told = [n.node for n in positions.untold(metrics)]
    assert len(told) == MOST_NOTICES
    while batch := positions.untold(metrics):
        assert len(batch) <= MOST_NOTICES
        told += [n.node for n in batch]
    assert sorted(told) == sorted(f"n{i}" for i in range(1000))


def test_what_is_kept_as_nodes_change_matches_the_fleet_read_afresh():
    """The bookkeeping is kept node by node (a pass must not walk 100,000 Nodes); after
    any sequence of changes, its gauges and Events are what the fleet itself shows."""
    rng = random.Random(5)
    readings = [
        PositionReading("rack=r1,position=u1"),
        PositionReading("rack=r1,position=u2"),
        read_position({}, DEFAULT_POSITION_LABELS),
        read_position({"rack": "r1"}, DEFAULT_POSITION_LABELS),
        PositionReading(problem=TOO_LONG),
    ]
    positions, metrics = Positions(), ControllerMetrics()
    fleet: dict[str, tuple[PositionReading, bool]] = {}
    told: set[str] = set()
    for step in range(400):
        name = f"n{rng.randrange(12)}"
        before = fleet.get(name)
        if rng.random() < 0.15:
            fleet.pop(name, None)
            positions.drop(name)
        else:
            fleet[name] = (rng.choice(readings), rng.random() < 0.8)
            positions.put(name, fleet[name][0], reporting=fleet[name][1])
        if fleet.get(name) != before:
            told.discard(name)  # unknown in a new way (or again): told again
        notices = positions.untold(metrics)

        unknown = {n: r for n, (r, reporting) in fleet.items() if r.problem and reporting}
        for reason in (UNLABELLED, INCOMPLETE, TOO_LONG):
            count = sum(r.problem == reason for r in unknown.values())
            gauge = "gpuguard_controller_nodes_without_position"
            assert sample(metrics.registry, gauge, reason=reason) == count, step
        claims: dict[str, set[str]] = {}
        for n, (r, _) in fleet.items():
            if r.position:
                claims.setdefault(r.position, set()).add(n)
        shared = sum(len(names) > 1 for names in claims.values())
        assert sample(metrics.registry, "gpuguard_controller_shared_positions") == shared, step
        told = {n for n in told if n in unknown}
        said = {n.node for n in notices if n.reason == POSITION_UNKNOWN}
        assert not said & told, f"told twice at step {step}"
        told |= said
        if claims:  # a fleet with positions: every unknown node has been told by now
            assert told >= set(unknown) or len(said) == MOST_NOTICES, step
