"""Who this gang member is and where the gang meets: torch's environment conventions.

``MASTER_ADDR``/``MASTER_PORT`` name the rendezvous (rank 0 listens there), ``WORLD_SIZE``
the number of members, ``RANK`` this member's place (an indexed Job's
``JOB_COMPLETION_INDEX`` when ``RANK`` is not set); ``NODE_NAME`` and ``POD_NAME`` name
the member in the verdict.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType


class GangConfigError(ValueError):
    """The environment does not describe a gang this member can join."""


@dataclass(frozen=True)
class GangSpec:
    master_addr: str
    master_port: int
    world_size: int
    rank: int
    node: str
    pod: str

    @property
    def init_method(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


def gang_spec(env: Mapping[str, str]) -> GangSpec:
    """The gang from the environment; a one-line GangConfigError when it does not add up."""
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE") if not env.get(k)]
    rank_text = env.get("RANK") or env.get("JOB_COMPLETION_INDEX")
    if rank_text is None:
        missing.append("RANK (or JOB_COMPLETION_INDEX)")
    if missing:
        raise GangConfigError(f"{', '.join(missing)} not set")
    port, size, rank = (_integer(env, k) for k in ("MASTER_PORT", "WORLD_SIZE", "RANK"))
    if rank is None:
        rank = _integer(env, "JOB_COMPLETION_INDEX")
    assert port is not None and size is not None and rank is not None
    if not 0 < port < 65536:
        raise GangConfigError(f"MASTER_PORT={port}: not a TCP port")
    if size < 2:
        raise GangConfigError(f"WORLD_SIZE={size}: a gang needs two members or more")
    if not 0 <= rank < size:
        raise GangConfigError(f"rank {rank} outside WORLD_SIZE={size}")
    node = env.get("NODE_NAME") or f"rank-{rank}"
    return GangSpec(env["MASTER_ADDR"], port, size, rank, node, env.get("POD_NAME", ""))


def _integer(env: Mapping[str, str], key: str) -> int | None:
    text = env.get(key)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise GangConfigError(f"{key}={text!r}: not a whole number") from None


def join(dist: ModuleType, spec: GangSpec, backend: str, timeout_s: float) -> None:
    """Meet the other members (raises when they are not all there within ``timeout_s``)."""
    dist.init_process_group(
        backend,
        init_method=spec.init_method,
        rank=spec.rank,
        world_size=spec.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
