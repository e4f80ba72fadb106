"""Climbing the ladder: an episode's next rung started, or the episode held quarantined
saying why (Karpenter's node repair owns the node, a do-not-disrupt pod, a fault shared
with its domain or its position, the replacement cap, an unconfirmed slow finding, the
minimum interval, the breaker, the budget).
"""

from __future__ import annotations

from gpuguard.contract.keys import DO_NOT_DISRUPT
from gpuguard.contract.remediation import MAX_MESSAGE
from gpuguard.contract.wire import cut
from gpuguard.model import Action
from gpuguard.remediation.confirm import confirmation
from gpuguard.remediation.correlation import has_own_fault, own_faults
from gpuguard.remediation.health import named_gpus
from gpuguard.remediation.ladder import choose_rung
from gpuguard.remediation.model import (
    Episode,
    NodeObservation,
    Phase,
)
from gpuguard.remediation.plan_writer import Kind, PlanWriter, attempt_label
from gpuguard.remediation.positions import (
    network_signature,
    position_evidence,
    replacement_cap,
    sharing,
)


class LadderClimber(PlanWriter):
    """A plan writer that starts rungs: what the phases call when an episode must move on."""

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
        label, gpus, attempt = attempt_label(episode), episode.gpus, episode.attempt
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
            attempt_label(episode),
            action=episode.rung,
            gpus=episode.gpus,
            attempt=episode.attempt,
        )
