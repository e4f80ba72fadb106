"""The scenario's sections for a GPU at a time: per-GPU quarantine and the preflight gate.

Both are off by default, as in the chart. Every figure is an input; docs/simulator.md
("Per-GPU quarantine and the preflight gate") gives the reason for each default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gpuguard.sim.faults import KINDS
from gpuguard.sim.scenario_types import NonNegative, Share, Strict

# What the gate's quick load check (matrix products checked for corruption and slowness,
# memory bandwidth, the adapters' loopback) catches of a fault present at the start that
# the health polls have not read yet, by class. A stated assumption, shown as a range in
# the sensitivity rows: a GPU lost or off its bus, a failing memory or SRAM fails the
# first kernels; a down port fails the loopback; corruption and slowness show only when
# they happen during the check's seconds; a switch, a host gone or a job's own fault not.
DEFAULT_CATCH: dict[str, float] = {
    "gpu": 0.95,
    "pcie": 0.95,
    "hbm": 0.9,
    "sram": 0.9,
    "gsp": 0.8,
    "nvlink": 0.8,
    "nic": 0.8,
    "thermal": 0.5,
    "kernel_driver": 0.5,
    "sdc": 0.5,
    "fail_slow": 0.5,
}


class GpuQuarantine(Strict):
    enabled: bool = Field(
        default=False,
        description=(
            "gpuguard takes a GPU-local fault's GPU out alone (a DRA device taint); the node"
            " keeps serving jobs that fit its other GPUs"
        ),
    )
    up_to: Literal["reset_gpu", "replace"] = Field(
        default="reset_gpu",
        description=(
            "The highest rung a GPU finding may recommend and be quarantined by a device"
            " taint: reset_gpu (a finding for a reboot or a replacement takes the node at"
            " once, as the controller does), replace (every GPU finding, the node taken only"
            " when the ladder gets there)"
        ),
    )


class Preflight(Strict):
    enabled: bool = Field(default=False, description="gpuguard's check before each job start")
    cost_s: NonNegative = Field(
        default=60.0, description="Seconds the check holds each start (the init container)"
    )
    false_failure: Share = Field(
        default=0.002,
        description="Chance a check fails a healthy node (it is quarantined, then verified)",
    )
    catch: dict[str, Share] = Field(
        default_factory=lambda: dict(DEFAULT_CATCH),
        description="Chance the check catches a fault present and not yet read, by class",
    )

    @field_validator("catch")
    @classmethod
    def _known_classes(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown fault class {unknown[0]!r} (classes: {', '.join(KINDS)})")
        return value
