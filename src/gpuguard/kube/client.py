"""A narrow Kubernetes client for gpuguard: the handful of calls the agent makes.

Everything above this module speaks plain dicts and gpuguard's own errors; lightkube and
its HTTP library stay here; errors are mapped onto :mod:`gpuguard.kube.errors`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpuguard.kube.errors import KubeRejected, KubeUnavailable, NodeView

REQUEST_TIMEOUT_S = 10.0
FIELD_MANAGER = "gpuguard-agent"


def load_client(kubeconfig: Path | None) -> Client:
    """A client from a kubeconfig file, or the pod's ServiceAccount when ``None``."""
    try:
        if kubeconfig is None:
            config = KubeConfig.from_service_account()
        else:
            config = KubeConfig.from_dict(yaml.safe_load(kubeconfig.read_text()))
    except Exception as exc:  # lightkube raises several types for a bad or absent config
        raise KubeRejected(f"cannot load Kubernetes credentials: {exc}") from None
    return Client(
        config=config, timeout=httpx2.Timeout(REQUEST_TIMEOUT_S), field_manager=FIELD_MANAGER
    )


class NodeApi:
    """Reads and writes one Node's health: conditions, annotations and Events."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def get_node(self, name: str) -> NodeView:
        node = _call(lambda: self._client.get(Node, name))
        conditions = {
            c.type: {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": _timestamp(c.lastTransitionTime),
                "lastHeartbeatTime": _timestamp(c.lastHeartbeatTime),
            }
            for c in (node.status.conditions or [] if node.status else [])
        }
        metadata = node.metadata
        return NodeView(
            name=name,
            uid=str(metadata.uid if metadata else ""),
            conditions=conditions,
            annotations=dict(metadata.annotations or {}) if metadata else {},
        )

    def patch_conditions(
        self, name: str, conditions: list[dict[str, Any]], remove: list[str]
    ) -> None:
        """Set the given conditions and delete the listed types, leaving all others alone.

        A strategic merge patch keyed by condition type, so the kubelet's own conditions
        (written concurrently) are never overwritten.
        """
        entries: list[dict[str, Any]] = list(conditions)
        entries += [{"$patch": "delete", "type": kind} for kind in remove]
        body = {"status": {"conditions": entries}}
        _call(lambda: self._client.patch(Node.Status, name, body, patch_type=PatchType.STRATEGIC))

    def patch_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        _call(lambda: self._client.patch(Node, name, body, patch_type=PatchType.MERGE))

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
        now = datetime.datetime.now(datetime.UTC)
        event = from_dict(
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"generateName": f"{node.name}-gpuguard-", "namespace": "default"},
                "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "reportingController": controller,
                "reportingInstance": instance,
                "action": action,
                "reason": reason,
                "note": note[:1024],
                "type": "Warning" if warning else "Normal",
                "regarding": {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node.name,
                    "uid": node.uid,
                },
            }
        )
        _call(lambda: self._client.create(event, namespace="default"))  # type: ignore[type-var]


def _call(request: Any) -> Any:
    try:
        return request()
    except ApiError as exc:
        code = exc.status.code or 0
        detail = f"{code} {exc.status.reason}: {exc.status.message}"
        if code == 429 or code >= 500:
            raise KubeUnavailable(detail) from None
        raise KubeRejected(detail) from None
    except (httpx2.HTTPError, OSError) as exc:
        raise KubeUnavailable(f"{type(exc).__name__}: {exc}") from None


def _timestamp(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)
