"""A dashboard drawn as SVG from its own panel queries against a real Prometheus, laid
out on Grafana's grid (24 columns, 30 px a row unit), with Grafana's stat, time-series and
table panels and units. It makes docs/img/dashboard-*.svg: no Grafana installs from the
package registries this project builds from."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuguard.sim.svg import PALETTE, document, legend, line_chart, text
from tests.support.prometheus import PrometheusServer, expression, panels

COLUMN_PX, ROW_PX, TITLE_PX = 50, 30, 24
WIDTH = 24 * COLUMN_PX
MOST_LEGEND_ROWS = 4
MOST_TABLE_ROWS = 6
LEGEND_COLUMN_PX = 190
Series = tuple[str, list[tuple[float, float]]]


@dataclass
class Drawn:
    """The SVG and, per panel title, how many series each of its targets drew."""

    svg: str
    series: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """The range the time series span: Unix seconds, and the step between points."""

    start: float
    end: float
    step: float = 1.0

    def first(self) -> float:
        """The first point's time: points are counted back from ``end``, so the last one
        sees everything scraped by then (as Grafana's "now")."""
        return self.end - self.step * math.floor((self.end - self.start) / self.step)


def unit_format(unit: str | None, decimals: int | None = None) -> Callable[[float], str]:
    """A value as Grafana shows ``unit``: percentunit, s, ops, anything else a number."""

    def number(value: float) -> str:
        return f"{value:.{decimals}f}" if decimals is not None else f"{value:.4g}"

    def seconds(value: float) -> str:
        for size, name in ((3600, "h"), (60, "min"), (1, "s")):
            if abs(value) >= size:
                return f"{value / size:.3g} {name}"
        return f"{value * 1000:.3g} ms" if value else "0 s"

    formats: dict[str | None, Callable[[float], str]] = {
        "percentunit": lambda v: f"{number(100 * v)} %",
        "s": seconds,
        "ops": lambda v: f"{number(v)}/s",
    }
    return formats.get(unit, number)


def label(legend_format: str, metric: dict[str, str]) -> str:
    """The series' name as Grafana writes it from ``legendFormat``."""
    if not legend_format:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), legend_format)


def finite(values: list[list[Any]]) -> list[tuple[float, float]]:
    points = [(float(t), float(v)) for t, v in values]
    return [(t, v) for t, v in points if math.isfinite(v)]


def fetch(
    prometheus: PrometheusServer, panel: dict[str, Any], window: Window
) -> list[list[Series]]:
    """Per target, its series: over ``window`` for a time series, the last value else."""
    out = []
    for target in panel.get("targets", []):
        expr, legend_format = expression(target), target.get("legendFormat", "")
        if panel["type"] == "timeseries":
            data = prometheus.api(
                "query_range",
                query=expr,
                start=str(window.first()),
                end=str(window.end),
                step=str(window.step),
            )["result"]
            out.append([(label(legend_format, s["metric"]), finite(s["values"])) for s in data])
        else:
            data = prometheus.query(expr)
            out.append(
                [(label(legend_format, s.get("metric", {})), finite([s["value"]])) for s in data]
            )
    return out


def stat_colour(config: dict[str, Any], value: float) -> str:
    """The colour of the last threshold step ``value`` reaches (Grafana's absolute mode)."""
    colour = "#2f855a"
    for step in config.get("thresholds", {}).get("steps", []):
        if step["value"] is None or value >= step["value"]:
            colour = {"red": "#c53030", "green": "#2f855a"}.get(step["color"], step["color"])
    return colour


def stat_text(config: dict[str, Any], value: float) -> str:
    for mapping in config.get("mappings", []):
        mapped = mapping.get("options", {}).get(f"{value:g}")
        if mapped:
            return str(mapped["text"])
    return unit_format(config.get("unit"), config.get("decimals"))(value)


