"""The life cycle of one episode, one call at a time (docs/remediation.md).

``PlanBuilder`` holds what one ``decide`` call has decided so far: decisions by node,
notes, this call's breaker and the pools' budget (``plan_writer``). Each phase handler
looks at the node as observed now and either waits, re-sends the idempotent action of its
phase, or moves the episode on, recording the step before the actions it leads to
(write-ahead); a move to the next rung is ``climbing``'s.
"""

from __future__ import annotations

from gpuguard.contract.remediation import MAX_MESSAGE
from gpuguard.contract.verify import VerifyAnswer, request_id, requested_time
from gpuguard.contract.wire import cut
from gpuguard.model import Action
from gpuguard.remediation.climbing import LadderClimber
from gpuguard.remediation.confirm import deep_verified
from gpuguard.remediation.health import (
    deferred_repair,
    deferred_since,
    describe,
    is_healthy,
    is_unhealthy,
    named_gpus,
    needed_action,
    tolerance_passed,
)
from gpuguard.remediation.model import (
    Episode,
    NodeObservation,
    Phase,
    Resolution,
)
from gpuguard.remediation.plan_writer import Kind, attempt_label


class PlanBuilder(LadderClimber):
    """One ``decide`` call's plan, built by advancing each episode through its phase."""

    def advance(
        self, episode: Episode, node: NodeObservation | None, *, restore_taint: bool
    ) -> None:
        if node is None or not node.exists:
            gone = Resolution.REPLACED if episode.rung is Action.REPLACE else Resolution.GONE
            self.close(episode, gone, "the Node no longer exists", None)
            return
        if episode.node_uid and node.uid and node.uid != episode.node_uid:
            gone = Resolution.REPLACED if episode.rung is Action.REPLACE else Resolution.GONE
            why = f"the Node was registered again (uid {node.uid}, was {episode.node_uid})"
            self.close(episode, gone, why, None)
            return
        if node.excluded or node.do_not_disrupt:
            self.note(node.name, "excluded or do-not-disrupt: open episode left as it is")
            return
        if node.position_fixed:
            self.take_position_mark(episode, node)
        handler = {
            Phase.QUARANTINED: self.quarantined,
            Phase.DRAINING: self.draining,
            Phase.ACTING: self.acting,
            Phase.VERIFYING: self.verifying,
        }[episode.phase]
        handler(episode, node)
        if episode.phase in (Phase.DRAINING, Phase.ACTING) and episode.phase_since < self.now:
            self.keep_cordoned(episode, node)  # not in the pass that cordoned it
        if restore_taint and episode.phase is not Phase.CLOSED and not node.tainted:
            self.emit(Kind.TAINT, node.name, "open episode: restoring the missing taint")

    def quarantined(self, episode: Episode, node: NodeObservation) -> None:
        now, policy = self.now, self.policy
        healthy = is_healthy(node, policy, now)
        if healthy and deep_verified(policy, episode):
            self.healthy_unverified(episode, node)
        elif healthy:
            tried = episode.rung is not None
            resolution = Resolution.REPAIRED if tried else Resolution.TRANSIENT
            self.close(episode, resolution, f"healthy for {policy.clear_after_s:g}s", node)
        elif episode.exhausted or not is_unhealthy(node, policy, now):
            return
        elif episode.rung is not None or tolerance_passed(node, episode, policy, now):
            after = f"after {attempt_label(episode)}"
            why: str | None = "persistent" if episode.rung is None else after
            if deferred_repair(node):
                why = self.running_work(episode, node)
            if why is not None:
                self.try_start(episode, node, f"{why}: {describe(node)}")

    def running_work(self, episode: Episode, node: NodeObservation) -> str | None:
        """A deferred repair (drain and reset) waits, tainted, for the pods on its GPUs to
        finish, at most ``drain_and_reset.max_wait_s``: the reason to start it now, or
        None while it waits (a step whenever the count changes)."""
        limit = self.policy.drain_and_reset.max_wait_s
        running = node.pods_on_gpus
        if running == 0:
            return f"running work finished: starting {needed_action(node)}"
        if self.now - deferred_since(node, episode) >= limit:
            return f"waited max_wait_s ({limit:g}s) for {running} running pods: draining"
        where = ", ".join(named_gpus(node)) or "the node's GPUs"
        message = (
            f"deferred repair: waiting for {running} running pods on {where}"
            f" (at most {limit:g}s): {describe(node)}"
        )
        if not episode.steps or episode.steps[-1].message != message:
            self.record(episode, message)
        return None

    def keep_cordoned(self, episode: Episode, node: NodeObservation) -> None:
        """A whole-node rung keeps the node cordoned while it drains and acts, whoever
        uncordoned it meanwhile (the close uncordons it: our marker is on the Node)."""
        if episode.rung is not None and episode.rung > Action.RESET_GPU and not node.unschedulable:
            episode.cordoned_by_us = True
            why = f"{attempt_label(episode)}: cordon re-asserted (uncordoned during the repair)"
            self.emit(Kind.CORDON, node.name, why)

    def draining(self, episode: Episode, node: NodeObservation) -> None:
        label = attempt_label(episode)
        if is_healthy(node, self.policy, self.now):
            self.close(episode, Resolution.REPAIRED, f"healthy before {label}", node)
        elif self.breaker.open:
            self.note(node.name, f"drain for {label} paused: circuit breaker open")
        elif node.pods_to_move == 0:
            self.record(episode, f"drained: requesting {label}", Phase.ACTING)
            self.request(episode)
        elif self.now - episode.phase_since > self.policy.drain_timeout_s and node.drain_blocked:
            self.drain_held(episode, node)
        elif self.now - episode.phase_since > self.policy.drain_timeout_s:
            self.drain_timed_out(episode, node)
        else:
            reason = f"draining for {label}: {node.pods_to_move} pods left"
            self.emit(Kind.EVICT_PODS, node.name, reason, gpus=episode.gpus)

    def drain_held(self, episode: Episode, node: NodeObservation) -> None:
        """Past the drain timeout with every eviction refused by a PodDisruptionBudget: a
        budget is no evidence against the machine, so the ladder does not climb and no pod
        is forced out. The node stays cordoned and tainted on this rung, evictions retried
        as the budget allows; said once in the episode."""
        why = (
            f"drain for {attempt_label(episode)} blocked by a PodDisruptionBudget past"
            f" {self.policy.drain_timeout_s:g}s: held on this rung (no escalation, nothing"
            " forced); the budget's owner or a person decides"
        )
        if not episode.steps or episode.steps[-1].message != cut(why, MAX_MESSAGE):
            self.record(episode, why)
        reason = f"draining for {attempt_label(episode)}: {node.pods_to_move} pods left"
        self.emit(Kind.EVICT_PODS, node.name, reason, gpus=episode.gpus)

    def drain_timed_out(self, episode: Episode, node: NodeObservation) -> None:
        why = f"drain for {attempt_label(episode)} timed out after {self.policy.drain_timeout_s:g}s"
        if self.policy.on_drain_timeout == "force":
            self.record(episode, f"{why}: deleting the remaining pods", Phase.ACTING)
            self.emit(
                Kind.KILL_PODS,
                node.name,
                why,
                action=episode.rung,
                gpus=episode.gpus,
                attempt=episode.attempt,
            )
            self.request(episode)
            return
        uncordon = episode.cordoned_by_us or node.cordoned_by_us
        episode.cordoned_by_us = False
        self.record(episode, f"{why}: attempt given up", Phase.QUARANTINED)
        if uncordon:
            self.emit(Kind.UNCORDON, node.name, why)

    def acting(self, episode: Episode, node: NodeObservation) -> None:
        label = attempt_label(episode)
        if episode.rung is Action.KILL_JOB:
            self.record(episode, f"{label} done: verifying", Phase.VERIFYING)
            return
        result = episode.action_result
        if result is not None and (result.attempt, result.action) != (
            episode.attempt,
            episode.rung,
        ):
            result = None  # an answer to an earlier attempt
        if result is not None and not result.succeeded:
            self.try_start(episode, node, f"{label} failed: {result.message or 'no message'}")
        elif result is not None and episode.rung is not Action.REPLACE:
            self.record(episode, f"{label} succeeded: verifying", Phase.VERIFYING)
        elif self.now - episode.phase_since > self.policy.action_timeout_s:
            timeout = self.policy.action_timeout_s
            self.try_start(episode, node, f"{label} not done within {timeout:g}s")
        elif self.breaker.open:
            self.note(node.name, f"{label} not re-sent: circuit breaker open")
        else:
            self.request(episode)

    def verifying(self, episode: Episode, node: NodeObservation) -> None:
        """Close once a fresh report is healthy and, where the verify gate applies, the
        deep suite passed for a request of this phase; a failed or missing verify counts as
        a failed repair (fail closed)."""
        # Fresh: written after the action ended. The agent stamps both its result and its
        # report, so compare its own clocks when there is a result.
        done = episode.action_result.at if episode.action_result else episode.phase_since
        fresh = node.reported_at is not None and node.reported_at > done
        healthy = fresh and is_healthy(node, self.policy, self.now)
        gated = deep_verified(self.policy, episode)
        # The request of this phase is named after its start: another answer is stale.
        request = request_id(episode.phase_since)
        answer = _answer_to(node, request) if gated else None
        waited = self.now - episode.phase_since
        label = attempt_label(episode)
        if answer is not None and not answer.passed:
            codes = ", ".join(answer.codes) or "no codes"
            self.try_start(episode, node, f"deep verify after {label} failed: {codes}")
        elif healthy and (answer is not None or not gated):
            passed = " and passed the deep verify" if gated else ""
            self.close(episode, Resolution.REPAIRED, f"healthy after {label}{passed}", node)
        elif not healthy and waited > self.policy.verify_timeout_s:
            timeout = self.policy.verify_timeout_s
            self.try_start(
                episode, node, f"not healthy {timeout:g}s after {label}: {describe(node)}"
            )
        elif gated and answer is None and waited > self.policy.verify.timeout_s:
            timeout = self.policy.verify.timeout_s
            self.try_start(episode, node, f"no deep verify answer {timeout:g}s after {label}")
        elif gated and answer is None and node.verify_request != request:
            self.emit(
                Kind.REQUEST_VERIFY,
                node.name,
                f"deep verify after {label}",
                request=request,
            )

    def healthy_unverified(self, episode: Episode, node: NodeObservation) -> None:
        """Healthy again in QUARANTINED after a verified rung (its attempt failed, timed out
        or had to wait): it returns to service only with a pass since its last action."""
        since = episode.last_action_at if episode.last_action_at is not None else 0.0
        answer = verify_since(node, since)
        label = attempt_label(episode)
        if answer is not None and answer.passed:
            why = f"healthy for {self.policy.clear_after_s:g}s and passed the deep verify"
            self.close(episode, Resolution.REPAIRED, f"{why} after {label}", node)
        elif _requested_since(node, since):
            outcome = "failed" if answer is not None else "was not answered"
            self.note(node.name, f"healthy, but the deep verify after {label} {outcome}")
        else:
            self.record(episode, f"healthy after {label}: deep verify", Phase.VERIFYING)


def verify_since(node: NodeObservation, since: float) -> VerifyAnswer | None:
    """The agent's verify answer, when it answers a request made at ``since`` or later."""
    answer = node.verify
    return answer if answer is not None and answer.requested_at >= since else None


def _answer_to(node: NodeObservation, request: str) -> VerifyAnswer | None:
    answer = node.verify
    return answer if answer is not None and answer.request == request else None


def _requested_since(node: NodeObservation, since: float) -> bool:
    if node.verify_request is None:
        return False
    at = requested_time(node.verify_request)
    return at is not None and at >= since
