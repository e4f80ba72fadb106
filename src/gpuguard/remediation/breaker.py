"""The fleet circuit breaker: many nodes turning bad at once is a rollout, not hardware.

The signal is the number of episodes *opened* within the window (still open or closed
since), relative to the fleet. It is self-clearing: once the wave leaves the window the
breaker closes and the per-pool budget paces the repairs of what is still sick, unlike
Karpenter's breaker that latches on currently unhealthy nodes and freezes all repair
(kubernetes-sigs/karpenter RFC #3192). An operator reset also closes it and stops the
episodes opened so far from counting, so the reset is not undone at the next call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpuguard.remediation.model import BreakerState
from gpuguard.remediation.policy_sections import Breaker


def next_breaker(
    state: BreakerState,
    opened_at: Iterable[float],
    fleet_size: int,
    config: Breaker,
    now: float,
    *,
    reset: bool = False,
) -> tuple[BreakerState, list[str]]:
    """The breaker after this call, and a note for each change (for events)."""
    counted = [
        t
        for t in opened_at
        if now - t <= config.window_s and (state.reset_at is None or t > state.reset_at)
    ]
    rate = 100.0 * len(counted) / fleet_size if fleet_size else 0.0
    seen = (
        f"{len(counted)} of {fleet_size} nodes ({rate:.0f}%) turned unhealthy"
        f" in the last {config.window_s:g}s"
    )
    if state.open:
        if reset:
            why = f"reset by an operator ({seen})"
            return _closed(state, why, reset_at=now), [f"circuit breaker closed: {why}"]
        if rate < config.close_percent:
            why = f"{seen}, below {config.close_percent:g}%"
            return _closed(state, why, reset_at=state.reset_at), [f"circuit breaker closed: {why}"]
        return state, []
    if rate >= config.threshold_percent and len(counted) >= config.min_nodes:
        why = f"{seen}, at least {config.threshold_percent:g}%: disruptive actions paused"
        opened = dataclasses.replace(state, open=True, opened_at=now, reason=why)
        return opened, [f"circuit breaker opened: {why}"]
    return state, []


def _closed(state: BreakerState, why: str, reset_at: float | None) -> BreakerState:
    return dataclasses.replace(state, open=False, opened_at=None, reason=why, reset_at=reset_at)
