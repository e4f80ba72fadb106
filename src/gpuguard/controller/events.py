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
EVENTS_PATH = "/apis/events.k8s.io/v1/namespaces/default/events"


class EventRecorder:
    def __init__(self, api: KubeApi, identity: str) -> None:
        self.api = api
        self.identity = identity

    def record(self, episode: Episode, decision: Decision, now: float) -> None:
        """Best effort: the episode itself is already written; a lost Event loses nothing."""
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": f"{episode.node}-remediation-"},
            "eventTime": format_micro_time(now),
            "reportingController": CONTROLLER_CONTROLLER,
            "reportingInstance": self.identity,
            "action": str(episode.phase),
            "reason": _reason(episode),
            "note": decision.reason[:1024],
            "type": "Normal" if episode.phase is Phase.CLOSED else "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": episode.node},
            "related": {
                "apiVersion": GROUP_VERSION,
                "kind": KIND,
                "name": object_name(episode.node, episode.opened_at),
            },
        }
        self._create(episode.node, body)

    def about_node(self, node: str, reason: str, note: str, now: float) -> None:
        """A Warning Event about ``node`` outside any episode (a silent agent, a held
        node); best effort like :meth:`record`."""
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}-{reason.lower()}-"},
            "eventTime": format_micro_time(now),
            "reportingController": CONTROLLER_CONTROLLER,
            "reportingInstance": self.identity,
            "action": reason,
            "reason": reason,
            "note": note[:1024],
            "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._create(node, body)

    def _create(self, node: str, body: Json) -> None:
        try:
            self.api.create(EVENTS_PATH, body)
        except KubeError as exc:
            log.warning("event for %s not recorded: %s", node, exc)


def _reason(episode: Episode) -> str:
    if episode.phase is Phase.CLOSED and episode.resolution is not None:
        return f"Closed{episode.resolution}"
    return str(episode.phase) + (episode.rung.name.title().replace("_", "") if episode.rung else "")
