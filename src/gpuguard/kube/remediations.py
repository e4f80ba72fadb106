"""Episodes kept in the cluster as ``NodeRemediation`` objects (gpuguard.io/v1alpha1).

State that must survive a controller restart lives here, not in memory (DESIGN.md). The
status has three owners, and each writes only its part with a merge patch, so no write
can undo another's: the controller's episode fields (:func:`save_episode`), the order for
the node's agent (``status.request``, :func:`set_request`) and the agent's answer
(``status.result``, :func:`report_result`). Merge patches need no resourceVersion, so a
save never fails on a conflict with the agent answering at the same moment.

Times are RFC 3339 strings that convert back to exactly the float they came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from gpuguard.contract.times import format_time, parse_time
from gpuguard.kube.rest import Json, KubeApi, KubeConflict, KubeNotFound, Resource
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult, Episode, Phase, Resolution, Step

log = logging.getLogger(__name__)

GROUP_VERSION = "gpuguard.io/v1alpha1"
KIND = "NodeRemediation"
NODE_REMEDIATIONS = Resource("/apis/gpuguard.io/v1alpha1", "noderemediations")
MAX_STEPS = 200  # keeps an object far below etcd's size limit; the oldest steps go first
RUNGS = (Action.KILL_JOB, Action.RESET_GPU, Action.REBOOT, Action.REPLACE)
_MAX_NAME = 253


@dataclass(frozen=True)
class ActionRequest:
    """The controller's order to a node's agent: do ``action`` (attempt ``attempt``)."""

    action: Action
    attempt: int
    gpus: tuple[str, ...]
    requested_at: float


def object_name(node: str, opened_at: float) -> str:
    """``<node>-<opened epoch seconds>``, shortened with a hash if the node name is long."""
    suffix = f"-{int(opened_at)}"
    if len(node) + len(suffix) <= _MAX_NAME:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: _MAX_NAME - len(suffix) - 11].rstrip('.-')}-{digest}{suffix}"


def episode_to_object(ep: Episode) -> Json:
    """The whole NodeRemediation for ``ep`` (``status.request`` is not part of an Episode)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": object_name(ep.node, ep.opened_at)},
        "spec": {"nodeName": ep.node, "openedAt": format_time(ep.opened_at)},
        "status": _without_nulls(_status(ep)),
    }


def episode_from_object(obj: Json) -> Episode:
    """The Episode a NodeRemediation holds; raises ``ValueError``/``KeyError`` if malformed."""
    spec = obj["spec"]
    status = obj.get("status") or {}
    opened_at = parse_time(spec["openedAt"])
    rung = status.get("rung")
    result = status.get("result")
    return Episode(
        node=str(spec["nodeName"]),
        opened_at=opened_at,
        phase=Phase(status.get("phase", Phase.QUARANTINED)),
        rung=Action[rung] if rung else None,
        attempts={Action[name]: int(n) for name, n in (status.get("attempts") or {}).items()},
        phase_since=parse_time(status["phaseSince"]) if "phaseSince" in status else opened_at,
        last_action_at=_time(status.get("lastActionAt")),
        action_result=_result(result) if result else None,
        gpus=tuple(str(gpu) for gpu in status.get("gpus") or ()),
        cordoned_by_us=bool(status.get("cordonedByUs", False)),
        exhausted=bool(status.get("exhausted", False)),
        closed_at=_time(status.get("closedAt")),
        resolution=Resolution(status["resolution"]) if status.get("resolution") else None,
        steps=[
            Step(at=parse_time(step["at"]), phase=Phase(step["phase"]), message=step["message"])
            for step in status.get("steps") or []
        ],
    )


def save_episode(api: KubeApi, ep: Episode, *, new: bool = False) -> None:
    """Create the object if needed and write the controller's part of its status.

    Idempotent: saving the same episode twice writes the same fields. ``status.result`` is
    written only when the episode carries one, so the agent's answer is never erased.
    """
    name = object_name(ep.node, ep.opened_at)
    patch = {"status": _status(ep)}
    if ep.action_result is None:
        del patch["status"]["result"]
    if not new:  # usually it exists: one write; ``new`` skips the doomed first try
        try:
            api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch)
            return
        except KubeNotFound:
            pass
    created = episode_to_object(ep)
    del created["status"]  # ignored on create: the status subresource owns it
    # AlreadyExists (409): created meanwhile by a retry of ours; the patch still applies.
    with contextlib.suppress(KubeConflict):
        api.create(NODE_REMEDIATIONS.path(), created)
    api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch)


def list_episodes(api: KubeApi) -> tuple[dict[str, Episode], list[Episode]]:
    """Open episodes by node (the newest if a node has several) and closed ones."""
    open_by_node: dict[str, Episode] = {}
    closed: list[Episode] = []
    for obj in api.list(NODE_REMEDIATIONS.path()).items:
        try:
            ep = episode_from_object(obj)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("skipping malformed NodeRemediation %s: %r", _name(obj), exc)
            continue
        if ep.phase is Phase.CLOSED:
            closed.append(ep)
        elif ep.node not in open_by_node or open_by_node[ep.node].opened_at < ep.opened_at:
            open_by_node[ep.node] = ep
    closed.sort(key=lambda ep: ep.opened_at)
    return open_by_node, closed


