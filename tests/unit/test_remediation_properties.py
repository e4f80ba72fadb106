"""Safety invariants of decide(), over random fleets, policies and histories of health.

Each example simulates a fleet for a few dozen calls: nodes turn bad (any rung, any
code), Unknown or healthy at random, drains finish or not, agents answer or stay silent,
operators exclude nodes. After every call the invariants of docs/remediation.md are
checked against that call's input and plan.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.model import Action
from gpuguard.remediation.budget import holds_slot
from gpuguard.remediation.model import Decision, Episode, NodeObservation, Phase, Plan
from gpuguard.remediation.policy import Policy
from tests.unit.remediation_builders import (
    ACTIONS,
    DISRUPTIVE,
    GPU0,
    GPU1,
    K,
    Sim,
    bad,
    fleet,
    node,
    ok,
    unknown,
)

REQUESTS = {K.REQUEST_ACTION, K.REPLACE, K.KILL_PODS}
# Re-sent without a new RECORD: the phase the episode was already recorded in allows it.
RESENT_IN = {K.EVICT_PODS: Phase.DRAINING, K.REQUEST_ACTION: Phase.ACTING, K.REPLACE: Phase.ACTING}

policies = st.builds(
    Policy,
    unknown_grace_s=st.sampled_from([0, 60, 300]),
    tolerance_s=st.sampled_from([0, 60, 120]),
    clear_after_s=st.sampled_from([0, 30, 60]),
    max_attempts=st.fixed_dictionaries(
        {rung.name: st.integers(0, 2) for rung in Action if rung is not Action.NONE}
    ),
    min_action_interval_s=st.sampled_from([0, 300]),
    drain_timeout_s=st.sampled_from([60, 900]),
    on_drain_timeout=st.sampled_from(["quarantine", "force"]),
    action_timeout_s=st.sampled_from([60, 900]),
    verify_timeout_s=st.sampled_from([60, 600]),
    lemon_episodes=st.integers(1, 4),
    budget=st.builds(
        dict,
        max_unavailable=st.integers(1, 3),
        max_unavailable_percent=st.sampled_from([0, 10, 50, 100]),
    ),
    breaker=st.builds(
        dict,
        threshold_percent=st.sampled_from([10, 30, 100]),
        min_nodes=st.integers(1, 3),
        close_percent=st.sampled_from([0, 5, 10]),
    ),
)

faults = st.builds(
    bad,
    action=st.sampled_from(list(Action)),
    codes=st.sampled_from([("XID_79",), ("XID_74",), ("XID_13", "XID_79"), ()]),
    gpus=st.sampled_from([(GPU0,), (GPU0, GPU1), ()]),
)


@st.composite
def fleets(draw: st.DrawFn) -> dict[str, NodeObservation]:
    size = draw(st.integers(1, 10))
    nodes = []
    for i in range(size):
        nodes.append(
            node(
                f"n{i:02}",
                pool=draw(st.sampled_from(["a", "b", "c"])),
                excluded=draw(st.integers(0, 6)) == 0,
                do_not_disrupt=draw(st.integers(0, 6)) == 0,
                unschedulable=draw(st.integers(0, 4)) == 0,  # cordoned by someone else
                tainted=draw(st.integers(0, 6)) == 0,
            )
        )
    return fleet(*nodes)


def _perturb(sim: Sim, data: st.DataObject) -> None:
    """One interval of the world: health, drains, agent answers, operators."""
    for name in sorted(sim.nodes):
        if not sim.nodes[name].exists:
            continue
        event = data.draw(st.integers(0, 9))
        if event == 0:
            sim.set_gpu(name, data.draw(faults))
        elif event == 1:
            sim.set_gpu(name, unknown())
        elif event in (2, 3):
            sim.set_gpu(name, ok())
        elif event == 4:
            sim.set(name, excluded=not sim.nodes[name].excluded)
        elif event == 5:
            held = "" if sim.nodes[name].protected_by else "ml/keep-me"
            sim.set(name, protected_by=held)
        sim.set(name, pods_to_move=data.draw(st.sampled_from([0, 0, 1, 3])))
        episode = sim.episodes.get(name)
        if episode is not None and episode.phase is Phase.ACTING:
            answer = data.draw(st.sampled_from([None, True, False]))
            if answer is not None:
                sim.answer(name, answer)


class Ledger:
    """What the invariants need to remember across calls."""

    def __init__(self, nodes: dict[str, NodeObservation]) -> None:
        self.theirs = {name for name, n in nodes.items() if n.unschedulable}
        self.saw_false: dict[str, bool] = {}
        self.requests: dict[tuple[str, float, Action, int], tuple[str, ...]] = {}
        self.last_attempt: dict[tuple[str, float, Action], int] = {}
        self.last_rung: dict[tuple[str, float], Action] = {}


def _check(
    sim: Sim,
    nodes: dict[str, NodeObservation],
    episodes: dict[str, Episode],
    plan: Plan,
    ledger: Ledger,
) -> None:
    by_node: dict[str, list[Decision]] = defaultdict(list)
    for decision in plan.decisions:
        by_node[decision.node].append(decision)

    for name, decisions in by_node.items():
        obs = nodes.get(name)
        before = episodes.get(name)
        # (a) excluded and do-not-disrupt nodes get nothing.
        if obs is not None and obs.exists:
            assert not (obs.excluded or obs.do_not_disrupt), (name, decisions)
        # (b) no rung starts under a pod's do-not-disrupt.
        if obs is not None and obs.protected_by:
            started = before is None or before.phase is Phase.QUARANTINED
            assert not (started and DISRUPTIVE & {d.kind for d in decisions}), decisions
        # (c) an open breaker allows nothing disruptive.
        if plan.breaker.open:
            assert not DISRUPTIVE & {d.kind for d in decisions}, decisions
        # (d) we only uncordon what we cordoned; never someone else's cordon.
        if any(d.kind is K.UNCORDON for d in decisions):
            ours = (before is not None and before.cordoned_by_us) or (obs and obs.cordoned_by_us)
            assert ours, (name, decisions)
            assert name not in ledger.theirs
        # (e) an episode that never saw a False layer takes no destructive action.
        if not ledger.saw_false.get(name, False):
            assert not DISRUPTIVE & {d.kind for d in decisions}, (name, decisions)
        # (f) write-ahead: every action follows a RECORD, or re-sends a recorded phase.
        recorded = False
        for d in decisions:
            if d.kind is K.RECORD:
                recorded = True
            elif d.kind in ACTIONS and not recorded:
                resend = before is not None and RESENT_IN.get(d.kind) is before.phase
                restore = before is not None and d.kind is K.TAINT
                leftover = before is None and d.kind in (K.UNTAINT, K.UNCORDON)
                assert resend or restore or leftover, (name, decisions, before)

    # (g) one request per attempt, attempts never go back, the ladder only climbs.
    for d in plan.decisions:
        if d.kind not in REQUESTS:
            continue
        ep = plan.episodes[d.node]
        assert d.action is not None and d.attempt >= 1
        key = (d.node, ep.opened_at, d.action)
        if d.kind is not K.KILL_PODS:
            assert ledger.requests.setdefault((*key, d.attempt), d.gpus) == d.gpus
        assert d.attempt >= ledger.last_attempt.get(key, 0)
        ledger.last_attempt[key] = d.attempt
        assert d.action >= ledger.last_rung.get(key[:2], Action.NONE)
        ledger.last_rung[key[:2]] = d.action
    for ep in plan.episodes.values():
        for rung, count in ep.attempts.items():
            assert count <= sim.policy.attempts_allowed(rung), ep

    # (b) no pool has more nodes in repair than its budget allows.
    busy = Counter(nodes[n].pool for n, ep in plan.episodes.items() if holds_slot(ep))
    sizes = Counter(n.pool for n in nodes.values())
    for pool, count in busy.items():
        assert count <= sim.policy.budget.allowed(sizes[pool]), (pool, busy)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=fleets(), policy=policies, data=st.data())
def test_safety_invariants_hold_over_random_histories(nodes, policy, data):
    sim = Sim(nodes, policy)
    ledger = Ledger(nodes)
    for _ in range(data.draw(st.integers(5, 40))):
        _perturb(sim, data)
        for name, obs in sim.nodes.items():
            if name not in sim.episodes:
                ledger.saw_false[name] = False
            if any(layer.status == "False" for layer in obs.layers.values()):
                ledger.saw_false[name] = True
        nodes_in, episodes_in = dict(sim.nodes), dict(sim.episodes)
        plan = sim.step(dt=data.draw(st.sampled_from([10, 30, 60, 200, 700])))
        _check(sim, nodes_in, episodes_in, plan, ledger)
        # Taints continue: every open episode of a node we may touch keeps its taint.
        for name in sim.episodes:
            obs = sim.nodes[name]
            if obs.exists and not (obs.excluded or obs.do_not_disrupt):
                assert obs.tainted, (name, plan)
