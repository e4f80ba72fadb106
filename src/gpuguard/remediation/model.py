"""The remediation vocabulary: what the policy sees, what it remembers, what it decides.

Pure data, no Kubernetes and no clock: times are seconds since the epoch (floats) passed in
by the caller, so the controller (real time) and the simulator (simulated time) run the
same decisions. See docs/remediation.md for the episode life cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

# The phases and resolutions are the NodeRemediation's own words (its schema's enums).
from gpuguard.contract.remediation import Phase as Phase
from gpuguard.contract.remediation import Resolution as Resolution
from gpuguard.contract.report import LayerReport
from gpuguard.contract.verify import VerifyAnswer
from gpuguard.model import Action
from gpuguard.remediation.policy import Policy

ACTIVE_PHASES = (Phase.DRAINING, Phase.ACTING, Phase.VERIFYING)  # count against the budget


@dataclass(frozen=True)
class NodeObservation:
    """The projection of one Node the policy needs (never the whole object)."""

    name: str
    pool: str  # value of the policy's pool label ("" when unlabelled)
    layers: dict[str, LayerReport]
    reported_at: float | None  # the agent's last report (heartbeat); None: never reported
    excluded: bool = False  # gpuguard.io/exclude=true
    do_not_disrupt: bool = False  # karpenter.sh/do-not-disrupt annotation
    tainted: bool = False  # carries our taint
    unschedulable: bool = False
    cordoned_by_us: bool = False
    pods_to_move: int = 0  # evictable pods the current drain still has to move
    # Every eviction of the drain's last round refused by a PodDisruptionBudget (429), none
    # failing otherwise: a budget the platform must respect, no evidence against the machine.
    drain_blocked: bool = False
    # Pods still running on the GPUs a deferred repair waits for (the named GPUs; every GPU
    # pod when none is named); counted only while such an episode waits in QUARANTINED.
    pods_on_gpus: int = 0
    exists: bool = True
    verify_request: str | None = None  # the id of the verify request on the Node, if any
    verify: VerifyAnswer | None = None  # the agent's latest verify answer
    domain: str = ""  # value of the correlation's domain label (a rack; "": never grouped)
    uid: str = ""  # the Node's metadata.uid ("": not known)
    # Conditions False that Karpenter's node repair replaces a node for (the EKS names).
    repair_conditions: tuple[str, ...] = ()
    # A pod on the node whose karpenter.sh/do-not-disrupt holds (namespace/name; ""
    # none): no rung starts while it runs. Counted only before a rung starts.
    protected_by: str = ""
    # The kind of machine, "<NodePool>/<instance type>" of a node Karpenter launched (""
    # otherwise), and when its Node registered: how a replacement is recognised.
    machine: str = ""
    registered_at: float | None = None
    # The physical position the machine occupies (rack slot, from the policy's position
    # labels; "" not known): what stays when the machine is replaced (docs/remediation.md,
    # "Where a fault lives"). A replacement gets a new Node name, never a new position.
    position: str = ""
    # Other live Nodes that claim the same position (mislabelled, or a replacement whose
    # predecessor is still registered): what happened there cannot be told apart.
    position_shared_with: tuple[str, ...] = ()
    # A person's mark that the position was repaired (gpuguard.io/position-fixed; "": none).
    position_fixed: str = ""
    # Tainted by the controller as its change arrived, ahead of the pass that opens the
    # episode: what it showed then ("": not so). The episode is opened even if the node
    # reads healthy again by then, so that no quarantine goes unrecorded.
    quarantined_for: str = ""


@dataclass(frozen=True)
class ActionResult:
    """What the agent or provider reported about a requested action."""

    attempt: int
    action: Action
    succeeded: bool
    at: float
    message: str = ""


@dataclass(frozen=True)
class Step:
    """One line of an episode's history (kept in the NodeRemediation status)."""

    at: float
    phase: Phase
    message: str


