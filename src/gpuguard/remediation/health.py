"""How the policy reads one node's layers: unhealthy, healthy, or not sure yet.

``False`` is evidence; ``Unknown`` is only the absence of it (an agent that stopped
reporting, a check that hung), so it counts as unhealthy only after a grace period and
never picks a destructive rung by itself. Healthy needs every layer ``True`` for a while,
so a flapping node keeps its taint (flap damping).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuguard.contract.conditions import FALSE, TRUE, UNKNOWN
from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.history import History
from gpuguard.remediation.model import Episode, NodeObservation
from gpuguard.remediation.policy import Policy


def as_policy_reads(layer: LayerReport) -> LayerReport:
    """A layer whose condition is ``True`` but whose report asks for a repair is a
    problem to work on: Degraded with an action (a job's fault: kill it), or a deferred
    repair under a profile that keeps the condition True (eks). The condition stays True
    so that Karpenter never replaces a node for a job's bug or for a drain and reset."""
    status = layer.status
    if status == TRUE and layer.action > Action.NONE and (layer.degraded or layer.deferred):
        status = FALSE
    deferred = layer.deferred and status == FALSE
    if (status, deferred) == (layer.status, layer.deferred):
        return layer
    return dataclasses.replace(layer, status=status, deferred=deferred)


AGENT_SILENT = "AgentSilent"


def silenced(node: NodeObservation, since: float) -> NodeObservation:
    """The node as read once its agent has been silent since ``since``: a layer it last
    reported True is Unknown from then on (its silence is no evidence of health); a fault
    it reported stays, so a dead agent never clears a node."""
    layers = {
        name: LayerReport(UNKNOWN, AGENT_SILENT, since) if layer.status == TRUE else layer
        for name, layer in node.layers.items()
    }
    return dataclasses.replace(node, layers=layers)


def false_layers(node: NodeObservation) -> list[LayerReport]:
    """The layers with evidence of a fault, in layer-name order (deterministic messages)."""
    return [node.layers[name] for name in sorted(node.layers) if node.layers[name].status == FALSE]


def is_unhealthy(node: NodeObservation, policy: Policy, now: float) -> bool:
    """Some layer ``False``, or not ``True`` (Unknown, garbled) for ``unknown_grace_s``."""
    return any(
        layer.status == FALSE
        or (layer.status != TRUE and now - layer.since >= policy.unknown_grace_s)
        for layer in node.layers.values()
    )


def repairable(node: NodeObservation) -> bool:
    """A Node that exists and is neither excluded from repair nor marked do-not-disrupt."""
    return node.exists and not node.excluded and not node.do_not_disrupt


def opens_episode(node: NodeObservation, policy: Policy, now: float) -> bool:
    """A node with no open episode that one must open (and quarantine) now. Taints are
    never limited or paused, so this alone decides them: the controller taints on it as
    the Node's change arrives, ahead of the pass that opens the episode."""
    return repairable(node) and is_unhealthy(node, policy, now)


def is_healthy(node: NodeObservation, policy: Policy, now: float) -> bool:
    """Every layer ``True``, the latest of them for at least ``clear_after_s``.

    A node with no layers at all (no agent yet) is neither healthy nor unhealthy.
    """
    layers = node.layers.values()
    return (
        bool(layers)
        and all(layer.status == TRUE for layer in layers)
        and now - max(layer.since for layer in layers) >= policy.clear_after_s
    )


def needed_action(node: NodeObservation) -> Action:
    """The rung the evidence asks for: the highest recommendation of the False layers."""
    return max((layer.action for layer in false_layers(node)), default=Action.NONE)


def deferred_repair(node: NodeObservation) -> bool:
    """Is every False layer's repair deferred (drain and reset: wait for running work)?"""
    layers = false_layers(node)
    return bool(layers) and all(layer.deferred for layer in layers)


def deferred_since(node: NodeObservation, episode: Episode) -> float:
    """When the deferred repair began to wait: the earliest False layer, counted as for
    the tolerance (not before the episode opened)."""
    return min(
        (max(episode.opened_at, layer.since) for layer in false_layers(node)),
        default=episode.opened_at,
    )


def named_gpus(node: NodeObservation) -> tuple[str, ...]:
    """The GPUs the False layers' findings name (``()``: none named, the whole node)."""
    return tuple(sorted({gpu for layer in false_layers(node) for gpu in layer.gpus}))


def tolerance_passed(node: NodeObservation, episode: Episode, policy: Policy, now: float) -> bool:
    """Has some False layer lasted its tolerance? Then the fault is persistent.

    Each layer counts from the later of its own transition and the episode's opening (an
    episode opened on ``Unknown`` does not lend its age to a ``False`` that just arrived;
    a fault older than the episode still waits once the node is tainted). The soonest
    expiry wins, as in Karpenter's repair policies. Without a False layer there is nothing
    to wait for (and nothing destructive to do: see ``choose_rung``).
    """
    layers = false_layers(node)
    if not layers:
        return True
    return any(
        now - max(episode.opened_at, layer.since) >= policy.tolerance_for(layer.codes)
        for layer in layers
    )


def recent_episodes(node: str, history: Sequence[Episode], policy: Policy, now: float) -> int:
    """Closed episodes of ``node`` within ``lemon_window_s`` (the lemon count, less this one)."""
    episodes = history.of(node) if isinstance(history, History) else history
    return sum(
        1
        for episode in episodes
        if episode.node == node
        and episode.closed_at is not None
        and now - episode.closed_at <= policy.lemon_window_s
    )


def describe(node: NodeObservation) -> str:
    """One line for steps and events: ``gpu False XID_79 -> REBOOT on 0000:91:00.0``; for
    a node tainted ahead of the pass, what it showed then too, if that has changed."""
    parts = []
    for name in sorted(node.layers):
        layer = node.layers[name]
        if layer.status == TRUE:
            continue
        text = f"{name} {layer.status}"
        if layer.codes:
            text += " " + ",".join(layer.codes)
        if layer.action is not Action.NONE:
            text += f" -> {layer.action}" + (" (deferred)" if layer.deferred else "")
        if layer.gpus:
            text += " on " + ",".join(layer.gpus)
        parts.append(text)
    now = "; ".join(parts) or "all layers True"
    if node.quarantined_for and node.quarantined_for != now:  # tainted, and cleared since
        return f"{node.quarantined_for} (now {now})"
    return now
