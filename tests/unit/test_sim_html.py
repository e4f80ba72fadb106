"""The HTML report's plots: round axis ticks, and the target named where no line hides it."""

from __future__ import annotations

import itertools
import re

import pytest

from gpuguard.sim.html import availability_plot, job_success_plot
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.svg import nice_ticks


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.995, 1.0, [0.995, 0.996, 0.997, 0.998, 0.999, 1.0]),
        (0.9, 1.0, [0.90, 0.92, 0.94, 0.96, 0.98, 1.0]),
        (0.4, 1.0, [0.4, 0.6, 0.8, 1.0]),
        (0, 365, [0, 100, 200, 300]),
        (0.9987, 1.0, [0.999, 0.9995, 1.0]),
    ],
)
def test_ticks_are_round_steps_inside_the_range(low, high, ticks):
    assert nice_ticks(low, high) == pytest.approx(ticks)


@pytest.fixture(scope="module")
def simulation():
    scenario = load_scenario().with_overrides(nodes=160, days=20, warmup_days=5)
    return simulate(scenario)


def _labels(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_the_availability_axes_read_in_round_steps_from_the_end_of_the_warm_up(simulation):
    svg = availability_plot(simulation)
    labels = _labels(svg)
    percents = [float(t.rstrip(" %")) for t in labels if t.endswith(" %") and "target" not in t]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(percents)}
    assert len(steps) == 1 and steps.pop() in {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0}
    assert {"0", "5", "10", "15", "20"} <= set(labels)
    assert "day after the 5-day warm-up" in labels


def test_the_target_is_named_in_the_margin_not_on_the_lines(simulation):
    svg = availability_plot(simulation)
    label = re.search(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>99\.95 % target</text>', svg)
    assert label is not None
    frame = re.search(r'<rect x="(\d+)" y="\d+" width="(\d+)"', svg)
    assert frame is not None
    assert float(label.group(1)) > int(frame.group(1)) + int(frame.group(2))  # right of it
    # The legend starts below the label when the label would sit among its entries.
    legend_ys = [float(y) for y in re.findall(r'<rect x="\d+" y="([\d.]+)" width="12"', svg)]
    label_y = float(label.group(2))
    assert all(y > label_y or y + 12 < label_y - 12 for y in legend_ys)


def test_job_success_ticks_are_round(simulation):
    labels = [t for t in _labels(job_success_plot(simulation)) if t.endswith(" %")]
    values = [float(t.rstrip(" %")) for t in labels]
    assert values[-1] == 100 and all(v == round(v) for v in values)
