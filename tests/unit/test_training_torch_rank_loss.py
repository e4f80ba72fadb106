"""A real torch.distributed run (DDP over gloo, three CPU processes under torchrun) under
``gpuguard run`` loses a rank to SIGKILL and resumes from its last checkpoint, having lost
at most one checkpoint interval of work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.train_interruptions import read_runs, recomputed_steps

REPO = Path(__file__).resolve().parents[2]
GPUGUARD = Path(sys.executable).with_name("gpuguard")
LOOP = REPO / "tests" / "support" / "torch_ddp_loop.py"
STEPS = 60
INTERVAL = 10
KILL_AFTER = 25  # rank 0 has logged this step: past two checkpoints, between two more
TIMEOUT_S = 240


def wait_for_step(log: Path, launcher: subprocess.Popen[bytes], step: int, run: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        runs = read_runs(log)
        if len(runs) >= run and runs[run - 1].steps and runs[run - 1].steps[-1] >= step:
            return
        assert launcher.poll() is None, (log.parent / "launcher.out").read_text()
        assert time.monotonic() < deadline, f"run {run} did not reach step {step}"
        time.sleep(0.02)


def test_a_run_that_loses_a_rank_resumes_from_its_last_checkpoint(tmp_path):
    log, victim = tmp_path / "steps.log", tmp_path / "victim.pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGUARD_", "TORCHELASTIC"))}
    # Loopback only: gloo's and the rendezvous's sockets.
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    command = [
        str(GPUGUARD),
        "run",
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--backoff",
        "0.05",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=3",
        "--max-restarts=0",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "--monitor-interval=0.1",
        str(LOOP),
        f"--steps={STEPS}",
        f"--interval={INTERVAL}",
        f"--progress-log={log}",
        f"--victim-pid={victim}",
    ]
    with (tmp_path / "launcher.out").open("wb") as output:
        launcher = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_step(log, launcher, KILL_AFTER, run=1)
        killed_at = time.monotonic()
        os.kill(int(victim.read_text()), signal.SIGKILL)  # rank 1 is gone
        wait_for_step(log, launcher, 1, run=2)
        resumed_s = time.monotonic() - killed_at
        returncode = launcher.wait(timeout=TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output_text = (tmp_path / "launcher.out").read_text()
    assert returncode == 0, output_text

    runs = read_runs(log)
    assert len(runs) == 2, output_text
    lost = recomputed_steps(runs)[0]
    resumed_after = runs[1].resumed_after
    assert resumed_after >= KILL_AFTER - KILL_AFTER % INTERVAL  # the last checkpoint, no older
    assert 0 <= lost <= INTERVAL, (runs[0].steps[-1], resumed_after)
    assert runs[1].steps == list(range(resumed_after + 1, STEPS + 1))  # finished, in order
    print(
        f"rank lost after step {runs[0].steps[-1]}; resumed after step {resumed_after} "
        f"({lost} steps recomputed of a {INTERVAL}-step interval), "
        f"{resumed_s:.1f} s from the kill to the resumed run's first step"
    )
