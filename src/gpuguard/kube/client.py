"""The agent's few calls on the Kubernetes API: its own Node's health, annotations, Events.

Built on the same raw-JSON client as the controller (:mod:`gpuguard.kube.rest`), so the
project has one way to talk to the API server; errors arrive as
:class:`~gpuguard.kube.errors.KubeUnavailable` (retry later) or
:class:`~gpuguard.kube.errors.KubeRejected` (do not retry as is).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.times import format_micro_time
from gpuguard.kube import fleet
from gpuguard.kube.errors import KubeUnavailable, NodeView
from gpuguard.kube.rest import NODES, KubeApi, KubeExpired, Resource

EVENTS = Resource("/apis/events.k8s.io/v1", "events", namespaced=True)
EVENT_NAMESPACE = "default"  # Node is cluster-scoped; kubectl describe node looks here


class NodeApi:
    """Reads and writes one Node's health: conditions, annotations and Events."""

    def __init__(self, api: KubeApi, clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._clock = clock  # stamps the Events

    def get_node(self, name: str) -> NodeView:
        node = self._api.get(NODES.path(name))
        metadata = node.get("metadata") or {}
        conditions = {
            c["type"]: {
                "type": c["type"],
                "status": c.get("status"),
                "reason": c.get("reason"),
                "message": c.get("message"),
                "lastTransitionTime": c.get("lastTransitionTime"),
                "lastHeartbeatTime": c.get("lastHeartbeatTime"),
            }
            for c in (node.get("status") or {}).get("conditions") or []
        }
        return NodeView(
            name=name,
            uid=str(metadata.get("uid", "")),
            conditions=conditions,
            annotations=dict(metadata.get("annotations") or {}),
        )

    def watch_annotations(self, name: str, stop: threading.Event) -> Iterator[dict[str, str]]:
        """The Node's annotations now, then after each change, until ``stop`` is set and
        :meth:`end_watches` called (the iterator then just ends). A broken connection
        raises :class:`~gpuguard.kube.errors.KubeUnavailable`; the caller retries.

        Only ``watch`` is needed, not ``list``: a watch from version "0" starts with the
        object as it is now."""
        version = "0"
        while not stop.is_set():
            try:
                for event in self._api.watch(
                    NODES.path(),
                    resource_version=version,
                    field_selector=f"metadata.name={name}",
                    stop=stop,
                ):
                    version = event.resource_version or version
                    if event.type in ("ADDED", "MODIFIED"):
                        metadata = event.object.get("metadata") or {}
                        yield dict(metadata.get("annotations") or {})
            except KubeExpired:
                version = "0"
            except KubeUnavailable:
                if stop.is_set():
                    return
                raise

    def end_watches(self, stop: threading.Event) -> None:
        """End the watches started with ``stop`` (already set) at once."""
        self._api.end_watches(stop)

    def patch_conditions(
        self, name: str, conditions: Sequence[Mapping[str, object]], remove: Sequence[str]
    ) -> None:
        """Set the given conditions and delete the listed types, leaving all others alone
        (``fleet.patch_conditions``)."""
        fleet.patch_conditions(self._api, name, conditions, remove)

    def patch_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        self._api.patch(NODES.path(name), body, kind="merge")

    def create_event(
        self,
        node: NodeView,
        *,
        reason: str,
        note: str,
        warning: bool,
        controller: str,
        instance: str,
        action: str,
    ) -> None:
        """One ``events.k8s.io/v1`` Event about the Node."""
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node.name}-gpuguard-", "namespace": EVENT_NAMESPACE},
            "eventTime": format_micro_time(self._clock.now()),
            "reportingController": controller,
            "reportingInstance": instance,
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": "Warning" if warning else "Normal",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid},
        }
        self._api.create(EVENTS.path(namespace=EVENT_NAMESPACE), event)
