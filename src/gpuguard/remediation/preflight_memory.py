"""Failed preflights remembered per node, and the ``preflight`` layer they raise.

The admission webhook's init container (``contract.preflight``) checks a GPU pod's GPUs
before its job starts. A failure is direct evidence against the node the pod was placed
on, or, from the cross-node gang check, against each participant found slow. Each
failure is remembered once (its pod and the moment its check ended) and raises the
node's ``preflight`` layer, which ``decide`` reads as any other evidence: quarantined at
once, then the ladder (docs/remediation.md, "A failed preflight").

A failure stands until something comes after it: a rung's action on the node (the
repair it asked for; the next preflight there judges the machine afresh), a pass of the
deep suite asked for after it (a second measurement: a false failure clears), or
``preflight.window_s`` at most, so a finding no rung mends (a slow link) still lapses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuguard.contract.conditions import FALSE
from gpuguard.contract.preflight import PREFLIGHT_LAYER
from gpuguard.contract.report import LayerReport
from gpuguard.contract.verify import VerifyAnswer
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase
from gpuguard.remediation.policy import Policy

REASON = "PreflightFailed"
KEPT_PER_NODE = 32  # a pod failing its check in a loop adds one failure per restart


@dataclass(frozen=True)
class PreflightFailure:
    """One failed check: ``key`` is its pod's uid and the moment it ended."""

    node: str
    pod: str  # namespace/name
    key: str
    at: float
    codes: tuple[str, ...]
    gpus: tuple[str, ...] = ()  # PCI bus ids the result names; () for the whole node
    # The gang check found this node slow: a link or a peer, which no rung of ours mends
    # (the deep suite's own DEEP_ALL_REDUCE_SLOW asks for no action either).
    slow_link: bool = False


class PreflightMemory:
    """The failures standing against each node."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._nodes: dict[str, list[PreflightFailure]] = {}
        self._seen: dict[tuple[str, str], float] = {}  # (node, key) -> when it ended

    def record(self, failure: PreflightFailure, now: float) -> bool:
        """Remember ``failure``; False when it was already remembered, or is too old to
        stand (a new leader lists pods that failed long ago)."""
        seen = (failure.node, failure.key)
        if seen in self._seen or not self.may_stand(failure.at, now):
            return False
        self._seen[seen] = failure.at
        kept = self._nodes.setdefault(failure.node, [])
        kept.append(failure)
        if len(kept) > KEPT_PER_NODE:
            del kept[1]  # the first stays: the layer's age is counted from it
        return True

    def may_stand(self, at: float, now: float) -> bool:
        """Is a failure that ended at ``at`` still within the window?"""
        return now - at < self.policy.preflight.window_s

    def knows(self, node: str, key: str) -> bool:
        return (node, key) in self._seen

    def standing(self, node: str, now: float) -> list[PreflightFailure]:
        return [f for f in self._nodes.get(node, ()) if self.may_stand(f.at, now)]

    def spend(self, node: str, after: float) -> bool:
        """Forget the node's failures that ended before ``after``; True if any were."""
        kept = self._nodes.get(node)
        if not kept:
            return False
        left = [f for f in kept if f.at >= after]
        if len(left) == len(kept):
            return False
        if left:
            self._nodes[node] = left
        else:
            del self._nodes[node]
        return True

    def forget_before(self, now: float) -> None:
        horizon = now - self.policy.preflight.window_s
        self._seen = {seen: at for seen, at in self._seen.items() if at > horizon}
        for node in list(self._nodes):
            self.spend(node, horizon)

    def clear(self, node: str) -> None:
        """The machine left (replaced, deleted): what failed on it says nothing of the next."""
        self._nodes.pop(node, None)

    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes)


def spent_after(
    node: str, verify: VerifyAnswer | None, episodes: Iterable[Episode]
) -> float | None:
    """The latest moment that spends the failures before it: a repair's action done on
    the node (a rung from RESET_GPU up; its episode verifying, or closed), or a pass of the
    deep suite asked for then. Killing a job mends no machine."""
    moments = [
        episode.last_action_at
        for episode in episodes
        if episode.node == node
        and episode.last_action_at is not None
        and episode.rung is not None
        and episode.rung >= Action.RESET_GPU
        and episode.phase in (Phase.VERIFYING, Phase.CLOSED)
    ]
    if verify is not None and verify.passed:
        moments.append(verify.requested_at)
    return max(moments, default=None)


def preflight_layer(failures: Iterable[PreflightFailure]) -> tuple[str, LayerReport] | None:
    """The layer standing failures raise (None: none stands).

    A check that failed on the node asks for a reset of the GPUs its result names, a
    reboot when it names none (``PREFLIGHT_FAILED``, no verdict, is confirmed by the deep
    suite first, as slowness is: ``confirm``); a slow link asks for nothing (quarantined,
    for a person or the window).
    """
    failures = list(failures)
    if not failures:
        return None
    own = [f for f in failures if not f.slow_link]
    if not own:
        action = Action.NONE
    elif all(f.gpus for f in own):
        action = Action.RESET_GPU
    else:
        action = Action.REBOOT
    return PREFLIGHT_LAYER, LayerReport(
        status=FALSE,
        reason=REASON,
        since=min(f.at for f in failures),
        action=action,
        codes=tuple(sorted({code for f in failures for code in f.codes})),
        gpus=tuple(sorted({gpu for f in own for gpu in f.gpus})),
    )
