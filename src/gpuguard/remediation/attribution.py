"""Whose fault a failed training pod was: the infrastructure's, or the job's own.

A job's retries are for its own bugs. A pod the platform took away, whose node was lost,
whose GPU the driver reported, or whose last words are a transport or device error was
the infrastructure's doing, and gpuguard marks it so that the Job's ``podFailurePolicy``
ignores it (docs/attribution.md). Everything else is the job's, and a crash with no cause
at all is remembered against the node (``crash_memory``).

Conservative by construction: evidence that the job itself caused the failure (an
application signature in its message, an Xid the driver blames on the application)
outweighs a coincident node finding, and a finding that names other GPUs than the pod's
is not the pod's. Only the platform's own removal of the pod and the loss of its node
count whatever the pod said: a pod killed from outside cannot have failed on its own.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from gpuguard.contract.gpu_ids import gpus_in_common
from gpuguard.contract.report import LayerReport

# Xids NVIDIA's documentation attributes to the application (a graphics engine
# exception, an MMU fault from a bad access, a reset channel verification error): the
# job's own, never the node's. The agent reports them; they do not excuse a crash.
APPLICATION_XIDS = frozenset({"XID_13", "XID_31", "XID_43"})
NO_CAUSE = "no cause found"


class Cause(StrEnum):
    """Why a failure is the infrastructure's (the condition's reason)."""

    DISRUPTED = "DisruptedByPlatform"  # evicted or killed (DisruptionTarget)
    NODE_LOST = "NodeLost"  # its node went away or stopped being Ready
    GPU_FAULT = "GpuFault"  # a finding names one of the pod's GPUs
    NODE_FAULT = "NodeFault"  # a finding on the node that names no GPU of another pod
    SIGNATURE = "InfrastructureSignature"  # the pod's own last words, or its launcher's
    PEER_LOST = "PeerLost"  # another pod of the job failed for the infrastructure


@dataclass(frozen=True)
class PodFailure:
    """What is known of one failed pod when it is judged."""

    pod: str  # namespace/name
    job: str  # namespace/name of the job it belonged to (a JobSet's, not its child Job's)
    node: str
    at: float  # when it failed (its container's finish, else when it was seen failed)
    disrupted: bool = False  # DisruptionTarget=True
    gpus: tuple[str, ...] = ()  # the GPUs it was given (gpuguard.io/gpu-ids), if known
    # The pod's message classified by the failure signatures: code and kind, "" / None
    # when nothing was recognised.
    signature: str = ""
    infrastructure_signature: bool | None = None


@dataclass(frozen=True)
class NodeAtFailure:
    """The node as it stood around the failure."""

    exists: bool = True
    ready: bool = True
    not_ready_since: float | None = None
    layers: tuple[LayerReport, ...] = ()  # the agent's layers (False ones are findings)


@dataclass(frozen=True)
class Attribution:
    infrastructure: bool
    cause: Cause | None
    detail: str  # for the condition's message and the Event: what was seen

    @property
    def reason(self) -> str:
        return str(self.cause) if self.cause is not None else "NotAttributed"

    @property
    def unexplained(self) -> bool:
        """Neither the infrastructure's nor shown to be the job's: a crash with no cause."""
        return not self.infrastructure and self.detail == NO_CAUSE


def attribute(
    failure: PodFailure,
    node: NodeAtFailure,
    window_s: float,
    peers_lost: Collection[str] = (),
) -> Attribution:
    """Judge one failure; ``peers_lost`` names other pods of the same job that failed for
    the infrastructure within ``window_s`` before it."""
    if failure.disrupted:
        return Attribution(True, Cause.DISRUPTED, "the pod was evicted or killed by the platform")
    if not node.exists:
        return Attribution(True, Cause.NODE_LOST, f"node {failure.node} is gone")
    if not node.ready and (
        node.not_ready_since is None or node.not_ready_since <= failure.at + window_s
    ):
        return Attribution(True, Cause.NODE_LOST, f"node {failure.node} is not Ready")
    if failure.infrastructure_signature is False:
        return Attribution(False, None, f"the job's own error: {failure.signature}")
    if failure.infrastructure_signature:
        return Attribution(True, Cause.SIGNATURE, failure.signature)
    finding = _finding(failure, node, window_s)
    if finding is not None:
        return finding
    if peers_lost:
        peer = sorted(peers_lost)[0]
        return Attribution(True, Cause.PEER_LOST, f"its peer {peer} was lost first")
    return Attribution(False, None, NO_CAUSE)


def _finding(failure: PodFailure, node: NodeAtFailure, window_s: float) -> Attribution | None:
    """A finding on the node that can have ended the pod: False within the window of
    the failure, not the application's own Xid, and naming the pod's GPUs, or none."""
    for layer in node.layers:
        if layer.status != "False" or layer.since > failure.at + window_s:
            continue
        codes = [code for code in layer.codes if code not in APPLICATION_XIDS]
        if layer.codes and not codes:
            continue
        shown = ", ".join(codes) or layer.reason
        if not layer.gpus:
            return Attribution(True, Cause.NODE_FAULT, f"node {failure.node}: {shown}")
        mine = gpus_in_common(failure.gpus, layer.gpus)
        if mine is None or mine:
            named = ", ".join(sorted(mine or layer.gpus))
            return Attribution(True, Cause.GPU_FAULT, f"{shown} on GPU {named}")
    return None


# Causes that rest on the pod's own account, with no evidence from the node.
SELF_REPORTED = frozenset({Cause.SIGNATURE, Cause.PEER_LOST})


class SelfReportedLimit:
    """Bounds how often a job's own account excuses its failures.

    Per job, the incidents excused on its word alone within ``window_s``; a failure less
    than ``incident_s`` after the job's last counted incident belongs to it (the ranks of
    one collective failing together)."""

    def __init__(self, limit: int, window_s: float, incident_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self.incident_s = incident_s
        self._incidents: dict[str, list[float]] = {}  # job -> start of each incident

    def judge(self, job: str, verdict: Attribution, at: float) -> Attribution:
        """The verdict, or a charged one when the job's allowance is spent."""
        if not verdict.infrastructure or verdict.cause not in SELF_REPORTED:
            return verdict
        incidents = [t for t in self._incidents.get(job, []) if at - t < self.window_s]
        if incidents and 0 <= at - incidents[-1] < self.incident_s:
            self._incidents[job] = incidents
            return verdict
        if len(incidents) >= self.limit:
            self._incidents[job] = incidents
            return Attribution(
                False,
                None,
                f"{verdict.detail}; charged all the same: the job's own account already "
                f"excused {len(incidents)} incidents within {self.window_s:g}s",
            )
        self._incidents[job] = [*incidents, at]
        return verdict

    def forget_before(self, now: float) -> None:
        self._incidents = {
            job: kept
            for job, times in self._incidents.items()
            if (kept := [t for t in times if now - t < self.window_s])
        }
