"""The bounded wait for RMA evidence before a REPLACE (docs/remediation.md, "RMA evidence").

With ``--evidence-wait-s`` set, the first REPLACE decision for a node asks its agent for
evidence (the Node's ``gpuguard.io/collect-evidence``, the request's time as its id) and
holds the replacement until the agent's answer names that request, or the wait is over:
the node is replaced either way, and an Event says where the evidence is or that there is
none. Off (no request, no wait) unless set.
"""

from __future__ import annotations

import logging

from gpuguard.contract.evidence import read_answer
from gpuguard.contract.keys import EVIDENCE_ANNOTATION, EVIDENCE_REQUEST_ANNOTATION
from gpuguard.contract.verify import request_id
from gpuguard.controller.events import EventRecorder
from gpuguard.kube.rest import NODES, KubeApi

log = logging.getLogger("gpuguard.controller")
REASON = "EvidenceForRMA"


class EvidenceGate:
    def __init__(self, api: KubeApi, events: EventRecorder, wait_s: float) -> None:
        self.api, self.events, self.wait_s = api, events, wait_s
        self._asked: dict[str, tuple[str, float]] = {}  # node -> (request id, asked at)

    def ready(self, node: str, now: float) -> bool:
        """Whether ``node`` may be replaced now; asks for its evidence the first time.
        Raises ``KubeError`` like any write (the next pass decides again)."""
        asked = self._asked.get(node)
        if asked is not None and now - asked[1] > 2 * self.wait_s:
            asked = None  # a wait no pass pursued (the episode ended first): ask afresh
        if asked is None:
            request = request_id(now)
            patch = {"metadata": {"annotations": {EVIDENCE_REQUEST_ANNOTATION: request}}}
            self.api.patch(NODES.path(node), patch)
            self._asked[node] = (request, now)
            log.info("asked %s for RMA evidence before replacing it (%s)", node, request)
            return False
        request, at = asked
        annotations = self.api.get(NODES.path(node)).get("metadata", {}).get("annotations") or {}
        answer = read_answer(annotations.get(EVIDENCE_ANNOTATION))
        if answer is not None and answer.request == request:
            note = (
                f"replacing; evidence for RMA: {answer.location}"
                if answer.location
                else "replacing; the agent could not collect evidence for RMA"
            )
        elif now - at >= self.wait_s:
            note = f"replacing without evidence for RMA: no answer in {self.wait_s:g}s"
        else:
            return False
        self.events.about_node(node, REASON, note, now)
        del self._asked[node]
        return True
