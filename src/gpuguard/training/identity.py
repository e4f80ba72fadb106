"""Who a rank is, as its verdicts name it: job, rank, world size, node and GPU.

Each field comes from the constructor argument when given, else from the environment a
launcher sets (``torchrun``, a Kubernetes pod with the downward API, ``gpuguard run``):

- rank, world size: ``RANK`` / ``WORLD_SIZE``, else ``torch.distributed`` when it is
  initialised, else a single rank.
- job: ``GPUGUARD_JOB``, else ``POD_NAMESPACE/JOB_NAME``, ``JOB_NAME``,
  ``TORCHELASTIC_RUN_ID``, else ``job@`` and ``MASTER_ADDR`` or the host name (the same on
  every rank of a single-node job).
- node: ``NODE_NAME`` (spec.nodeName), else the host name.
- GPU: ``GPUGUARD_GPU_PCI_BUS_ID``, else the current CUDA device's PCI bus id when the job
  has already imported torch and CUDA is up, else "" (the agent then suspects the node).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Protocol

from gpuguard.training.verdicts import NODE_NAME_ENV

JOB_ENV = "GPUGUARD_JOB"
"""The job's name in verdicts (``namespace/name`` under Kubernetes)."""
GPU_PCI_BUS_ID_ENV = "GPUGUARD_GPU_PCI_BUS_ID"
"""The PCI bus id of this rank's GPU, as NVML prints it (``00000000:3B:00.0``)."""


class _Distributed(Protocol):
    """``torch.distributed``, for the process's place in the default group."""

    def get_rank(self) -> int: ...

    def get_world_size(self) -> int: ...


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    world_size: int
    job: str
    node: str
    gpu: str

    @classmethod
    def resolve(
        cls,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        job: str | None = None,
        node: str | None = None,
        gpu: str | None = None,
    ) -> RankIdentity:
        env = os.environ
        if rank is None or world_size is None:
            found_rank, found_size = _rank_and_size()
            rank = found_rank if rank is None else rank
            world_size = found_size if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        return cls(
            rank=rank,
            world_size=world_size,
            job=job or env.get(JOB_ENV) or _job_from_env(),
            node=node or env.get(NODE_NAME_ENV) or socket.gethostname(),
            gpu=gpu if gpu is not None else env.get(GPU_PCI_BUS_ID_ENV) or _torch_gpu_bus_id(),
        )


def _rank_and_size() -> tuple[int, int]:
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"])
    dist = _initialised_torch_distributed()
    if dist is not None:
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def _job_from_env() -> str:
    env = os.environ
    name = env.get("JOB_NAME")
    if name:
        namespace = env.get("POD_NAMESPACE")
        return f"{namespace}/{name}" if namespace else name
    return env.get("TORCHELASTIC_RUN_ID") or f"job@{env.get('MASTER_ADDR') or socket.gethostname()}"


def _initialised_torch_distributed() -> _Distributed | None:
    torch = sys.modules.get("torch")  # only a job that uses torch pays for its import
    if torch is None:
        return None
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def _torch_gpu_bus_id() -> str:
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return ""
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except (AttributeError, RuntimeError):  # an older torch without the PCI fields
        return ""
