"""What the deep checks need from a compute library, and nothing more.

Everything a check decides (is this result right, is this GPU slow) happens outside the
backend, in code the NumPy-simulated backend exercises in tests; a backend only allocates,
computes, copies, compares and times. Operations may be asynchronous (CUDA): only
``Timer.seconds``, ``download``, ``raw_bits``, ``mismatches``, ``find_pattern_errors`` and
``synchronize`` wait for the device, and device errors may surface at any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

# One backend's array, on a device or in pinned host memory: opaque to everything but the
# backend that made it, which checks that it is its own kind.
Buffer = object


@dataclass(frozen=True)
class DeviceInfo:
    index: int  # the backend's device number
    name: str  # as the driver reports it ("NVIDIA H200"): the key into the figure table
    pci_bus_id: str  # names the GPU in findings
    uuid: str | None = None
    free_bytes: int = 0


@dataclass(frozen=True)
class Pattern:
    """A memory test pattern over 32-bit words: a constant, or each word's own index
    XOR ``value`` (catches address lines that alias two locations)."""

    kind: Literal["constant", "address"]
    value: int

    def __str__(self) -> str:
        return f"{self.kind} 0x{self.value:08x}"


PATTERNS = (
    Pattern("constant", 0x00000000),
    Pattern("constant", 0xFFFFFFFF),
    Pattern("constant", 0x55555555),
    Pattern("constant", 0xAAAAAAAA),
    Pattern("address", 0x00000000),
    Pattern("address", 0xFFFFFFFF),
)


class Timer(Protocol):
    def stop(self) -> None:
        """Mark the end of the timed work (queued after it; does not wait)."""

    def seconds(self) -> float:
        """Time between start and stop on the device; waits for the work to finish."""


class Backend(Protocol):
    name: str

    def devices(self) -> list[DeviceInfo]: ...

    def upload(self, device: int, host: np.ndarray, dtype: str) -> Buffer:
        """A device copy of a float32 host array in ``dtype`` (tf32: float32 storage)."""

    def download(self, buffer: Buffer) -> np.ndarray:
        """The values as float64 (small buffers only: the CPU reference check)."""

    def raw_bits(self, buffer: Buffer) -> np.ndarray:
        """The bit patterns as unsigned integers, for exact comparison across devices."""

    def matmul(self, a: Buffer, b: Buffer, dtype: str) -> Buffer: ...

    def mismatches(self, x: Buffer, y: Buffer) -> int:
        """How many elements of two same-device buffers differ in any bit."""

    def allocate(self, device: int | None, nbytes: int) -> Buffer:
        """Uninitialised bytes on ``device``, or pinned host memory for ``None``."""

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copy between any two same-size buffers: device, host or peer."""

    def write_pattern(self, buffer: Buffer, pattern: Pattern) -> None: ...

    def find_pattern_errors(
        self, buffer: Buffer, pattern: Pattern, limit: int
    ) -> tuple[int, list[int]]:
        """Words that do not hold the pattern: how many, and the byte offsets of the first."""

    def start_timer(self, device: int) -> Timer: ...

    def synchronize(self, device: int) -> None: ...

    def all_reduce_seconds(
        self, devices: list[int], nbytes: int, repeats: int, timeout_s: float
    ) -> float:
        """Seconds for one all-reduce of ``nbytes`` across ``devices`` (mean of repeats);
        NotApplicable on one device; gives up (raises) after ``timeout_s``."""

    def release(self) -> None:
        """Return cached device memory (between phases, and at the end)."""
        ...
