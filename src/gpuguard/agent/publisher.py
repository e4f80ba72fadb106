"""The publisher: brings this agent's Node up to date with the node state.

It writes the health conditions (``conditions.plan_write``), the report annotation
(``contract.report``), the kernel memory (the kernel-log monitor's) and one Event per
status transition. Like node-problem-detector's condition manager it keeps three promises:

- update: a change in the state reaches the Node at once (the state's ``changed`` wakes
  it), and only what changed is written;
- resync: a failed write is tried again with backoff (0.5 s, doubling to 30 s), and nothing
  counts as written until the API server took it, so the next try writes it all again;
- heartbeat: every ``heartbeat_interval_s`` every condition is rewritten, the report is
  stamped anew and the Node read again (a verify request, should its watch be refused).

Stamps come from the injected clock; only the Events' are the API client's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuguard.agent.conditions import ConditionWrite, plan_write
from gpuguard.agent.events import record_health_changed
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.clock import Clock
from gpuguard.config import Config
from gpuguard.contract.conditions import OWNED_TYPES, Desired, desired_conditions
from gpuguard.contract.keys import MEMORY_ANNOTATION, REPORT_ANNOTATION
from gpuguard.contract.report import (
    DeepEntry,
    ReportDocument,
    VerifyEntry,
    encode_report,
    layer_entries,
)
from gpuguard.contract.times import format_micro_time, format_time, format_whole_time
from gpuguard.kube.errors import KubeError, KubeRejected, NodeView
from gpuguard.model import NodeReport
from gpuguard.retry import Backoff

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

log = logging.getLogger("gpuguard.agent")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0


class Memory(Protocol):
    """Findings kept on the Node across agent restarts (the kernel-log monitor)."""

    def recall(self, annotation: str, node: str) -> None: ...

    def memory(self, report: NodeReport) -> str: ...


@dataclass
class _Published:
    """What we believe the Node says, and what we owe it."""

    node: NodeView | None = None
    conditions: dict[str, dict[str, object]] | None = None
    last_heartbeat: float = float("-inf")
    memory: str | None = None
    report: str | None = None  # the report annotation's content, without its timestamp


class Publisher:
    def __init__(
        self,
        api: NodeApi,
        node_name: str,
        config: Config,
        state: NodeState,
        *,
        report: Callable[[], NodeReport | None],
        memory: Memory,
        on_node: Callable[[Mapping[str, str]], None],
        metrics: AgentMetrics,
        clock: Clock,
    ) -> None:
        """``report``: the node's health now; ``on_node``: the annotations at each read of
        the Node (for the verify request in them)."""
        self._api = api
        self._node_name = node_name
        self._heartbeat_s = config.heartbeat_interval_s
        self._profile = config.condition_profile
        self._state = state
        self._report = report
        self._memory = memory
        self.on_node = on_node
        self._metrics = metrics
        self._clock = clock
        self._published = _Published()

    def run(self, stop: threading.Event) -> None:
        """Publish on every change and heartbeat until ``stop``; never raises on API errors.
        Whoever sets ``stop`` sets the state's ``changed`` too, to end the wait."""
        backoff = Backoff(BACKOFF_MIN_S, BACKOFF_MAX_S)
        while not stop.is_set():
            self._metrics.alive()
            self._state.changed.clear()
            wait = self._heartbeat_wait()
            try:
                if self.publish_once():
                    backoff.reset()
            except KubeError as exc:
                kind = "rejected" if isinstance(exc, KubeRejected) else "unavailable"
                self._metrics.publish_errors.labels(kind).inc()
                delay = backoff.next()
                log.warning(
                    "publishing conditions failed (%s), retrying in %.1fs: %s", kind, delay, exc
                )
                stop.wait(delay)
                continue
            self._state.changed.wait(wait)

    def publish_once(self) -> bool:
        """Bring the Node up to date; True when there was something to decide."""
        published = self._published
        first_read = published.node is None
        if published.node is None:
            self._read_node_after_start()
        report = self._report()
        if report is None:
            return False
        self._metrics.observe_report(report)
        now = self._clock.monotonic()
        heartbeat_due = now - published.last_heartbeat >= self._heartbeat_s
        if heartbeat_due and not first_read:
            published.node = self._api.get_node(self._node_name)
        assert published.node is not None
        self.on_node(published.node.annotations)
        write = plan_write(
            desired_conditions(report.layers, self._profile),
            published.conditions or {},
            format_whole_time(self._clock.now()),
            heartbeat_due=heartbeat_due,
        )
        if not write.empty:
            with self._metrics.publish_duration.time():
                self._write_conditions(write, report)
            if heartbeat_due:
                published.last_heartbeat = now
            self._metrics.last_publish.set(self._clock.now())
            for want, old in write.transitions:
                self._announce(report, want, old)
        refresh = heartbeat_due or self._state.fresh_report_requested()
        self._write_annotations(report, refresh=refresh)
        self._state.fresh_report_written()
        self._metrics.ready.set()
        return True

    def _read_node_after_start(self) -> None:
        """What the Node says: our conditions, and the memory an earlier agent left."""
        published = self._published
        published.node = self._api.get_node(self._node_name)
        published.conditions = {
            t: c for t, c in published.node.conditions.items() if t in OWNED_TYPES
        }
        memory = published.node.annotations.get(MEMORY_ANNOTATION, "")
        published.memory = memory
        published.report = None  # always write a fresh report after (re)starting
        self._memory.recall(memory, self._node_name)

    def _write_conditions(self, write: ConditionWrite, report: NodeReport) -> None:
        self._api.patch_conditions(self._node_name, write.conditions, write.remove)
        conditions = self._published.conditions or {}
        for removed in write.remove:
            conditions.pop(removed, None)
        conditions.update({str(c["type"]): c for c in write.conditions})
        self._published.conditions = conditions

    def _announce(self, report: NodeReport, want: Desired, old: str | None) -> None:
        assert self._published.node is not None
        try:
            record_health_changed(self._api, self._published.node, report, want, old, self._profile)
        except KubeError as exc:  # the condition is written; the event is best effort
            self._metrics.publish_errors.labels("event").inc()
            log.warning("recording the %s transition as an Event failed: %s", want.type, exc)

    def _write_annotations(self, report: NodeReport, *, refresh: bool) -> None:
        """The remembered kernel findings and the report the controller acts on."""
        published = self._published
        changes: dict[str, str | None] = {}
        memory = self._memory.memory(report)
        if memory != (published.memory or ""):
            changes[MEMORY_ANNOTATION] = memory or None
        deep, verify = deep_entries(*self._state.deep_runs())
        layers = layer_entries(report)
        content = encode_report(ReportDocument(layers=layers, deep=deep, verify=verify))
        if refresh or content != published.report:
            stamp = format_micro_time(self._clock.now())
            changes[REPORT_ANNOTATION] = encode_report(ReportDocument(stamp, layers, deep, verify))
        if changes:
            self._api.patch_annotations(self._node_name, changes)
            published.memory = memory
            published.report = content

    def _heartbeat_wait(self) -> float:
        since = self._clock.monotonic() - self._published.last_heartbeat
        return max(0.05, self._heartbeat_s - since)


def deep_entries(
    last: DeepRun | None, verify: DeepRun | None
) -> tuple[DeepEntry | None, VerifyEntry | None]:
    """The report's ``deep`` (the latest run) and ``verify`` (the answer to the latest
    request, its id echoed exactly as the controller wrote it) entries, when there are."""
    deep = verified = None
    if last is not None:
        deep = DeepEntry(format_time(last.finished_at), last.trigger, last.verdict, last.codes)
    if verify is not None and verify.requested_at is not None:
        verified = VerifyEntry(
            verify.requested_at, format_time(verify.finished_at), verify.passed, verify.codes
        )
    return deep, verified
