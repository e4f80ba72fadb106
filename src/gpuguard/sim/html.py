"""The HTML report: one self-contained file, plots drawn as inline SVG (no plotting library)."""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence

from gpuguard.sim import in_job_report
from gpuguard.sim.report import gpu_hours_lost, span_text, table
from gpuguard.sim.results import GPU_HOUR_KINDS, SIZE_CLASSES
from gpuguard.sim.run import WITHOUT_IN_JOB, Simulation
from gpuguard.sim.svg import document, legend, nice_ticks, text
from gpuguard.sim.sweep import Interval

COLOURS = {
    "none": "#8c8c8c",
    "reactive": "#d9822b",
    "gpuguard": "#2b6cb0",
    WITHOUT_IN_JOB: "#90cdf4",
}
KIND_COLOURS = (
    "#2f855a",
    "#9b2c2c",
    "#c53030",
    "#dd6b20",
    "#805ad5",
    "#d69e2e",
    "#718096",
    "#e2e8f0",
)
FOUND_COLOURS = ("#2b6cb0", "#805ad5", "#d69e2e", "#c53030")
OUTCOME_COLOURS = {"succeeded": "#2f855a", "failed": "#c53030", "unfinished": "#cbd5e0"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 720, 300, 70, 130, 20, 40


def _svg(body: list[str], title: str, height: int = H) -> str:
    return document(body, title, W, height)


def _percent(value: float, step: float) -> str:
    """``value`` as a percentage with as many decimals as the tick step needs."""
    digits = max(0, -math.floor(math.log10(100 * step) + 1e-9))
    return f"{100 * value:.{digits}f} %"


def availability_plot(simulation: Simulation) -> str:
    """Slot availability per measured day, one line per policy, the target named in the
    margin so no line hides it."""
    series = {n: r.availability_by_day for n, r in simulation.results.items()}
    values = [v for s in series.values() for v in s] or [1.0]
    ticks = nice_ticks(min(min(values), 0.999), 1.0)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 0.001
    low = math.floor(min(min(values), 0.999) / step + 1e-9) * step
    ticks = nice_ticks(low, 1.0)
    days = max(len(s) for s in series.values()) or 1
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM

    def xy(day: float, value: float) -> tuple[float, float]:
        x = LEFT + plot_w * day / days
        y = TOP + plot_h * (1 - (value - low) / (1 - low))
        return x, y

    body = [
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>'
    ]
    for value in ticks:
        _, y = xy(0, value)
        body.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
        )
        body.append(text(LEFT - 6, y + 4, _percent(value, step), "end"))
    for day in nice_ticks(0, days, most=8):
        x, _ = xy(day, low)
        body.append(text(x, TOP + plot_h + 14, f"{day:g}", "middle"))
    for name, points in series.items():
        coords = " ".join(
            f"{x:.1f},{y:.1f}" for x, y in (xy(d + 0.5, v) for d, v in enumerate(points))
        )
        body.append(
            f'<polyline points="{coords}" fill="none" stroke="{COLOURS.get(name, "#000")}" '
            'stroke-width="2"/>'
        )
    legend_y = TOP + 10
    target_y = xy(0, 0.9995)[1]
    if target_y > TOP:
        # Drawn over the lines, named in the margin beside its end.
        body.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{target_y:.1f}" y2="{target_y:.1f}" '
            'stroke="#c53030" stroke-dasharray="4 4"/>'
        )
        body.append(text(LEFT + plot_w + 6, target_y + 4, "99.95 % target", size=11))
        if target_y < legend_y + 18 * len(series):
            legend_y = round(target_y) + 16
    warmup = simulation.scenario.warmup_days
    axis = f"day after the {warmup:g}-day warm-up" if warmup else "day of the run"
    body.append(text(LEFT + plot_w / 2, H - 8, axis, "middle"))
    body += legend([(n, COLOURS.get(n, "#000")) for n in series], W - RIGHT + 16, legend_y)
    return _svg(body, "GPU-node slot availability per day")


