"""The life cycle of one episode, one call at a time (docs/remediation.md).

``PlanBuilder`` holds what one ``decide`` call has decided so far: decisions by node,
notes, this call's breaker and the pools' budget. Each phase handler looks at the node as
observed now and either waits, re-sends the idempotent action of its phase, or moves the
episode on, recording the step before the actions it leads to (write-ahead).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuguard.contract.keys import DO_NOT_DISRUPT
from gpuguard.contract.remediation import MAX_MESSAGE
from gpuguard.contract.verify import VerifyAnswer, request_id, requested_time
from gpuguard.contract.wire import cut
from gpuguard.model import Action
from gpuguard.remediation.budget import BudgetLedger
from gpuguard.remediation.confirm import confirmation, deep_verified
from gpuguard.remediation.correlation import SharedCauses, has_own_fault, own_faults
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
from gpuguard.remediation.ladder import choose_rung
from gpuguard.remediation.model import (
    BreakerState,
    Decision,
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Resolution,
    Step,
)
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.positions import (
    network_signature,
    position_evidence,
    position_of,
    replacement_cap,
    sharing,
)

Kind = DecisionKind


def _label(episode: Episode) -> str:
    return f"{episode.rung} attempt {episode.attempt}"


class PlanBuilder:
    """The state of one ``decide`` call: decisions by node, notes, breaker, budget."""

    def __init__(
        self,
        nodes: Mapping[str, NodeObservation],
        episodes: Mapping[str, Episode],
        history: Sequence[Episode],
        breaker: BreakerState,
        policy: Policy,
        now: float,
        population: Mapping[str, int] | None = None,
        shared: SharedCauses | None = None,
    ) -> None:
        self.history = history
        self.shared = shared or {}  # the layers of each node whose fault has a shared cause
        self.breaker = breaker  # replaced by this call's breaker before any episode advances
        self.policy = policy
        self.now = now
        self.ledger = BudgetLedger(nodes, episodes, policy.budget, population)
        self.decisions: dict[str, list[Decision]] = defaultdict(list)
        self.notes: list[str] = []
        self.held: dict[str, str] = {}  # nodes held with no new step: the hold's note

    # -- writing ---------------------------------------------------------------------

    def emit(
        self,
        kind: DecisionKind,
        node: str,
        reason: str,
        *,
        action: Action | None = None,
        gpus: tuple[str, ...] = (),
        attempt: int = 0,
        request: str | None = None,
    ) -> None:
        self.decisions[node].append(Decision(kind, node, reason, action, gpus, attempt, request))

    def record(self, episode: Episode, message: str, phase: Phase | None = None) -> None:
        """Enter ``phase`` (its clock restarts), add a step, write it ahead of its actions."""
        if phase is not None:
            episode.phase = phase
            episode.phase_since = self.now
        # Cut as the NodeRemediation stores it, so a step read back compares equal.
        episode.steps.append(Step(self.now, episode.phase, cut(message, MAX_MESSAGE)))
        self.emit(Kind.RECORD, episode.node, message)
        self.ledger.update(episode.node, episode)

    def note(self, node: str, message: str) -> None:
        self.notes.append(f"{node}: {message}")

    # -- opening and closing -----------------------------------------------------------

    def open(self, node: NodeObservation) -> Episode:
        episode = Episode(
            node=node.name,
            opened_at=self.now,
            phase_since=self.now,
            node_uid=node.uid,
            position=position_of(node),
        )
        self.record(episode, f"quarantined: {describe(node)}")
        if not node.tainted:
            self.emit(Kind.TAINT, node.name, f"unhealthy: {describe(node)}")
        return episode

    def clear_leftovers(self, node: NodeObservation) -> None:
        """A healthy node with no episode keeps nothing of ours (a close cut short)."""
        if node.tainted:
            self.emit(Kind.UNTAINT, node.name, "healthy, no open episode: leftover taint")
        if node.cordoned_by_us:
            self.emit(Kind.UNCORDON, node.name, "healthy, no open episode: leftover cordon")
        if node.verify_request is not None:
            self.emit(Kind.CLEAR_VERIFY, node.name, "no open episode: leftover verify request")
        if node.position_fixed:
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, "no position fault held here")

    def take_position_mark(self, episode: Episode, node: NodeObservation) -> None:
        """A person marked the node's position fixed: what happened there before no longer
        counts (the mark is taken off, so it applies once)."""
        mark = f"position {episode.position} marked fixed ({node.position_fixed!r})"
        if episode.position_fault:
            episode.position_fault = ""
            episode.position_fixed_at = self.now
            self.record(episode, f"{mark}: its history no longer counts")
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, mark)
        else:
            self.emit(Kind.CLEAR_POSITION_FIXED, node.name, f"{mark}: no position fault held")

    def close(
        self, episode: Episode, resolution: Resolution, why: str, node: NodeObservation | None
    ) -> None:
        episode.closed_at = self.now
        episode.resolution = resolution
        self.record(episode, f"closed {resolution}: {why}", Phase.CLOSED)
        if node is None:
            return
        self.emit(Kind.UNTAINT, node.name, f"{resolution}: {why}")
        if episode.cordoned_by_us or node.cordoned_by_us:
            self.emit(Kind.UNCORDON, node.name, f"{resolution}: {why}")
        if node.verify_request is not None:
            self.emit(Kind.CLEAR_VERIFY, node.name, f"{resolution}: {why}")

    # -- the episode's life cycle ------------------------------------------------------

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
            why: str | None = "persistent" if episode.rung is None else f"after {_label(episode)}"
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
            why = f"{_label(episode)}: cordon re-asserted (uncordoned during the repair)"
            self.emit(Kind.CORDON, node.name, why)

    def draining(self, episode: Episode, node: NodeObservation) -> None:
        if is_healthy(node, self.policy, self.now):
            self.close(episode, Resolution.REPAIRED, f"healthy before {_label(episode)}", node)
        elif self.breaker.open:
            self.note(node.name, f"drain for {_label(episode)} paused: circuit breaker open")
        elif node.pods_to_move == 0:
            self.record(episode, f"drained: requesting {_label(episode)}", Phase.ACTING)
            self.request(episode)
        elif self.now - episode.phase_since > self.policy.drain_timeout_s and node.drain_blocked:
            self.drain_held(episode, node)
        elif self.now - episode.phase_since > self.policy.drain_timeout_s:
            self.drain_timed_out(episode, node)
        else:
            reason = f"draining for {_label(episode)}: {node.pods_to_move} pods left"
            self.emit(Kind.EVICT_PODS, node.name, reason, gpus=episode.gpus)

    def drain_held(self, episode: Episode, node: NodeObservation) -> None:
        """Past the drain timeout with every eviction refused by a PodDisruptionBudget: a
        budget is no evidence against the machine, so the ladder does not climb and no pod
        is forced out. The node stays cordoned and tainted on this rung, evictions retried
        as the budget allows; said once in the episode."""
        why = (
            f"drain for {_label(episode)} blocked by a PodDisruptionBudget past"
            f" {self.policy.drain_timeout_s:g}s: held on this rung (no escalation, nothing"
            " forced); the budget's owner or a person decides"
        )
        if not episode.steps or episode.steps[-1].message != cut(why, MAX_MESSAGE):
            self.record(episode, why)
        reason = f"draining for {_label(episode)}: {node.pods_to_move} pods left"
        self.emit(Kind.EVICT_PODS, node.name, reason, gpus=episode.gpus)

    def drain_timed_out(self, episode: Episode, node: NodeObservation) -> None:
        why = f"drain for {_label(episode)} timed out after {self.policy.drain_timeout_s:g}s"
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
        label = _label(episode)
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
        label = _label(episode)
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
        label = _label(episode)
        if answer is not None and answer.passed:
            why = f"healthy for {self.policy.clear_after_s:g}s and passed the deep verify"
            self.close(episode, Resolution.REPAIRED, f"{why} after {label}", node)
        elif _requested_since(node, since):
            outcome = "failed" if answer is not None else "was not answered"
            self.note(node.name, f"healthy, but the deep verify after {label} {outcome}")
        else:
            self.record(episode, f"healthy after {label}: deep verify", Phase.VERIFYING)

    # -- climbing the ladder -----------------------------------------------------------

    def try_start(self, episode: Episode, node: NodeObservation, why: str) -> None:
        """Start the next rung, or wait in QUARANTINED saying why (a step when it changes).

        The rung is chosen by the node's own faults: a fault shared with its domain is
        held (no rung, no budget), another layer's fault on the same node is not.
        """
        if self.policy.karpenter_repair and node.repair_conditions:
            # One authority per node: Karpenter replaces it after its toleration, and a
            # rung of ours would be cut short by it (or a REPLACE done twice).
            owner = ", ".join(f"{kind}=False" for kind in node.repair_conditions)
            message = f"{why}; left to Karpenter's node repair ({owner}): quarantined only"
            self.hold(episode, node, message, f"Karpenter's node repair owns it ({owner})")
            return
        if node.protected_by:
            # Karpenter's contract for the pod: no voluntary disruption while it holds.
            held = f"pod {node.protected_by} carries {DO_NOT_DISRUPT}"
            self.hold(episode, node, f"{why}; no rung while {held}", held)
            return
        shared = self.shared.get(node.name, {})
        if shared and not has_own_fault(node, shared):
            held = "; ".join(shared[layer] for layer in sorted(shared))
            message = f"{why}; held until the domain recovers or a person acts: {held}"
            self.hold(episode, node, message, held)
            return
        shared_position = sharing(node)
        if shared_position:
            self.hold(episode, node, f"{why}; no rung while {shared_position}", shared_position)
            return
        if episode.position_fault:
            message = f"{why}; no reboot or replace: {episode.position_fault}"
            self.hold(episode, node, message, episode.position_fault)
            return
        node = own_faults(node, shared)
        choice = choose_rung(episode, node, self.history, self.policy, self.now)
        if choice.rung is None:
            self.note(node.name, choice.why)
            newly_exhausted = choice.exhausted and not episode.exhausted
            episode.exhausted = episode.exhausted or choice.exhausted
            self.settle(episode, f"{why}; {choice.why}", changed=newly_exhausted)
            return
        if not self.allowed_here(episode, node, choice.rung, why):
            return
        blocker = self.gate(episode, node, choice.rung)
        if blocker:
            self.note(node.name, f"{choice.rung} waits: {blocker}")
            self.settle(episode, f"{why}; {choice.rung} waits: {blocker}", changed=False)
            return
        self.start(episode, node, choice.rung, f"{why}; {choice.why}")

    def allowed_here(self, episode: Episode, node: NodeObservation, rung: Action, why: str) -> bool:
        """May ``rung`` start on this machine at this position? Not where the fault is the
        position's, nor beyond the position's replacement cap, nor on slowness that a
        second measurement has not confirmed (each waits quarantined, saying why)."""
        if rung >= Action.REBOOT:
            evidence = position_evidence(episode, node, self.history, self.policy, self.now)
            if evidence:
                episode.position_fault = evidence
                self.hold(episode, node, f"{why}; no reboot or replace: {evidence}", evidence)
                return False
        if rung is Action.REPLACE:
            capped = replacement_cap(episode, self.history, self.policy, self.now)
            if capped:
                self.wait(episode, node, f"{why}; no {rung}: {capped}")
                return False
        confirmed = confirmation(episode, node, rung, self.policy, self.now)
        if confirmed.request is not None:
            self.emit(
                Kind.REQUEST_VERIFY,
                node.name,
                f"second measurement before {rung}",
                request=confirmed.request,
            )
        if not confirmed.confirmed:
            self.wait(episode, node, f"{why}; {rung} waits: {confirmed.why}")
        episode.slow_confirmed = episode.slow_confirmed or confirmed.measured
        return confirmed.confirmed

    def wait(self, episode: Episode, node: NodeObservation, message: str) -> None:
        """Quarantined with a note each call; a step when the message changes."""
        self.note(node.name, message)
        changed = not episode.steps or episode.steps[-1].message != cut(message, MAX_MESSAGE)
        self.settle(episode, message, changed=changed)

    def hold(self, episode: Episode, node: NodeObservation, message: str, held: str) -> None:
        """Quarantined, no rung, for a reason outside the ladder: a step when it changes."""
        note = f"held: {held}"
        self.note(node.name, note)
        repeated = bool(episode.steps) and episode.steps[-1].message == message
        if repeated and episode.phase is Phase.QUARANTINED:  # no step: held as it was
            self.held[node.name] = note
        self.settle(episode, message, changed=not repeated)

    def settle(self, episode: Episode, message: str, *, changed: bool) -> None:
        """Back to (or stay in) QUARANTINED, taint kept; a step only when that changes."""
        if changed or episode.phase is not Phase.QUARANTINED:
            self.record(episode, message, Phase.QUARANTINED)

    def gate(self, episode: Episode, node: NodeObservation, rung: Action) -> str:
        last = episode.last_action_at
        if last is not None and self.now - last < self.policy.min_action_interval_s:
            return f"last action {self.now - last:g}s ago (minimum interval)"
        if self.breaker.open:
            return "circuit breaker open"
        if rung >= Action.RESET_GPU and not self.ledger.has_room(node.name):
            pool = node.pool or "(unlabelled)"
            allowed = self.ledger.allowed(node.pool)
            return f"budget: {self.ledger.in_use(node.pool)} of {allowed} in pool {pool} busy"
        return ""

    def start(self, episode: Episode, node: NodeObservation, rung: Action, why: str) -> None:
        episode.rung = rung
        episode.attempts[rung] = episode.attempts.get(rung, 0) + 1
        episode.last_action_at = self.now
        episode.action_result = None  # a new attempt has no answer yet
        episode.gpus = named_gpus(node) if rung <= Action.RESET_GPU else ()
        seen = set(episode.signature).union(network_signature(node))
        episode.signature = tuple(sorted(seen))
        if rung is Action.REPLACE:
            episode.machine = node.machine
        label, gpus, attempt = _label(episode), episode.gpus, episode.attempt
        where = ", ".join(gpus) or "every GPU"
        if rung is Action.KILL_JOB:
            self.record(episode, f"{why}: {label}: killing the pods on {where}", Phase.ACTING)
            self.emit(Kind.KILL_PODS, node.name, label, action=rung, gpus=gpus, attempt=attempt)
        elif rung is Action.RESET_GPU:
            self.record(episode, f"{why}: {label}: draining {where}", Phase.DRAINING)
            self.emit(Kind.EVICT_PODS, node.name, label, gpus=gpus)
        else:
            cordon = not node.unschedulable
            episode.cordoned_by_us = episode.cordoned_by_us or cordon
            self.record(episode, f"{why}: {label}: cordoning and draining", Phase.DRAINING)
            if cordon:
                self.emit(Kind.CORDON, node.name, label)
            self.emit(Kind.EVICT_PODS, node.name, label)

    def request(self, episode: Episode) -> None:
        """Ask for the rung's action; re-sent each call until answered (idempotent)."""
        kind = Kind.REPLACE if episode.rung is Action.REPLACE else Kind.REQUEST_ACTION
        self.emit(
            kind,
            episode.node,
            _label(episode),
            action=episode.rung,
            gpus=episode.gpus,
            attempt=episode.attempt,
        )


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
