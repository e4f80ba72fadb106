"""Episodes kept in the cluster as ``NodeRemediation`` objects (gpuguard.io/v1alpha1).

State that must survive a controller restart lives here, not in memory (DESIGN.md). The
status has three owners, and each writes only its part with a merge patch, so no write
can undo another's: the controller's episode fields (:func:`save_episode`), the order for
the node's agent (``status.request``, :func:`set_request`) and the agent's answer
(``status.result``, :func:`report_result`). Merge patches need no resourceVersion, so a
save never fails on a conflict with the agent answering at the same moment.

The object's shape is ``contract.remediation``'s models (the CRD schema is generated from
them); this module maps them to and from the policy's Episode and talks to the API server.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass, field

from gpuguard.contract import remediation as wire
from gpuguard.contract.errors import ContractError
from gpuguard.contract.remediation import GROUP_VERSION, MAX_SIGNATURE, PLURAL, RUNGS
from gpuguard.kube.rest import Json, KubeApi, KubeConflict, KubeNotFound, Resource
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult, Episode, Phase, Step

log = logging.getLogger(__name__)

NODE_REMEDIATIONS = Resource(f"/apis/{GROUP_VERSION}", PLURAL)
MAX_STEPS = wire.MAX_STEPS  # the CRD's maxItems; the oldest steps go first
_MAX_NAME = 253


@dataclass(frozen=True)
class ActionRequest:
    """The controller's order to a node's agent: do ``action`` (attempt ``attempt``)."""

    action: Action
    attempt: int
    gpus: tuple[str, ...]
    requested_at: float
    # The agent's mark that it began this attempt (report_started), if it did.
    started: wire.Started | None = None
    node_uid: str = ""  # the uid of the Node the episode is about ("": not recorded)


def object_name(node: str, opened_at: float) -> str:
    """``<node>-<opened epoch seconds>``, shortened with a hash if the node name is long."""
    suffix = f"-{int(opened_at)}"
    if len(node) + len(suffix) <= _MAX_NAME:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: _MAX_NAME - len(suffix) - 11].rstrip('.-')}-{digest}{suffix}"


def episode_to_object(ep: Episode) -> Json:
    """The whole NodeRemediation for ``ep`` (``status.request`` is not part of an Episode)."""
    whole = wire.NodeRemediation(
        metadata={"name": object_name(ep.node, ep.opened_at)},
        spec=wire.Spec(
            node_name=ep.node,
            opened_at=ep.opened_at,
            nodeUID=ep.node_uid or None,
            position=ep.position or None,
        ),
        status=_status(ep),
    )
    return whole.model_dump(mode="json", by_alias=True, exclude_none=True)


def episode_from_object(obj: Json) -> Episode:
    """The Episode a NodeRemediation holds; raises ``ContractError`` if malformed."""
    whole = wire.read_remediation(obj)
    spec, status = whole.spec, whole.status
    return Episode(
        node=spec.node_name,
        opened_at=spec.opened_at,
        phase=status.phase,
        rung=status.rung,
        attempts=dict(status.attempts),
        phase_since=spec.opened_at if status.phase_since is None else status.phase_since,
        last_action_at=status.last_action_at,
        action_result=_result(status.result) if status.result is not None else None,
        gpus=status.gpus,
        cordoned_by_us=status.cordoned_by_us,
        exhausted=status.exhausted,
        closed_at=status.closed_at,
        resolution=status.resolution,
        steps=[Step(at=step.at, phase=step.phase, message=step.message) for step in status.steps],
        node_uid=spec.node_uid or "",
        machine=status.machine or "",
        replacement=status.replacement or "",
        position=spec.position or spec.node_name,
        signature=status.signature,
        position_fault=status.position_fault or "",
        position_fixed_at=status.position_fixed_at,
        slow_confirmed=status.slow_confirmed,
    )


def save_episode(
    api: KubeApi, ep: Episode, *, new: bool = False, resource_version: str = ""
) -> str:
    """Create the object if needed and write the controller's part of its status; returns
    the object's new resourceVersion.

    Idempotent: saving the same episode twice writes the same fields. ``status.result`` is
    written only when the episode carries one, so the agent's answer is never erased.
    ``resource_version``: the version this save was computed from; the API server refuses
    the write (409) if the object changed since, so a replica that lost its leadership
    cannot overwrite what the new leader wrote.
    """
    name = object_name(ep.node, ep.opened_at)
    patch: Json = {"status": _status_patch(ep)}
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    if not new:  # usually it exists: one write; ``new`` skips the doomed first try
        try:
            return _version(api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch))
        except KubeNotFound:
            pass
    created = episode_to_object(ep)
    del created["status"]  # ignored on create: the status subresource owns it
    # AlreadyExists (409): created meanwhile by a retry of ours; the patch still applies.
    with contextlib.suppress(KubeConflict):
        made = api.create(NODE_REMEDIATIONS.path(), created)
        patch["metadata"] = {"resourceVersion": _version(made)}
    return _version(api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch))


@dataclass
class StoredEpisodes:
    """Every NodeRemediation as the controller reads it when it (re)starts.

    ``held``: nodes whose episode object cannot be read (the reason, naming the object and
    field). Such a node is held, never treated as having no episode: starting its ladder
    over could repeat a reboot already done. ``unreadable``: why each unreadable object
    (open, closed or naming no node) could not be read."""

    open: dict[str, Episode] = field(default_factory=dict)  # by node, the newest
    closed: list[Episode] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # object name -> resourceVersion
    held: dict[str, str] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)


def read_episodes(api: KubeApi) -> StoredEpisodes:
    stored = StoredEpisodes()
    for obj in api.list(NODE_REMEDIATIONS.path()).items:
        stored.versions[_name(obj)] = _version(obj)
        try:
            ep = episode_from_object(obj)
        except ContractError as exc:
            stored.unreadable.append(str(exc))
            node = (obj.get("spec") or {}).get("nodeName")
            if (obj.get("status") or {}).get("phase") == Phase.CLOSED:
                log.warning("unreadable closed NodeRemediation, left out of the history: %s", exc)
            elif isinstance(node, str) and node:
                stored.held[node] = str(exc)
                log.warning("unreadable NodeRemediation, node %s held: %s", node, exc)
            else:
                log.warning("unreadable NodeRemediation naming no node: %s", exc)
            continue
        if ep.phase is Phase.CLOSED:
            stored.closed.append(ep)
        elif ep.node not in stored.open or stored.open[ep.node].opened_at < ep.opened_at:
            stored.open[ep.node] = ep
    stored.closed.sort(key=lambda ep: ep.opened_at)
    return stored


def list_episodes(api: KubeApi) -> tuple[dict[str, Episode], list[Episode]]:
    """Open episodes by node (the newest if a node has several) and closed ones."""
    stored = read_episodes(api)
    return stored.open, stored.closed


def delete_closed_before(api: KubeApi, cutoff: float) -> int:
    """Delete the NodeRemediations of episodes that closed before ``cutoff``; how many.

    Open episodes are never deleted, whatever their age, and neither is an object this
    module cannot read (a person should see it).
    """
    deleted = 0
    for obj in api.list(NODE_REMEDIATIONS.path()).items:
        try:
            ep = episode_from_object(obj)
        except ContractError:
            continue
        if ep.phase is Phase.CLOSED and (ep.closed_at or ep.opened_at) < cutoff:
            with contextlib.suppress(KubeNotFound):  # deleted meanwhile by another replica
                api.delete(NODE_REMEDIATIONS.path(_name(obj)))
            deleted += 1
    return deleted


def set_request(
    api: KubeApi, ep: Episode, action: Action, attempt: int, gpus: tuple[str, ...], now: float
) -> str:
    """Order ``action`` from the node's agent; returns the object's new resourceVersion,
    or "" (nothing written) when this attempt of this action is already requested, so
    repeating a decision after a restart is harmless, or when the episode is closed."""
    path = NODE_REMEDIATIONS.path(object_name(ep.node, ep.opened_at), sub="status")
    obj = api.get(path)
    if (obj.get("status") or {}).get("phase") == Phase.CLOSED:
        return ""  # closed meanwhile (by another leader): nothing to order
    try:
        current = wire.request_of(obj)
    except ContractError as exc:  # ours to write: an unreadable one is replaced
        log.warning("replacing an unreadable request: %s", exc)
        current = None
    if current is not None and (current.action, current.attempt) == (action, attempt):
        return ""
    request = wire.Request(action=action, attempt=attempt, gpus=gpus, requested_at=now)
    patch = {
        "metadata": {"resourceVersion": _version(obj)},  # as read: nothing wrote meanwhile
        "status": {"request": request.model_dump(mode="json", by_alias=True)},
    }
    return _version(api.patch(path, patch))


def read_result(api: KubeApi, ep: Episode) -> ActionResult | None:
    """The answer to the episode's current rung and attempt, once one was reported."""
    if ep.rung is None:
        return None
    answer = wire.result_of(api.get(NODE_REMEDIATIONS.path(object_name(ep.node, ep.opened_at))))
    if answer is None or (answer.action, answer.attempt) != (ep.rung, ep.attempt):
        return None
    return _result(answer)


