"""How the report writes figures: percentages, means with their intervals, row labels, and
rows of cells aligned into a grid."""

from __future__ import annotations

import math

from gpuguard.sim.sweep import NOT_SHARES, Interval

RATIOS = ("ettr", "effective", "goodput", "ml_goodput")  # shown as ratios, not percentages


def pct(value: float) -> str:
    return f"{100 * value:.3f} %"


def interval_text(interval: Interval | None, scale: float, digits: int) -> str:
    """``mean [low, high]`` (the mean alone without an interval; "-" without a figure)."""
    if interval is None:
        return "-"
    mean = f"{scale * interval.mean:.{digits}f}"
    if not math.isfinite(interval.low):
        return mean
    return f"{mean} [{scale * interval.low:.{digits}f}, {scale * interval.high:.{digits}f}]"


def metric_cell(interval: Interval | None, metric: str) -> str:
    """One headline figure over the seeds, scaled and rounded as its kind is shown."""
    scale, digits = (1.0, 2) if metric in NOT_SHARES else (100.0, 3)
    if metric.startswith(RATIOS):
        scale, digits = 1.0, 4
    return interval_text(interval, scale, digits)


def metric_label(metric: str) -> str:
    if metric == "mttr_hours":
        unit = " (h)"
    else:
        unit = "" if metric.startswith(RATIOS) or metric in NOT_SHARES else " %"
    return metric.replace("_", " ") + unit


def grid(rows: list[tuple[str, list[str]]]) -> list[str]:
    """Labels left-aligned, then each column right-aligned to its widest cell."""
    width = max(len(label) for label, _ in rows)
    cells = [max(len(row[1][i]) for row in rows) for i in range(len(rows[0][1]))]
    return [
        f"{label:<{width}}  " + "  ".join(f"{v:>{cells[i]}}" for i, v in enumerate(values))
        for label, values in rows
    ]
