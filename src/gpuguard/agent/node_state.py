"""What the agent's monitors have seen, kept for the publisher.

The check loops, the kernel-log monitor and the deep schedule write here from their own
threads; the publisher reads. ``changed`` is set on every write, so the publisher wakes at
once and a new Xid line reaches the Node in about a second. There is no report until every
check has run once and the kernel log has been read: a restarted agent never reports a
known-bad node healthy because it has not looked yet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.model import CheckResult, Finding, NodeReport, Outcome
from gpuguard.runner import assess


class NodeState:
    def __init__(self, checks: Iterable[str]) -> None:
        """``checks``: the names of the checks that must run before the first report."""
        self._checks = frozenset(checks)
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self._results: dict[str, CheckResult] = {}
        self._first_round = set(self._checks)
        self._kernel: CheckResult | None = None  # findings left out: they age (TTL)
        self._last_deep: DeepRun | None = None
        self._verify: DeepRun | None = None  # the answer to the latest verify request
        self._fresh_report = threading.Event()

    # --- written by the monitors ------------------------------------------------------
    def put_result(self, name: str, result: CheckResult | None) -> None:
        """A check's latest result; None withdraws it (a fallback whose primary answers)."""
        with self._lock:
            if result is None:
                self._results.pop(name, None)
            else:
                self._results[name] = result
            self._first_round.discard(name)
        self.changed.set()

    def put_kernel_status(self, status: CheckResult) -> None:
        """Whether the kernel log is being read (its findings are read at report time)."""
        with self._lock:
            self._kernel = status
        self.changed.set()

    def put_deep_run(self, run: DeepRun) -> None:
        """A deep verdict folds into the GPU layer until the next run replaces it."""
        with self._lock:
            self._results[run.result.check] = run.result
            self._last_deep = run
            if run.requested_at is not None:
                self._verify = run
        self.request_fresh_report()

    def look_again(self) -> None:
        """After a repair: report only fresh results, and not the deep verdict on the GPUs
        as they were before."""
        with self._lock:
            self._first_round = set(self._checks)
            if self._last_deep is not None:
                self._results.pop(self._last_deep.result.check, None)

    def request_fresh_report(self) -> None:
        """Make the next publish write a new report timestamp (after a repair, say)."""
        self._fresh_report.set()
        self.changed.set()

    # --- read by the publisher --------------------------------------------------------
    def result(self, name: str) -> CheckResult | None:
        with self._lock:
            return self._results.get(name)

    def report(
        self, kernel_findings: Callable[[], list[Finding]], *, fail_closed: bool
    ) -> NodeReport | None:
        """The node's health now, or None until every source has been read once."""
        with self._lock:
            if self._first_round or self._kernel is None:
                return None
            results = list(self._results.values())
            kernel = self._kernel
        if kernel.outcome is Outcome.OK:
            kernel = CheckResult(
                kernel.check, kernel.layer, kernel.outcome, kernel_findings(), kernel.duration_s
            )
        return assess([kernel, *results], fail_closed=fail_closed)

    def deep_runs(self) -> tuple[DeepRun | None, DeepRun | None]:
        """The latest deep run, and the latest answer to a verify request."""
        with self._lock:
            return self._last_deep, self._verify

    def fresh_report_requested(self) -> bool:
        return self._fresh_report.is_set()

    def fresh_report_written(self) -> None:
        self._fresh_report.clear()
