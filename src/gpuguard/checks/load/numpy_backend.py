"""Simulated GPUs on the CPU: real NumPy arithmetic, device time from a speed model.

It stands in for a GPU machine in tests and demonstrations: results are computed for real
(so a corrupted element is a real wrong answer), while each operation's duration comes
from the simulated device's speeds, not from the busy CPU, so throughput verdicts are
deterministic. ``faults.py`` wraps it to inject the failures the checks must catch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuguard.checks.load.backend import Buffer, DeviceInfo, Pattern
from gpuguard.errors import NotApplicable


@dataclass(frozen=True)
class SimulatedSpeeds:
    """How fast a simulated device is (what a healthy one of its model would measure)."""

    tflops: dict[str, float]
    memory_gb_s: float
    host_link_gb_s: float
    peer_gb_s: float


@dataclass
class SimBuffer:
    device: int | None  # None: host memory
    data: np.ndarray
    dtype: str = "bytes"


def sim(buffer: Buffer) -> SimBuffer:
    """A buffer a NumPy backend made, as the SimBuffer it is."""
    if not isinstance(buffer, SimBuffer):
        raise TypeError(f"not a simulated buffer: {type(buffer).__name__}")
    return buffer


@dataclass
class _SimTimer:
    backend: NumpyBackend
    device: int
    started: float
    stopped: float | None = None

    def stop(self) -> None:
        self.stopped = self.backend.clock[self.device]

    def seconds(self) -> float:
        assert self.stopped is not None, "timer not stopped"
        return self.stopped - self.started


_STORAGE = {"bf16": np.float32, "fp16": np.float16, "tf32": np.float32, "fp32": np.float32}


@dataclass
class NumpyBackend:
    """``count`` simulated GPUs named ``model``, each with ``speeds``."""

    count: int
    model: str
    speeds: SimulatedSpeeds
    free_bytes: int = 64 * 1024 * 1024
    name: str = "numpy"
    clock: dict[int, float] = field(default_factory=dict)  # simulated seconds per device

    def __post_init__(self) -> None:
        self.clock = {d: 0.0 for d in range(self.count)}

    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(d, self.model, f"0000:{0x10 + d:02x}:00.0", f"GPU-sim-{d}", self.free_bytes)
            for d in range(self.count)
        ]

    def speed_of(self, device: int) -> SimulatedSpeeds:
        return self.speeds

    def upload(self, device: int, host: np.ndarray, dtype: str) -> SimBuffer:
        data = host.astype(_STORAGE[dtype])
        if dtype == "bf16":  # keep the top 16 bits of each float32, as bfloat16 does
            data = (data.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        self._spend(device, host.nbytes / (self.speed_of(device).host_link_gb_s * 1e9))
        return SimBuffer(device, data, dtype)

    def download(self, buffer: Buffer) -> np.ndarray:
        return np.asarray(sim(buffer).data, dtype=np.float64)

    def raw_bits(self, buffer: Buffer) -> np.ndarray:
        data = sim(buffer).data
        bits: np.ndarray = data.view(np.uint16 if data.itemsize == 2 else np.uint32).copy()
        return bits

    def matmul(self, a: Buffer, b: Buffer, dtype: str) -> SimBuffer:
        a, b = sim(a), sim(b)
        device = a.device
        assert device is not None, "a matrix product runs on a device"
        n = a.data.shape[0]
        result = (a.data @ b.data).astype(a.data.dtype)
        self._spend(device, 2 * n**3 / (self.speed_of(device).tflops[dtype] * 1e12))
        return SimBuffer(device, result, dtype)

    def mismatches(self, x: Buffer, y: Buffer) -> int:
        return int(np.count_nonzero(self.raw_bits(x) != self.raw_bits(y)))

    def allocate(self, device: int | None, nbytes: int) -> SimBuffer:
        return SimBuffer(device, np.zeros(nbytes // 4, dtype=np.uint32))

    def copy(self, dst: Buffer, src: Buffer) -> None:
        dst, src = sim(dst), sim(src)
        np.copyto(dst.data, src.data)
        nbytes = src.data.nbytes
        if src.device is not None and src.device == dst.device:
            # A device copy reads and writes every byte.
            self._spend(src.device, 2 * nbytes / (self.speed_of(src.device).memory_gb_s * 1e9))
        elif src.device is None or dst.device is None:
            device = dst.device if src.device is None else src.device
            assert device is not None
            self._spend(device, nbytes / (self.speed_of(device).host_link_gb_s * 1e9))
        else:
            self._spend(src.device, nbytes / (self.speed_of(src.device).peer_gb_s * 1e9))

    def write_pattern(self, buffer: Buffer, pattern: Pattern) -> None:
        words = sim(buffer).data
        words[:] = _expected_words(pattern, 0, words.size)

    def find_pattern_errors(
        self, buffer: Buffer, pattern: Pattern, limit: int
    ) -> tuple[int, list[int]]:
        words = sim(buffer).data
        wrong = np.flatnonzero(words != _expected_words(pattern, 0, words.size))
        return int(wrong.size), [int(i) * 4 for i in wrong[:limit]]

    def start_timer(self, device: int) -> _SimTimer:
        return _SimTimer(self, device, self.clock[device])

    def synchronize(self, device: int) -> None:
        return None

    def all_reduce_seconds(
        self, devices: list[int], nbytes: int, repeats: int, timeout_s: float
    ) -> float:
        if len(devices) < 2:
            raise NotApplicable("all-reduce needs two GPUs or more")
        parts = [np.full(nbytes // 4, d, dtype=np.float32) for d in devices]
        total = np.sum(parts, axis=0)
        assert total[0] == sum(devices)
        # A ring all-reduce moves 2(n-1)/n of the data over the slowest GPU's links.
        slowest = min(self.speed_of(d).peer_gb_s for d in devices)
        moved = 2 * (len(devices) - 1) / len(devices) * nbytes
        return moved / (slowest * 1e9)

    def release(self) -> None:
        return None

    def _spend(self, device: int | None, seconds: float) -> None:
        if device is not None:
            self.clock[device] += seconds


def _expected_words(pattern: Pattern, start: int, count: int) -> np.ndarray:
    if pattern.kind == "constant":
        return np.full(count, pattern.value, dtype=np.uint32)
    index = np.arange(start, start + count, dtype=np.uint64) & 0xFFFFFFFF
    return (index ^ pattern.value).astype(np.uint32)
