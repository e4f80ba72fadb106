"""Slowness confirmed before anything is destroyed.

A slow finding (a load test below its expected figure, a job's rank slower than its
peers) is one measurement; a noisy neighbour, a throttled job or a misjudged expectation
gives the same one. Acting on it alone turns every false verdict into a drain. So before a
rung that resets, reboots or replaces starts on slowness alone, an independent second
measurement (the deep suite, asked for with the verify request) must find the node slow
again. Unconfirmed, the node stays quarantined and is measured again later: it is never
destroyed on one measurement (docs/remediation.md, "Confirming slowness").
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.contract.preflight import PREFLIGHT_FAILED
from gpuguard.contract.verify import request_id, requested_time
from gpuguard.model import Action
from gpuguard.remediation.crash_memory import CRASHES_ACROSS_JOBS
from gpuguard.remediation.health import false_layers
from gpuguard.remediation.model import Episode, NodeObservation
from gpuguard.remediation.policy import Policy


@dataclass(frozen=True)
class Confirmation:
    """``confirmed``: the rung may start. Otherwise ``why`` it waits, and ``request``, a
    verify request to send now (None: one is pending, or the next is not due yet)."""

    confirmed: bool
    why: str = ""
    request: str | None = None
    measured: bool = False  # confirmed by a second measurement, not needing one


CONFIRMED = Confirmation(True)
MEASURED = Confirmation(True, measured=True)
MEASURING = "confirming with a second measurement (the deep suite)"


def slow_only(node: NodeObservation, policy: Policy) -> bool:
    """Is every code of the False layers one measurement that needs a second: slowness
    (``confirm.codes``), a first suspicion of crash memory (crashes of other jobs,
    indirect as a slow step time is), or a preflight that failed without a verdict?"""
    codes = [code for layer in false_layers(node) for code in layer.codes]
    indirect = {*policy.confirm.codes, CRASHES_ACROSS_JOBS, PREFLIGHT_FAILED}
    return bool(codes) and all(code in indirect for code in codes)


def confirmation(
    episode: Episode, node: NodeObservation, rung: Action, policy: Policy, now: float
) -> Confirmation:
    """May ``rung`` start on the node's evidence, or must a second measurement come first?

    A measurement counts when it was asked for after the episode's last action (or its
    opening): it is independent of the finding and of the node as it was before a repair.
    It confirms when the suite failed with a slowness code; a pass, or a failure of
    anything else (the suite missing, another code), does not.
    """
    if not policy.confirm.enabled or rung < Action.RESET_GPU or not slow_only(node, policy):
        return CONFIRMED
    since = episode.last_action_at if episode.last_action_at is not None else episode.opened_at
    answer = node.verify if node.verify is not None and node.verify.requested_at >= since else None
    asked = requested_time(node.verify_request) if node.verify_request else None
    if asked is not None and asked >= since and (answer is None or asked > answer.requested_at):
        if now - asked > policy.verify.timeout_s:
            why = f"no answer to the second measurement within {policy.verify.timeout_s:g}s"
            return Confirmation(False, f"{why}: asking again", request_id(now))
        return Confirmation(False, MEASURING)
    if answer is None:
        return Confirmation(False, MEASURING, request_id(now))
    slow = policy.confirm.codes
    if not answer.passed and any(code in slow for code in answer.codes):
        return MEASURED
    outcome = "passed" if answer.passed else f"found {', '.join(answer.codes) or 'nothing'}"
    why = f"not confirmed: the second measurement {outcome}; measuring again"
    due = answer.requested_at + policy.confirm.remeasure_s
    return Confirmation(False, why, request_id(now) if now >= due else None)


def deep_verified(policy: Policy, episode: Episode) -> bool:
    """Must the rung's repair pass the deep suite before the node returns? Where the verify
    gate says so, and always after slowness a measurement confirmed: the suite answered on
    this node, so it can answer again."""
    return policy.verify.applies_to(episode.rung) or (
        episode.slow_confirmed and episode.rung is not None and episode.rung < Action.REPLACE
    )


def confirm_timers(node: NodeObservation, policy: Policy) -> list[float]:
    """When a waiting confirmation asks again: a request's timeout, a re-measurement."""
    timers = []
    asked = requested_time(node.verify_request) if node.verify_request else None
    if asked is not None:
        timers.append(asked + policy.verify.timeout_s)
    if node.verify is not None:
        timers.append(node.verify.requested_at + policy.confirm.remeasure_s)
    return timers