@dataclass
class Episode:
    """One node's trip from detection back to service; lives in a NodeRemediation object."""

    node: str
    opened_at: float
    phase: Phase = Phase.QUARANTINED
    rung: Action | None = None
    attempts: dict[Action, int] = field(default_factory=dict)
    phase_since: float = 0.0
    last_action_at: float | None = None
    action_result: ActionResult | None = None
    cordoned_by_us: bool = False
    exhausted: bool = False  # no rung left: stays quarantined for a human
    closed_at: float | None = None
    resolution: Resolution | None = None
    steps: list[Step] = field(default_factory=list)
    # The GPUs the current rung works on, fixed when the rung starts so that every
    # re-sent eviction and request of one attempt names the same GPUs even when the report
    # changes meanwhile (a resetting GPU reads Unknown). () means the whole node.
    gpus: tuple[str, ...] = ()
    # The Node's uid when the episode opened ("": not known, an older episode): another
    # machine registered under the same name closes the episode instead of inheriting it.
    node_uid: str = ""
    # For REPLACE: the replaced node's ``machine`` (recorded when the rung starts), and the
    # Node found to have taken over from it once the episode closed Replaced.
    machine: str = ""
    replacement: str = ""
    # Where the machine sat (the observation's position, else the node's name) when the
    # episode opened, and the network faults its rungs acted on (``CODE@port``): the
    # memory of a position across the machines replaced in it.
    position: str = ""
    signature: tuple[str, ...] = ()
    # The evidence that the fault is the position's, not the machine's ("": none): no
    # reboot or replace there until a person marks the position fixed or the fault clears.
    position_fault: str = ""
    position_fixed_at: float | None = None  # when a person's mark was taken
    # A second measurement confirmed slowness before a rung started: a slow GPU's repair is
    # judged by measuring again (the deep verify), not by the finding being gone (a reset
    # forgets a deep verdict; a slow GPU shows nothing at rest).
    slow_confirmed: bool = False

    @property
    def attempt(self) -> int:
        return self.attempts.get(self.rung, 0) if self.rung is not None else 0


class DecisionKind(StrEnum):
    TAINT = "Taint"
    UNTAINT = "Untaint"
    CORDON = "Cordon"
    UNCORDON = "Uncordon"
    EVICT_PODS = "EvictPods"  # drain: all evictable pods, or only those on ``gpus``
    KILL_PODS = "KillPods"  # KILL_JOB: delete the pods on ``gpus`` (DisruptionTarget first)
    REQUEST_ACTION = "RequestAction"  # ask the node's agent: RESET_GPU (``gpus``) or REBOOT
    REQUEST_VERIFY = "RequestVerify"  # ask the node's agent for the deep suite (``request``)
    CLEAR_VERIFY = "ClearVerify"  # remove a verify request once its episode is over
    REPLACE = "Replace"  # delete the NodeClaim (or the provider's equivalent)
    RECORD = "Record"  # persist the episode (every phase change) and emit an Event
    CLEAR_POSITION_FIXED = "ClearPositionFixed"  # take a person's position-fixed mark off


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    node: str
    reason: str
    action: Action | None = None
    gpus: tuple[str, ...] = ()
    attempt: int = 0
    request: str | None = None  # REQUEST_VERIFY: the request's id (contract.verify)


@dataclass(frozen=True)
class BreakerState:
    open: bool = False
    opened_at: float | None = None
    reason: str = ""
    # When an operator last reset it: episodes opened up to then no longer count, so a
    # reset is not undone by the very storm it acknowledged.
    reset_at: float | None = None


@dataclass(frozen=True)
class Settled:
    """An episode a call left as it was, with its input: held for a reason outside the
    ladder (a shared cause, Karpenter's repair, a do-not-disrupt pod; ``note`` says which),
    or untouched (no step, decision or note: waiting out a tolerance, a grace, a verify).
    Given the same episode, observation, shared cause and policy before ``until``, the next
    call would do the same, so ``decide`` skips it: a hold reads no clock, breaker, budget
    or history, and the tests that led to it stay passed as time goes on; an untouched
    episode read no breaker, budget or history either (each of those reads ends in a
    note), only the clocks of ``timers.node_timers``, and ``until`` is before the next.
    """

    episode: Episode  # the very object (episodes are copied on every change)
    node: NodeObservation
    shared: dict[str, str]  # the node's layers with a shared cause
    policy: Policy
    note: str  # "": none
    until: float = math.inf


@dataclass
class Plan:
    """What one call of the policy decided."""

    decisions: list[Decision]
    episodes: dict[str, Episode]
    breaker: BreakerState
    notes: list[str] = field(default_factory=list)  # budget/breaker explanations for events
    settled: dict[str, Settled] = field(default_factory=dict)  # by node
