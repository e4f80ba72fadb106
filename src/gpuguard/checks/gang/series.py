"""The all-reduce series every gang member runs, and the verdict they all reach.

gloo on the CPU, NCCL when CUDA is there. Each member times its own part before each
all-reduce and its time inside it, then every member gathers everyone's timings and runs
the same judge, so each container knows which member (if any) the gang waited on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.checks.gang.judge import GangVerdict, MemberTimings, judge_gang
from gpuguard.checks.gang.rendezvous import GangSpec, join
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.errors import ToolMissing

# Called before each all-reduce with its index: tests slow one member down through it.
Hook = Callable[[int], None]


@dataclass(frozen=True)
class GangSettings:
    nbytes: int = 64 << 20  # per all-reduce: long enough to load a link, short in total
    rounds: int = 8
    warmup: int = 2  # untimed: connections and buffers are set up in the first ones
    timeout_s: float = 120.0  # for every member to show up; also each collective's limit
    expected_gbps: float | None = None


@dataclass(frozen=True)
class GangOutcome:
    """A verdict, or why there is none (``note``): a member that never showed up."""

    verdict: GangVerdict | None
    note: str = ""


def run_gang(spec: GangSpec, settings: GangSettings, hook: Hook | None = None) -> GangOutcome:
    """Join the gang, run the series, judge it. Never raises for a gang that falls apart
    (a member missing or gone mid-series): the outcome says so; the caller decides."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise ToolMissing("the gang check needs PyTorch (torch.distributed)") from None
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    box: dict[str, object] = {}

    def work() -> None:
        try:
            join(dist, spec, backend, settings.timeout_s)
            box["verdict"] = _measure_and_judge(spec, settings, hook)
        except Exception as exc:  # a peer missing or gone: torch raises several kinds
            box["error"] = exc

    # A thread, so that a collective stuck past every timeout is abandoned, not waited on.
    thread = threading.Thread(target=work, name="gang-check", daemon=True)
    thread.start()
    thread.join(settings.timeout_s * 2 + 30)
    verdict = box.get("verdict")
    if isinstance(verdict, GangVerdict):
        return GangOutcome(verdict)
    error = box.get("error")
    why = str(error).strip().splitlines()[0] if error else "no answer"
    return GangOutcome(
        None,
        f"gang check skipped: the {spec.world_size} members did not all take part within"
        f" {settings.timeout_s:g}s ({type(error).__name__ if error else 'timeout'}: {why[:200]})",
    )


def _measure_and_judge(spec: GangSpec, settings: GangSettings, hook: Hook | None) -> GangVerdict:
    import torch.distributed as dist

    from gpuguard.training.exchange import TorchExchange

    timings = _series(spec, settings, hook)
    gathered = TorchExchange().all_gather(timings)
    dist.destroy_process_group()
    members = [m for m in gathered if isinstance(m, MemberTimings)]
    if len(members) != spec.world_size:
        raise RuntimeError(f"{len(members)} of {spec.world_size} members sent their timings")
    return judge_gang(members, settings.nbytes, settings.expected_gbps)


def _series(spec: GangSpec, settings: GangSettings, hook: Hook | None) -> MemberTimings:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    buffer = torch.empty(max(1, settings.nbytes // 4), dtype=torch.float32, device=device)

    def settle() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    clock = SYSTEM_CLOCK
    compute, inside = [], []
    dist.barrier()  # start together: the first round must not carry the rendezvous' skew
    for k in range(settings.warmup + settings.rounds):
        started = clock.monotonic()
        if hook is not None:
            hook(k)
        buffer.fill_(1.0)  # the member's own part: a real job's compute goes here
        settle()
        arrived = clock.monotonic()
        dist.all_reduce(buffer)
        settle()
        if k >= settings.warmup:
            compute.append(arrived - started)
            inside.append(clock.monotonic() - arrived)
    return MemberTimings(spec.rank, spec.node, spec.pod, tuple(compute), tuple(inside))
