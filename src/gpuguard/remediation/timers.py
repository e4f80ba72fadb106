"""The policy's own clocks on one node: when a decision about it can change with nothing
new observed. Every timer ``lifecycle`` reads is here, next to it, so a driver never
misses one (``reconciler.next_deadline``) and ``decide`` knows how long an episode it
left untouched stays so (``Settled.until``).
"""

from __future__ import annotations

import math

from gpuguard.contract.conditions import TRUE
from gpuguard.remediation.confirm import confirm_timers, deep_verified
from gpuguard.remediation.model import Episode, NodeObservation, Phase
from gpuguard.remediation.policy import Policy

# Timeouts compare with ">": look again just past them.
PAST_S = 1e-6


def node_timers(
    policy: Policy, node: NodeObservation, episode: Episode | None, now: float
) -> list[float]:
    """A layer's tolerance, unknown grace or clear-after, a deferred repair's longest wait,
    a phase's timeout, a confirmation's re-request, the minimum action interval. Without an
    episode the tolerances count from ``now`` (one opened now)."""
    timers: list[float] = []
    opened = episode.opened_at if episode is not None else now
    for layer in node.layers.values():
        if layer.status == TRUE:
            timers.append(layer.since + policy.clear_after_s)
        else:
            timers.append(layer.since + policy.unknown_grace_s)
            start = layer.since if layer.since > opened else opened
            timers.append(start + policy.tolerance_for(layer.codes))
            if layer.deferred:
                timers.append(start + policy.drain_and_reset.max_wait_s)
    if episode is None:
        return timers
    phase = episode.phase
    if phase is Phase.QUARANTINED:
        timers.extend(t + PAST_S for t in confirm_timers(node, policy))
    elif phase is Phase.DRAINING:
        timers.append(episode.phase_since + policy.drain_timeout_s + PAST_S)
    elif phase is Phase.ACTING:
        timers.append(episode.phase_since + policy.action_timeout_s + PAST_S)
    elif phase is Phase.VERIFYING:
        timers.append(episode.phase_since + policy.verify_timeout_s + PAST_S)
        if deep_verified(policy, episode):
            timers.append(episode.phase_since + policy.verify.timeout_s + PAST_S)
    if episode.last_action_at is not None:
        timers.append(episode.last_action_at + policy.min_action_interval_s)
    return timers


def next_timer(policy: Policy, node: NodeObservation, episode: Episode | None, now: float) -> float:
    """The first of the node's timers after ``now`` (``math.inf``: none)."""
    return min((t for t in node_timers(policy, node, episode, now) if t > now), default=math.inf)
