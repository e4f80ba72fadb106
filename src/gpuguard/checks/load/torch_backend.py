"""PyTorch on CUDA GPUs: the backend of the deep checks on real nodes.

Deliberately thin: each method is one or two PyTorch calls, and everything that decides
anything lives in backend-independent code that the NumPy tests run. Timing uses CUDA
events on the device's current stream; the all-reduce runs NCCL through
``torch.distributed``, one spawned process per GPU.
"""

from __future__ import annotations

import queue
import socket

import numpy as np

from gpuguard.checks.load.backend import Buffer, DeviceInfo, Pattern
from gpuguard.checks.load.torch_types import DeviceProperties, ReportQueue, Torch, TorchTensor
from gpuguard.errors import NotApplicable, ToolMissing

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32"}


def load_torch_backend() -> TorchBackend:
    """The backend, or the reason there is none (missing PyTorch, no CUDA GPU)."""
    try:
        import torch
    except ImportError:
        raise ToolMissing("PyTorch is not installed (pip install 'gpuguard[torch]')") from None
    module: Torch = torch
    if not module.cuda.is_available():
        raise NotApplicable("PyTorch sees no CUDA GPU on this node")
    return TorchBackend(module)


class _CudaTimer:
    def __init__(self, torch: Torch, device: int) -> None:
        self.torch, self.device = torch, device
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.begin.record(torch.cuda.current_stream(device))

    def stop(self) -> None:
        self.end.record(self.torch.cuda.current_stream(self.device))

    def seconds(self) -> float:
        self.end.synchronize()
        return float(self.begin.elapsed_time(self.end)) / 1000


class TorchBackend:
    name = "torch"

    def __init__(self, torch: Torch) -> None:
        self.torch = torch

    def devices(self) -> list[DeviceInfo]:
        cuda = self.torch.cuda
        found = []
        for index in range(cuda.device_count()):
            props = cuda.get_device_properties(index)
            free, _total = cuda.mem_get_info(index)
            uuid = getattr(props, "uuid", None)
            found.append(
                DeviceInfo(
                    index,
                    props.name,
                    _bus_id(props, index),
                    f"GPU-{uuid}" if uuid is not None else None,
                    int(free),
                )
            )
        return found

    def upload(self, device: int, host: np.ndarray, dtype: str) -> TorchTensor:
        on_device = self.torch.from_numpy(host).to(f"cuda:{device}")
        return on_device.to(getattr(self.torch, _TORCH_DTYPES[dtype]))

    def download(self, buffer: Buffer) -> np.ndarray:
        return self._tensor(buffer).double().cpu().numpy()

    def raw_bits(self, buffer: Buffer) -> np.ndarray:
        return self._bits(buffer).cpu().numpy()

    def matmul(self, a: Buffer, b: Buffer, dtype: str) -> TorchTensor:
        self.torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        return self.torch.matmul(self._tensor(a), self._tensor(b))

    def mismatches(self, x: Buffer, y: Buffer) -> int:
        return int(self._bits(x).ne(self._bits(y)).sum().item())

    def allocate(self, device: int | None, nbytes: int) -> TorchTensor:
        words = nbytes // 4
        if device is None:
            return self.torch.empty(words, dtype=self.torch.int32, pin_memory=True)
        return self.torch.empty(words, dtype=self.torch.int32, device=f"cuda:{device}")

    def copy(self, dst: Buffer, src: Buffer) -> None:
        self._tensor(dst).copy_(self._tensor(src), non_blocking=True)

    def write_pattern(self, buffer: Buffer, pattern: Pattern) -> None:
        words = self._tensor(buffer)
        if pattern.kind == "constant":
            words.fill_(_int32(pattern.value))
        else:
            self.torch.arange(words.numel(), dtype=self.torch.int32, out=words)
            words.bitwise_xor_(_int32(pattern.value))

    def find_pattern_errors(
        self, buffer: Buffer, pattern: Pattern, limit: int
    ) -> tuple[int, list[int]]:
        words = self._tensor(buffer)
        if pattern.kind == "constant":
            wrong = words.ne(_int32(pattern.value))
        else:
            expected = self.torch.arange(words.numel(), dtype=self.torch.int32, device=words.device)
            wrong = words.ne(expected.bitwise_xor_(_int32(pattern.value)))
        count = int(wrong.sum().item())
        if not count:
            return 0, []
        first = wrong.nonzero()[:limit].flatten().tolist()
        return count, [int(i) * 4 for i in first]

    def start_timer(self, device: int) -> _CudaTimer:
        return _CudaTimer(self.torch, device)

    def synchronize(self, device: int) -> None:
        self.torch.cuda.synchronize(device)

    def all_reduce_seconds(
        self, devices: list[int], nbytes: int, repeats: int, timeout_s: float
    ) -> float:
        distributed = self.torch.distributed
        if len(devices) < 2:
            raise NotApplicable("all-reduce needs two GPUs or more")
        if not distributed.is_available() or not distributed.is_nccl_available():
            raise NotApplicable("this PyTorch has no NCCL")
        ctx = self.torch.multiprocessing.get_context("spawn")
        results = ctx.Queue()
        port = _free_port()
        workers = [
            ctx.Process(
                target=_all_reduce_worker,
                args=(rank, devices, port, nbytes, repeats, results),
                daemon=True,
            )
            for rank in range(len(devices))
        ]
        for worker in workers:
            worker.start()
        try:
            kind, value = results.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"NCCL all-reduce gave no result in {timeout_s:.0f}s") from None
        finally:
            for worker in workers:
                worker.join(timeout=5)
                if worker.is_alive():
                    worker.kill()
        if kind != "ok":
            raise RuntimeError(f"NCCL all-reduce failed: {value}")
        return float(value)

    def release(self) -> None:
        self.torch.cuda.empty_cache()

    def _tensor(self, buffer: Buffer) -> TorchTensor:
        """A buffer this backend made, as the tensor it is."""
        if not isinstance(buffer, self.torch.Tensor):
            raise TypeError(f"not a PyTorch tensor: {type(buffer).__name__}")
        return buffer

    def _bits(self, buffer: Buffer) -> TorchTensor:
        tensor = self._tensor(buffer)
        width = {2: self.torch.int16, 4: self.torch.int32}[tensor.element_size()]
        return tensor.view(width)


def _all_reduce_worker(
    rank: int, devices: list[int], port: int, nbytes: int, repeats: int, results: ReportQueue
) -> None:
    """One rank of the all-reduce (a spawned process); rank 0 reports the time."""
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(devices[rank])
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(devices)
        )
        try:
            data = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
            dist.all_reduce(data)  # warm-up: NCCL builds its rings here
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(repeats):
                dist.all_reduce(data)
            end.record()
            torch.cuda.synchronize()
            if rank == 0:
                results.put(("ok", begin.elapsed_time(end) / 1000 / repeats))
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which names it in the finding
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def _bus_id(props: DeviceProperties, index: int) -> str:
    try:
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:  # an older PyTorch: the CUDA index is all we have
        return f"cuda:{index}"


def _int32(value: int) -> int:
    """A 32-bit pattern as the signed value an int32 tensor holds."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
