"""The preflight gate's wire: webhook -> pod -> init container -> controller.

The controller's admission webhook adds an init container named ``INIT_CONTAINER`` to GPU
pods in namespaces labelled ``NAMESPACE_LABEL=ENABLED``; the container runs
``gpuguard preflight`` on the pod's GPUs and, before it exits, writes a ``PreflightResult``
to its termination message (the kubelet keeps at most 4096 bytes of it). The controller
reads that result from the pod's status: a failed preflight is a finding on the node the
pod was placed on, so the job goes elsewhere. A pod labelled ``SKIP_LABEL=SKIP`` is never
mutated; a pod already carrying ``INIT_CONTAINER`` is never mutated twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

INIT_CONTAINER = "gpuguard-preflight"
NAMESPACE_LABEL = "gpuguard.io/preflight"  # on a Namespace: opted in when ENABLED
ENABLED = "enabled"
SKIP_LABEL = "gpuguard.io/preflight"  # on a Pod: never mutated when SKIP
SKIP = "skip"
# On the webhook's pod: the mutation asked for the cross-node (gang) check as well.
GANG_ANNOTATION = "gpuguard.io/preflight-gang"

# The layer of a node's observation that a failed preflight raises (as crash memory
# raises "crashes").
PREFLIGHT_LAYER = "preflight"
# The code of a failed preflight that left no result to read (it crashed, hung or was
# killed before writing one), or whose result names no code: a failure all the same.
PREFLIGHT_FAILED = "PREFLIGHT_FAILED"

# The check could not run because its image lacks what it needs (PyTorch): a fault of the
# setup, the same on every node, so the pod fails but no node is quarantined for it.
NOT_EQUIPPED = "PREFLIGHT_NOT_EQUIPPED"

PASSED = "Passed"
FAILED = "Failed"
MESSAGE_LIMIT = 4096  # the kubelet's limit on a container's termination message
_MAX_LISTED = 32  # codes or GPUs listed; more are cut so the message always fits


@dataclass(frozen=True)
class PreflightResult:
    """What one preflight run found: ``FAILED`` with the codes it found and the GPUs
    (PCI bus ids) they name, empty when node-wide; ``slow_nodes`` are the gang members a
    cross-node check found slow (the node itself when it is the slow one)."""

    status: str
    codes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    slow_nodes: tuple[str, ...] = ()
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status != PASSED

    def encode(self) -> str:
        """The termination message: JSON, always within MESSAGE_LIMIT bytes."""
        doc = {
            "status": self.status,
            "codes": list(self.codes[:_MAX_LISTED]),
            "gpus": list(self.gpus[:_MAX_LISTED]),
            "slowNodes": list(self.slow_nodes[:_MAX_LISTED]),
            "message": self.message[:1024],
        }
        return json.dumps(doc, separators=(",", ":"))[:MESSAGE_LIMIT]


def read_result(message: object) -> PreflightResult | None:
    """The result in a termination message; None when there is none to read (the
    container died before writing it): the caller treats a failed container without a
    result as a failure all the same (fail closed)."""
    if not isinstance(message, str):
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("status") not in (PASSED, FAILED):
        return None

    def strings(key: str) -> tuple[str, ...]:
        value = doc.get(key)
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    return PreflightResult(
        status=str(doc["status"]),
        codes=strings("codes"),
        gpus=strings("gpus"),
        slow_nodes=strings("slowNodes"),
        message=str(doc.get("message") or ""),
    )
