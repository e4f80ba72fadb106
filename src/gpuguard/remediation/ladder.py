"""Which rung of the ladder to try next for one episode.

The ladder only climbs within an episode: the next rung is the lowest one at least as high
as both what the evidence asks for and what was already tried, with attempts left. So a rung
is retried while it has attempts (KILL_JOB twice by default) before the next one. A lemon
goes straight to REPLACE. Slowness alone that names its GPUs starts at RESET_GPU whatever it
recommends (a reset clears a clock held low; the ladder climbs if it does not). Unknown
layers or findings that recommend nothing never pick a destructive rung: those wait for a
human. The cloud's scheduled maintenance gets its rung once and no other: the node then
waits, drained, for the cloud to do its work, since no repair of ours completes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuguard.contract.maintenance import CLOUD_SCHEDULED
from gpuguard.contract.remediation import RUNGS
from gpuguard.model import Action
from gpuguard.remediation.confirm import slow_only
from gpuguard.remediation.health import false_layers, named_gpus, needed_action, recent_episodes
from gpuguard.remediation.model import Episode, NodeObservation
from gpuguard.remediation.policy import Policy


@dataclass(frozen=True)
class Choice:
    """A rung to start, or why there is none (``exhausted``: every rung was used up)."""

    rung: Action | None
    why: str
    exhausted: bool = False


def choose_rung(
    episode: Episode,
    node: NodeObservation,
    history: Sequence[Episode],
    policy: Policy,
    now: float,
) -> Choice:
    if not false_layers(node):
        return Choice(None, "only Unknown layers: no destructive action, needs a human")
    needed = needed_action(node)
    if needed is Action.NONE:
        return Choice(None, "the findings recommend no action: needs a human")
    if cloud_scheduled(node):
        return _ahead_of_the_cloud(episode, needed, policy)
    if needed > Action.RESET_GPU and slow_only(node, policy) and named_gpus(node):
        needed = Action.RESET_GPU
    earlier = recent_episodes(node.name, history, policy, now)
    if earlier + 1 >= policy.lemon_episodes:
        candidates: tuple[Action, ...] = (Action.REPLACE,)
        why = f"lemon: {earlier + 1} episodes within {policy.lemon_window_s:g}s"
    else:
        floor = max(needed, episode.rung or Action.NONE)
        candidates = tuple(rung for rung in RUNGS if rung >= floor)
        why = f"{needed} recommended"
    for rung in candidates:
        if episode.attempts.get(rung, 0) < policy.attempts_allowed(rung):
            return Choice(rung, why)
    tried = ", ".join(f"{r} x{n}" for r, n in sorted(episode.attempts.items())) or "nothing"
    return Choice(None, f"{why}, no rung left (tried {tried}): needs a human", exhausted=True)


def cloud_scheduled(node: NodeObservation) -> bool:
    """Is every code of the False layers the cloud's own scheduled maintenance?"""
    codes = [code for layer in false_layers(node) for code in layer.codes]
    return bool(codes) and all(code in CLOUD_SCHEDULED for code in codes)


def _ahead_of_the_cloud(episode: Episode, needed: Action, policy: Policy) -> Choice:
    """The event's rung once (a drain, and the reboot that may let the cloud finish early);
    then held drained, never climbing and never counted a lemon: the locus is the cloud's
    schedule, which a reboot or a new machine of ours does not move."""
    if not episode.attempts.get(needed) and policy.attempts_allowed(needed) > 0:
        return Choice(needed, f"{needed} ahead of the cloud's scheduled maintenance")
    return Choice(
        None,
        "the cloud's maintenance is still scheduled: held drained until the cloud does it"
        " (no rung of ours completes it)",
    )
