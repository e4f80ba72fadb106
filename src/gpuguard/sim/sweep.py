"""Many seeds of one scenario: each headline figure as a mean and a 95 % interval.

One seed is one draw of the failures and the workload; a verdict on a target needs the
spread over draws. The interval is Student's t on the seeds' means, so it widens when few
seeds were run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from gpuguard.sim.results import SIZE_CLASSES, PolicyResult

# Two-sided 95 % quantiles of Student's t for 1-30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z95 = 1.959964


def t95(df: int) -> float:
    if df <= len(_T95):
        return _T95[df - 1]
    z = _Z95  # Cornish-Fisher expansion: within 0.001 of the table's values beyond 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: list[float], share: bool = True) -> Interval:
        """``share``: the figure lies in [0, 1], and so does its interval."""
        mean = statistics.fmean(values)
        if len(values) < 2:
            return cls(mean, -math.inf, math.inf, tuple(values))  # one seed says nothing
        half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        low, high = mean - half, mean + half
        if share:
            low, high = max(0.0, low), min(1.0, high)
        return cls(mean, low, high, tuple(values))

    def verdict(self, target: float) -> str:
        """``met`` only if the whole interval is at or above the target."""
        if self.low >= target:
            return "met"
        if self.high < target:
            return "MISSED"
        return "not settled"

    def to_dict(self) -> dict[str, object]:
        finite = math.isfinite(self.low)
        return {
            "mean": self.mean,
            "low": self.low if finite else None,
            "high": self.high if finite else None,
            "values": list(self.values),
        }


def _size(label: str) -> Callable[[PolicyResult], float | None]:
    return lambda r: r.job_success_by_size[label].rate


# The figures given with an interval; a seed where a figure is undefined (no 512+ job
# ended) leaves it out.
NOT_SHARES = ("mttr_hours", "job_interruptions_per_1000_node_days")  # not in [0, 1]
METRICS: dict[str, Callable[[PolicyResult], float | None]] = {
    "gpu_node_availability": lambda r: r.gpu_node_availability,
    "slot_availability": lambda r: r.slot_availability,
    "gpu_slot_availability": lambda r: r.gpu_slot_availability,
    "job_success_rate": lambda r: r.job_success_rate,
    "job_success_by_gpu_hours": lambda r: r.job_success_by_gpu_hours,
    **{f"job_success_{label}_gpus": _size(label) for _, label in SIZE_CLASSES},
    "ettr": lambda r: r.ettr,
    "effective_training_time": lambda r: r.effective,
    "effective_training_time_failed_work_lost": lambda r: r.effective_failed_lost,
    "goodput": lambda r: r.goodput,
    "ml_goodput_scheduling": lambda r: r.ml_goodput.scheduling,
    "ml_goodput_runtime": lambda r: r.ml_goodput.runtime,
    "ml_goodput_program": lambda r: r.ml_goodput.program,
    "mttr_hours": lambda r: r.mttr_hours,
    "job_interruptions_per_1000_node_days": lambda r: r.interruptions_per_1000_node_days,
}


def intervals(results: list[PolicyResult]) -> dict[str, Interval | None]:
    """Each metric over the seeds' results of one policy (None: defined in no seed)."""
    out: dict[str, Interval | None] = {}
    for name, metric in METRICS.items():
        values = [v for v in (metric(r) for r in results) if v is not None]
        out[name] = Interval.of(values, share=name not in NOT_SHARES) if values else None
    return out