def _stacked(
    rows: list[tuple[str, list[float]]],
    labels: Sequence[str],
    colours: Sequence[str],
    title: str,
    left: int = LEFT,
) -> str:
    """One 100 % bar per row, segments in ``labels`` order."""
    bar_h, gap = 28, 16
    height = TOP + len(rows) * (bar_h + gap) + 30
    plot_w = W - left - RIGHT
    body = []
    for i, (name, parts) in enumerate(rows):
        y = TOP + i * (bar_h + gap)
        body.append(text(left - 6, y + bar_h / 2 + 4, name, "end"))
        total = sum(parts) or 1.0
        x = float(left)
        for part, colour, label in zip(parts, colours, labels, strict=True):
            width = plot_w * part / total
            if width <= 0:
                continue
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{bar_h}" fill="{colour}">'
                f"<title>{html.escape(f'{name}: {label} {part:,.0f} ({100 * part / total:.2f} %)')}"
                "</title></rect>"
            )
            x += width
    body += legend(list(zip(labels, colours, strict=True)), W - RIGHT + 16, TOP)
    return _svg(body, title, height)


def gpu_hours_plot(simulation: Simulation) -> str:
    rows = [
        (name, [r.gpu_hours[k] for k in GPU_HOUR_KINDS]) for name, r in simulation.results.items()
    ]
    labels = [k.replace("_", " ") for k in GPU_HOUR_KINDS]
    return _stacked(rows, labels, KIND_COLOURS, "Where the GPU-hours went")


def found_plot(simulation: Simulation) -> str:
    """Persistent fail-slow and SDC GPUs by the path that named them, pooled over seeds."""
    rows = []
    for name in (n for n in ("gpuguard", WITHOUT_IN_JOB) if n in simulation.results):
        results = simulation.every_seed(name)
        for cls, label in in_job_report.CLASSES:
            found = in_job_report.pooled(results, cls)
            parts = [found.in_job, found.deep_suite, found.passive, found.missed]
            rows.append((f"{name}: {label}", [float(p) for p in parts]))
    labels = ("in job", "deep suite", "passive", "missed")
    return _stacked(rows, labels, FOUND_COLOURS, "Who found the hidden faults", left=250)


def outcomes_plot(simulation: Simulation) -> str:
    kinds = list(OUTCOME_COLOURS)
    rows = [(name, [float(r.jobs[k]) for k in kinds]) for name, r in simulation.results.items()]
    return _stacked(rows, kinds, list(OUTCOME_COLOURS.values()), "Job outcomes per policy")


def repair_plot(simulation: Simulation) -> str:
    """Share of faults back in service within x hours (log scale), one line per policy."""
    low, high = 0.01, 1000.0
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x_of(hours: float) -> float:
        hours = min(max(hours, low), high)
        return LEFT + plot_w * math.log10(hours / low) / math.log10(high / low)

    body = [
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>'
    ]
    for exponent in range(-2, 4):
        x = x_of(10.0**exponent)
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#eee"/>'
        )
        body.append(text(x, H - 24, f"{10.0**exponent:g} h", "middle"))
    for i in range(5):
        y = TOP + plot_h * (1 - i / 4)
        body.append(text(LEFT - 6, y + 4, f"{25 * i} %", "end"))
    for name, result in simulation.results.items():
        values = result.time_to_repair_h.values
        total = len(values) + result.unrepaired_faults
        if not total:
            continue
        points: list[tuple[float, float]] = [(x_of(low), float(TOP + plot_h))]
        for i, hours in enumerate(values, start=1):
            y = TOP + plot_h * (1 - i / total)
            points.append((x_of(hours), points[-1][1]))
            points.append((x_of(hours), y))
        points.append((x_of(high), points[-1][1]))
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        body.append(
            f'<polyline points="{coords}" fill="none" stroke="{COLOURS.get(name, "#000")}" '
            'stroke-width="2"/>'
        )
    body.append(text(LEFT + plot_w / 2, H - 6, "fault to back in service", "middle"))
    body += legend(
        [(n, COLOURS.get(n, "#000")) for n in simulation.results], W - RIGHT + 16, TOP + 10
    )
    return _svg(body, "Time to repair: share of faults back in service")


