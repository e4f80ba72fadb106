"""Replica agreement: silent data corruption found by comparing replicas' parameters.

In data-parallel training every replica applies the same averaged gradient to the same
parameters, so after each step they are bit for bit identical (collectives hand every rank
the same result). A GPU that silently corrupts its replica's own state (its
parameters or optimiser state in memory, or the optimiser step it computes) leaves that
replica different, and since later steps update all replicas alike, the difference stays.
A wrong value computed before the gradient all-reduce is averaged into every replica
alike: this cannot see it; the compute probe can (``JobMonitor.check_compute``: a
`ReplicaCheck` too, over the gradients every replica computes on one fixed batch).

Every ``interval`` steps each rank takes a `fingerprint` of its parameters and the ranks
vote within each replica group (ranks that must hold identical parameters; the caller
names the group). A rank outside a strict majority of its group is a suspect; it is named
only if it is odd again at the re-check ``recheck_after`` steps later, which rules out a
transient (a flip that healed, a fault in the fingerprint itself). With ``rechecks`` > 1
(the probe's: a GPU may compute wrong only now and then) a suspect that agrees is
re-checked again, every ``recheck_after`` steps, up to that many times; odd at any of them
names it. Two replicas that disagree, or a group with no strict majority, name no one:
the round is inconclusive.

Covered: plain DP, and the DP dimension of FSDP/HSDP/TP/PP jobs, where the ranks that hold
the same shard form a group (pass the shard's index as the group). Not covered: ranks that
hold different shards (TP, PP, FSDP within a shard group) differ by design; and a job
whose replicas are not bit-identical (non-deterministic optimiser kernels, per-rank
dropout of the parameters) needs ``rtol > 0``, which only catches larger corruptions.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from gpuguard.training.tensors import Module, Tensor

Fingerprint = tuple[float, ...]
_MASK = (1 << 64) - 1
_FOLD = 1_000_003


def fingerprint(parameters: object, *, rtol: float = 0.0) -> Fingerprint:
    """A few numbers that differ when one element of ``parameters`` does.

    ``parameters``: a mapping of name to array (taken in name order), a torch module, one
    NumPy array or torch tensor, or an iterable of them. With ``rtol == 0`` (the default)
    the sum of each array's bit patterns as integers (mod 2**64), folded in order: one
    pass over memory, on the tensor's own device, deterministic, and changed by any one
    element changing. With ``rtol > 0``: the float64 sum and sum of magnitudes, to be
    compared within ``rtol`` (see `agree`).
    """
    arrays = list(_arrays(parameters))
    if rtol > 0:
        total = magnitude = 0.0
        for array in arrays:
            value, size = _float_sums(array)
            total, magnitude = total + value, magnitude + size
        return (total, magnitude)
    folded = 0
    for array in _bit_sums(arrays):
        folded = (folded * _FOLD + array) & _MASK
    return (float(len(arrays)), float(folded >> 32), float(folded & 0xFFFFFFFF))


def agree(a: Fingerprint, b: Fingerprint, rtol: float = 0.0) -> bool:
    if rtol <= 0 or len(a) != 2 or len(b) != 2:
        return a == b
    scale = max(abs(a[1]), abs(b[1]), 1e-30)
    return abs(a[0] - b[0]) <= rtol * scale and abs(a[1] - b[1]) <= rtol * scale


@dataclass(frozen=True)
class Vote:
    odd: tuple[int, ...]  # ranks outside the strict majority of their group
    inconclusive: tuple[int, ...]  # ranks of groups that disagree without a majority


def vote(groups: Mapping[int, tuple[object, Fingerprint]], rtol: float = 0.0) -> Vote:
    """``groups``: rank -> (replica group, fingerprint)."""
    by_group: dict[Hashable, list[int]] = {}
    for rank in sorted(groups):
        by_group.setdefault(_group_key(groups[rank][0]), []).append(rank)
    odd: list[int] = []
    inconclusive: list[int] = []
    for ranks in by_group.values():
        prints = {rank: groups[rank][1] for rank in ranks}
        majority = _majority(prints, rtol)
        if majority is None:
            inconclusive.extend(ranks)
        else:
            odd.extend(rank for rank in ranks if not agree(prints[rank], majority, rtol))
    return Vote(tuple(sorted(odd)), tuple(sorted(inconclusive)))


@dataclass(frozen=True)
class Mismatch:
    """A rank named for holding parameters its replicas do not."""

    rank: int
    first_step: int  # the round that first found it odd
    last_step: int  # the latest round that found it odd
    evidence: str


@dataclass(frozen=True)
class ReplicaRound:
    step: int
    vote: Vote
    named: dict[int, Mismatch]  # every rank named so far, this round's included
    subject: str = "parameters"  # what was fingerprinted (`ReplicaCheck.subject`)


@dataclass
class ReplicaCheck:
    """Decides when a round is due and keeps suspects and named ranks between rounds.
    A named rank stays named: the results it computed are wrong, whatever comes later."""

    interval: int = 50
    recheck_after: int = 10
    rtol: float = 0.0
    subject: str = "parameters"  # what the replicas fingerprint, for the evidence
    # Re-checks of a suspect before it is forgotten (wrong parameters stay wrong: one is
    # enough; wrong arithmetic may come and go).
    rechecks: int = 1
    # rank -> (the round that first found it odd, re-checks left)
    _suspects: dict[int, tuple[int, int]] = field(default_factory=dict, init=False)
    _named: dict[int, Mismatch] = field(default_factory=dict, init=False)
    _recheck_at: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if min(self.interval, self.recheck_after, self.rechecks) < 1:
            raise ValueError("interval, recheck_after and rechecks must be at least 1")

    def due(self, step: int) -> bool:
        return step % self.interval == 0 or step == self._recheck_at

    def recheck_step(self, round_step: int) -> int:
        """The step whose `due` depends on the round of ``round_step``: judge it by then."""
        return round_step + min(self.recheck_after, self.interval)

    def judge(self, step: int, groups: Mapping[int, tuple[object, Fingerprint]]) -> ReplicaRound:
        result = vote(groups, self.rtol)
        self._recheck_at = None
        odd = set(result.odd)
        for rank, (first, left) in list(self._suspects.items()):
            if rank not in odd:
                if left > 1:
                    self._suspects[rank] = (first, left - 1)
                else:
                    del self._suspects[rank]  # agreed at every re-check: a transient
        for rank in odd:
            if rank in self._named:
                old = self._named[rank]
                self._named[rank] = Mismatch(rank, old.first_step, step, old.evidence)
            elif rank in self._suspects:
                first, _ = self._suspects.pop(rank)
                group = groups[rank][0]
                size = sum(1 for g, _ in groups.values() if _group_key(g) == _group_key(group))
                self._named[rank] = Mismatch(
                    rank,
                    first,
                    step,
                    f"{self.subject} differ from the majority of replica group {group!r} "
                    f"({size} ranks) at step {first} and again at step {step}",
                )
            else:
                self._suspects[rank] = (step, self.rechecks)
        if self._suspects:
            self._recheck_at = self.recheck_step(step)
        return ReplicaRound(step, result, dict(self._named), self.subject)


def _majority(prints: Mapping[int, Fingerprint], rtol: float) -> Fingerprint | None:
    ranks = sorted(prints)
    if rtol <= 0:
        value, count = Counter(prints[rank] for rank in ranks).most_common(1)[0]
        return value if 2 * count > len(ranks) else None
    best = max(ranks, key=lambda r: sum(agree(prints[r], prints[o], rtol) for o in ranks))
    count = sum(agree(prints[best], prints[other], rtol) for other in ranks)
    return prints[best] if 2 * count > len(ranks) else None


def _group_key(group: object) -> Hashable:
    if isinstance(group, list):  # JSON turns tuples to lists
        return tuple(group)
    if not isinstance(group, Hashable):
        raise TypeError(f"replica group {group!r} is not hashable")
    return group


def _arrays(parameters: object) -> Iterable[object]:
    if isinstance(parameters, Mapping):
        return (parameters[name] for name in sorted(parameters))
    if hasattr(parameters, "parameters") and callable(parameters.parameters):
        module: Module = parameters  # a torch module
        return module.parameters()
    if hasattr(parameters, "shape") and hasattr(parameters, "dtype"):
        return [parameters]  # one array, not its rows
    if not isinstance(parameters, Iterable):
        raise TypeError(f"cannot fingerprint a {type(parameters).__name__}: no arrays in it")
    return parameters


def _bit_sums(arrays: list[object]) -> list[int]:
    torch = sys.modules.get("torch")
    if torch is not None and arrays:
        tensors = [a for a in arrays if isinstance(a, torch.Tensor)]
        if len(tensors) == len(arrays):
            return _torch_bit_sums(torch, tensors)
    import numpy as np

    sums = []
    for array in arrays:
        data = np.ascontiguousarray(array)
        integers = data.reshape(-1).view(_numpy_int(data.dtype.itemsize))
        sums.append(int(integers.sum(dtype=np.int64)) & _MASK)
    return sums


def _numpy_int(itemsize: int) -> str:
    """The widest signed integer type (``i8``, ``i4``...) whose size divides ``itemsize``."""
    for size in (8, 4, 2):
        if itemsize % size == 0:
            return f"i{size}"
    return "i1"


def _torch_bit_sums(torch: ModuleType, tensors: Sequence[Tensor]) -> list[int]:
    by_size = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    sums = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        sums.append(flat.view(by_size[flat.element_size()]).sum(dtype=torch.int64))
    values: list[float]
    if len({s.device for s in sums}) == 1:
        values = torch.stack(sums).tolist()  # one device-to-host copy, one synchronisation
    else:
        values = [s.item() for s in sums]
    return [int(value) & _MASK for value in values]


def _float_sums(array: object) -> tuple[float, float]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        data = array.detach().double()
        return float(data.sum()), float(data.abs().sum())
    import numpy as np

    data = np.asarray(array, dtype=np.float64)
    return float(data.sum()), float(np.abs(data).sum())