@dataclass(frozen=True)
class Answer:
    """An agent's (or provider's) answer, with the episode it belongs to."""

    node: str
    opened_at: float
    result: ActionResult


def answer_in(obj: Json) -> Answer | None:
    """The answer a NodeRemediation holds (for a watch of them); ``ContractError`` if the
    object is malformed."""
    answer = wire.result_of(obj)
    if answer is None:
        return None
    spec = wire.read_remediation(obj).spec
    return Answer(spec.node_name, spec.opened_at, _result(answer))


def pending_request_for(api: KubeApi, node: str) -> tuple[str, ActionRequest] | None:
    """For the agent: the newest request on ``node``'s open episodes not yet answered.

    Each object is read on its own: one that cannot be read is left out, with a warning
    naming it and the field, and a closed episode is not read at all."""
    found = api.list(NODE_REMEDIATIONS.path(), field_selector=f"spec.nodeName={node}").items
    pending: list[tuple[str, ActionRequest]] = []
    for obj in found:
        status = obj.get("status") or {}
        if not status.get("request") or status.get("phase") == Phase.CLOSED:
            continue
        try:
            order = _unanswered(obj)
        except ContractError as exc:
            log.warning("skipping a repair request that cannot be read: %s", exc)
            continue
        if order is not None:
            pending.append((_name(obj), order))
    return max(pending, key=lambda item: item[1].requested_at, default=None)


