"""The launcher's restart decisions: classification, the two budgets, crash loop, back-off."""

from __future__ import annotations

import signal

import pytest

from gpuguard.remediation.signatures import classify as read_last_words
from gpuguard.training.contract import EXIT_INFRASTRUCTURE
from gpuguard.training.restart_policy import (
    Cause,
    Restart,
    RestartBudget,
    RestartPolicy,
    RunResult,
    Stop,
    classify,
    describe,
    exit_status,
)

INFRA_CODES = RestartPolicy().infra_exit_codes


def ended(returncode: int, at: float = 100.0, *, step: int | None = None, **extra) -> RunResult:
    return RunResult(returncode, started_at=at - 10, ended_at=at, step=step, **extra)


@pytest.mark.parametrize(
    ("result", "cause"),
    [
        (ended(0), Cause.SUCCESS),
        (ended(75), Cause.INFRASTRUCTURE),
        (ended(69), Cause.INFRASTRUCTURE),
        (ended(-signal.SIGKILL), Cause.INFRASTRUCTURE),
        (ended(-signal.SIGTERM), Cause.INFRASTRUCTURE),
        (ended(1), Cause.APPLICATION),
        (ended(2), Cause.APPLICATION),
        (ended(-signal.SIGSEGV), Cause.APPLICATION),
        (ended(-signal.SIGABRT), Cause.APPLICATION),
        (ended(1, stalled=True), Cause.INFRASTRUCTURE),
        (ended(1, reported_code=75), Cause.INFRASTRUCTURE),
        (ended(1, reported_code=3), Cause.APPLICATION),
        (ended(0, reported_code=75), Cause.SUCCESS),  # the command itself finished
    ],
)
def test_classify(result, cause):
    assert classify(result, INFRA_CODES) is cause


def test_extra_infrastructure_exit_codes():
    assert classify(ended(42), INFRA_CODES | {42}) is Cause.INFRASTRUCTURE
    assert classify(ended(42), INFRA_CODES) is Cause.APPLICATION


def test_exit_status_and_description():
    assert exit_status(ended(-signal.SIGKILL)) == 137
    assert exit_status(ended(3)) == 3
    assert exit_status(ended(1, reported_code=75)) == 75  # what torchrun's 1 stands for
    assert exit_status(ended(0, reported_code=75)) == 0
    assert describe(ended(75)) == "exit 75 (preempted)"
    assert describe(ended(-9)) == "killed by SIGKILL"
    assert describe(ended(1, reported_code=69)) == "exit 1, a worker reported 69 (GPU lost)"
    assert "watchdog" in describe(ended(-9, stalled=True))


NCCL_LOST = read_last_words("NCCL error: remote process exited or there was a network error")
OUT_OF_MEMORY = read_last_words("torch.OutOfMemoryError: CUDA out of memory.")


def test_last_words_of_the_infrastructure_make_a_failure_an_interruption():
    assert classify(ended(1, last_words=NCCL_LOST), INFRA_CODES) is Cause.INFRASTRUCTURE
    assert classify(ended(1, last_words=OUT_OF_MEMORY), INFRA_CODES) is Cause.APPLICATION
    # A crash signal stays the job's, whatever it printed before it.
    assert classify(ended(-signal.SIGSEGV, last_words=NCCL_LOST), INFRA_CODES) is (
        Cause.APPLICATION
    )
    assert exit_status(ended(1, last_words=NCCL_LOST)) == EXIT_INFRASTRUCTURE
    assert exit_status(ended(1, last_words=OUT_OF_MEMORY)) == 1
    assert exit_status(ended(75, last_words=NCCL_LOST)) == 75  # a code of its own stands
    assert describe(ended(1, last_words=NCCL_LOST)) == (
        "exit 1, last words NCCL_REMOTE_ERROR (infrastructure): NCCL error: remote process "
        "exited or there was a network error"
    )


