"""Runs the deep suite's work on a backend within a time budget and records what it saw.

No verdicts here: ``judge.py`` turns a :class:`NodeMeasurement` into findings. Each phase
gets a share of the budget; a phase that no longer fits is recorded as skipped, and a
device that raises (a CUDA error) is recorded and left out of later phases.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuguard.checks.load.backend import PATTERNS, Backend, Buffer, DeviceInfo, Timer
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.config import DeepChecks
from gpuguard.errors import CheckError

REFERENCE_SIZE = 256  # the matmul also checked against NumPy on the CPU
MAX_BATCH = 64  # matmuls per timed batch
BATCH_TARGET_S = 0.25
COPY_BYTES = 1 << 30  # device, host and peer copies
ALL_REDUCE_BYTES = 1 << 30
PATTERN_BLOCK_BYTES = 1 << 30
MAX_PATTERN_OFFSETS = 16
# Shares of the budget, in phase order; the compute phase gets what the others leave.
_SHARES = {"memory": 0.1, "pattern": 0.15, "host_link": 0.05, "peer": 0.1, "all_reduce": 0.1}


@dataclass
class PatternResult:
    tested_bytes: int
    errors: int = 0
    offsets: list[int] = field(default_factory=list)  # byte offsets of the first bad words
    failed_patterns: list[str] = field(default_factory=list)


@dataclass
class DeviceMeasurement:
    device: DeviceInfo
    tflops: dict[str, float] = field(default_factory=dict)
    matmuls: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)  # of the first product, per dtype
    self_mismatches: dict[str, int] = field(default_factory=dict)  # vs. its own first product
    reference_error: float | None = None  # worst relative error vs. the CPU (fp32)
    reference_index: tuple[int, int] | None = None
    memory_gb_s: float | None = None
    pattern: PatternResult | None = None
    h2d_gb_s: float | None = None
    d2h_gb_s: float | None = None
    errors: list[str] = field(default_factory=list)  # device errors raised during the load

    @property
    def failed(self) -> bool:
        return bool(self.errors)


@dataclass
class NodeMeasurement:
    backend: str
    devices: list[DeviceMeasurement]
    matmul_size: int
    peer_gb_s: dict[tuple[int, int], float] = field(default_factory=dict)
    all_reduce_bus_gb_s: float | None = None
    all_reduce_note: str = ""  # why it did not run (one GPU, no NCCL)
    all_reduce_error: str = ""
    skipped: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


class Suite:
    """One run of the deep suite on ``backend`` (construct, then :meth:`run`)."""

    def __init__(self, backend: Backend, deep: DeepChecks, budget_s: float) -> None:
        self.backend = backend
        self.deep = deep
        self.started = SYSTEM_CLOCK.monotonic()
        self.deadline = self.started + budget_s
        self.budget_s = budget_s
        devices = backend.devices()
        self.node = NodeMeasurement(
            backend.name, [DeviceMeasurement(d) for d in devices], deep.matmul_size
        )

    def run(self) -> NodeMeasurement:
        self._reference_check()
        compute_until = self.deadline - sum(_SHARES.values()) * self.budget_s
        dtypes = list(self.deep.dtypes)
        for i, dtype in enumerate(dtypes):
            share = (compute_until - SYSTEM_CLOCK.monotonic()) / (len(dtypes) - i)
            self._compute(dtype, SYSTEM_CLOCK.monotonic() + max(share, 0.0))
        self._phase("memory", self._memory_bandwidth)
        self._phase("pattern", self._pattern_test)
        self._phase("host_link", self._host_link)
        self._phase("peer", self._peer_copies)
        self._phase("all_reduce", self._all_reduce)
        self.backend.release()
        self.node.elapsed_s = SYSTEM_CLOCK.monotonic() - self.started
        return self.node

    # -- plumbing ----------------------------------------------------------------------

    def _live(self) -> list[DeviceMeasurement]:
        return [m for m in self.node.devices if not m.failed]

    def _on_each(self, what: str, work: Callable[[DeviceMeasurement], None]) -> None:
        """Run ``work`` per healthy device; a device error is recorded against that GPU."""
        for m in self._live():
            try:
                work(m)
            except CheckError:
                raise
            except Exception as exc:  # a CUDA error names the device it happened on
                m.errors.append(f"{what}: {type(exc).__name__}: {exc}")

    def _phase(self, name: str, work: Callable[[float], None]) -> None:
        remaining = self.deadline - SYSTEM_CLOCK.monotonic()
        if remaining <= 0:
            self.node.skipped.append(name)
            return
        work(SYSTEM_CLOCK.monotonic() + min(remaining, _SHARES[name] * self.budget_s))
        self.backend.release()

    # -- compute -----------------------------------------------------------------------

    def _reference_check(self) -> None:
        rng = np.random.default_rng(1)
        a = rng.uniform(-1, 1, (REFERENCE_SIZE, REFERENCE_SIZE)).astype(np.float32)
        b = rng.uniform(-1, 1, (REFERENCE_SIZE, REFERENCE_SIZE)).astype(np.float32)
        expected = a.astype(np.float64) @ b.astype(np.float64)
        scale = float(np.abs(expected).max())

        def check(m: DeviceMeasurement) -> None:
            d = m.device.index
            got = self.backend.download(
                self.backend.matmul(
                    self.backend.upload(d, a, "fp32"), self.backend.upload(d, b, "fp32"), "fp32"
                )
            )
            error = np.abs(got - expected) / scale
            worst = np.unravel_index(int(np.argmax(error)), error.shape)
            m.reference_error = float(error[worst])
            m.reference_index = (int(worst[0]), int(worst[1]))

        self._on_each("reference matmul", check)

    def _compute(self, dtype: str, until: float) -> None:
        n = self.deep.matmul_size
        rng = np.random.default_rng(2)
        a_host = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        b_host = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        inputs: dict[int, tuple[Buffer, Buffer, Buffer]] = {}

        def prepare(m: DeviceMeasurement) -> None:
            d = m.device.index
            a, b = self.backend.upload(d, a_host, dtype), self.backend.upload(d, b_host, dtype)
            first = self.backend.matmul(a, b, dtype)
            m.digests[dtype] = hashlib.sha256(self.backend.raw_bits(first).tobytes()).hexdigest()
            m.self_mismatches[dtype] = 0
            m.matmuls[dtype] = 0
            inputs[d] = (a, b, first)

        self._on_each(f"{dtype} matmul", prepare)
        seconds: dict[int, float] = {}
        batch = 1
        while SYSTEM_CLOCK.monotonic() < until and inputs:
            timers: dict[int, Timer] = {}
            last: dict[int, Buffer] = {}
            for m in self._live():  # queue a batch on every GPU, then wait: they run together
                d = m.device.index
                if d not in inputs:
                    continue
                a, b, _ = inputs[d]
                try:
                    timers[d] = self.backend.start_timer(d)
                    for _ in range(batch):
                        last[d] = self.backend.matmul(a, b, dtype)
                    timers[d].stop()
                except Exception as exc:
                    m.errors.append(f"{dtype} matmul: {type(exc).__name__}: {exc}")
                    inputs.pop(d)

            def collect(
                m: DeviceMeasurement,
                batch: int = batch,
                timers: dict[int, Timer] = timers,
                last: dict[int, Buffer] = last,
            ) -> None:
                d = m.device.index
                if d not in timers:
                    return
                spent = timers[d].seconds()
                seconds[d] = seconds.get(d, 0.0) + spent
                m.matmuls[dtype] += batch
                m.self_mismatches[dtype] += self.backend.mismatches(last[d], inputs[d][2])
                m.tflops[dtype] = 2 * n**3 * m.matmuls[dtype] / seconds[d] / 1e12

            self._on_each(f"{dtype} matmul", collect)
            for m in self.node.devices:
                if m.failed:
                    inputs.pop(m.device.index, None)
            batch = self._next_batch(seconds, dtype)
        inputs.clear()
        self.backend.release()

    def _next_batch(self, seconds: dict[int, float], dtype: str) -> int:
        """Matmuls per batch so that the slowest GPU's batch takes about BATCH_TARGET_S."""
        slowest = max((s / max(1, self._count(d, dtype)) for d, s in seconds.items()), default=0)
        batch = MAX_BATCH if slowest <= 0 else int(min(MAX_BATCH, BATCH_TARGET_S / slowest))
        return max(1, batch)

    def _count(self, device: int, dtype: str) -> int:
        return next(m.matmuls.get(dtype, 0) for m in self.node.devices if m.device.index == device)

    # -- memory ------------------------------------------------------------------------

    def _copy_size(self, m: DeviceMeasurement) -> int:
        # Two buffers must fit comfortably in what is free.
        return max(1 << 20, min(COPY_BYTES, m.device.free_bytes // 8)) // 4 * 4

    def _memory_bandwidth(self, until: float) -> None:
        def measure(m: DeviceMeasurement) -> None:
            d, size = m.device.index, self._copy_size(m)
            src, dst = self.backend.allocate(d, size), self.backend.allocate(d, size)
            self.backend.copy(dst, src)  # warm-up
            m.memory_gb_s = 2 * size / self._time_copies(d, dst, src, until) / 1e9

        self._on_each("memory bandwidth", measure)

    def _time_copies(self, device: int, dst: Buffer, src: Buffer, until: float) -> float:
        """Mean seconds per copy, repeating while the phase has time (at least 3)."""
        total, count = 0.0, 0
        while count < 3 or (SYSTEM_CLOCK.monotonic() < until and count < 50):
            timer = self.backend.start_timer(device)
            for _ in range(3):
                self.backend.copy(dst, src)
            timer.stop()
            total += timer.seconds()
            count += 3
        return total / count

    def _pattern_test(self, until: float) -> None:
        def test(m: DeviceMeasurement) -> None:
            d = m.device.index
            budget = int(m.device.free_bytes * self.deep.memory_test_fraction)
            block = max(4, min(PATTERN_BLOCK_BYTES, budget) // 4 * 4)
            blocks = [self.backend.allocate(d, block) for _ in range(max(1, budget // block))]
            result = PatternResult(tested_bytes=block * len(blocks))
            for pattern in PATTERNS:
                if SYSTEM_CLOCK.monotonic() > until and pattern is not PATTERNS[0]:
                    break
                for buffer in blocks:
                    self.backend.write_pattern(buffer, pattern)
                for i, buffer in enumerate(blocks):
                    count, offsets = self.backend.find_pattern_errors(
                        buffer, pattern, MAX_PATTERN_OFFSETS
                    )
                    if count:
                        result.errors += count
                        result.failed_patterns.append(str(pattern))
                        room = MAX_PATTERN_OFFSETS - len(result.offsets)
                        result.offsets += [i * block + o for o in offsets[:room]]
            m.pattern = result
            blocks.clear()

        self._on_each("memory pattern test", test)

    # -- links -------------------------------------------------------------------------

    def _host_link(self, until: float) -> None:
        def measure(m: DeviceMeasurement) -> None:
            d, size = m.device.index, self._copy_size(m)
            host, dev = self.backend.allocate(None, size), self.backend.allocate(d, size)
            self.backend.copy(dev, host)
            m.h2d_gb_s = size / self._time_copies(d, dev, host, until) / 1e9
            m.d2h_gb_s = size / self._time_copies(d, host, dev, until) / 1e9

        self._on_each("host link", measure)

    def _peer_copies(self, until: float) -> None:
        """Each GPU to the next (a ring): every GPU's links used once, in bounded time."""
        live = self._live()
        if len(live) < 2:
            return
        pairs = [(live[i], live[(i + 1) % len(live)]) for i in range(len(live))]
        for src_m, dst_m in pairs if len(live) > 2 else pairs[:1]:
            s, t = src_m.device.index, dst_m.device.index
            try:
                size = min(self._copy_size(src_m), self._copy_size(dst_m))
                src, dst = self.backend.allocate(s, size), self.backend.allocate(t, size)
                self.backend.copy(dst, src)
                self.node.peer_gb_s[(s, t)] = size / self._time_copies(s, dst, src, until) / 1e9
            except CheckError:
                raise
            except Exception as exc:
                src_m.errors.append(f"peer copy to GPU {t}: {type(exc).__name__}: {exc}")

    def _all_reduce(self, until: float) -> None:
        live = [m.device.index for m in self._live()]
        nbytes = min([ALL_REDUCE_BYTES] + [self._copy_size(m) for m in self._live()])
        try:
            seconds = self.backend.all_reduce_seconds(
                live, nbytes, repeats=5, timeout_s=max(10.0, until - SYSTEM_CLOCK.monotonic())
            )
        except CheckError as exc:
            self.node.all_reduce_note = str(exc)
            return
        except Exception as exc:
            self.node.all_reduce_error = f"{type(exc).__name__}: {exc}"
            return
        n = len(live)
        # NCCL's bus bandwidth: what each GPU's links carry in a ring all-reduce.
        self.node.all_reduce_bus_gb_s = nbytes / seconds * 2 * (n - 1) / n / 1e9
