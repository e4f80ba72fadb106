"""The report's rows for a GPU at a time: GPU-slot availability, per-GPU quarantine and
the preflight gate (docs/simulator.md, "Per-GPU quarantine and the preflight gate")."""

from __future__ import annotations

from collections.abc import Callable

from gpuguard.sim.formatting import pct
from gpuguard.sim.results import GpuFigures, PolicyResult

Row = tuple[str, Callable[[PolicyResult], str]]


def _cell(show: Callable[[GpuFigures], str]) -> Callable[[PolicyResult], str]:
    return lambda r: show(r.gpu) if r.gpu is not None else "-"


def rows() -> list[Row]:
    return [
        ("GPU-slot availability (GPUs in service)", lambda r: pct(r.gpu_slot_availability)),
        (
            "per-GPU quarantine: GPUs out alone / taken to the node",
            _cell(lambda g: f"{g.gpus_quarantined} / {g.escalations}"),
        ),
        (
            "preflight: node checks / faults caught / false failures",
            _cell(
                lambda g: (
                    f"{g.preflight_checks} / {sum(g.preflight_caught.values())}"
                    f" / {g.preflight_false_failures}"
                )
            ),
        ),
        (
            "  starts failed / GPU-hours the checks held",
            _cell(lambda g: f"{g.preflight_failed_starts} / {g.preflight_gpu_hours:,.0f}"),
        ),
    ]
