"""The interrupted-training check on a GPU: a small PyTorch model trained on ``cuda`` under
gpuguard's launcher, interrupted at random steps by SIGKILL and by SIGTERM, must end with
parameters bit-identical to an uninterrupted run, recomputing little.

The job (``--child``) is an MLP trained with AdamW, deterministic: fixed seed, the batch
of step k drawn on the CPU from (SEED, k), ``torch.use_deterministic_algorithms``, no TF32.
Its checkpoints (model and optimizer, asynchronous every INTERVAL steps, synchronous on
SIGTERM) go through `gpuguard.training.Checkpointer` and ``torch.save``.

Run from the repository root, where the job side needs only torch and NumPy::

    PYTHONPATH=src python3 bench/gpu_interrupted_training.py

It prints a PASS/FAIL summary (steps, interruptions, recomputed steps, times) and exits 0
on PASS. Takes about a minute, most of it interpreter and CUDA start-up of each run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from gpuguard.training.contract import CHECKPOINT_DIR_ENV, RESTART_COUNT_ENV  # noqa: E402
from tests.support.train_interruptions import (  # noqa: E402
    Interruption,
    Run,
    interrupt,
    random_plan,
    read_runs,
    recomputed_steps,
)

SEED = 20240611
STEPS = 300
INTERVAL = 25
INTERRUPTIONS = 6
STEP_SECONDS = 0.01
TIMEOUT_S = 180


def child(log_path: Path, out: Path) -> None:
    """The training job."""
    import torch

    from gpuguard.training import Checkpointer, Heartbeat, Preemption

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    checkpointer = Checkpointer(keep=2, asynchronous=True)
    restored = checkpointer.restore()
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
    start = restored.step + 1 if restored is not None else 1
    state = {"model": model, "optimizer": optimizer}
    heartbeat = Heartbeat(min_interval_s=0)
    restart = os.environ.get(RESTART_COUNT_ENV, "0")
    with log_path.open("a", buffering=1) as log, Preemption() as preemption:
        log.write(f"start {os.getpid()} {restart} {start - 1}\n")
        for step in range(start, STEPS + 1):
            generator = torch.Generator().manual_seed(SEED * 100_003 + step)
            x = torch.randn(128, 64, generator=generator)
            y = torch.sin(x.sum(dim=1, keepdim=True))
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            time.sleep(STEP_SECONDS)
            log.write(f"{step}\n")
            heartbeat.beat(step)
            if preemption.should_stop():
                checkpointer.save(step, state, blocking=True)
                preemption.exit()
            if step % INTERVAL == 0:
                checkpointer.save(step, state)
    checkpointer.close()
    out.write_bytes(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))


def check() -> bool:
    try:
        import torch
    except ImportError:
        print("FAIL: PyTorch is not installed")
        return False

    if not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return False
    print(
        f"gpuguard interrupted-training check on {torch.cuda.get_device_name(0)} "
        f"(torch {torch.__version__}, CUDA {torch.version.cuda}, Python {sys.version.split()[0]})"
    )
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-gpu-check-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # what deterministic cuBLAS asks for
    job = [sys.executable, __file__, "--child"]
    try:
        started = time.monotonic()
        subprocess.run(
            [*job, str(workdir / "reference.log"), str(workdir / "reference.bin")],
            env={**env, CHECKPOINT_DIR_ENV: str(workdir / "reference-checkpoints")},
            check=True,
            timeout=TIMEOUT_S,
        )
        reference_s = time.monotonic() - started
        print(f"uninterrupted run: {STEPS} steps in {reference_s:.1f} s")

        plan = random_plan(SEED, INTERRUPTIONS, first=10, last=STEPS - 10)
        log, out = workdir / "interrupted.log", workdir / "interrupted.bin"
        started = time.monotonic()
        with (workdir / "launcher.out").open("wb") as output:
            launcher = subprocess.Popen(
                [
                    *(sys.executable, "-m", "gpuguard.training.launcher"),
                    *("--checkpoint-dir", str(workdir / "checkpoints"), "--backoff", "0"),
                    *("--progress-timeout", "60", "--startup-timeout", "120"),
                    *("--", *job, str(log), str(out)),
                ],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        interrupt(log, launcher, plan, seed=SEED, step_seconds=STEP_SECONDS, timeout_s=TIMEOUT_S)
        returncode = launcher.wait(timeout=TIMEOUT_S)
        interrupted_s = time.monotonic() - started
        launcher_output = (workdir / "launcher.out").read_text()
        return summarize(plan, read_runs(log), returncode, launcher_output, workdir, interrupted_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def summarize(
    plan: list[Interruption],
    runs: list[Run],
    returncode: int,
    launcher_output: str,
    workdir: Path,
    seconds: float,
) -> bool:
    reference = (workdir / "reference.bin").read_bytes()
    result = workdir / "interrupted.bin"
    identical = result.exists() and result.read_bytes() == reference
    recomputed = recomputed_steps(runs)
    executed = sum(len(run.steps) for run in runs)
    kinds = [i.signal.name for i in plan]
    print(
        f"interrupted run: {len(runs)} runs, {len(plan)} interruptions "
        f"({kinds.count('SIGKILL')} SIGKILL, {kinds.count('SIGTERM')} SIGTERM) "
        f"at steps {[i.step for i in plan]}, {seconds:.1f} s"
    )
    print(f"  order: {kinds}")
    print(f"  recomputed steps per interruption: {recomputed} ({executed - STEPS} in all)")
    reports = [line for line in launcher_output.splitlines() if line.startswith("gpuguard run:")]
    print(f"  launcher: {reports[-1] if reports else '(no report)'}")
    print(
        f"  parameters: {len(reference) // 4:,} float32 values; "
        f"bit-identical to the uninterrupted run: {'yes' if identical else 'NO'}"
    )
    failures = []
    if returncode != 0:
        failures.append(f"launcher exit status {returncode}")
    if not identical:
        failures.append("final parameters differ from the uninterrupted run")
    if len(runs) != len(plan) + 1:
        failures.append(f"{len(runs)} runs for {len(plan)} interruptions")
    if {s for run in runs for s in run.steps} != set(range(1, STEPS + 1)):
        failures.append("some steps never ran")
    for interruption, redone in zip(plan, recomputed, strict=False):
        # SIGTERM: the job saves the step it finished. SIGKILL: back to the newest checkpoint,
        # which may be one interval older when an asynchronous save was still being written.
        bound = 0 if interruption.signal.name == "SIGTERM" else 2 * INTERVAL
        if redone > bound:
            failures.append(f"{redone} steps recomputed after {interruption}")
    if failures:
        print("FAIL: " + "; ".join(failures))
        print(launcher_output[-4000:])
        return False
    print("PASS")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, type=Path, metavar=("LOG", "OUT"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    return 0 if check() else 1


if __name__ == "__main__":
    sys.exit(main())
