"""How a machine is handed back for a fresh one: one small interface, one file per provider.

``replace(node)`` starts the replacement and returns True once it is under way (idempotent:
called again each reconcile until the Node is gone). Karpenter's is the default: deleting
the NodeClaim makes Karpenter drain the node (respecting budgets) and launch a new one.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from gpuguard.kube.rest import NODES, Json, KubeApi, KubeNotFound, Resource

GROUP = "karpenter.sh/"
NODECLAIMS = Resource("/apis/karpenter.sh/v1", "nodeclaims")


class Provider(Protocol):
    name: str

    def replace(self, node: str) -> bool: ...


class KarpenterProvider:
    """Deletes the node's Karpenter NodeClaim: the one its Node names as owner (Karpenter's
    registration sets that reference), found with two reads whatever the fleet's size;
    else, for a Node without it, the NodeClaim whose ``status.nodeName`` is the node."""

    name = "karpenter"

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def replace(self, node: str) -> bool:
        claims = self._owning(node)
        if claims is None:
            claims = [
                claim
                for claim in self.api.list(NODECLAIMS.path()).items
                if (claim.get("status") or {}).get("nodeName") == node
            ]
        for claim in claims:
            if not claim["metadata"].get("deletionTimestamp"):
                # Deleted meanwhile is what we wanted anyway.
                with contextlib.suppress(KubeNotFound):
                    self.api.delete(NODECLAIMS.path(claim["metadata"]["name"]))
        return bool(claims)

    def _owning(self, node: str) -> list[Json] | None:
        """The NodeClaim the Node names as its owner ([] if it is gone already); None when
        the Node (or its reference) is not there to say."""
        try:
            owners = self.api.get(NODES.path(node))["metadata"].get("ownerReferences") or []
        except KubeNotFound:
            return None
        names = [
            o.get("name")
            for o in owners
            if o.get("kind") == "NodeClaim" and str(o.get("apiVersion", "")).startswith(GROUP)
        ]
        if not names or not isinstance(names[0], str):
            return None
        try:
            return [self.api.get(NODECLAIMS.path(names[0]))]
        except KubeNotFound:
            return []


class DeleteNodeProvider:
    """Deletes the Node object (for tests, and clusters whose autoscaler reacts to that)."""

    name = "delete-node"

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def replace(self, node: str) -> bool:
        with contextlib.suppress(KubeNotFound):
            self.api.delete(NODES.path(node))
        return True


def provider_for(name: str, api: KubeApi) -> Provider:
    """The provider registered under ``name`` (see controller/options.py for the names)."""
    if name == "karpenter":
        return KarpenterProvider(api)
    if name == "delete-node":
        return DeleteNodeProvider(api)
    raise ValueError(f"unknown provider {name!r}")
