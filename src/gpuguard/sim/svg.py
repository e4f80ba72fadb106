"""Inline SVG primitives for the reports and the documentation's figures (no plotting
library): a document, text, a legend, round axis ticks and a line chart."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence

Point = tuple[float, float]
PALETTE = ("#2b6cb0", "#c53030", "#2f855a", "#d69e2e", "#805ad5", "#dd6b20", "#718096")


def document(body: list[str], title: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" font-family="sans-serif" font-size="12" '
        f'role="img" aria-label="{html.escape(title)}">'
        f'<rect width="{width}" height="{height}" fill="white"/>' + "".join(body) + "</svg>"
    )


def text(x: float, y: float, words: str, anchor: str = "start", size: int = 12) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}">'
        f"{html.escape(words)}</text>"
    )


def legend(entries: Sequence[tuple[str, str]], x: float, y: float, size: int = 12) -> list[str]:
    """A swatch and a label per entry, one under the other from (x, y)."""
    out = []
    step = size + 6
    for i, (label, colour) in enumerate(entries):
        top = y + step * i
        out.append(f'<rect x="{x}" y="{top}" width="{size}" height="{size}" fill="{colour}"/>')
        out.append(text(x + size + 6, top + size - 2, label, size=size))
    return out


def nice_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round values within [low, high], at most ``most`` of them: a step of 1, 2 or 5
    times a power of ten, as a reader counts."""
    span = high - low
    if span <= 0:
        return [low]
    raw = span / (most - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
    return [k * step for k in range(first, last + 1)]


def line_chart(
    box: tuple[float, float, float, float],
    series: Mapping[str, Sequence[Point]],
    y_label: Callable[[float], str],
    x_label: Callable[[float], str],
    x_range: tuple[float, float] | None = None,
) -> list[str]:
    """Lines in ``box`` (x, y, width, height), the x axis over ``x_range`` (else fitted
    to the points, as the y axis is), y ticks named by ``y_label`` and x ticks by
    ``x_label``; colours follow PALETTE in ``series`` order."""
    left, top, width, height = box
    xs = list(x_range or [x for points in series.values() for x, _ in points]) or [0.0, 1.0]
    ys = [y for points in series.values() for _, y in points] or [0.0, 1.0]
    x_low, x_high = min(xs), max(xs)
    y_ticks = nice_ticks(min(0.0, min(ys)), max(ys)) if max(ys) > min(0.0, min(ys)) else [0.0]
    y_low = min([*y_ticks, *ys])
    y_high = max([*y_ticks, *ys])
    x_span = (x_high - x_low) or 1.0
    y_span = (y_high - y_low) or 1.0

    def at(x: float, y: float) -> Point:
        return left + width * (x - x_low) / x_span, top + height * (1 - (y - y_low) / y_span)

    body = [
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#ccc"/>'
    ]
    for value in y_ticks:
        _, y = at(x_low, value)
        body.append(
            f'<line x1="{left}" x2="{left + width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        body.append(text(left - 4, y + 4, y_label(value), "end", size=10))
    for value in nice_ticks(x_low, x_high, most=5):
        x, _ = at(value, y_low)
        body.append(text(x, top + height + 12, x_label(value), "middle", size=10))
    for index, points in enumerate(series.values()):
        colour = PALETTE[index % len(PALETTE)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(*p) for p in points))
        body.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
    return body
