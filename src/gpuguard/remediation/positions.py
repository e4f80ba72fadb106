"""Where a fault lives: the memory of a physical position across the machines put in it.

A cable, an optic, a switch port or a power outlet stays with the rack position when the
server is replaced: the new server plugs into the same cable and shows the same fault. A
policy that judges one machine at a time replaces it again, and again (a replacement
loop). So the policy asks three questions of the closed episodes at a position
(docs/remediation.md, "Where a fault lives"):

- Is the fault the position's? A machine replaced there within ``positions.window_s``
  whose network fault (code and port) the machine now there shows again: no reboot or
  replace there until a person marks the position fixed or the fault clears.
- How many automatic replacements did the position have within the window? At most
  ``positions.max_replacements``; beyond, a person decides, whatever the evidence says.
- Does another live Node claim the position? Then what happened there cannot be told
  apart: no disruptive rung until one of them is gone or relabelled.

Pure: the answers come from the observation, the episode and the history alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuguard.contract.conditions import FALSE
from gpuguard.contract.times import format_time
from gpuguard.model import Action
from gpuguard.remediation.history import History, age
from gpuguard.remediation.model import Episode, NodeObservation, Resolution
from gpuguard.remediation.policy import Policy

# The layer whose faults can live in the position: links, ports, cables.
POSITION_LAYER = "network"


def position_of(node: NodeObservation) -> str:
    """The node's position; a node without one is its own (its name)."""
    return node.position or node.name


def network_signature(node: NodeObservation) -> tuple[str, ...]:
    """The network faults the node shows now, as ``CODE@port`` (``CODE`` when the finding
    names no port): two machines with the same entry show the same fault."""
    layer = node.layers.get(POSITION_LAYER)
    if layer is None or layer.status != FALSE:
        return ()
    if not layer.ports:
        return tuple(sorted(layer.codes))
    return tuple(sorted(f"{code}@{port}" for code in layer.codes for port in layer.ports))


def _at(position: str, history: Sequence[Episode]) -> Iterable[Episode]:
    if isinstance(history, History):
        return history.at(position)
    return (e for e in history if e.position == position)


def fixed_at(episode: Episode, history: Sequence[Episode]) -> float:
    """When a person last marked the episode's position fixed (``-inf``: never): nothing
    that happened there before counts."""
    marks = [e.position_fixed_at for e in _at(episode.position, history)]
    marks.append(episode.position_fixed_at)
    return max((mark for mark in marks if mark is not None), default=float("-inf"))


def position_evidence(
    episode: Episode,
    node: NodeObservation,
    history: Sequence[Episode],
    policy: Policy,
    now: float,
) -> str:
    """Why the node's fault is its position's ("": no such evidence): a machine replaced
    at the same position within the window showed the same network fault."""
    shows = set(network_signature(node))
    if not shows:
        return ""
    since = max(now - policy.positions.window_s, fixed_at(episode, history))
    for earlier in sorted(_at(episode.position, history), key=age, reverse=True):
        if (
            earlier.node == node.name
            or earlier.resolution is not Resolution.REPLACED
            or age(earlier) < since
        ):
            continue
        same = sorted(shows.intersection(earlier.signature))
        if same:
            return (
                f"position {episode.position}: {earlier.node} was replaced there"
                f" {format_time(age(earlier))} for {', '.join(same)}, and {node.name}"
                " shows it again: the fault stays with the position (a cable, an optic, a"
                " switch port)"
            )
    return ""


def replacement_cap(
    episode: Episode, history: Sequence[Episode], policy: Policy, now: float
) -> str:
    """Why no automatic replacement may start at the episode's position now ("": one may)."""
    config = policy.positions
    since = max(now - config.window_s, fixed_at(episode, history))
    done = sorted(
        (e.last_action_at or 0.0, e.node)
        for e in _at(episode.position, history)
        if e.attempts.get(Action.REPLACE, 0) > 0 and (e.last_action_at or 0.0) >= since
    )
    if len(done) < config.max_replacements:
        return ""
    latest = f": {done[-1][1]} at {format_time(done[-1][0])}" if done else ""
    return (
        f"position {episode.position} had {len(done)} automatic replacements within"
        f" {config.window_s:g}s{latest} (at most {config.max_replacements}): a person decides"
    )


def sharing(node: NodeObservation) -> str:
    """Why the node's position cannot be trusted ("": it can)."""
    if not node.position or not node.position_shared_with:
        return ""
    others = ", ".join(node.position_shared_with)
    return f"position {node.position} is claimed by {node.name} and {others}"
