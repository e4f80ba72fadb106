"""Shared causes: a rack-wide fault is held as one incident, not repaired node by node.

A leaf switch that dies takes the network layer down on every node of its rack; rebooting
or replacing those nodes cannot help. These tests run ``decide`` call after call (the
``Sim`` of the other policy tests) and check what it does to the nodes of such a rack,
to nodes elsewhere, and to other faults of the same nodes.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.contract.report import LayerReport
from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.decide import decide
from gpuguard.remediation.health import recent_episodes
from gpuguard.remediation.history import History
from gpuguard.remediation.model import BreakerState, Episode, NodeObservation, Phase, Resolution
from gpuguard.remediation.policy import Policy, build_policy
from tests.unit.remediation_builders import DISRUPTIVE, T0, K, Sim, bad, kinds, node, ok

LABEL = Policy().correlation.domain_label
LINK_DOWN = bad(Action.REBOOT, codes=("IB_LINK_DOWN",), gpus=())
XID_79 = bad(Action.REBOOT, codes=("XID_79",))
ROOMY = {"max_unavailable": 10, "max_unavailable_percent": 100}  # the budget never waits


def rack_node(name: str, rack: str) -> NodeObservation:
    return dataclasses.replace(node(name), domain=rack)


def set_layer(sim: Sim, name: str, layer: str, report: LayerReport) -> None:
    """The agent reports ``layer``; its ``since`` moves only when the status changes."""
    current = sim.nodes[name]
    previous = current.layers[layer]
    since = previous.since if previous.status == report.status else sim.now
    layers = {**current.layers, layer: dataclasses.replace(report, since=since)}
    sim.nodes[name] = dataclasses.replace(current, layers=layers)


def racks(*names_by_rack: tuple[str, list[str]], spare: int = 0) -> Sim:
    """A fleet of racks, plus ``spare`` healthy nodes outside any rack (pool size)."""
    nodes = [rack_node(n, rack) for rack, names in names_by_rack for n in names]
    nodes += [node(f"spare-{i}") for i in range(spare)]
    return Sim({n.name: n for n in nodes}, Policy(budget=ROOMY))


def run_for(sim: Sim, seconds: float, dt: float = 30.0) -> list[K]:
    """Step the fleet; every decision kind made on the way."""
    made: list[K] = []
    for _ in range(int(seconds // dt)):
        made += kinds(sim.step(dt))
    return made


def disruptive_on(sim: Sim, names: set[str]) -> list[K]:
    return [
        d.kind for p in sim.plans for d in p.decisions if d.node in names and d.kind in DISRUPTIVE
    ]


RACK_A = [f"a{i}" for i in range(4)]


def test_a_rack_wide_link_loss_is_held_tainted_and_spends_no_budget() -> None:
    sim = racks(("rack-a", RACK_A), ("rack-b", ["b0"]), spare=56)
    sim.policy = Policy(budget={"max_unavailable": 1})
    for name in RACK_A:
        set_layer(sim, name, "network", LINK_DOWN)
    set_layer(sim, "b0", "gpu", XID_79)  # an unrelated fault elsewhere, same pool
    run_for(sim, 3 * 3600)

    assert disruptive_on(sim, set(RACK_A)) == []
    for name in RACK_A:
        assert sim.nodes[name].tainted
        episode = sim.episodes[name]
        assert (episode.phase, episode.rung, episode.attempts) == (Phase.QUARANTINED, None, {})
        held = [s.message for s in episode.steps if "held until the domain recovers" in s.message]
        assert len(held) == 1, episode.steps  # recorded once, not on every call
        assert f"network fault shared by 4 nodes of {LABEL}=rack-a" in held[0]
    # With one repair slot in the pool, the other rack's node still got it: the held
    # nodes hold none.
    assert K.REQUEST_ACTION in disruptive_on(sim, {"b0"})
    assert any("a0: held: network fault shared" in note for p in sim.plans for note in p.notes)


def test_the_same_number_of_link_losses_spread_over_racks_is_handled_node_by_node() -> None:
    spread = [(f"rack-{i}", [f"n{i}"]) for i in range(4)]
    sim = racks(*spread, spare=56)
    for i in range(4):
        set_layer(sim, f"n{i}", "network", LINK_DOWN)
    run_for(sim, 600)
    for i in range(4):
        made = disruptive_on(sim, {f"n{i}"})
        assert K.CORDON in made and K.EVICT_PODS in made, (i, made)
        assert not any("held" in s.message for s in sim.episodes[f"n{i}"].steps)


def test_below_min_nodes_a_rack_is_handled_node_by_node() -> None:
    sim = racks(("rack-a", RACK_A), spare=56)
    for name in RACK_A[:2]:
        set_layer(sim, name, "network", LINK_DOWN)
    run_for(sim, 600)
    for name in RACK_A[:2]:
        assert K.EVICT_PODS in disruptive_on(sim, {name})


def test_faults_far_apart_in_time_are_not_one_incident() -> None:
    sim = racks(("rack-a", RACK_A), spare=56)
    sim.policy = Policy(budget=ROOMY, correlation={"window_s": 300})
    for name in RACK_A[:3]:
        set_layer(sim, name, "network", LINK_DOWN)
        sim.step(400)  # each one 400 s after the last: never three within 300 s
    run_for(sim, 1200)
    for name in RACK_A[:3]:
        assert K.EVICT_PODS in disruptive_on(sim, {name}), name


@pytest.mark.parametrize(
    "rack, correlation",
    [("", {}), ("rack-a", {"enabled": False}), ("rack-a", {"layers": ["gpu"]})],
    ids=["unlabelled nodes", "disabled", "network not a correlated layer"],
)
def test_no_grouping_without_a_domain_or_with_the_rule_off(
    rack: str, correlation: dict[str, object]
) -> None:
    sim = racks((rack, RACK_A), spare=56)
    sim.policy = Policy(budget=ROOMY, correlation=correlation)
    for name in RACK_A:
        set_layer(sim, name, "network", LINK_DOWN)
    run_for(sim, 600)
    for name in RACK_A:
        assert K.EVICT_PODS in disruptive_on(sim, {name}), name


def test_a_gpu_fault_in_the_affected_rack_is_still_repaired_and_then_held() -> None:
    sim = racks(("rack-a", RACK_A), spare=56)
    for name in RACK_A:
        set_layer(sim, name, "network", LINK_DOWN)
    set_layer(sim, "a0", "gpu", XID_79)  # a GPU fell off the bus on one of them
    run_for(sim, 300)
    assert K.CORDON in disruptive_on(sim, {"a0"})
    assert disruptive_on(sim, set(RACK_A[1:])) == []
    episode = sim.episodes["a0"]
    assert episode.rung is Action.REBOOT
    assert any("XID_79 -> REBOOT" in step.message for step in episode.steps)

    sim.set("a0", unschedulable=True)  # cordoned; the drain found nothing to move
    run_for(sim, 60)
    assert sim.episodes["a0"].phase is Phase.ACTING
    sim.answer("a0", True)  # the reboot brought the GPU back; the switch is still down
    set_layer(sim, "a0", "gpu", ok())
    run_for(sim, 2 * 3600)
    episode = sim.episodes["a0"]
    assert episode.phase is Phase.QUARANTINED
    assert dict(episode.attempts) == {Action.REBOOT: 1}  # no REPLACE for the switch
    assert "held until the domain recovers" in episode.steps[-1].message
    assert sim.nodes["a0"].tainted


def test_the_domain_recovering_closes_the_episodes() -> None:
    sim = racks(("rack-a", RACK_A), spare=56)
    for name in RACK_A:
        set_layer(sim, name, "network", LINK_DOWN)
    run_for(sim, 3600)
    assert set(sim.episodes) == set(RACK_A)
    for name in RACK_A:
        set_layer(sim, name, "network", ok())  # the switch is back
    run_for(sim, 300)
    assert sim.episodes == {}
    closed = [e for e in sim.history if e.node in RACK_A]
    assert {e.resolution for e in closed} == {Resolution.TRANSIENT}
    assert not any(sim.nodes[name].tainted for name in RACK_A)
    assert disruptive_on(sim, set(RACK_A)) == []


def test_bad_correlation_settings_are_named() -> None:
    with pytest.raises(ConfigError, match=r"correlation\.min_nodes"):
        build_policy({"correlation": {"min_nodes": 1}}, "policy.yaml")
    with pytest.raises(ConfigError, match=r"correlation\.layers"):
        build_policy({"correlation": {"layers": ["switch"]}}, "policy.yaml")


# -- the indexed history answers as the plain one ------------------------------------

NODES = [f"n{i}" for i in range(4)]
closed_episodes = st.builds(
    lambda name, opened, length: Episode(
        node=name,
        opened_at=T0 - opened,
        phase=Phase.CLOSED,
        closed_at=T0 - opened + length,
        resolution=Resolution.REPAIRED,
    ),
    st.sampled_from(NODES),
    st.floats(0, 9 * 24 * 3600),
    st.floats(0, 3600),
)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(closed_episodes, max_size=30),
    later=st.floats(0, 3 * 24 * 3600),
    horizon=st.floats(0, 9 * 24 * 3600),
    window=st.sampled_from([60.0, 600.0, 7200.0]),
)
def test_an_indexed_history_decides_as_the_plain_list(
    history: list[Episode], later: float, horizon: float, window: float
) -> None:
    now = T0 + later
    policy = Policy(breaker={"window_s": window, "min_nodes": 1}, lemon_episodes=2)
    nodes = {name: node(name, XID_79 if i % 2 else None) for i, name in enumerate(NODES)}
    nodes["n0"] = node("n0", dataclasses.replace(XID_79, since=now - 3600))
    index = History(history[:10])
    index.add(history[10:])
    for name in NODES:
        plain = recent_episodes(name, history, policy, now)
        assert recent_episodes(name, index, policy, now) == plain
    assert sorted(map(id, index)) == sorted(map(id, history))
    open_ = {"n0": Episode("n0", opened_at=now - 3600, phase_since=now - 3600)}
    plans = [decide(nodes, open_, h, BreakerState(), policy, now) for h in (history, index)]
    assert plans[0] == plans[1]

    index.forget_before(now - horizon)
    kept = [e for e in history if (e.closed_at or e.opened_at) >= now - horizon]
    assert sorted(map(id, index)) == sorted(map(id, kept))
    assert index.opened_from(-1.0) == sorted(e.opened_at for e in kept)
    plans = [decide(nodes, open_, h, BreakerState(), policy, now) for h in (kept, index)]
    assert plans[0] == plans[1]
