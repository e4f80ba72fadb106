"""Command-line options of ``gpuguard run`` (also ``python -m gpuguard.training.launcher``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuguard.training.contract import (
    CHECKPOINT_DIR_ENV,
    EXIT_GPU_LOST,
    EXIT_INFRASTRUCTURE,
    EXIT_PREEMPTED,
    EXIT_REASON_FILE_ENV,
    HEARTBEAT_FILE_ENV,
    RESTART_COUNT_ENV,
)
from gpuguard.training.restart_policy import RestartPolicy

DEFAULTS = RestartPolicy()
DEFAULT_KILL_GRACE_S = 30.0

EPILOG = f"""\
environment given to COMMAND:
  {CHECKPOINT_DIR_ENV}    the --checkpoint-dir (when given)
  {RESTART_COUNT_ENV}     restarts so far: 0 on the first run
  {HEARTBEAT_FILE_ENV}    where gpuguard.training.Heartbeat reports the step
  {EXIT_REASON_FILE_ENV}  where a worker records exit {EXIT_PREEMPTED}/{EXIT_GPU_LOST}

infrastructure interruptions: exit {EXIT_PREEMPTED} (preempted), exit {EXIT_GPU_LOST} (GPU lost), \
--infra-exit-code,
  SIGKILL, SIGTERM, no progress for --progress-timeout, and a failure whose last words on
  stderr are a transport or device error (NCCL, InfiniBand, EFA, a lost GPU); anything
  else is an application error. SIGTERM, SIGINT and SIGHUP to gpuguard run are passed to
  COMMAND (SIGHUP as SIGTERM) and stop the restarts; a second one kills the job.

exit status: COMMAND's own (128+N when a signal N ended it); {EXIT_INFRASTRUCTURE} when it failed
with a transport or device error as its last words (a podFailurePolicy rule can ignore
it, see examples/jobs/); 127 when COMMAND cannot be found, 126 when it cannot be run, 64
for bad usage. See docs/training.md.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help=f"created if missing and exported to COMMAND as {CHECKPOINT_DIR_ENV}",
    )
    _add_restart_arguments(parser)
    _add_watchdog_arguments(parser)
    parser.add_argument(
        "job_command",  # not "command": the gpuguard CLI keeps its subcommand there
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the training command and its arguments",
    )


def _add_restart_arguments(parser: argparse.ArgumentParser) -> None:
    """How many restarts, after what, how far apart; when a crash loop stops them."""
    restarts = parser.add_argument_group("restarts")
    restarts.add_argument(
        "--infra-retries",
        type=_count,
        default=DEFAULTS.infra_retries,
        metavar="N",
        help="restarts after infrastructure interruptions (default %(default)s)",
    )
    restarts.add_argument(
        "--app-retries",
        type=_count,
        default=DEFAULTS.app_retries,
        metavar="N",
        help="restarts after application errors (default %(default)s)",
    )
    restarts.add_argument(
        "--infra-exit-code",
        type=_exit_code,
        action="append",
        default=[],
        metavar="CODE",
        help="count this exit status of COMMAND as an infrastructure interruption too (repeatable)",
    )
    restarts.add_argument(
        "--backoff",
        type=_seconds,
        default=DEFAULTS.backoff_s,
        metavar="S",
        help="delay before the first restart; doubles after each failure without progress "
        "(default %(default)s)",
    )
    restarts.add_argument(
        "--backoff-max",
        type=_seconds,
        default=DEFAULTS.backoff_max_s,
        metavar="S",
        help="longest delay between restarts (default %(default)s)",
    )
    restarts.add_argument(
        "--crash-loop",
        type=_positive_count,
        default=DEFAULTS.crash_loop_failures,
        metavar="N",
        help="stop after N failures in a row without progress within --crash-loop-window "
        "(default %(default)s)",
    )
    restarts.add_argument(
        "--crash-loop-window",
        type=_positive_seconds,
        default=DEFAULTS.crash_loop_window_s,
        metavar="S",
        help="the time span of --crash-loop (default %(default)s)",
    )


def _add_watchdog_arguments(parser: argparse.ArgumentParser) -> None:
    """When a job that makes no progress is ended, and how."""
    watchdog = parser.add_argument_group("watchdog")
    watchdog.add_argument(
        "--progress-timeout",
        type=_positive_seconds,
        metavar="S",
        help="end the job when its heartbeat has not moved for S seconds (default: off)",
    )
    watchdog.add_argument(
        "--startup-timeout",
        type=_positive_seconds,
        metavar="S",
        help="time allowed before the first heartbeat of a run (default: --progress-timeout)",
    )
    watchdog.add_argument(
        "--kill-grace",
        type=_seconds,
        default=DEFAULT_KILL_GRACE_S,
        metavar="S",
        help="from the watchdog's SIGTERM to its SIGKILL (default %(default)s)",
    )


def _count(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return int(value)


def _positive_count(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _exit_code(text: str) -> int:
    value = _count(text)
    if not 1 <= value <= 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exit status (1-255)")
    return value


def _seconds(text: str) -> float:
    value = _number(text, float)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return float(value)


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