def test_application_errors_use_the_small_budget_and_report_the_jobs_status():
    budget = RestartBudget(RestartPolicy(app_retries=2, crash_loop_failures=100))
    assert isinstance(budget.after(ended(3, 10, step=5)), Restart)
    assert isinstance(budget.after(ended(3, 20, step=6)), Restart)
    stop = budget.after(ended(3, 30, step=7))
    assert isinstance(stop, Stop)
    assert stop.exit_status == 3
    assert "application budget spent (2 restarts allowed)" in stop.report
    assert "last run: exit 3" in stop.report
    assert "application errors 3" in stop.report


def test_interruptions_do_not_touch_the_application_budget():
    budget = RestartBudget(RestartPolicy(app_retries=1, infra_retries=10))
    for at in range(10):
        assert isinstance(budget.after(ended(75, at * 1000.0, step=at * 100)), Restart)
    assert isinstance(budget.after(ended(1, 20_000.0, step=2000)), Restart)
    assert isinstance(budget.after(ended(1, 30_000.0, step=3000)), Stop)
    assert (budget.infrastructure, budget.application) == (10, 2)


def test_the_infrastructure_budget_runs_out_too():
    budget = RestartBudget(RestartPolicy(infra_retries=2))
    results = [budget.after(ended(-9, at * 1000.0, step=at)) for at in range(1, 4)]
    assert [type(r) for r in results] == [Restart, Restart, Stop]
    assert results[-1].exit_status == 137
    assert "infrastructure budget spent (2 restarts allowed)" in results[-1].report


def test_a_crash_loop_without_progress_is_stopped_within_its_window():
    budget = RestartBudget(RestartPolicy(crash_loop_failures=3, crash_loop_window_s=60))
    assert isinstance(budget.after(ended(75, 10, step=100)), Restart)  # progress
    assert isinstance(budget.after(ended(75, 20, step=100)), Restart)  # none since
    assert isinstance(budget.after(ended(75, 30, step=90)), Restart)
    stop = budget.after(ended(75, 40, step=None))
    assert isinstance(stop, Stop)
    assert "crash loop, 3 failures in 20 s without progress past step 100" in stop.report
    assert stop.exit_status == 75


def test_failures_farther_apart_than_the_window_are_no_crash_loop():
    budget = RestartBudget(RestartPolicy(crash_loop_failures=2, crash_loop_window_s=60))
    for at in (100.0, 200.0, 300.0, 400.0):
        assert isinstance(budget.after(ended(75, at)), Restart)


def test_a_job_that_progresses_each_run_is_never_a_crash_loop():
    budget = RestartBudget(RestartPolicy(crash_loop_failures=2, crash_loop_window_s=600))
    for run in range(10):
        assert isinstance(budget.after(ended(-9, 1.0 + run, step=10 * (run + 1))), Restart)


def test_a_job_without_heartbeat_progresses_by_running_long_enough():
    budget = RestartBudget(RestartPolicy(crash_loop_failures=2, crash_loop_window_s=60))
    for at in (100.0, 200.0, 300.0):
        long_run = RunResult(75, started_at=at - 61, ended_at=at)
        assert isinstance(budget.after(long_run), Restart)
    assert isinstance(budget.after(RunResult(75, started_at=301, ended_at=302)), Restart)
    assert isinstance(budget.after(RunResult(75, started_at=303, ended_at=304)), Stop)


def test_backoff_doubles_without_progress_is_capped_and_starts_over_after_progress():
    budget = RestartBudget(
        RestartPolicy(backoff_s=1, backoff_max_s=5, crash_loop_failures=100, infra_retries=100)
    )
    delays = [budget.after(ended(75, at, step=50)).delay_s for at in range(1, 6)]
    assert delays == [1, 1, 2, 4, 5]  # the first run progressed; then no progress
    assert budget.after(ended(75, 7, step=60)).delay_s == 1


def test_success_stops_with_zero_and_a_summary():
    budget = RestartBudget(RestartPolicy())
    budget.after(ended(75, 10, step=10))
    stop = budget.after(ended(0, 20, step=40))
    assert isinstance(stop, Stop)
    assert stop.exit_status == 0
    assert stop.report == (
        "job finished after 2 runs: exit 0; infrastructure interruptions 1, "
        "application errors 0, best step 40"
    )
