"""Runs checks isolated, each under a hard timeout, and turns their results into layer health.

Fail closed: a check that hangs, crashes, or returns garbage becomes an explicit finding
(``CHECK_TIMED_OUT``, ``CHECK_FAILED``, ``OUTPUT_UNPARSEABLE``) that keeps its layer from
being Healthy. Each check runs in its own thread (a check run again and again, in one
long-lived worker thread of its own); if one is stuck where it cannot be interrupted (an
NVML call blocked in the driver), the runner abandons it at its deadline and still returns
on time.
"""

from __future__ import annotations

import datetime
import queue
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuguard.checks.base import Check, CheckContext, Fallback
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.config import Config
from gpuguard.errors import (
    CheckError,
    CheckFailed,
    CheckTimedOut,
    NotApplicable,
    ParseError,
    ToolMissing,
)
from gpuguard.model import (
    NODE,
    OUTCOME_CODES,
    Action,
    CheckResult,
    Finding,
    Layer,
    NodeReport,
    Outcome,
    Severity,
    assess_layer,
)
from gpuguard.plugins_config import PLUGIN_PREFIX
from gpuguard.sources import Sources

# Checks that only add evidence about a layer others diagnose: a job's verdicts and the
# load-clock comparison see nothing while nothing runs, so their answer never vouches for
# the layer (a node whose NVML, nvidia-smi and DCGM all fail must not read as healthy).
# The maintenance check speaks of the cloud's plans, never of the host's health; a plugin
# adds a team's own evidence, never stands in for the built-in checks.
SUPPLEMENTARY = frozenset({"in-job", "load-clocks", "maintenance"})

# Time a check gets past its own timeout to notice it and report (its tools are killed
# at the timeout itself; this margin only matters for checks stuck in-process).
GRACE_S = 0.5

_OUTCOME_FOR_ERROR: tuple[tuple[type[CheckError], Outcome], ...] = (
    (ToolMissing, Outcome.TOOL_MISSING),
    (NotApplicable, Outcome.NOT_APPLICABLE),
    (CheckTimedOut, Outcome.TIMED_OUT),
    (ParseError, Outcome.UNPARSEABLE),
    (CheckFailed, Outcome.FAILED),
)


def run_check(check: Check, ctx: CheckContext) -> CheckResult:
    """One check under its timeout; never raises and never takes much longer than it."""
    return _collect(_start(check, ctx))


def run_all(
    checks: Sequence[Check],
    sources: Sources,
    config: Config,
    fallbacks: Sequence[Fallback] = (),
) -> NodeReport:
    """Run every check (concurrently), then the fallbacks that are needed; assess layers."""
    secondary = {f.check for f in fallbacks}
    first_wave = [c for c in checks if c.name not in secondary]
    results = [_collect(p) for p in [_start(c, _context(c, sources, config)) for c in first_wave]]
    answered = {r.check for r in results if r.answered}
    for fallback in fallbacks:
        check = next((c for c in checks if c.name == fallback.check), None)
        if check is None:
            continue
        if fallback.primary not in answered or config.cross_check:
            results.append(run_check(check, _context(check, sources, config)))
    order = [c.name for c in checks]
    results.sort(key=lambda r: order.index(r.check))
    return assess(results, fail_closed=config.fail_closed)


def assess(results: Sequence[CheckResult], *, fail_closed: bool) -> NodeReport:
    """Layer health from check results: findings go to the layer they are about."""
    findings = _deduplicate([f for r in results for f in r.findings])
    layers = {}
    for layer in Layer:
        own = [r for r in results if r.layer is layer]
        layers[layer] = assess_layer(
            layer,
            [f for f in findings if f.layer is layer],
            answered_by=[r.check for r in own if r.answered and vouches(r.check)],
            not_answered=[f"{r.check} ({r.outcome})" for r in own if not r.answered],
            fail_closed=fail_closed,
        )
    return NodeReport(layers, list(results))


def vouches(check: str) -> bool:
    """Can this check's answer alone make its layer's verdict (see SUPPLEMENTARY)?"""
    return check not in SUPPLEMENTARY and not check.startswith(PLUGIN_PREFIX)


def _deduplicate(findings: list[Finding]) -> list[Finding]:
    """Keep the first report of each (code, component): sources overlap on purpose.

    Findings about a check's own outcome (``TOOL_MISSING`` …) are per check, never merged.
    """
    seen: set[tuple[str, str, str, str]] = set()
    unique = []
    for finding in findings:
        own_outcome = finding.code in _OUTCOME_FINDING_CODES
        key = (
            finding.code,
            finding.component.kind,
            finding.component.id,
            finding.source if own_outcome else "",
        )
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique


_OUTCOME_FINDING_CODES = frozenset(OUTCOME_CODES.values())


def _context(check: Check, sources: Sources, config: Config) -> CheckContext:
    return CheckContext(sources=sources, config=config, timeout_s=config.timeout_for(check.name))


