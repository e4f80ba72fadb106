"""Which Node took over from a replaced one.

Karpenter does not link the NodeClaim it launches to the one gpuguard deleted: it
launches for whatever pods are pending. So the replacement is recognised: the first Node
of the same kind of machine (NodePool and instance type) to register after the REPLACE
began that no other episode names. Several replacements at once in one pool are paired in
order, first replaced with first registered: each episode names a machine of the kind it
gave back, which is what someone tracing the episode needs.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuguard.remediation.model import Episode, NodeObservation, Resolution

# How long after closing an episode waits to be paired; a node launched later is not its.
PAIRING_WINDOW_S = 3600.0


def awaiting_replacement(episode: Episode, now: float) -> bool:
    return (
        episode.resolution is Resolution.REPLACED
        and bool(episode.machine)
        and not episode.replacement
        and episode.last_action_at is not None
        and episode.closed_at is not None
        and now - episode.closed_at <= PAIRING_WINDOW_S
    )


def pair_replacements(
    closed: Iterable[Episode], nodes: Iterable[NodeObservation], now: float
) -> list[tuple[Episode, str]]:
    """(episode, the Node that replaced it) for each closed episode awaiting one."""
    closed = list(closed)
    waiting = sorted(
        (e for e in closed if awaiting_replacement(e, now)),
        key=lambda e: e.last_action_at or 0.0,
    )
    if not waiting:
        return []
    named = {e.replacement for e in closed if e.replacement}
    free = sorted(
        (n for n in nodes if n.exists and n.machine and n.registered_at is not None),
        key=lambda n: (n.registered_at or 0.0, n.name),
    )
    free = [n for n in free if n.name not in named]
    pairs = []
    for episode in waiting:
        began = episode.last_action_at or 0.0
        for node in free:
            if node.machine == episode.machine and (node.registered_at or 0.0) >= began:
                pairs.append((episode, node.name))
                free.remove(node)
                break
    return pairs
