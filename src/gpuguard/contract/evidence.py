"""The RMA evidence request (controller or person -> agent) and the agent's answer.

The request is the Node's ``gpuguard.io/collect-evidence`` annotation, any id (the
controller writes the request's time in RFC 3339); the answer is the agent's
``gpuguard.io/evidence`` annotation, JSON ``{"request": id, "location": where}``, with an
empty location when the capture failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class EvidenceAnswer:
    request: str  # the id of the request it answers
    location: str  # the archive's path or URL; "": not collected


def write_answer(answer: EvidenceAnswer) -> str:
    return json.dumps({"request": answer.request, "location": answer.location})


def read_answer(value: object) -> EvidenceAnswer | None:
    """The agent's answer on a Node; anything garbled is no answer."""
    try:
        entry = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    request, location = entry.get("request"), entry.get("location")
    if not isinstance(request, str) or not isinstance(location, str):
        return None
    return EvidenceAnswer(request, location)
