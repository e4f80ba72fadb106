"""``gpuguard agent``: checks on a schedule, the kernel log followed, conditions published.

Five kinds of thread: one loop per scheduled check, one kernel-log follower, the deep
check (``deep.py``: rare, long, only on idle GPUs or on request), a watch of the own Node
for the controller's verify requests (``verify_requests.py``), and the publisher (the
caller's thread). They share one state object; the publisher wakes on every
change, so a new Xid line reaches the Node in about a second. Nothing is published before
every check has run once: a restarted agent never reports a known-bad node healthy
because it has not looked yet.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuguard.agent.conditions import plan_write
from gpuguard.agent.deep import DeepSchedule, Idleness, nvml_idleness
from gpuguard.agent.follow import Follower
from gpuguard.agent.kernel_state import KernelState, lasting, recall
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.verify_requests import follow_verify_requests
from gpuguard.checks.base import Check, CheckContext
from gpuguard.checks.load.checks import DeepGpuCheck
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.config import Config
from gpuguard.contract.conditions import OWNED_TYPES, PROFILES, Desired, desired_conditions
from gpuguard.contract.keys import (
    AGENT_CONTROLLER,
    MEMORY_ANNOTATION,
    REPORT_ANNOTATION,
    VERIFY_REQUEST_ANNOTATION,
)
from gpuguard.contract.memory import encode_memory
from gpuguard.contract.report import (
    DeepEntry,
    ReportDocument,
    VerifyEntry,
    encode_report,
    layer_entries,
)
from gpuguard.contract.times import format_time
from gpuguard.kube.errors import KubeError, KubeRejected, NodeView
from gpuguard.kube.watch import WATCH_JOIN_S
from gpuguard.model import Action, CheckResult, Layer, NodeReport, Outcome
from gpuguard.runner import RepeatingCheck, assess, inconclusive_result
from gpuguard.sources import Sources

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

log = logging.getLogger("gpuguard.agent")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
FOLLOW_RETRY_S = 5.0


@dataclass
class _Published:
    """What we believe the Node says, and what we owe it."""

    node: NodeView | None = None
    conditions: dict[str, dict[str, object]] | None = None
    last_heartbeat: float = float("-inf")
    memory: str | None = None
    report: str | None = None  # the report annotation's content, without its timestamp


class Agent:
    def __init__(
        self,
        config: Config,
        sources: Sources,
        checks: list[Check],
        follower: Follower,
        node_name: str,
        api: NodeApi | None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        deep_check: Check | None = None,
        idleness: Callable[[], Idleness] | None = None,
    ) -> None:
        """``deep_check``/``idleness`` default to the PyTorch suite and NVML's activity."""
        self.config = config
        self.sources = sources
        self.node_name = node_name
        self.api = api
        self.metrics = metrics or AgentMetrics()
        self.follower = follower
        self._clock = clock
        # The kernel log is followed, not polled.
        self._checks = [c for c in checks if c.name != "kernel-log"]
        self._results: dict[str, CheckResult] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._first_round: set[str] = {c.name for c in self._checks}
        self._kernel = KernelState(config.application_fault_ttl_s, sources.boot_id, clock)
        self._kernel_status: CheckResult | None = None
        self._published = _Published()
        self._report_requested = threading.Event()
        self._deep = DeepSchedule(
            deep_check or DeepGpuCheck(),
            config,
            sources,
            idleness=idleness or nvml_idleness(config.deep.idle_utilization_percent),
            on_run=self._take_deep_run,
            metrics=self.metrics,
        )
        self._last_deep: DeepRun | None = None
        self._verify: DeepRun | None = None  # the answer to the latest verify request
        self._kicks: list[threading.Event] = [self._deep.wake]

    # --- running ------------------------------------------------------------------
    def start_observers(self, stop: threading.Event) -> None:
        """Start the check loops and the kernel-log follower (daemon threads)."""
        for check in self._checks:
            ctx = CheckContext(self.sources, self.config, self.config.timeout_for(check.name))
            runner = RepeatingCheck(check, ctx)
            kick = threading.Event()
            self._kicks.append(kick)
            threading.Thread(
                target=self._check_loop,
                args=(runner, stop, kick),
                name=f"loop-{check.name}",
                daemon=True,
            ).start()
        threading.Thread(target=self._follow, args=(stop,), name="kernel-log", daemon=True).start()
        threading.Thread(target=self._deep.run, args=(stop,), name="deep", daemon=True).start()

    def run(self, stop: threading.Event) -> None:
        """Observe and publish until ``stop`` is set. Never raises on API errors."""
        assert self.api is not None
        self.start_observers(stop)
        requests = threading.Thread(
            target=follow_verify_requests,
            args=(self.api, self.node_name, self._deep.request_verify, stop),
            name="verify-requests",
            daemon=True,
        )
        requests.start()
        threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True).start()
        backoff = BACKOFF_MIN_S
        while not stop.is_set():
            self.metrics.alive()
            self._changed.clear()
            wait = self._heartbeat_wait()
            try:
                if self.publish_once():
                    backoff = BACKOFF_MIN_S
            except KubeError as exc:
                kind = "rejected" if isinstance(exc, KubeRejected) else "unavailable"
                self.metrics.publish_errors.labels(kind).inc()
                log.warning(
                    "publishing conditions failed (%s), retrying in %.1fs: %s", kind, backoff, exc
                )
                stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            self._changed.wait(wait)
        requests.join(WATCH_JOIN_S)  # ended by _wake_on_stop: none left reading the client

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        if self.api is not None:
            self.api.end_watches(stop)
        self._changed.set()
        for kick in self._kicks:
            kick.set()

    def wait_first_round(self, timeout_s: float) -> bool:
        deadline = self._clock() + timeout_s
        while self._clock() < deadline:
            if self.report() is not None:
                return True
            self._changed.wait(0.1)
            self._changed.clear()
        return False

    # --- state --------------------------------------------------------------------
    def report(self) -> NodeReport | None:
        """The node's health now, or None until every source has been read once."""
        with self._lock:
            if self._first_round or self._kernel_status is None:
                return None
            results = list(self._results.values())
            kernel = self._kernel_status
        if kernel.outcome is Outcome.OK:
            kernel = CheckResult(
                kernel.check,
                kernel.layer,
                kernel.outcome,
                self._kernel.findings(),
                kernel.duration_s,
            )
        return assess([kernel, *results], fail_closed=self.config.fail_closed)

    def desired(self, report: NodeReport) -> list[Desired]:
        return desired_conditions(report.layers, self.config.condition_profile)

    def _check_loop(
        self, runner: RepeatingCheck, stop: threading.Event, kick: threading.Event
    ) -> None:
        name = runner.check.name
        while not stop.is_set():
            if self._skip_as_fallback(name):
                result = None
            else:
                result = runner.run_once()
                self.metrics.observe_check(result)
            with self._lock:
                if result is None:
                    self._results.pop(name, None)
                else:
                    self._results[name] = result
                self._first_round.discard(name)
            self._changed.set()
            kick.wait(self.config.interval_for(name))
            kick.clear()

    def _take_deep_run(self, run: DeepRun) -> None:
        """A deep verdict folds into the GPU layer until the next run replaces it."""
        with self._lock:
            self._results[run.result.check] = run.result
            self._last_deep = run
            if run.requested_at is not None:
                self._verify = run
        self.request_fresh_report()

    def _skip_as_fallback(self, name: str) -> bool:
        # nvidia-smi stands in for NVML; it runs only while NVML gives no verdict.
        if name != "nvidia-smi" or self.config.cross_check:
            return False
        with self._lock:
            nvml = self._results.get("nvml")
        return nvml is not None and nvml.answered

    def _follow(self, stop: threading.Event) -> None:
        started = self._clock()

        def on_lines(lines: list[str], reset: bool) -> None:
            for event in self._kernel.add_lines(lines, reset):
                if event.kind == "xid":
                    self.metrics.xids.labels(str(event.code)).inc()
            with self._lock:
                self._kernel_status = CheckResult(
                    "kernel-log", Layer.KERNEL, Outcome.OK, [], self._clock() - started
                )
            self._changed.set()

        while not stop.is_set():
            try:
                self.follower.follow(on_lines, stop)
            except Exception as exc:  # an unreadable log is a verdict on the kernel layer
                detail = f"kernel-log: cannot follow {self.follower.description}: {exc}"
                log.error("%s; retrying in %.0fs", detail, FOLLOW_RETRY_S)
                with self._lock:
                    self._kernel_status = inconclusive_result(
                        "kernel-log", Layer.KERNEL, Outcome.FAILED, detail, 0.0
                    )
                self._changed.set()
                stop.wait(FOLLOW_RETRY_S)

    # --- publishing ---------------------------------------------------------------
    def publish_once(self) -> bool:
        """Bring the Node up to date; True when there was something to decide."""
        assert self.api is not None
        published = self._published
        first_read = published.node is None
        if published.node is None:
            published.node = self.api.get_node(self.node_name)
            published.conditions = {
                t: c for t, c in published.node.conditions.items() if t in OWNED_TYPES
            }
            memory = published.node.annotations.get(MEMORY_ANNOTATION, "")
            published.memory = memory
            published.report = None  # always write a fresh report after (re)starting
            self._kernel.remember(*recall(memory, self.node_name))
        report = self.report()
        if report is None:
            return False
        self.metrics.observe_report(report)
        now = self._clock()
        heartbeat_due = now - published.last_heartbeat >= self.config.heartbeat_interval_s
        if heartbeat_due and not first_read:  # the controller's verify request, if any
            published.node = self.api.get_node(self.node_name)
        assert published.node is not None
        stamp = published.node.annotations.get(VERIFY_REQUEST_ANNOTATION)
        if stamp:
            self._deep.request_verify(stamp)
        write = plan_write(
            self.desired(report),
            published.conditions or {},
            _utc_now(),
            heartbeat_due=heartbeat_due,
        )
        if not write.empty:
            self.api.patch_conditions(self.node_name, write.conditions, write.remove)
            conditions = published.conditions or {}
            for removed in write.remove:
                conditions.pop(removed, None)
            conditions.update({str(c["type"]): c for c in write.conditions})
            published.conditions = conditions
            if heartbeat_due:
                published.last_heartbeat = now
            self.metrics.last_publish.set(time.time())
            for want, old in write.transitions:
                self._announce(report, want, old)
        self._save_annotations(report, refresh=heartbeat_due or self._report_requested.is_set())
        self._report_requested.clear()
        self.metrics.ready.set()
        return True

    def after_repair(self, action: Action, gpus: tuple[str, ...], at: float) -> None:
        """A repair on this node finished: forget what it fixed and look again at once."""
        if action is Action.RESET_GPU:
            self._kernel.forget_gpus(gpus)
        with self._lock:
            self._first_round = {c.name for c in self._checks}  # report only fresh results
            if self._last_deep is not None:  # a verdict on the GPUs as they were before
                self._results.pop(self._last_deep.result.check, None)
        for kick in self._kicks:
            kick.set()
        self.request_fresh_report()

    def request_fresh_report(self) -> None:
        """Make the next publish write a new report timestamp (after a repair, say)."""
        self._report_requested.set()
        self._changed.set()

    def _announce(self, report: NodeReport, want: Desired, old: str | None) -> None:
        assert self.api is not None and self._published.node is not None
        layer = next(
            layer for layer, h in report.layers.items() if self.desired_type(layer) == want.type
        )
        codes = sorted({f.code for f in report.layers[layer].findings if f.severity > 0})
        note = f"{want.type}: {old or 'none'} -> {want.status} ({want.reason}); " + (
            f"findings: {', '.join(codes)}" if codes else "no findings"
        )
        try:
            self.api.create_event(
                self._published.node,
                reason=want.reason,
                note=note,
                warning=want.status != "True",
                controller=AGENT_CONTROLLER,
                instance=f"{AGENT_CONTROLLER}/{self.node_name}",
                action="HealthChanged",
            )
        except KubeError as exc:  # the condition is written; the event is best effort
            self.metrics.publish_errors.labels("event").inc()
            log.warning("recording the %s transition as an Event failed: %s", want.type, exc)

    def desired_type(self, layer: Layer) -> str:
        return PROFILES[self.config.condition_profile][layer]

    def _save_annotations(self, report: NodeReport, *, refresh: bool) -> None:
        """The remembered kernel findings and the report the controller acts on."""
        assert self.api is not None
        published = self._published
        changes: dict[str, str | None] = {}
        findings = lasting(f for h in report.layers.values() for f in h.findings)
        memory = encode_memory(self.sources.boot_id(), findings) if findings else ""
        if memory != (published.memory or ""):
            changes[MEMORY_ANNOTATION] = memory or None
        with self._lock:
            deep, verify = deep_entries(self._last_deep, self._verify)
        layers = layer_entries(report)
        content = encode_report(ReportDocument(layers=layers, deep=deep, verify=verify))
        if refresh or content != published.report:
            document = ReportDocument(_utc_now(precise=True), layers, deep, verify)
            changes[REPORT_ANNOTATION] = encode_report(document)
        if changes:
            self.api.patch_annotations(self.node_name, changes)
            published.memory = memory
            published.report = content

    def _heartbeat_wait(self) -> float:
        since = self._clock() - self._published.last_heartbeat
        return max(0.05, self.config.heartbeat_interval_s - since)


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


def _utc_now(*, precise: bool = False) -> str:
    """Condition times have whole seconds (the API's Time); the report keeps microseconds,
    so the controller can tell a report written just after a repair from one just before."""
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if precise else "%Y-%m-%dT%H:%M:%SZ")