def _unanswered(obj: Json) -> ActionRequest | None:
    request = wire.request_of(obj)
    if request is None:
        return None
    key = (request.action, request.attempt)
    result = wire.result_of(obj)
    if result is not None and (result.action, result.attempt) == key:
        return None
    started = wire.started_of(obj)
    if started is not None and (started.action, started.attempt) != key:
        started = None  # an earlier attempt's mark
    node_uid = (obj.get("spec") or {}).get("nodeUID")
    return ActionRequest(
        request.action,
        request.attempt,
        request.gpus,
        request.requested_at,
        started,
        node_uid if isinstance(node_uid, str) else "",
    )


def report_started(
    api: KubeApi, name: str, request: ActionRequest, at: float, boot_id: str
) -> None:
    """For the agent: mark on NodeRemediation ``name`` that it begins ``request``, before
    it does, so that an agent restarted before it answered answers instead of repeating."""
    mark = wire.Started(action=request.action, attempt=request.attempt, at=at, bootID=boot_id)
    patch = {"status": {"started": mark.model_dump(mode="json", by_alias=True)}}
    api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch)


def report_result(api: KubeApi, name: str, result: ActionResult) -> None:
    """For the agent: answer the request on NodeRemediation ``name`` (the message cut to
    the CRD's maxLength)."""
    answer = _wire_result(result).model_dump(mode="json", by_alias=True)
    patch = {"status": {"result": answer}}
    api.patch(NODE_REMEDIATIONS.path(name, sub="status"), patch)


def _status(ep: Episode) -> wire.Status:
    """The episode's status as stored (without ``request``, the controller's order).

    The wire model cuts every message to the CRD's maxLength (the agent's answer, copied
    into a step and lastMessage, may be anything), so this write is never too big."""
    steps = ep.steps[-MAX_STEPS:]
    result = ep.action_result
    return wire.Status(
        phase=ep.phase,
        rung=ep.rung,
        attempt=ep.attempt,
        attempts={rung: ep.attempts[rung] for rung in RUNGS if rung in ep.attempts},
        phase_since=ep.phase_since,
        last_action_at=ep.last_action_at,
        gpus=ep.gpus,
        cordoned_by_us=ep.cordoned_by_us,
        exhausted=ep.exhausted,
        closed_at=ep.closed_at,
        resolution=ep.resolution,
        machine=ep.machine or None,
        replacement=ep.replacement or None,
        signature=ep.signature[:MAX_SIGNATURE],
        position_fault=ep.position_fault or None,
        position_fixed_at=ep.position_fixed_at,
        slow_confirmed=ep.slow_confirmed,
        last_message=steps[-1].message if steps else None,
        steps=tuple(wire.Step(at=s.at, phase=s.phase, message=s.message) for s in steps),
        result=_wire_result(result) if result is not None else None,
    )


def _status_patch(ep: Episode) -> Json:
    """The controller's part of the status as a merge patch, where ``None`` removes a
    field: never ``request`` (:func:`set_request`'s) or ``started`` (the agent's), ``result``
    only when the episode carries one."""
    mine = {"request", "started"}
    if ep.action_result is None:
        mine.add("result")
    patch = _status(ep).model_dump(mode="json", by_alias=True, exclude=mine)
    patch["attempts"] = {rung.name: patch["attempts"].get(rung.name) for rung in RUNGS}
    return patch


def _wire_result(result: ActionResult) -> wire.Result:
    return wire.Result(
        action=result.action,
        attempt=result.attempt,
        succeeded=result.succeeded,
        at=result.at,
        message=result.message,
    )


def _result(answer: wire.Result) -> ActionResult:
    return ActionResult(
        attempt=answer.attempt,
        action=answer.action,
        succeeded=answer.succeeded,
        at=answer.at,
        message=answer.message,
    )


def _name(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Json) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
