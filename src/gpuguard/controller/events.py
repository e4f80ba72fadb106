"""One ``events.k8s.io/v1`` Event per recorded decision, about the Node and its episode."""

from __future__ import annotations

import logging

from gpuguard.contract.keys import CONTROLLER_CONTROLLER
from gpuguard.contract.remediation import GROUP_VERSION, KIND
from gpuguard.contract.times import format_micro_time
from gpuguard.kube.errors import KubeError
from gpuguard.kube.remediations import object_name
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.remediation.model import Decision, Episode, Phase

log = logging.getLogger("gpuguard.controller")
EVENTS_PATH = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"


class EventRecorder:
    def __init__(self, api: KubeApi, identity: str) -> None:
        self.api = api
        self.identity = identity

    def record(self, episode: Episode, decision: Decision, now: float) -> None:
        """Best effort: the episode itself is already written; a lost Event loses nothing."""
        related = {
            "apiVersion": GROUP_VERSION,
            "kind": KIND,
            "name": object_name(episode.node, episode.opened_at),
        }
        self._emit(
            episode.node,
            f"{episode.node}-remediation-",
            action=str(episode.phase),
            reason=_reason(episode),
            note=decision.reason,
            warning=episode.phase is not Phase.CLOSED,
            now=now,
            related=related,
        )

    def about_node(self, node: str, reason: str, note: str, now: float) -> None:
        """A Warning Event about ``node`` outside any episode (a silent agent, a held
        node); best effort like :meth:`record`."""
        self._emit(
            node,
            f"{node}-{reason.lower()}-",
            action=reason,
            reason=reason,
            note=note,
            warning=True,
            now=now,
        )

    def about_pod(self, pod: Json, reason: str, note: str, now: float, *, warning: bool) -> None:
        """An Event about a (slim) pod, in its namespace where ``kubectl describe`` looks."""
        metadata = pod["metadata"]
        regarding = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": metadata["namespace"],
            "name": metadata["name"],
            "uid": metadata["uid"],
        }
        self._emit(
            metadata["name"],
            f"{metadata['name']}-{reason.lower()}-",
            action=reason,
            reason=reason,
            note=note,
            warning=warning,
            now=now,
            regarding=regarding,
        )

    def _emit(
        self,
        node: str,
        generate_name: str,
        *,
        action: str,
        reason: str,
        note: str,
        warning: bool,
        now: float,
        related: Json | None = None,
        regarding: Json | None = None,
    ) -> None:
        body: Json = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": generate_name},
            "eventTime": format_micro_time(now),
            "reportingController": CONTROLLER_CONTROLLER,
            "reportingInstance": self.identity,
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": "Warning" if warning else "Normal",
            "regarding": regarding or {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if related is not None:
            body["related"] = related
        try:
            namespace = (regarding or {}).get("namespace") or "default"
            self.api.create(EVENTS_PATH.format(namespace=namespace), body)
        except KubeError as exc:
            log.warning("event for %s not recorded: %s", node, exc)


def _reason(episode: Episode) -> str:
    if episode.phase is Phase.CLOSED and episode.resolution is not None:
        return f"Closed{episode.resolution}"
    return str(episode.phase) + (episode.rung.name.title().replace("_", "") if episode.rung else "")