JOB_VIEWS = (
    ("per job", "job_success_rate"),
    ("per GPU-hour", "job_success_by_gpu_hours"),
    *((f"{label} GPUs", f"job_success_{label}_gpus") for _, label in SIZE_CLASSES[1:]),
)


def job_success_plot(simulation: Simulation) -> str:
    """Job success four ways, mean over the seeds with its 95 % interval, per policy."""
    names = list(simulation.results)
    over = {name: simulation.over_seeds(name) for name in names}
    bar_h, group_gap = 12, 14
    group_h = bar_h * len(names) + group_gap
    height = TOP + group_h * len(JOB_VIEWS) + 40
    plot_w = W - LEFT - RIGHT - 40
    left = LEFT + 40
    floor = min(
        [0.9]
        + [
            shown.mean
            for name in names
            for _, metric in JOB_VIEWS
            if (shown := over[name][metric]) is not None
        ]
    )
    floor = math.floor(floor * 10) / 10
    ticks = nice_ticks(floor, 1.0)

    def x_of(value: float) -> float:
        return left + plot_w * (min(max(value, floor), 1.0) - floor) / (1.0 - floor)

    body = []
    for g, (label, metric) in enumerate(JOB_VIEWS):
        y0 = TOP + g * group_h
        body.append(text(left - 6, y0 + bar_h * len(names) / 2 + 4, label, "end"))
        for k, name in enumerate(names):
            interval = over[name][metric]
            y = y0 + k * bar_h
            if interval is None:
                body.append(text(left + 4, y + bar_h - 2, f"{name}: no job ended", size=10))
                continue
            body.append(
                f'<rect x="{left}" y="{y}" width="{x_of(interval.mean) - left:.1f}" '
                f'height="{bar_h - 2}" fill="{COLOURS.get(name, "#000")}">'
                f"<title>{html.escape(f'{name} {label}: {100 * interval.mean:.3f} %')}</title>"
                "</rect>"
            )
            if math.isfinite(interval.low):
                lo, hi = x_of(interval.low), x_of(interval.high)
                mid = y + (bar_h - 2) / 2
                body.append(
                    f'<line x1="{lo:.1f}" x2="{hi:.1f}" y1="{mid:.1f}" y2="{mid:.1f}" '
                    'stroke="#000" stroke-width="1.5"/>'
                )
    for value in ticks:
        x = x_of(value)
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{height - 36}" stroke="#eee"/>'
        )
        body.append(text(x, height - 22, _percent(value, ticks[1] - ticks[0]), "middle"))
    body += legend([(n, COLOURS.get(n, "#000")) for n in names], W - RIGHT + 16, TOP + 10)
    return _svg(body, "Job success per job, per GPU-hour and by size", height)


def _sections(simulation: Simulation) -> list[tuple[str, str]]:
    return [
        (
            "Job success four ways (mean, 95 % interval over the seeds)",
            job_success_plot(simulation),
        ),
        (
            "GPU-node availability over time (slots, daily, first seed)",
            availability_plot(simulation),
        ),
        ("Job outcomes per policy (first seed)", outcomes_plot(simulation)),
        ("Time to repair (share of faults back in service, first seed)", repair_plot(simulation)),
        ("Where the GPU-hours went (first seed)", gpu_hours_plot(simulation)),
        (
            "Persistent fail-slow and SDC GPUs: who named them (all seeds)",
            found_plot(simulation),
        ),
    ]


# The summary's rows: (label, metric over the seeds, shown as a percentage).
SUMMARY = (
    ("job success by GPU-hour", "job_success_by_gpu_hours", True),
    ("512+ GPU jobs succeeded", "job_success_512+_gpus", True),
    ("ETTR (Meta)", "ettr", False),
    ("effective training time", "effective_training_time", False),
    ("GPU availability (physical)", "gpu_node_availability", True),
    ("MTTR (h)", "mttr_hours", False),  # not a share: its interval is not clipped
)


