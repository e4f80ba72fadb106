"""Job-side recovery: checkpoints, preemption handling and a progress heartbeat; and
in-job detection of a slow or silently wrong GPU.

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

A `JobMonitor` finds, while the job runs, the rank whose GPU computes slower than its
peers' (FAIL_SLOW), whose communication alone is slow (LINK_SLOW), whose parameters
differ from its replicas' (REPLICA_MISMATCH), or whose gradients of the job's probe batch
do (COMPUTE_MISMATCH), and writes that rank's verdict on its own node for the agent
(``$GPUGUARD_IN_JOB_DIR``; docs/in_job.md)::

    from gpuguard.training import JobMonitor

    monitor = JobMonitor()                      # rank, job, node, GPU from the environment
    for step in range(start, total_steps):
        with monitor.step(step):
            loss = forward_backward(batch)      # compute
            with monitor.communicating():       # the step's first collective
                all_reduce(gradients)
            optimizer.step()
        monitor.check_replicas(step, model)     # parameter fingerprints every 50 steps
        monitor.check_compute(step, probe)      # the probe batch's gradients every 200
        if step % interval == 0:
            checkpointer.save(step, state, blocking=True)
            monitor.checkpoint_saved(step)
    monitor.close()
"""

from gpuguard.training.checkpoint import Checkpointer, CheckpointError, Restored
from gpuguard.training.contract import (
    CHECKPOINT_DIR_ENV,
    EXIT_GPU_LOST,
    EXIT_INFRASTRUCTURE,
    EXIT_PREEMPTED,
    EXIT_REASON_FILE_ENV,
    HEARTBEAT_FILE_ENV,
    RESTART_COUNT_ENV,
)
from gpuguard.training.exchange import (
    EXCHANGE_PORT_ENV,
    BackgroundExchange,
    Exchange,
    ExchangeError,
    LoopbackExchange,
    TorchExchange,
    open_exchange,
)
from gpuguard.training.exits import exit_gpu_lost, exit_preempted
from gpuguard.training.heartbeat import Heartbeat
from gpuguard.training.identity import GPU_PCI_BUS_ID_ENV, JOB_ENV, RankIdentity
from gpuguard.training.monitor import JobMonitor
from gpuguard.training.preemption import Preemption
from gpuguard.training.replicas import Mismatch, ReplicaCheck, ReplicaRound, fingerprint
from gpuguard.training.step_timer import StepTimer, WindowRecord
from gpuguard.training.straggler import Slowness, StragglerJudge, StragglerPolicy
from gpuguard.training.verdicts import IN_JOB_DIR_ENV, NODE_NAME_ENV, Verdict, VerdictKind

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "EXCHANGE_PORT_ENV",
    "EXIT_GPU_LOST",
    "EXIT_INFRASTRUCTURE",
    "EXIT_PREEMPTED",
    "EXIT_REASON_FILE_ENV",
    "GPU_PCI_BUS_ID_ENV",
    "HEARTBEAT_FILE_ENV",
    "IN_JOB_DIR_ENV",
    "JOB_ENV",
    "NODE_NAME_ENV",
    "RESTART_COUNT_ENV",
    "BackgroundExchange",
    "CheckpointError",
    "Checkpointer",
    "Exchange",
    "ExchangeError",
    "Heartbeat",
    "JobMonitor",
    "LoopbackExchange",
    "Mismatch",
    "Preemption",
    "RankIdentity",
    "ReplicaCheck",
    "ReplicaRound",
    "Restored",
    "Slowness",
    "StepTimer",
    "StragglerJudge",
    "StragglerPolicy",
    "TorchExchange",
    "Verdict",
    "VerdictKind",
    "WindowRecord",
    "exit_gpu_lost",
    "exit_preempted",
    "fingerprint",
    "open_exchange",
]
