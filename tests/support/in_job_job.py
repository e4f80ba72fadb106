"""A multi-rank NumPy job with the in-job monitor on, each rank a process of
tests/support/in_job_rank.py talking to the others on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.controlplane import free_port

RANK_SCRIPT = Path(__file__).with_name("in_job_rank.py")


def start_ranks(
    world_size: int,
    steps: int,
    reports: Path,
    identity: Callable[[int], dict[str, str]],
    *options: str,
) -> list[subprocess.Popen[str]]:
    """Every rank, started; ``identity(rank)``: its NODE_NAME, GPUGUARD_GPU_PCI_BUS_ID,
    GPUGUARD_JOB and GPUGUARD_IN_JOB_DIR. Rank N reports to ``reports/rankN.json``."""
    exchange_port, allreduce_port = free_port(), free_port()
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "GPUGUARD_EXCHANGE_PORT": str(exchange_port),
            **identity(rank),
        }
        command = [
            sys.executable,
            str(RANK_SCRIPT),
            f"--steps={steps}",
            f"--allreduce-port={allreduce_port}",
            f"--report={reports / f'rank{rank}.json'}",
            *options,
        ]
        processes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    return processes


def stop_ranks(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
