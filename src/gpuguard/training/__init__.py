"""Job-side recovery: checkpoints, preemption handling and a progress heartbeat.

A training script uses three small pieces, with the standard library alone (NumPy or
PyTorch only when its state holds their objects)::

    from gpuguard.training import Checkpointer, Heartbeat, Preemption

    checkpointer = Checkpointer(keep=3, asynchronous=True)   # $GPUGUARD_CHECKPOINT_DIR
    restored = checkpointer.restore()
    start = restored.step + 1 if restored else 0
    heartbeat = Heartbeat()
    with Preemption() as preemption:
        for step in range(start, total_steps):
            train_one_step(step)
            heartbeat.beat(step)
            if preemption.should_stop():
                checkpointer.save(step, state, blocking=True)
                preemption.exit()                            # exit status 75
            if step % interval == 0:
                checkpointer.save(step, state)
    checkpointer.close()

and runs under ``gpuguard run --checkpoint-dir DIR -- python train.py`` (see launcher.py).
"""

from gpuguard.training.checkpoint import Checkpointer, CheckpointError, Restored
from gpuguard.training.contract import (
    CHECKPOINT_DIR_ENV,
    EXIT_GPU_LOST,
    EXIT_PREEMPTED,
    EXIT_REASON_FILE_ENV,
    HEARTBEAT_FILE_ENV,
    RESTART_COUNT_ENV,
)
from gpuguard.training.exits import exit_gpu_lost, exit_preempted
from gpuguard.training.heartbeat import Heartbeat
from gpuguard.training.preemption import Preemption

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "EXIT_GPU_LOST",
    "EXIT_PREEMPTED",
    "EXIT_REASON_FILE_ENV",
    "HEARTBEAT_FILE_ENV",
    "RESTART_COUNT_ENV",
    "CheckpointError",
    "Checkpointer",
    "Heartbeat",
    "Preemption",
    "Restored",
    "exit_gpu_lost",
    "exit_preempted",
]
