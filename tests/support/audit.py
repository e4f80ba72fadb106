"""The API server's audit log read back: every write, by which client, to what, when.

``ControlPlane(..., audit=True)`` starts kube-apiserver with :data:`AUDIT_POLICY`: write
verbs only, one event per request (the ResponseComplete stage), at level Request so a
patch's body is there too: a cordon, a taint and an episode's request are all a ``patch``
of the same object, and only the body tells them apart.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Request", "verbs": WRITE_VERBS}, {"level": "None"}],
}


@dataclass(frozen=True)
class Write:
    user: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    received: float  # the API server's wall clock, seconds since the epoch
    completed: float
    body: Any  # the request body as sent (a patch is the patch)

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


class AuditLog:
    """The writes logged so far, read afresh on each call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def writes(
        self,
        *,
        after: float | None = None,
        user: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
    ) -> list[Write]:
        """Writes received after ``after`` (epoch seconds), filtered by the other fields."""
        wanted = {"user": user, "resource": resource, "subresource": subresource, "name": name}
        return [
            w
            for w in self._read()
            if (after is None or w.received > after)
            and all(v is None or getattr(w, k) == v for k, v in wanted.items())
        ]

    def first(self, *, after: float | None = None, user: str | None = None) -> Write | None:
        found = self.writes(after=after, user=user)
        return min(found, key=lambda w: w.received) if found else None

    def _read(self) -> list[Write]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the line the server is writing right now
                continue
            found.append(_write(event))
        return found


def _write(event: dict[str, Any]) -> Write:
    ref = event.get("objectRef") or {}
    body = event.get("requestObject")
    name = ref.get("name") or _body_name(body)
    return Write(
        user=str((event.get("user") or {}).get("username", "")),
        verb=str(event.get("verb", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        name=name,
        code=int((event.get("responseStatus") or {}).get("code", 0)),
        received=_epoch(event["requestReceivedTimestamp"]),
        completed=_epoch(event["stageTimestamp"]),
        body=body,
    )


def _body_name(body: Any) -> str:
    """A create names its object in the body, not in the URL."""
    if isinstance(body, dict):
        return str((body.get("metadata") or {}).get("name") or "")
    return ""


def _epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


# --- what gpuguard's writes mean --------------------------------------------------------
def cordons(writes: Iterable[Write], node: str) -> list[Write]:
    """Successful writes that set ``spec.unschedulable`` on ``node``."""
    return [
        w
        for w in writes
        if w.resource == "nodes" and w.name == node and w.succeeded and _sets_unschedulable(w)
    ]


def _sets_unschedulable(write: Write) -> bool:
    body = write.body
    if isinstance(body, dict):  # a merge patch, or an update of the whole Node
        return bool((body.get("spec") or {}).get("unschedulable"))
    if isinstance(body, list):  # a JSON patch
        return any(
            op.get("path") == "/spec/unschedulable" and op.get("value") is True
            for op in body
            if isinstance(op, dict)
        )
    return False


def repair_requests(writes: Iterable[Write], node: str) -> list[Write]:
    """Successful writes of a repair request (``status.request``) on ``node``'s episodes,
    the NodeRemediations ``writes`` show created for it."""
    writes = list(writes)
    names = {w.name for w in episodes_created(writes, node)}
    return [
        w
        for w in writes
        if w.resource == "noderemediations"
        and w.name in names
        and w.succeeded
        and _writes_request(w.body)
    ]


def _writes_request(body: Any) -> bool:
    if isinstance(body, dict):
        return bool((body.get("status") or {}).get("request"))
    if isinstance(body, list):
        return any(
            isinstance(op, dict)
            and str(op.get("path", "")).startswith("/status/request")
            and op.get("op") != "remove"
            for op in body
        )
    return False


def evictions(writes: Iterable[Write], *, succeeded: bool = True) -> list[Write]:
    """Eviction requests (the API server's answer: 201 evicted, 429 refused)."""
    return [
        w
        for w in writes
        if w.resource == "pods"
        and w.subresource == "eviction"
        and w.verb == "create"
        and w.succeeded == succeeded
    ]


def episodes_created(writes: Iterable[Write], node: str) -> list[Write]:
    return [
        w
        for w in writes
        if w.resource == "noderemediations"
        and w.verb == "create"
        and w.succeeded
        and isinstance(w.body, dict)
        and (w.body.get("spec") or {}).get("nodeName") == node
    ]