@dataclass
class _Pending:
    """One run of a check: ``done`` is set once it returned or raised into ``box``."""

    check: Check
    ctx: CheckContext
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    box: dict[str, object] = field(default_factory=dict)


def _start(check: Check, ctx: CheckContext) -> _Pending:
    pending = _Pending(check, ctx, SYSTEM_CLOCK.monotonic())
    thread = threading.Thread(
        target=_run_into, args=(pending,), name=f"check-{check.name}", daemon=True
    )
    thread.start()
    return pending


def _run_into(pending: _Pending) -> None:
    try:
        pending.box["findings"] = pending.check.run(pending.ctx)
    except BaseException as exc:  # a broken check is a verdict, not a crash
        pending.box["error"] = exc
    finally:
        pending.done.set()


def _collect(pending: _Pending) -> CheckResult:
    deadline = pending.started + pending.ctx.timeout_s + GRACE_S
    finished = pending.done.wait(max(0.0, deadline - SYSTEM_CLOCK.monotonic()))
    elapsed = SYSTEM_CLOCK.monotonic() - pending.started
    check = pending.check
    if not finished:
        return _inconclusive(
            check,
            Outcome.TIMED_OUT,
            f"{check.name}: no result after {pending.ctx.timeout_s:g}s; abandoned",
            elapsed,
        )
    error = pending.box.get("error")
    if error is None:
        findings = pending.box.get("findings")
        if not isinstance(findings, list):
            return _inconclusive(
                check, Outcome.FAILED, f"{check.name}: returned no findings list", elapsed
            )
        return CheckResult(check.name, check.layer, Outcome.OK, findings, elapsed)
    for error_type, outcome in _OUTCOME_FOR_ERROR:
        if isinstance(error, error_type):
            return _inconclusive(check, outcome, f"{check.name}: {error}", elapsed)
    detail = f"{check.name}: internal error: {type(error).__name__}: {error}"
    return _inconclusive(check, Outcome.FAILED, detail, elapsed)


def _inconclusive(check: Check, outcome: Outcome, detail: str, elapsed: float) -> CheckResult:
    return inconclusive_result(check.name, check.layer, outcome, detail, elapsed)


def inconclusive_result(
    name: str, layer: Layer, outcome: Outcome, detail: str, elapsed: float
) -> CheckResult:
    """The result of a check that gave no verdict, with the finding that says why."""
    # Missing tools and absent hardware are facts, not faults; the rest block "Healthy".
    quiet = outcome in (Outcome.TOOL_MISSING, Outcome.NOT_APPLICABLE)
    finding = Finding(
        layer=layer,
        code=OUTCOME_CODES[outcome],
        severity=Severity.INFO if quiet else Severity.WARNING,
        action=Action.NONE,
        component=NODE,
        source=name,
        message=detail,
    )
    return CheckResult(name, layer, outcome, [finding], elapsed, detail)


class _Worker:
    """A daemon thread that runs the runs handed to it, one after another, until closed:
    starting a thread for every run cost more CPU than most checks' runs."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(self._jobs,), name=name, daemon=True).start()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Pending | None]) -> None:
        while (job := jobs.get()) is not None:
            _run_into(job)

    def submit(self, check: Check, ctx: CheckContext) -> _Pending:
        pending = _Pending(check, ctx, SYSTEM_CLOCK.monotonic())
        self._jobs.put(pending)
        return pending

    def close(self) -> None:
        """The thread ends after the run it is in, if any."""
        self._jobs.put(None)


class RepeatingCheck:
    """Runs one check again and again (the agent's schedule) without piling up stuck runs.

    The runs take turns on one worker thread. If the previous run is still blocked past its
    timeout (abandoned, not killed), the next run does not start another copy: it reports
    the check as still timed out, and the worker takes the next run once the stuck one
    returns. A tool that outlives its kill is kept in sight the same way, by
    ``tool_process``: the check runs, but that tool is not started again until the stuck
    one exits.
    """

    def __init__(self, check: Check, ctx: CheckContext) -> None:
        self.check = check
        self.ctx = ctx
        self._stuck: _Pending | None = None
        self._worker = _Worker(f"check-{check.name}")
        weakref.finalize(self, self._worker.close)

    def run_once(self) -> CheckResult:
        if self._stuck is not None and not self._stuck.done.is_set():
            waited = SYSTEM_CLOCK.monotonic() - self._stuck.started
            since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=waited)
            detail = (
                f"{self.check.name}: the previous run has not exited yet (stuck since"
                f" {since:%Y-%m-%dT%H:%M:%SZ}, {waited:.0f}s); not started again"
            )
            return _inconclusive(self.check, Outcome.TIMED_OUT, detail, 0.0)
        pending = self._worker.submit(self.check, self.ctx)
        result = _collect(pending)
        self._stuck = None if pending.done.is_set() else pending
        return result

    def close(self) -> None:
        """No more runs: the worker thread ends (after a stuck run, once it returns)."""
        self._worker.close()