def draw_stat(
    box: tuple[float, float, float, float], config: dict[str, Any], series: list[Series]
) -> list[str]:
    x, y, width, height = box
    values = [points[-1][1] for _, points in series if points]
    if not values:
        return [text(x + width / 2, y + height / 2, "No data", "middle", size=14)]
    shown = values[0]
    size = int(min(36, height * 0.6))
    return [
        f'<text x="{x + width / 2:.1f}" y="{y + height / 2 + size / 3:.1f}" text-anchor="middle" '
        f'font-size="{size}" font-weight="bold" fill="{stat_colour(config, shown)}">'
        f"{stat_text(config, shown)}</text>"
    ]


def draw_table(box: tuple[float, float, float, float], series: list[Series]) -> list[str]:
    x, y, width, _ = box
    rows = [(name, points[-1][1]) for name, points in series if points]
    body = [text(x + 4, y + 14, "series", size=11), text(x + width - 4, y + 14, "value", "end", 11)]
    for index, (name, value) in enumerate(rows[:MOST_TABLE_ROWS]):
        top = y + 32 + 18 * index
        body += [text(x + 4, top, name, size=11), text(x + width - 4, top, f"{value:g}", "end", 11)]
    if len(rows) > MOST_TABLE_ROWS:
        body.append(
            text(
                x + 4,
                y + 32 + 18 * MOST_TABLE_ROWS,
                f"and {len(rows) - MOST_TABLE_ROWS} more",
                size=11,
            )
        )
    return body


def draw_timeseries(
    box: tuple[float, float, float, float],
    config: dict[str, Any],
    series: list[Series],
    window: Window,
) -> list[str]:
    """Lines over the window, time counted back from its end (Grafana's "now")."""
    x, y, width, height = box
    shown = [(name, [(t - window.end, v) for t, v in points]) for name, points in series]
    shown = shown[: len(PALETTE)]
    legend_rows = min(len(shown), MOST_LEGEND_ROWS)
    plot = (x + 64, y + 4, width - 72, height - 22 - 16 * legend_rows)
    body = line_chart(
        plot,
        dict(shown),
        unit_format(config.get("unit")),
        lambda t: f"{t:.0f} s",
        x_range=(window.first() - window.end, 0.0),
    )
    if not any(points for _, points in shown):
        body.append(text(plot[0] + plot[2] / 2, plot[1] + plot[3] / 2, "No data", "middle", 14))
    entries = [(name, PALETTE[i]) for i, (name, _) in enumerate(shown)]
    for column in range(0, len(entries), legend_rows):
        left = x + 8 + LEGEND_COLUMN_PX * (column // legend_rows)
        chunk = entries[column : column + legend_rows]
        body += legend(chunk, left, y + height - 16 * legend_rows, size=10)
    return body


def render(dashboard: dict[str, Any], prometheus: PrometheusServer, window: Window) -> Drawn:
    """``dashboard`` drawn from what ``prometheus`` answers its panels' queries."""
    body: list[str] = []
    drawn = Drawn(svg="")
    bottom = 0
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        x, y = grid["x"] * COLUMN_PX, grid["y"] * ROW_PX + 40
        width, height = grid["w"] * COLUMN_PX, grid["h"] * ROW_PX
        bottom = max(bottom, y + height)
        body.append(
            f'<rect x="{x + 2}" y="{y + 2}" width="{width - 4}" height="{height - 4}" '
            'fill="none" stroke="#cbd5e0" rx="3"/>'
        )
        body.append(text(x + 10, y + 18, panel["title"], size=13))
        per_target = fetch(prometheus, panel, window)
        drawn.series[panel["title"]] = [len(found) for found in per_target]
        everything = [s for found in per_target for s in found]
        inner = (x + 8, y + TITLE_PX + 4, width - 16, height - TITLE_PX - 12)
        config = panel.get("fieldConfig", {}).get("defaults", {})
        if panel["type"] == "stat":
            body += draw_stat(inner, config, everything)
        elif panel["type"] == "table":
            body += draw_table(inner, everything)
        else:
            body += draw_timeseries(inner, config, everything, window)
    body.insert(0, text(10, 26, dashboard["title"], size=18))
    drawn.svg = document(body, dashboard["title"], WIDTH, bottom + 10)
    return drawn
