"""The deep checks as the runner sees them: same interface, same timeout, fail closed."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from gpuguard.checks.base import Check, CheckContext
from gpuguard.checks.load.nic_loopback import DeepNetworkCheck
from gpuguard.config import DEEP_TIMEOUT_MARGIN_S
from gpuguard.errors import CheckFailed, NotApplicable, ToolMissing
from gpuguard.model import Finding, Layer

if TYPE_CHECKING:
    from gpuguard.checks.load.backend import Backend
    from gpuguard.checks.load.figures import FigureTable
    from gpuguard.checks.nvml_binding import Nvml


class DeepGpuCheck:
    """Every GPU under load: correctness, throughput, memory, host and peer links."""

    name: ClassVar[str] = "deep-gpu"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(
        self,
        backend: Backend | None = None,
        nvml: Nvml | None = None,
        table: FigureTable | None = None,
    ) -> None:
        """``backend``/``nvml`` default to PyTorch and pynvml, imported when the check runs."""
        self._backend = backend
        self._nvml = nvml
        self._table = table

    def run(self, ctx: CheckContext) -> list[Finding]:
        # Imported here: the suite's NumPy and the table cost an idle agent ~15 MB, and
        # most agents run the suite rarely or never.
        from gpuguard.checks.load.figures import builtin_table
        from gpuguard.checks.load.judge import judge
        from gpuguard.checks.load.measure import Suite
        from gpuguard.checks.load.telemetry import LoadTelemetry

        if not ctx.sources.live:
            raise ToolMissing("the deep checks run on the live node only, not on a bundle")
        backend = self._backend if self._backend is not None else _torch_backend()
        devices = backend.devices()
        if not devices:
            if ctx.expectations.gpus:
                raise CheckFailed(
                    f"{backend.name} sees no GPU while {ctx.expectations.gpus} are expected"
                )
            raise NotApplicable(f"{backend.name} sees no GPU on this node")
        deep = ctx.config.deep
        # Leave the runner's margin for start-up; a suite never plans past its timeout.
        budget = min(deep.budget_s, max(1.0, ctx.timeout_s - DEEP_TIMEOUT_MARGIN_S))
        table = self._table or builtin_table()
        telemetry = LoadTelemetry(self._nvml if self._nvml is not None else _pynvml())
        telemetry.start(expected_s=budget)
        try:
            measured = Suite(backend, deep, budget).run()
        finally:
            telemetry.stop()
        return judge(measured, table, deep) + telemetry.findings()


def deep_checks() -> list[Check]:
    return [DeepGpuCheck(), DeepNetworkCheck()]


def _torch_backend() -> Backend:
    from gpuguard.checks.load.torch_backend import load_torch_backend

    return load_torch_backend()


def _pynvml() -> Nvml | None:
    """pynvml, or None where it is not installed (the load then runs without telemetry)."""
    from gpuguard.checks.nvml import import_pynvml

    try:
        return import_pynvml()
    except ToolMissing:
        return None
