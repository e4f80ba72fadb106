"""What the launcher and a training job agree on: environment variables and exit codes.

Kept in one place, free of imports, so that a job can read it without gpuguard's other
dependencies and the launcher cannot drift from what the library writes.
"""

from __future__ import annotations

# Set by `gpuguard run` for the job it starts.
CHECKPOINT_DIR_ENV = "GPUGUARD_CHECKPOINT_DIR"
"""Where the job keeps its checkpoints (set when ``--checkpoint-dir`` is given)."""
RESTART_COUNT_ENV = "GPUGUARD_RESTART_COUNT"
"""How many times the launcher has restarted the job: 0 on the first run."""
HEARTBEAT_FILE_ENV = "GPUGUARD_HEARTBEAT_FILE"
"""The file `Heartbeat.beat` writes the job's step to, for the launcher's watchdog."""
EXIT_REASON_FILE_ENV = "GPUGUARD_EXIT_REASON_FILE"
"""Where `exit_preempted` / `exit_gpu_lost` write their code, for when a wrapper such as
``torchrun`` replaces the worker's exit status with its own."""

# Exit codes a job uses to say "this was not my fault" (BSD sysexits values, so that they
# do not collide with a Python exception's 1 or a usage error's 2).
EXIT_PREEMPTED = 75
"""EX_TEMPFAIL: the job was asked to stop, saved a checkpoint, and wants to be resumed."""
EXIT_GPU_LOST = 69
"""EX_UNAVAILABLE: the job lost its GPU (a CUDA error such as Xid 79) and cannot go on here."""
EXIT_INFRASTRUCTURE = 76
"""EX_PROTOCOL: ``gpuguard run``'s own verdict: the job's last words were a transport or
device error (gpuguard.remediation.signatures), so the failure is the infrastructure's."""
