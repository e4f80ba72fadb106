"""The torch tensors, torch modules and NumPy arrays a job hands over, as gpuguard sees them.

Neither library is imported for these: a job's state or parameters can only hold their
objects if the script imported the library itself. Each protocol names only the members
gpuguard calls (checkpoint staging, replica fingerprints), so that a change of how they are
used shows in the types.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from types import EllipsisType
from typing import Protocol


class Tensor(Protocol):
    """A ``torch.Tensor``."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> object: ...

    @property
    def device(self) -> Hashable: ...

    def detach(self) -> Tensor: ...

    def reshape(self, shape: int, /) -> Tensor: ...

    def view(self, dtype: object, /) -> Tensor: ...

    def element_size(self) -> int: ...

    def sum(self, *, dtype: object = None) -> Tensor: ...

    def abs(self) -> Tensor: ...

    def double(self) -> Tensor: ...

    def item(self) -> float: ...

    def to(self, device: str, *, copy: bool) -> Tensor: ...

    def copy_(self, source: Tensor, /) -> Tensor: ...

    def __float__(self) -> float: ...


class Module(Protocol):
    """A ``torch.nn.Module``, for its parameters."""

    def parameters(self) -> Iterable[Tensor]: ...


class DType(Protocol):
    @property
    def hasobject(self) -> bool: ...


class Flags(Protocol):
    @property
    def c_contiguous(self) -> bool: ...


class Array(Protocol):
    """A ``numpy.ndarray``, as checkpoint staging copies it."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> DType: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def flags(self) -> Flags: ...

    def reshape(self, shape: int, /) -> Array: ...

    def view(self, dtype: str, /) -> Array: ...

    def __getitem__(self, index: slice, /) -> Array: ...

    def __setitem__(self, index: EllipsisType, value: Array, /) -> None: ...
