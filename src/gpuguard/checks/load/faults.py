"""Simulated GPUs that fail the way real ones do, to prove the deep checks catch it."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import numpy as np

from gpuguard.checks.load.backend import Buffer
from gpuguard.checks.load.numpy_backend import NumpyBackend, SimBuffer, SimulatedSpeeds, sim


@dataclass
class CorruptingBackend(NumpyBackend):
    """Device ``bad_device`` flips one bit of one element of every matrix product."""

    bad_device: int = 0
    element: tuple[int, int] = (3, 5)

    def matmul(self, a: Buffer, b: Buffer, dtype: str) -> SimBuffer:
        result = super().matmul(a, b, dtype)
        if sim(a).device == self.bad_device:
            data = result.data.copy()
            bits = data.view(np.uint16 if data.itemsize == 2 else np.uint32)
            bits[self.element] ^= 1 << (bits.itemsize * 8 - 10)  # a high mantissa bit
            result = SimBuffer(result.device, data, result.dtype)
        return result


@dataclass
class SlowBackend(NumpyBackend):
    """Device ``slow_device`` runs everything at ``factor`` of its model's speed."""

    slow_device: int = 0
    factor: float = 0.5

    def speed_of(self, device: int) -> SimulatedSpeeds:
        if device != self.slow_device:
            return self.speeds
        s = self.speeds
        return dataclasses.replace(
            s,
            tflops={k: v * self.factor for k, v in s.tflops.items()},
            memory_gb_s=s.memory_gb_s * self.factor,
            host_link_gb_s=s.host_link_gb_s * self.factor,
            peer_gb_s=s.peer_gb_s * self.factor,
        )


@dataclass
class HangingBackend(NumpyBackend):
    """Matrix products never return (a hung kernel) until ``release_hang`` is set."""

    release_hang: threading.Event = field(default_factory=threading.Event)

    def matmul(self, a: Buffer, b: Buffer, dtype: str) -> SimBuffer:
        self.release_hang.wait()
        return super().matmul(a, b, dtype)
