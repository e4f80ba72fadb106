"""Builders and a tiny fleet simulator for the remediation policy tests.

The simulator plays the controller and the cluster: it calls ``decide``, keeps the plan's
episodes as the next call's input, and applies taints, cordons and replacements to the
node observations, the way the real controller would.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.decide import decide
from gpuguard.remediation.model import (
    ActionResult,
    BreakerState,
    Decision,
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Plan,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler

T0 = 1_000_000.0
LONG_AGO = T0 - 24 * 3600
GPU0 = "0000:91:00.0"
GPU1 = "0000:92:00.0"
LAYERS = ("gpu", "kernel", "network")

K = DecisionKind
ACTIONS = {
    K.TAINT,
    K.UNTAINT,
    K.CORDON,
    K.UNCORDON,
    K.EVICT_PODS,
    K.KILL_PODS,
    K.REQUEST_ACTION,
    K.REPLACE,
}
DISRUPTIVE = {K.EVICT_PODS, K.KILL_PODS, K.REQUEST_ACTION, K.REPLACE, K.CORDON}


def ok(since: float = LONG_AGO) -> LayerReport:
    return LayerReport("True", "Healthy", since)


def bad(
    action: Action = Action.REBOOT,
    codes: tuple[str, ...] = ("XID_79",),
    gpus: tuple[str, ...] = (GPU0,),
    since: float = T0,
) -> LayerReport:
    return LayerReport("False", "Unhealthy", since, action, codes, gpus)


def unknown(since: float = T0) -> LayerReport:
    return LayerReport("Unknown", "NoReport", since)


def node(
    name: str,
    gpu: LayerReport | None = None,
    *,
    pool: str = "pool-a",
    reported_at: float | None = LONG_AGO,
    **flags: object,
) -> NodeObservation:
    """A node whose gpu layer is ``gpu`` (healthy by default) and other layers healthy."""
    layers = {name_: ok() for name_ in LAYERS}
    if gpu is not None:
        layers["gpu"] = gpu
    return NodeObservation(name, pool, layers, reported_at, **flags)  # type: ignore[arg-type]


def fleet(*nodes: NodeObservation) -> dict[str, NodeObservation]:
    return {n.name: n for n in nodes}


def run(
    nodes: dict[str, NodeObservation],
    episodes: dict[str, Episode] | None = None,
    *,
    now: float = T0,
    policy: Policy | None = None,
    history: Sequence[Episode] = (),
    breaker: BreakerState | None = None,
    breaker_reset: bool = False,
) -> Plan:
    return decide(
        nodes,
        episodes or {},
        history,
        breaker or BreakerState(),
        policy or Policy(),
        now,
        breaker_reset=breaker_reset,
    )


def kinds(plan: Plan, name: str | None = None) -> list[DecisionKind]:
    return [d.kind for d in plan.decisions if name is None or d.node == name]


def of_kind(plan: Plan, kind: DecisionKind) -> list[Decision]:
    return [d for d in plan.decisions if d.kind is kind]


def episode(
    name: str,
    phase: Phase = Phase.QUARANTINED,
    rung: Action | None = None,
    *,
    opened_at: float = T0 - 3600,
    phase_since: float = T0 - 60,
    attempts: dict[Action, int] | None = None,
    **fields: object,
) -> Episode:
    """An open episode; a rung given without attempts counts as tried once."""
    if attempts is None:
        attempts = {rung: 1} if rung is not None else {}
    last = fields.pop("last_action_at", phase_since if rung is not None else None)
    return Episode(
        node=name,
        opened_at=opened_at,
        phase=phase,
        rung=rung,
        attempts=attempts,
        phase_since=phase_since,
        last_action_at=last,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def answered(ep: Episode, succeeded: bool, message: str = "") -> Episode:
    assert ep.rung is not None
    result = ActionResult(ep.attempt, ep.rung, succeeded, ep.phase_since + 1, message)
    return dataclasses.replace(ep, action_result=result)


@dataclass
class Sim:
    """The controller and cluster around ``decide``: the reconciler that carries state
    from call to call, with this class as its actuator (decisions change the nodes)."""

    nodes: dict[str, NodeObservation]
    policy: Policy = field(default_factory=Policy)
    now: float = T0
    plans: list[Plan] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reconciler = Reconciler(self.policy)
        self.reconciler.load({}, [], BreakerState())

    @property
    def episodes(self) -> dict[str, Episode]:
        return self.reconciler.episodes

    @property
    def history(self) -> Sequence[Episode]:
        return self.reconciler.history

    @property
    def breaker(self) -> BreakerState:
        return self.reconciler.breaker

    def set_gpu(self, name: str, layer: LayerReport) -> None:
        current = self.nodes[name]
        layers = dict(current.layers)
        previous = layers.get("gpu")
        if previous is not None and previous.status == layer.status:
            layer = dataclasses.replace(layer, since=previous.since)  # no transition
        else:
            layer = dataclasses.replace(layer, since=self.now)
        layers["gpu"] = layer
        self.nodes[name] = dataclasses.replace(current, layers=layers)

    def heal(self, names: Iterable[str]) -> None:
        for name in names:
            self.set_gpu(name, ok())

    def break_(self, names: Iterable[str], **kw: object) -> None:
        for name in names:
            self.set_gpu(name, bad(**kw))  # type: ignore[arg-type]

    def set(self, name: str, **changes: object) -> None:
        self.nodes[name] = dataclasses.replace(self.nodes[name], **changes)  # type: ignore[arg-type]

    def answer(self, name: str, succeeded: bool) -> None:
        """The agent's answer to the current request, as the controller would store it."""
        ep = self.episodes[name]
        assert ep.rung is not None
        ep.action_result = ActionResult(ep.attempt, ep.rung, succeeded, self.now)

    def step(
        self, dt: float = 30.0, *, breaker_reset: bool = False, heartbeat: bool = True
    ) -> Plan:
        """Advance the clock, let every agent report (``heartbeat``), decide, apply."""
        self.now += dt
        if heartbeat:
            for name, current in self.nodes.items():
                if current.exists:
                    self.nodes[name] = dataclasses.replace(current, reported_at=self.now)
        self.reconciler.policy = self.policy  # tests may swap the policy between steps
        self.reconciler.forget_nodes()
        for name, current in self.nodes.items():
            self.reconciler.track(name, current)
        before = copy.deepcopy((self.nodes, self.episodes, list(self.history), self.breaker))
        done = self.reconciler.reconcile(
            self.nodes, self.now, _Checked(self, before), breaker_reset=breaker_reset
        )
        self.plans.append(done.plan)
        return done.plan

    def apply(self, decision: Decision) -> None:
        name = decision.node
        if name not in self.nodes:
            return
        changes: dict[str, object] = {
            K.TAINT: {"tainted": True},
            K.UNTAINT: {"tainted": False},
            K.CORDON: {"unschedulable": True, "cordoned_by_us": True},
            K.UNCORDON: {"unschedulable": False, "cordoned_by_us": False},
            K.REPLACE: {"exists": False},
        }.get(decision.kind, {})
        if changes:
            self.set(name, **changes)  # type: ignore[arg-type]


@dataclass
class _Checked:
    """Applies a plan after checking that ``decide`` left its inputs as they were."""

    sim: Sim
    before: object

    def apply(self, plan: Plan, opened: Collection[str]) -> set[str]:
        sim = self.sim
        now = (sim.nodes, sim.episodes, list(sim.history), sim.breaker)
        assert self.before == now, "mutated"
        for decision in plan.decisions:
            sim.apply(decision)
        return set()
