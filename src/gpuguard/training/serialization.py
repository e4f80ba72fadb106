"""Turning the state a training script hands over into bytes on disk, and back.

State is any picklable structure of dicts, lists and tuples. PyTorch modules and optimizers
in it are replaced by their ``state_dict()``; when it holds anything from torch the whole
state is written with ``torch.save`` (torch's own format), otherwise with `pickle`
(protocol 5, so NumPy arrays go out without an extra copy). Pickle runs code on load: that
is acceptable here because a job only loads checkpoints it wrote itself, into a directory it
owns, after their checksum matched; never point a job at checkpoints from elsewhere.

Neither NumPy nor torch is imported here: a state can only hold their objects if the
script already imported them, so `sys.modules` tells whether to look for them.
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol

from gpuguard.training.tensors import Array, Tensor

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

Serializer = Literal["pickle", "torch"]
StatePath = tuple[Hashable, ...]
"""Where a value sits in the state: the keys and indices that lead to it."""
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None))
_CHUNK_BYTES = 64 << 20  # arrays below this are copied in one piece
_COPY_THREADS = 8


class Writable(Protocol):
    def write(self, data: Buffer, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class Prepared:
    """The state as it will be written, and how."""

    state: object
    serializer: Serializer


class StagingArea:
    """Host-memory copies of a state's arrays and tensors, reused from one asynchronous
    save to the next.

    Copying into buffers that already exist costs a fraction of allocating new ones (no
    page faults), and that copy is all the training loop waits for; large NumPy arrays are
    copied in chunks by several threads (NumPy releases the GIL), since one core does not
    reach the memory bandwidth of a GPU server. A buffer is reused only once the save that
    wrote it has finished; the `Checkpointer` guarantees that by keeping at most one save
    in flight.
    """

    def __init__(self) -> None:
        # The buffers of the last save, and those of the save under way.
        self._arrays: dict[StatePath, Array] = {}
        self._tensors: dict[StatePath, Tensor] = {}
        self._next_arrays: dict[StatePath, Array] = {}
        self._next_tensors: dict[StatePath, Tensor] = {}
        self._copies: list[Future[None]] = []
        self._pool: ThreadPoolExecutor | None = None

    def array(self, path: StatePath, source: Array, numpy: ModuleType) -> Array:
        if source.dtype.hasobject:  # object arrays hold references: copy what they point to
            return copy.deepcopy(source)
        buffer = self._arrays.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = numpy.empty_like(source, order="C")
        if source.nbytes < _CHUNK_BYTES or not source.flags.c_contiguous:
            buffer[...] = source
        else:
            target, origin = buffer.reshape(-1).view("u1"), source.reshape(-1).view("u1")
            for start in range(0, origin.size, _CHUNK_BYTES):
                end = start + _CHUNK_BYTES
                self._copies.append(
                    self._threads().submit(numpy.copyto, target[start:end], origin[start:end])
                )
        self._next_arrays[path] = buffer
        return buffer

    def tensor(self, path: StatePath, source: Tensor) -> Tensor:
        source = source.detach()
        buffer = self._tensors.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = source.to("cpu", copy=True)
        else:
            buffer.copy_(source)
        self._next_tensors[path] = buffer
        return buffer

    def finish(self) -> None:
        """Wait for the copies; forget the buffers of entries the state no longer has."""
        copies, self._copies = self._copies, []
        for done in copies:
            done.result()
        self._arrays, self._next_arrays = self._next_arrays, {}
        self._tensors, self._next_tensors = self._next_tensors, {}

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            workers = min(_COPY_THREADS, os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpuguard-staging")
        return self._pool


def prepare(state: object, staging: StagingArea | None) -> Prepared:
    """The state to write. With ``staging``, every array, tensor and mutable leaf is copied
    so that the script may change its state while the copy is written in the background;
    without, only the containers are rebuilt (the write happens before the script goes on).
    """
    walker = _Walker(sys.modules.get("torch"), sys.modules.get("numpy"), staging)
    try:
        prepared = walker.visit(state, ())
    finally:
        if staging is not None:  # also after a failure: no copy may still be running
            staging.finish()
    return Prepared(prepared, "torch" if walker.uses_torch else "pickle")


def dump(prepared: Prepared, out: Writable) -> None:
    if prepared.serializer == "torch":
        import torch

        torch.save(prepared.state, out)
    else:
        pickle.dump(prepared.state, out, protocol=5)


def load(path: Path, serializer: str, map_location: object) -> object:
    """Read a payload whose checksum was already verified.

    ``weights_only=False``: the state may hold NumPy arrays and plain Python objects, which
    torch's restricted unpickler refuses; see the module docstring on trust.
    """
    if serializer == "torch":
        import torch

        return torch.load(path, map_location=map_location, weights_only=False)
    if serializer == "pickle":
        with path.open("rb") as payload:
            state: object = pickle.load(payload)
            return state
    raise ValueError(f"unknown serializer {serializer!r}")


class _Walker:
    def __init__(
        self, torch: ModuleType | None, numpy: ModuleType | None, staging: StagingArea | None
    ) -> None:
        self.torch = torch
        self.numpy = numpy
        self.staging = staging
        self.uses_torch = False

    def visit(self, obj: object, path: StatePath) -> object:
        torch = self.torch
        if torch is not None:
            if isinstance(obj, torch.nn.Module | torch.optim.Optimizer):
                self.uses_torch = True
                return self.visit(obj.state_dict(), path)
            if isinstance(obj, torch.Tensor):
                self.uses_torch = True
                return obj if self.staging is None else self.staging.tensor(path, obj)
        numpy = self.numpy
        if numpy is not None and isinstance(obj, numpy.ndarray):
            return obj if self.staging is None else self.staging.array(path, obj, numpy)
        if isinstance(obj, dict):
            # copy.copy keeps the mapping's type and attributes (a state_dict's _metadata).
            rebuilt = copy.copy(obj)
            rebuilt.update((key, self.visit(value, (*path, key))) for key, value in obj.items())
            return rebuilt
        if isinstance(obj, list):
            return [self.visit(item, (*path, index)) for index, item in enumerate(obj)]
        if isinstance(obj, tuple):
            items = [self.visit(item, (*path, index)) for index, item in enumerate(obj)]
            if not hasattr(obj, "_fields"):
                return tuple(items)
            named_tuple: Callable[..., object] = type(obj)  # takes the fields one by one
            return named_tuple(*items)
        if self.staging is None or isinstance(obj, _IMMUTABLE):
            return obj
        return copy.deepcopy(obj)