def delete_closed_before(api: KubeApi, cutoff: float) -> int:
    """Delete the NodeRemediations of episodes that closed before ``cutoff``; how many.

    Open episodes are never deleted, whatever their age, and neither is an object this
    module cannot read (a person should see it).
    """
    deleted = 0
    for obj in api.list(NODE_REMEDIATIONS.path()).items:
        try:
            ep = episode_from_object(obj)
        except (KeyError, ValueError, TypeError):
            continue
        if ep.phase is Phase.CLOSED and (ep.closed_at or ep.opened_at) < cutoff:
            with contextlib.suppress(KubeNotFound):  # deleted meanwhile by another replica
                api.delete(NODE_REMEDIATIONS.path(_name(obj)))
            deleted += 1
    return deleted


def set_request(
    api: KubeApi, ep: Episode, action: Action, attempt: int, gpus: tuple[str, ...], now: float
) -> bool:
    """Order ``action`` from the node's agent; False (nothing written) when this attempt of
    this action is already requested, so repeating a decision after a restart is harmless."""
    path = NODE_REMEDIATIONS.path(object_name(ep.node, ep.opened_at), sub="status")
    current = _request(api.get(path))
    if current is not None and (current.action, current.attempt) == (action, attempt):
        return False
    request = {
        "action": action.name,
        "attempt": attempt,
        "gpus": list(gpus),
        "requestedAt": format_time(now),
    }
    api.patch(path, {"status": {"request": request}})
    return True


def read_result(api: KubeApi, ep: Episode) -> ActionResult | None:
    """The answer to the episode's current rung and attempt, once one was reported."""
    if ep.rung is None:
        return None
    obj = api.get(NODE_REMEDIATIONS.path(object_name(ep.node, ep.opened_at)))
    result = (obj.get("status") or {}).get("result")
    if not result:
        return None
    answer = _result(result)
    return answer if (answer.action, answer.attempt) == (ep.rung, ep.attempt) else None


def pending_request_for(api: KubeApi, node: str) -> tuple[str, ActionRequest] | None:
    """For the agent: the newest request on ``node``'s open episodes not yet answered."""
    found = api.list(NODE_REMEDIATIONS.path(), field_selector=f"spec.nodeName={node}").items
    pending: list[tuple[str, ActionRequest]] = []
    for obj in found:
        status = obj.get("status") or {}
        request = _request(obj)
        if request is None or status.get("phase") == Phase.CLOSED:
            continue
        result = status.get("result")
        if result and (result.get("action"), result.get("attempt")) == (
            request.action.name,
            request.attempt,
        ):
            continue
        pending.append((_name(obj), request))
    return max(pending, key=lambda item: item[1].requested_at, default=None)


def report_result(api: KubeApi, name: str, result: ActionResult) -> None:
    """For the agent: answer the request on NodeRemediation ``name``."""
    api.patch(NODE_REMEDIATIONS.path(name, sub="status"), {"status": {"result": _wire(result)}})


def _status(ep: Episode) -> dict[str, Any]:
    """The controller-owned status fields; ``None`` removes a field in a merge patch."""
    steps = ep.steps[-MAX_STEPS:]
    attempts: dict[str, int | None] = {rung.name: ep.attempts.get(rung) for rung in RUNGS}
    return {
        "phase": str(ep.phase),
        "rung": ep.rung.name if ep.rung is not None else None,
        "attempt": ep.attempt,
        "attempts": attempts,
        "phaseSince": format_time(ep.phase_since),
        "lastActionAt": _stamp(ep.last_action_at),
        "gpus": list(ep.gpus),
        "cordonedByUs": ep.cordoned_by_us,
        "exhausted": ep.exhausted,
        "closedAt": _stamp(ep.closed_at),
        "resolution": str(ep.resolution) if ep.resolution is not None else None,
        "lastMessage": steps[-1].message if steps else None,
        "steps": [
            {"at": format_time(s.at), "phase": str(s.phase), "message": s.message} for s in steps
        ],
        "result": _wire(ep.action_result) if ep.action_result is not None else None,
    }


def _without_nulls(status: dict[str, Any]) -> Json:
    kept = {key: value for key, value in status.items() if value is not None}
    kept["attempts"] = {rung: n for rung, n in status["attempts"].items() if n is not None}
    return kept


def _wire(result: ActionResult) -> Json:
    return {
        "action": result.action.name,
        "attempt": result.attempt,
        "succeeded": result.succeeded,
        "at": format_time(result.at),
        "message": result.message,
    }


def _result(wire: Json) -> ActionResult:
    return ActionResult(
        attempt=int(wire["attempt"]),
        action=Action[wire["action"]],
        succeeded=bool(wire["succeeded"]),
        at=parse_time(wire["at"]),
        message=str(wire.get("message", "")),
    )


def _request(obj: Json) -> ActionRequest | None:
    wire = (obj.get("status") or {}).get("request")
    if not wire:
        return None
    return ActionRequest(
        action=Action[wire["action"]],
        attempt=int(wire["attempt"]),
        gpus=tuple(wire.get("gpus") or ()),
        requested_at=parse_time(wire["requestedAt"]),
    )


def _stamp(seconds: float | None) -> str | None:
    return format_time(seconds) if seconds is not None else None


def _time(text: str | None) -> float | None:
    return parse_time(text) if text else None


def _name(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))
