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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpuguard.kube.watch import keep_watching

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

log = logging.getLogger("gpuguard.agent")


def follow_verify_requests(
    api: NodeApi,
    node: str,
    take: Callable[[Mapping[str, str]], None],
    stop: threading.Event,
) -> None:
    """Hand ``node``'s annotations to ``take`` at each change until ``stop``: a verify
    stamp, and an evidence request where the agent takes them."""
    keep_watching(
        lambda: api.watch_annotations(node, stop),
        take,
        stop,
        log=log,
        what=f"node {node}",
        when_refused="verify and evidence requests are read at each heartbeat meanwhile",
    )