def _summary_cell(interval: Interval | None, percent: bool) -> str:
    if interval is None:
        return "-"
    scale, digits = (100.0, 2) if percent else (1.0, 3)
    shown = f"{scale * interval.mean:.{digits}f}{' %' if percent else ''}"
    if not math.isfinite(interval.low):
        return shown
    low, high = scale * interval.low, scale * interval.high
    return f"{shown}<br><small>[{low:.{digits}f}, {high:.{digits}f}]</small>"


def summary(simulation: Simulation) -> str:
    """The answer first: the headline figures per policy, mean and 95 % interval."""
    names = list(simulation.results)
    head = "".join(f"<th>{html.escape(name)}</th>" for name in names)
    rows = []
    for label, metric, percent in SUMMARY:
        cells = "".join(
            f"<td>{_summary_cell(simulation.over_seeds(name)[metric], percent)}</td>"
            for name in names
        )
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    lost = "".join(
        f"<td>{statistics.fmean(gpu_hours_lost(r) for r in simulation.every_seed(name)):,.0f}</td>"
        for name in names
    )
    rows.append(
        "<tr><th>GPU-hours lost (failed jobs, rollbacks, restarts, stalls), per seed</th>"
        f"{lost}</tr>"
    )
    return f'<table class="summary"><tr><th></th>{head}</tr>{"".join(rows)}</table>'


def render(
    simulation: Simulation, replay: Simulation | None = None, sensitivity: str | None = None
) -> str:
    scenario = simulation.scenario
    sections = _sections(simulation)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gpuguard simulation: {html.escape(scenario.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:780px;margin:2em auto;color:#222}"
        "pre{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}"
        "h2{font-size:1.1em;margin-top:2em}"
        "table.summary{border-collapse:collapse;margin:1em 0}"
        "table.summary td,table.summary th{border:1px solid #ddd;padding:4px 10px;"
        "text-align:right}table.summary th{background:#f7f7f7}"
        ".wide{width:96vw;position:relative;left:50%;transform:translateX(-50%)}"
        "</style></head><body>",
        f"<h1>gpuguard fleet simulation: {html.escape(scenario.name)}</h1>",
        f"<p>{scenario.fleet.nodes} nodes of 8 GPUs, {span_text(scenario)}, seeds"
        f" {', '.join(map(str, simulation.seeds))}. Every policy saw the same failures and the"
        " same jobs in each seed. The gpuguard"
        " run is the controller's own policy code (<code>remediation.decide</code>) fed by"
        " the agent's own parsers and rules.</p>",
        summary(simulation),
    ]
    for title, svg in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>{svg}")
    if sensitivity is not None:
        parts += [
            "<h2>What each assumption moves (one changed per row)</h2>",
            f"<pre>{html.escape(sensitivity)}</pre>",
        ]
    if replay is not None and replay.trace is not None:
        trace = replay.trace
        parts += [
            f"<h1>Replay of a recorded fault trace: {html.escape(trace.name)}</h1>",
            f"<p>{trace.nodes} nodes, {trace.days:g} days, {len(trace.records)} recorded"
            " faults, each emitted as the signal its class maps to (docs/simulator.md,"
            " \u201cReplaying a fault trace\u201d). The three policies ran on the trace's"
            " faults; \u201cas recorded\u201d is the trace's own operations: the downtime it"
            " recorded.</p>",
            summary(replay),
        ]
        for title, svg in _sections(replay)[:2]:
            parts.append(f"<h2>{html.escape(title)} (trace)</h2>{svg}")
    parts.append("<h2>The full report</h2>")
    parts.append(f'<pre class="wide">{html.escape(table(simulation))}</pre>')
    if replay is not None:
        parts.append(f'<pre class="wide">{html.escape(table(replay))}</pre>')
    parts.append("</body></html>")
    return "\n".join(parts)
