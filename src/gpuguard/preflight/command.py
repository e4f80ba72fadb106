"""``gpuguard preflight``: the command the ``gpuguard-preflight`` init container runs.

It runs the deep (load) checks on the pod's GPUs within ``--budget``, then, with
``--gang``, the cross-node all-reduce check; writes a ``PreflightResult`` to the
termination log; prints one line (or the result's JSON); exits 0 on a pass. Fail closed:
a check that hangs or crashes is a failure, and a hard deadline past every check's own
limit writes a failed result and ends the process whatever is stuck.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from gpuguard.checks.base import Check
from gpuguard.checks.gang.series import GangSettings, Hook
from gpuguard.config import Config, load_config
from gpuguard.contract.preflight import FAILED, NOT_EQUIPPED, PreflightResult
from gpuguard.model import CHECK_TIMED_OUT, OUTCOME_CODES
from gpuguard.preflight.verdict import local_result, with_gang
from gpuguard.runner import GRACE_S, run_all
from gpuguard.sources import LiveSources

EXIT_PASSED = 0
EXIT_FAILED = 1  # a fault found: a finding, or the member the gang waited on
EXIT_NO_VERDICT = 2  # a check hung or crashed, or the hard deadline passed
TERMINATION_LOG = Path("/dev/termination-log")  # the kubelet's default terminationMessagePath
DEADLINE_MARGIN_S = 10.0  # past the checks' own limits: the runner abandons them before


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget", type=_positive, required=True, metavar="S", help="time the load checks may take"
    )
    parser.add_argument(
        "--gang",
        action="store_true",
        help="then the cross-node all-reduce check (docs/gang-check.md)",
    )
    parser.add_argument(
        "--gang-timeout",
        type=_positive,
        default=GangSettings.timeout_s,
        metavar="S",
        help="how long to wait for every gang member (default %(default)g); then a note, a pass",
    )
    parser.add_argument(
        "--gang-expected-gbps",
        type=_positive,
        metavar="G",
        help="the all-reduce bus bandwidth the fleet expects, Gb/s (default: the gang's median)",
    )
    parser.add_argument(
        "--gang-mib",
        type=int,
        default=GangSettings.nbytes >> 20,
        metavar="MIB",
        help="size of each all-reduce, MiB (default %(default)d)",
    )
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=TERMINATION_LOG,
        metavar="PATH",
        help="where the result goes (default %(default)s)",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    parser.add_argument("--json", action="store_true", help="print the result's JSON")


def run_preflight(
    args: argparse.Namespace,
    checks: Sequence[Check] | None = None,
    gang_hook: Hook | None = None,
) -> int:
    """Run it; ``checks`` (the deep checks by default) and ``gang_hook`` are for tests."""
    config = load_config(args.config)
    config = config.with_overrides(deep={**config.deep.model_dump(), "budget_s": args.budget})
    if checks is None:
        from gpuguard.checks.load.checks import deep_checks

        checks = deep_checks()
    settings = GangSettings(
        nbytes=max(1, args.gang_mib) << 20,
        timeout_s=args.gang_timeout,
        expected_gbps=args.gang_expected_gbps,
    )
    reporter = _Reporter(args.termination_log, args.json)
    deadline_s = _deadline(config, checks, settings if args.gang else None)
    watchdog = threading.Timer(deadline_s, reporter.deadline, args=(deadline_s,))
    watchdog.daemon = True
    watchdog.start()
    try:
        result = _run(args, config, checks, settings, gang_hook)
    finally:
        watchdog.cancel()
    return reporter.finish(result)


def _run(
    args: argparse.Namespace,
    config: Config,
    checks: Sequence[Check],
    settings: GangSettings,
    gang_hook: Hook | None,
) -> PreflightResult:
    result = local_result(run_all(checks, LiveSources(config), config).results)
    if result.failed or not args.gang:
        return result
    from gpuguard.checks.gang.rendezvous import GangConfigError, gang_spec
    from gpuguard.checks.gang.series import run_gang

    try:
        spec = gang_spec(os.environ)
    except GangConfigError as exc:
        # The node is fine; the pod does not describe a gang: skip, never fail the node.
        note = f"gang check skipped: {exc}; {result.message}"
        return PreflightResult(result.status, result.codes, result.gpus, (), note)
    return with_gang(result, spec, run_gang(spec, settings, gang_hook))


def _deadline(config: Config, checks: Sequence[Check], gang: GangSettings | None) -> float:
    """Every check's own limit (the runner abandons it there), the gang's, and a margin."""
    local = max((config.timeout_for(c.name) for c in checks), default=0.0) + GRACE_S
    together = local + (gang.timeout_s * 2 + 30 if gang is not None else 0.0)
    return together + DEADLINE_MARGIN_S


class _Reporter:
    """Writes the one result, once: the verdict, or the watchdog's failure if first."""

    def __init__(self, log: Path, as_json: bool) -> None:
        self._log = log
        self._json = as_json
        self._lock = threading.Lock()
        self._done = False

    def finish(self, result: PreflightResult) -> int:
        with self._lock:
            if self._done:  # the watchdog has written and is ending the process
                threading.Event().wait()
            self._done = True
            return self._report(result)

    def deadline(self, deadline_s: float) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            message = f"no verdict within the hard deadline ({deadline_s:g}s); stuck work abandoned"
            code = self._report(PreflightResult(FAILED, (CHECK_TIMED_OUT,), message=message))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # a check stuck in the driver cannot be joined: end the process

    def _report(self, result: PreflightResult) -> int:
        text = result.encode()
        try:
            self._log.write_text(text)
        except OSError as exc:
            print(
                f"gpuguard preflight: cannot write the result to {self._log}:"
                f" {exc.strerror or exc}",
                file=sys.stderr,
            )
        print(text if self._json else _summary(result), flush=True)
        if not result.failed:
            return EXIT_PASSED
        no_verdict = {*OUTCOME_CODES.values(), NOT_EQUIPPED}
        return EXIT_NO_VERDICT if set(result.codes) <= no_verdict else EXIT_FAILED


def _summary(result: PreflightResult) -> str:
    parts = [f"gpuguard preflight: {result.status}"]
    if result.codes:
        parts.append(f"codes {','.join(result.codes)}")
    if result.gpus:
        parts.append(f"gpus {','.join(result.gpus)}")
    if result.slow_nodes:
        parts.append(f"slow nodes {','.join(result.slow_nodes)}")
    return " ".join(parts) + (f": {result.message}" if result.message else "")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0")
    return value
