"""Errors of the Kubernetes layer, split by what the caller should do next.

Kept apart from the client so that code handling them does not import the client library.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.errors import GpuguardError


class KubeError(GpuguardError):
    """A Kubernetes API call did not succeed."""


class KubeUnavailable(KubeError):
    """The API server could not be reached or asked us to come back later; retry."""


class KubeRejected(KubeError):
    """The API server refused the request (forbidden, invalid, not found); do not retry."""


class KubeFenced(KubeError):
    """A write was not sent: the client's fence (a controller's leadership) is down."""


@dataclass(frozen=True)
class NodeView:
    """The small part of a Node the agent needs."""

    name: str
    uid: str
    conditions: dict[str, dict[str, object]]  # by type, each as the API server wrote it
    annotations: dict[str, str]
