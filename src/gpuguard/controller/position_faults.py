"""A position at fault, made visible: for each open episode the policy holds because its
fault is the position's (``Episode.position_fault``), the controller's own Node condition
``GpuguardPositionHealthy=False``, one Event when it turns so, and the gauge
``gpuguard_position_at_fault`` (the alert's). When the episode closes or a person's mark
is taken, the condition turns True again (``PositionReturned``) and the series goes.

The condition is written from what the Node cache shows of it, so a new leader (or one
whose write failed) finishes what the last one began; Events are told once per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from gpuguard.contract.conditions import (
    FALSE,
    POSITION_AT_FAULT,
    POSITION_CONDITION,
    POSITION_RETURNED,
    TRUE,
)
from gpuguard.contract.times import format_time
from gpuguard.contract.wire import cut
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.kube import fleet
from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import Json, KubeApi, KubeNotFound
from gpuguard.remediation.model import Episode, Phase

log = logging.getLogger("gpuguard.controller")
MESSAGE_LIMIT = 1024  # the evidence names two machines, a time and the faults


def condition_status(node: Json) -> str:
    """Our condition's status on the (slim) Node; "" when it has none."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == POSITION_CONDITION:
            return str(condition.get("status", ""))
    return ""


def message(episode: Episode) -> str:
    evidence = episode.position_fault
    if episode.position and episode.position in evidence:
        return cut(evidence, MESSAGE_LIMIT)
    return cut(f"position {episode.position}: {evidence}", MESSAGE_LIMIT)


class PositionFaults:
    def __init__(
        self,
        api: KubeApi,
        events: EventRecorder,
        metrics: ControllerMetrics,
        *,
        dry_run: bool = False,
    ) -> None:
        self.api = api
        self.events = events
        self.metrics = metrics
        self.dry_run = dry_run  # the Event and the gauge, no condition
        self._status: dict[str, str] = {}  # node -> our condition's status, as last known
        self._told: set[str] = set()  # nodes whose PositionAtFault Event was given
        self._lock = threading.Lock()  # the Node watch writes _status, the pass reads it

    def seen(self, node: Json) -> None:
        """The Node as the cache holds it now."""
        name = str(node["metadata"]["name"])
        status = condition_status(node)
        with self._lock:
            if status:
                self._status[name] = status
            else:
                self._status.pop(name, None)

    def forget(self, name: str) -> None:
        with self._lock:
            self._status.pop(name, None)

    def clear(self) -> None:
        """Before a fresh list of the fleet: every Node is seen again."""
        with self._lock:
            self._status.clear()

    def publish(self, episodes: Iterable[Episode], now: float) -> bool:
        """Bring conditions, Events and gauge in line with ``episodes`` (the pass's);
        False when a write failed (tried again at the next pass)."""
        at_fault = {e.node: e for e in episodes if e.phase is not Phase.CLOSED and e.position_fault}
        self.metrics.position_at_fault.clear()
        for name, episode in at_fault.items():
            self.metrics.position_at_fault.labels(episode.position, name).set(1)
        with self._lock:
            status = dict(self._status)
        ok = True
        for name, episode in sorted(at_fault.items()):
            if name not in self._told:
                self.events.about_node(name, POSITION_AT_FAULT, message(episode), now)
                self._told.add(name)
            if status.get(name) != FALSE:
                ok &= self._write(name, FALSE, POSITION_AT_FAULT, message(episode), now)
        self._told &= at_fault.keys()
        returned = [n for n, s in status.items() if s == FALSE and n not in at_fault]
        for name in sorted(returned):
            note = "no open episode holds the node's position at fault"
            ok &= self._write(name, TRUE, POSITION_RETURNED, note, now)
        return ok

    def _write(self, name: str, status: str, reason: str, note: str, now: float) -> bool:
        if self.dry_run:
            return True
        when = format_time(now)
        condition = {
            "type": POSITION_CONDITION,
            "status": status,
            "reason": reason,
            "message": note,
            "lastTransitionTime": when,
            "lastHeartbeatTime": when,
        }
        try:
            fleet.patch_conditions(self.api, name, [condition])
        except KubeNotFound:
            self.forget(name)  # the Node is gone, and its condition with it
            return True
        except KubeError as exc:
            log.warning(
                "condition %s=%s on %s not written: %s", POSITION_CONDITION, status, name, exc
            )
            return False
        with self._lock:
            self._status[name] = status  # until the watch shows it
        return True
