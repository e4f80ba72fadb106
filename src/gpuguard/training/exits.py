"""Ending a job for a reason that is not its own fault, in a way the launcher can tell.

The exit code alone is not enough: ``torchrun`` (and a shell script in between) turns any
worker's failure into its own exit status 1. So the job also writes the code to
``$GPUGUARD_EXIT_REASON_FILE`` when the launcher provides one; the launcher reads it after
the run and counts the run as an infrastructure interruption.
"""

from __future__ import annotations

import os
from typing import NoReturn

from gpuguard.training.contract import EXIT_GPU_LOST, EXIT_PREEMPTED, EXIT_REASON_FILE_ENV


def exit_preempted() -> NoReturn:
    """Exit with `EXIT_PREEMPTED` (75): stopped on request, checkpoint saved, resume me."""
    _exit_for_infrastructure(EXIT_PREEMPTED)


def exit_gpu_lost() -> NoReturn:
    """Exit with `EXIT_GPU_LOST` (69): the GPU failed under the job (e.g. a CUDA error
    after Xid 79); the job should be restarted, on another node if need be."""
    _exit_for_infrastructure(EXIT_GPU_LOST)


def _exit_for_infrastructure(code: int) -> NoReturn:
    path = os.environ.get(EXIT_REASON_FILE_ENV)
    if path:
        with open(path, "w") as reason:
            reason.write(f"{code}\n")
    raise SystemExit(code)
