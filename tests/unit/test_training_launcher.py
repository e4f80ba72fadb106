"""``gpuguard run`` end to end: a real NumPy training loop, a real subprocess under the real
launcher, interrupted by real signals; results compared byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuguard.cli import EXIT_USAGE, main
from gpuguard.training import CHECKPOINT_DIR_ENV, EXIT_INFRASTRUCTURE, Checkpointer
from tests.support.train_interruptions import (
    Interruption,
    interrupt,
    random_plan,
    read_runs,
    recomputed_steps,
)

REPO = Path(__file__).resolve().parents[2]
GPUGUARD = Path(sys.executable).with_name("gpuguard")
LOOP = REPO / "tests" / "support" / "train_loop.py"
STEPS = 240
INTERVAL = 20
STEP_SECONDS = 0.004
TIMEOUT_S = 60


def job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGUARD_")}
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")  # one core each, same sums
    return env


def loop_command(workdir: Path, *extra: str, step_seconds: float = STEP_SECONDS) -> list[str]:
    return [
        sys.executable,
        str(LOOP),
        "--steps",
        str(STEPS),
        "--interval",
        str(INTERVAL),
        "--step-seconds",
        str(step_seconds),
        "--log",
        str(workdir / "steps.log"),
        "--out",
        str(workdir / "params.bin"),
        *extra,
    ]


def start(workdir: Path, options: list[str], command: list[str]) -> subprocess.Popen[bytes]:
    output = (workdir / "launcher.out").open("ab")
    return subprocess.Popen(
        [
            str(GPUGUARD),
            "run",
            "--checkpoint-dir",
            str(workdir / "checkpoints"),
            "--backoff",
            "0.05",
            *options,
            "--",
            *command,
        ],
        stdout=output,
        stderr=subprocess.STDOUT,
        env=job_env(),
    )


def finish(launcher: subprocess.Popen[bytes], workdir: Path) -> tuple[int, str]:
    returncode = launcher.wait(timeout=TIMEOUT_S)
    return returncode, (workdir / "launcher.out").read_text()


def last_report(output: str) -> str:
    return [line for line in output.splitlines() if line.startswith("gpuguard run:")][-1]


@pytest.fixture(scope="module")
def reference_params(tmp_path_factory) -> bytes:
    """The parameters of an uninterrupted run."""
    workdir = tmp_path_factory.mktemp("reference")
    env = {**job_env(), CHECKPOINT_DIR_ENV: str(workdir / "checkpoints")}
    subprocess.run(loop_command(workdir, step_seconds=0), env=env, check=True, timeout=TIMEOUT_S)
    return (workdir / "params.bin").read_bytes()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_interrupted_training_ends_bit_identical(tmp_path, reference_params, mode):
    plan = random_plan(seed=11, count=6, first=10, last=STEPS - 10)
    assert {i.signal for i in plan} == {signal.SIGKILL, signal.SIGTERM}
    extra = ["--async"] if mode == "async" else []
    # --crash-loop 2: a job that makes progress between interruptions is no crash loop.
    launcher = start(tmp_path, ["--crash-loop", "2"], loop_command(tmp_path, *extra))
    interrupt(
        tmp_path / "steps.log",
        launcher,
        plan,
        seed=11,
        step_seconds=STEP_SECONDS,
        timeout_s=TIMEOUT_S,
    )
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 0, output
    assert (tmp_path / "params.bin").read_bytes() == reference_params
    runs = read_runs(tmp_path / "steps.log")
    assert [run.restart for run in runs] == list(range(len(plan) + 1))
    assert {step for run in runs for step in run.steps} == set(range(1, STEPS + 1))
    # An asynchronous save still being written when SIGKILL comes is lost: one more interval.
    bound = INTERVAL if mode == "sync" else 2 * INTERVAL
    for interruption, redone in zip(plan, recomputed_steps(runs), strict=True):
        if interruption.signal is signal.SIGTERM:
            assert redone == 0, (interruption, runs)  # it saved the step it had finished
        else:
            assert redone <= bound, (interruption, runs)
    assert last_report(output).startswith(
        "gpuguard run: job finished after 7 runs: exit 0; infrastructure interruptions 6, "
        "application errors 0"
    )


def test_sigterm_to_the_launcher_saves_stops_and_a_new_launcher_resumes(tmp_path, reference_params):
    launcher = start(tmp_path, [], loop_command(tmp_path))
    log = tmp_path / "steps.log"
    while not (runs := read_runs(log)) or not runs[0].steps or runs[0].steps[-1] < 50:
        assert launcher.poll() is None
        time.sleep(0.005)
    launcher.send_signal(signal.SIGTERM)  # the pod is going away
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 75, output
    assert "stopped: asked to stop (SIGTERM); last run: exit 75 (preempted)" in output
    assert "restarting" not in output
    runs = read_runs(log)
    assert len(runs) == 1
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    assert checkpointer.steps()[-1] == runs[0].steps[-1]

    # The newest checkpoint is damaged on disk; the replacement pod resumes from the one before.
    older, newest = checkpointer.steps()[-2:]
    manifest = json.loads((tmp_path / "checkpoints" / f"step-{newest:012d}.json").read_text())
    payload = tmp_path / "checkpoints" / manifest["payload"]
    payload.write_bytes(payload.read_bytes()[:-100])
    returncode, output = finish(start(tmp_path, [], loop_command(tmp_path)), tmp_path)

    assert returncode == 0, output
    assert f"skipping checkpoint {tmp_path}/checkpoints/step-{newest:012d}.json" in output
    runs = read_runs(log)
    assert runs[1].resumed_after == older
    assert 0 < recomputed_steps(runs)[0] <= INTERVAL
    assert (tmp_path / "params.bin").read_bytes() == reference_params


def test_the_watchdog_ends_a_stalled_job_and_the_restart_finishes_it(tmp_path, reference_params):
    options = ["--progress-timeout", "2", "--startup-timeout", "30", "--kill-grace", "0.5"]
    launcher = start(tmp_path, options, loop_command(tmp_path, "--hang-at", "30"))
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 0, output
    assert (
        "no progress for 2 s (at step 29): ending the job (SIGTERM, SIGKILL after 0.5 s)" in output
    )
    assert (
        "run 1 ended: killed by SIGKILL, after the watchdog ended it for making no progress; "
        "infrastructure interruption 1 of 50 allowed"
    ) in output
    runs = read_runs(tmp_path / "steps.log")
    assert len(runs) == 2
    assert runs[0].steps[-1] == 29
    assert runs[1].resumed_after == INTERVAL
    assert (tmp_path / "params.bin").read_bytes() == reference_params


def test_application_errors_exhaust_their_budget_preemptions_do_not(tmp_path):
    launcher = start(tmp_path, ["--app-retries", "1"], loop_command(tmp_path, "--fail-at", "150"))
    preemptions = [Interruption(40, signal.SIGTERM), Interruption(90, signal.SIGTERM)]
    interrupt(
        tmp_path / "steps.log",
        launcher,
        preemptions,
        seed=3,
        step_seconds=STEP_SECONDS,
        timeout_s=TIMEOUT_S,
    )
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 1, output
    assert "RuntimeError: loss became NaN at step 150" in output
    assert last_report(output) == (
        "gpuguard run: stopped after 4 runs: application budget spent (1 restart allowed); "
        "last run: exit 1, last words PYTHON_TRACEBACK (application): RuntimeError: loss "
        "became NaN at step 150; infrastructure interruptions 2, application errors 2, "
        "best step 149; exit status 1"
    )
    assert len(read_runs(tmp_path / "steps.log")) == 4


def test_a_crash_loop_is_stopped(tmp_path):
    launcher = start(tmp_path, ["--crash-loop", "3"], ["sh", "-c", "echo started; exit 75"])
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 75, output
    assert output.count("started") == 3
    assert "stopped after 3 runs: crash loop, 3 failures in" in last_report(output)


# Stands for torchrun: passes SIGTERM on to its worker, exits 1 when the worker fails.
TORCHRUN_LIKE = (
    "import signal, subprocess, sys; worker = subprocess.Popen(sys.argv[1:]); "
    "signal.signal(signal.SIGTERM, lambda *_: worker.send_signal(signal.SIGTERM)); "
    "sys.exit(1 if worker.wait() else 0)"
)


def test_a_preemption_reported_through_a_wrapper_counts_and_is_the_exit_status(
    tmp_path, reference_params
):
    command = [sys.executable, "-c", TORCHRUN_LIKE, *loop_command(tmp_path)]
    launcher = start(tmp_path, ["--app-retries", "0"], command)
    log = tmp_path / "steps.log"
    interrupt(
        log,
        launcher,
        [Interruption(60, signal.SIGTERM)],  # to the worker: the wrapper exits 1
        seed=1,
        step_seconds=STEP_SECONDS,
        timeout_s=TIMEOUT_S,
    )
    while read_runs(log)[-1].steps[-1:] < [100]:
        assert launcher.poll() is None
        time.sleep(0.005)
    launcher.send_signal(signal.SIGTERM)  # the pod goes away; the wrapper passes it on
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 75, output  # the worker's word, not the wrapper's 1
    assert "run 1 ended: exit 1, a worker reported 75 (preempted); infrastructure" in output
    assert "stopped: asked to stop (SIGTERM); last run: exit 1, a worker reported 75" in output
    returncode, output = finish(start(tmp_path, [], command), tmp_path)
    assert returncode == 0, output
    assert recomputed_steps(read_runs(log)) == [0, 0]
    assert (tmp_path / "params.bin").read_bytes() == reference_params


def test_processes_the_job_left_behind_are_ended(tmp_path):
    """A worker in a session of its own (as torchrun starts them) outlives its parent."""
    pid_file = tmp_path / "worker.pid"
    spawn = (
        "import subprocess, sys; "
        "worker = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        "open(sys.argv[1], 'w').write(str(worker.pid)); sys.exit(3)"
    )
    launcher = start(tmp_path, ["--app-retries", "0"], [sys.executable, "-c", spawn, str(pid_file)])
    returncode, output = finish(launcher, tmp_path)

    assert returncode == 3, output
    worker = int(pid_file.read_text())
    assert not _alive(worker), f"worker {worker} survived the launcher"


def test_exit_status_of_a_signal_and_of_a_missing_command(tmp_path):
    launcher = start(tmp_path, ["--app-retries", "0"], ["sh", "-c", "kill -SEGV $$"])
    returncode, output = finish(launcher, tmp_path)
    assert returncode == 128 + signal.SIGSEGV, output
    assert "last run: killed by SIGSEGV" in output

    returncode, output = finish(start(tmp_path, [], ["no-such-command-here"]), tmp_path)
    assert returncode == 127
    assert "cannot start 'no-such-command-here'" in output


def test_a_transport_error_as_last_words_is_an_interruption_and_the_infrastructure_status(
    tmp_path,
):
    """The worker's own exit 1 after an NCCL error: counted against the infrastructure's
    budget, and the launcher's status is the one a podFailurePolicy ignores."""
    script = (
        "import sys; print('step 10', flush=True); "
        "print('NCCL error: remote process exited or there was a network error', "
        "file=sys.stderr); sys.exit(1)"
    )
    launcher = start(tmp_path, ["--infra-retries", "1"], [sys.executable, "-c", script])
    returncode, output = finish(launcher, tmp_path)
    assert returncode == EXIT_INFRASTRUCTURE, output
    assert output.count("NCCL error: remote process exited") >= 2  # passed through, twice
    assert "infrastructure interruption 1 of 1 allowed" in output
    assert "infrastructure budget spent" in last_report(output)


def test_usage_errors_name_the_problem(capsys):
    assert main(["run"]) == EXIT_USAGE
    assert "no command to run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", "--backoff", "soon", "--", "true"])
    assert exited.value.code == EXIT_USAGE
    assert "--backoff: 'soon' is not a number" in capsys.readouterr().err


def test_the_job_side_needs_only_the_standard_library():
    """A training image has torch, not gpuguard's service dependencies."""
    probe = (
        "import sys, gpuguard.training, gpuguard.training.launcher; "
        "heavy = {'pydantic', 'msgspec', 'lightkube', 'yaml', 'prometheus_client', 'numpy', "
        "'torch', 'gpuguard.config', 'gpuguard.kube', 'gpuguard.cli'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
