"""The in-job verdict file: how a running job tells its node's agent that one of its GPUs
is slow or computes wrong answers.

A multi-node job cannot reach another node's disk, and must not use its own API
credentials to mark Nodes; so each verdict is written on the node it accuses, by the rank
that runs there, into a directory the job pod and the agent DaemonSet share through a
hostPath (``$GPUGUARD_IN_JOB_DIR``; the chart's ``inJob.hostPath``). One JSON file per
job and rank, replaced atomically: the agent never reads half a verdict.

A rank refreshes its verdict while it holds (``written_at``) and deletes it when its GPU
recovers; a verdict not refreshed for ``ttl_s`` tells the agent its job has ended, and it
still stands (the GPU did not get better) until the repair it asked for. Once the job has
saved a checkpoint after the verdict (``checkpointed_at``), the repair need not wait for
the job any longer. Standard library only, like the rest of ``gpuguard.training``.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

IN_JOB_DIR_ENV = "GPUGUARD_IN_JOB_DIR"
"""The shared directory verdicts are written to (unset: verdicts are only returned)."""
NODE_NAME_ENV = "NODE_NAME"
"""The Kubernetes node a rank runs on (the downward API's spec.nodeName)."""
FORMAT_VERSION = 1
SUFFIX = ".verdict.json"
DEFAULT_TTL_S = 900.0
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class VerdictKind(StrEnum):
    FAIL_SLOW = "fail_slow"  # the rank's compute is consistently slower than its peers'
    LINK_SLOW = "link_slow"  # the rank's compute keeps pace, its communication does not
    REPLICA_MISMATCH = "replica_mismatch"  # its parameters differ from the other replicas'
    COMPUTE_MISMATCH = "compute_mismatch"  # its gradients of the probe batch differ from theirs


class VerdictError(ValueError):
    """A verdict file that cannot be trusted as one (its path and the reason)."""


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    job: str  # namespace/name, or the job's own id outside Kubernetes
    rank: int
    world_size: int
    node: str
    gpu: str  # the GPU's PCI bus id as NVML prints it ("" when the rank does not know)
    since: float  # unix time the judge first saw it
    written_at: float  # unix time of the last refresh
    ratio: float  # the rank's time over its peers' median; 0 for a replica/compute mismatch
    steps: tuple[int, int]  # first and last step the evidence covers
    evidence: str
    ttl_s: float = DEFAULT_TTL_S
    checkpointed_at: float | None = None  # a checkpoint saved after `since`, if any
    version: int = FORMAT_VERSION

    def file_name(self) -> str:
        return f"{_SAFE.sub('_', self.job)}.rank{self.rank}{SUFFIX}"

    def lapsed(self, now: float) -> bool:
        return now - self.written_at > self.ttl_s

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = str(self.kind)
        data["steps"] = list(self.steps)
        return json.dumps(data, sort_keys=True)


def write_verdict(directory: Path, verdict: Verdict) -> Path:
    """Replace ``directory/<job>.rank<N>.verdict.json`` with ``verdict`` atomically."""
    target = directory / verdict.file_name()
    # Not ending in SUFFIX, so a reader listing the directory never opens it half written.
    temporary = directory / f".{verdict.file_name()}.{os.getpid()}.tmp"
    temporary.write_text(verdict.to_json() + "\n")
    os.replace(temporary, target)
    return target


def withdraw_verdict(directory: Path, job: str, rank: int) -> None:
    """Delete the rank's verdict, if it wrote one (it recovered, or the job ends cleanly)."""
    name = f"{_SAFE.sub('_', job)}.rank{rank}{SUFFIX}"
    (directory / name).unlink(missing_ok=True)


def read_verdicts(directory: Path) -> tuple[list[Verdict], list[VerdictError]]:
    """Every verdict file in ``directory``, and an error naming each one that is not a
    valid verdict. A missing directory holds none."""
    verdicts: list[Verdict] = []
    errors: list[VerdictError] = []
    try:
        paths = sorted(p for p in directory.glob(f"*{SUFFIX}") if not p.name.startswith("."))
    except OSError as exc:
        return [], [VerdictError(f"{directory}: cannot list: {exc}")]
    for path in paths:
        try:
            verdicts.append(parse_verdict(path.read_text(), str(path)))
        except FileNotFoundError:
            continue  # withdrawn since the listing
        except (OSError, VerdictError) as exc:
            errors.append(exc if isinstance(exc, VerdictError) else VerdictError(f"{path}: {exc}"))
    return verdicts, errors


def parse_verdict(text: str, where: str) -> Verdict:
    """The verdict in ``text``; `VerdictError` naming ``where`` and the bad field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerdictError(f"{where}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise VerdictError(f"{where}: not a JSON object")
    if data.get("version") != FORMAT_VERSION:
        raise VerdictError(f"{where}: version {data.get('version')!r}, expected {FORMAT_VERSION}")
    try:
        kind = VerdictKind(str(data.get("kind")))
    except ValueError:
        kinds = ", ".join(k.value for k in VerdictKind)
        raise VerdictError(f"{where}: kind {data.get('kind')!r} is not one of {kinds}") from None
    steps = data.get("steps")
    if not (
        isinstance(steps, list) and len(steps) == 2 and all(_is_int(s) and s >= 0 for s in steps)
    ):
        raise VerdictError(f"{where}: steps must be [first, last], got {steps!r}")
    checkpointed = data.get("checkpointed_at")
    rank, world_size = _count(data, "rank", where), _count(data, "world_size", where, least=1)
    if rank >= world_size:
        raise VerdictError(f"{where}: rank {rank} is not below world_size {world_size}")
    return Verdict(
        kind=kind,
        job=_text(data, "job", where, empty=False),
        rank=rank,
        world_size=world_size,
        node=_text(data, "node", where, empty=False),
        gpu=_text(data, "gpu", where),
        since=_number(data, "since", where),
        written_at=_number(data, "written_at", where),
        ratio=_number(data, "ratio", where),
        steps=(steps[0], steps[1]),
        evidence=_text(data, "evidence", where),
        ttl_s=_number(data, "ttl_s", where),
        checkpointed_at=None if checkpointed is None else _number(data, "checkpointed_at", where),
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(data: dict[str, object], key: str, where: str, *, empty: bool = True) -> str:
    value = data.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise VerdictError(f"{where}: {key} must be a{'' if empty else ' non-empty'} string")
    return value


def _count(data: dict[str, object], key: str, where: str, *, least: int = 0) -> int:
    value = data.get(key)
    if not _is_int(value) or value < least:  # type: ignore[operator]
        raise VerdictError(f"{where}: {key} must be an integer >= {least}, got {value!r}")
    return value  # type: ignore[return-value]


def _number(data: dict[str, object], key: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise VerdictError(f"{where}: {key} must be a finite number, got {value!r}")
    if value < 0:
        raise VerdictError(f"{where}: {key} must not be negative, got {value!r}")
    return float(value)
