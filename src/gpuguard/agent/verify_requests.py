"""The controller's verify requests, seen as soon as they are written.

The controller asks for a deep verify by annotating the Node
(``gpuguard.io/verify-requested``); the node stays out of service until the answer comes,
so the agent watches its own Node instead of waiting for its next heartbeat (up to
``heartbeat_interval_s``, 180 s by default). The heartbeat's read of the Node stays as the
fallback: an older chart whose RBAC lacks ``watch`` is told once and backed off from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuguard.kube.errors import KubeError, KubeRejected
from gpuguard.remediation.model import VERIFY_REQUEST_ANNOTATION

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

log = logging.getLogger("gpuguard.agent")

RETRY_S = 2.0
REFUSED_RETRY_MAX_S = 300.0


def follow_verify_requests(
    api: NodeApi, node: str, request_verify: Callable[[str], None], stop: threading.Event
) -> None:
    """Hand each verify stamp on ``node`` to ``request_verify`` until ``stop``."""
    refused = 0  # refusals in a row
    while not stop.is_set():
        try:
            for annotations in api.watch_annotations(node, stop):
                refused = 0
                stamp = annotations.get(VERIFY_REQUEST_ANNOTATION)
                if stamp:
                    request_verify(stamp)
        except KubeRejected as exc:
            if not refused:
                log.warning(
                    "cannot watch node %s (%s): verify requests are read at each heartbeat",
                    node,
                    exc,
                )
            refused += 1
            stop.wait(min(RETRY_S * 2**refused, REFUSED_RETRY_MAX_S))
        except KubeError as exc:
            log.info("watch of node %s broken, resuming: %s", node, exc)
            stop.wait(RETRY_S)
