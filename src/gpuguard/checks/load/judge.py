"""Verdicts on a deep-suite measurement: silent data corruption, fail-slow, bad memory.

Every GPU is judged twice where it can be: against the figure its model should reach
(``figures.py``) and against its siblings of the same model on the node, so a slow GPU is
caught even on a model the table does not know, and a whole node running slow is caught
even though its GPUs agree with each other.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator

from gpuguard.checks.load.figures import FigureTable, expected_for, pcie_gb_s
from gpuguard.checks.load.measure import DeviceMeasurement, NodeMeasurement
from gpuguard.checks.rules import Rule, table
from gpuguard.config import DeepChecks, GpuFigures
from gpuguard.model import NODE, Action, Component, Finding, Layer, Severity, gpu

SOURCE = "deep-gpu"
REFERENCE_TOLERANCE = 1e-3  # fp32 256x256 product: real error is ~1e-6 of the largest value

RULES: dict[str, Rule] = table(
    *(
        Rule(code, Severity.CRITICAL, Action.RESET_GPU, why)
        for code, why in (
            (
                "DEEP_SILENT_DATA_CORRUPTION",
                "wrong answers with no error reported: the job's results cannot be trusted",
            ),
            ("DEEP_DEVICE_ERROR", "the GPU failed under load"),
            ("DEEP_MEMORY_PATTERN_ERRORS", "memory returned other bits than were written"),
        )
    ),
    # Deferred: a slow GPU still computes correctly, and the suite's own load (or a false
    # positive, which the reset also settles) is no reason to kill a job that is making
    # progress on it.
    *(
        Rule(
            code,
            Severity.WARNING,
            Action.RESET_GPU,
            "fail-slow: one slow GPU holds back every synchronous step of a multi-GPU job;"
            " its answers are right, so the reset waits until its work ends",
            deferred=True,
        )
        for code in ("DEEP_MATMUL_SLOW", "DEEP_MEMORY_BANDWIDTH_LOW", "DEEP_PEER_BANDWIDTH_LOW")
    ),
    Rule(
        "DEEP_HOST_LINK_SLOW",
        Severity.WARNING,
        Action.NONE,
        "a slow host link is renegotiated only by a reboot; like PCIE_WIDTH_DEGRADED, report it",
    ),
    Rule("DEEP_ALL_REDUCE_SLOW", Severity.WARNING, Action.NONE, "a link or a peer, not one GPU"),
    Rule("DEEP_ALL_REDUCE_FAILED", Severity.WARNING, Action.NONE, "a link or a peer, not one GPU"),
    *(
        Rule(code, Severity.INFO, Action.NONE, "what the suite measured or could not")
        for code in (
            "DEEP_GPU_MEASURED",
            "DEEP_SUITE_MEASURED",
            "DEEP_MODEL_UNKNOWN",
            "DEEP_PHASE_SKIPPED",
        )
    ),
)


def finding(code: str, component: Component, message: str, evidence: str = "") -> Finding:
    prefix = "" if component == NODE else f"{component.id}: "
    return RULES[code].finding(Layer.GPU, component, SOURCE, prefix + message, evidence)


def judge(node: NodeMeasurement, table: FigureTable, deep: DeepChecks) -> list[Finding]:
    figures = {m.device.index: expected_for(m.device.name, table, deep) for m in node.devices}
    findings = [*_corruption(node), *_errors(node)]
    findings += _slow(node, figures, deep)
    findings += _pattern(node)
    findings += _interconnect(node, figures, deep)
    findings += _summaries(node, figures)
    return findings


def component_of(m: DeviceMeasurement) -> Component:
    return gpu(m.device.pci_bus_id, m.device.uuid)


# -- correctness -----------------------------------------------------------------------


def _corruption(node: NodeMeasurement) -> Iterator[Finding]:
    for m in node.devices:
        if m.reference_error is not None and m.reference_error > REFERENCE_TOLERANCE:
            yield finding(
                "DEEP_SILENT_DATA_CORRUPTION",
                component_of(m),
                "fp32 matrix product differs from the CPU reference",
                f"relative error {m.reference_error:.3g} at element {m.reference_index}"
                f" (tolerance {REFERENCE_TOLERANCE:g})",
            )
            continue
        changed = {d: c for d, c in m.self_mismatches.items() if c}
        if changed:
            detail = ", ".join(f"{d}: {c} elements" for d, c in sorted(changed.items()))
            yield finding(
                "DEEP_SILENT_DATA_CORRUPTION",
                component_of(m),
                "repeating the same matrix product gave different results",
                f"differences from its own first result over the run: {detail}",
            )
    yield from _sibling_disagreement(node)


def _sibling_disagreement(node: NodeMeasurement) -> Iterator[Finding]:
    """Identical inputs on identical GPUs give bit-identical products; the odd one out is
    wrong. Without a strict majority every disagreeing GPU is named."""
    flagged: dict[str, list[str]] = defaultdict(list)
    for model, group in _by_model(node).items():
        for dtype in sorted({d for m in group for d in m.digests}):
            voters = [m for m in group if dtype in m.digests]
            groups: dict[str, list[DeviceMeasurement]] = defaultdict(list)
            for m in voters:
                groups[m.digests[dtype]].append(m)
            if len(groups) < 2:
                continue
            sizes = sorted((len(g) for g in groups.values()), reverse=True)
            majority = sizes[0] > sizes[1]
            for members in groups.values():
                if majority and len(members) == sizes[0]:
                    continue
                for m in members:
                    others = len(voters) - len(members)
                    flagged[m.device.pci_bus_id].append(
                        f"{dtype} product differs from {others} of {len(voters) - 1} {model} GPUs"
                        + ("" if majority else " (no majority)")
                    )
    for m in node.devices:
        if m.device.pci_bus_id in flagged:
            yield finding(
                "DEEP_SILENT_DATA_CORRUPTION",
                component_of(m),
                "matrix product differs from identical GPUs given identical inputs",
                "; ".join(flagged[m.device.pci_bus_id]),
            )


def _errors(node: NodeMeasurement) -> Iterator[Finding]:
    for m in node.devices:
        if m.errors:
            yield finding(
                "DEEP_DEVICE_ERROR",
                component_of(m),
                f"device error under load: {m.errors[0]}",
                "; ".join(m.errors),
            )


def _pattern(node: NodeMeasurement) -> Iterator[Finding]:
    for m in node.devices:
        p = m.pattern
        if p is None or not p.errors:
            continue
        offsets = ", ".join(f"0x{o:x}" for o in p.offsets)
        yield finding(
            "DEEP_MEMORY_PATTERN_ERRORS",
            component_of(m),
            f"{p.errors} memory words read back wrong in a {p.tested_bytes / 2**30:.2f} GiB test",
            f"patterns: {', '.join(p.failed_patterns)}; first byte offsets in the tested"
            f" region: {offsets}",
        )


# -- speed -----------------------------------------------------------------------------


def _slow(
    node: NodeMeasurement, figures: dict[int, GpuFigures | None], deep: DeepChecks
) -> Iterator[Finding]:
    groups = _by_model(node)
    for m in node.devices:
        siblings = groups[m.device.name]
        fig = figures[m.device.index]
        for dtype, tflops in sorted(m.tflops.items()):
            peak = fig.peak_tflops(dtype) if fig else None
            yield from _judge_speed(
                m, "DEEP_MATMUL_SLOW", f"{dtype} matmul", "TFLOP/s", tflops,
                _floor(peak, fig, "matmul", deep),
                [s.tflops[dtype] for s in siblings if dtype in s.tflops], deep,
            )  # fmt: skip
        memory_peak = fig.memory_gb_s if fig else None
        if m.memory_gb_s is not None:
            yield from _judge_speed(
                m, "DEEP_MEMORY_BANDWIDTH_LOW", "memory bandwidth", "GB/s", m.memory_gb_s,
                _floor(memory_peak, fig, "memory", deep),
                [s.memory_gb_s for s in siblings if s.memory_gb_s is not None], deep,
            )  # fmt: skip
        link_peak = (
            pcie_gb_s(fig.pcie_gen, fig.pcie_width)
            if fig and fig.pcie_gen and fig.pcie_width
            else None
        )
        for direction, value in (("host-to-device", m.h2d_gb_s), ("device-to-host", m.d2h_gb_s)):
            if value is None:
                continue
            yield from _judge_speed(
                m, "DEEP_HOST_LINK_SLOW", f"{direction} copy", "GB/s", value,
                _floor(link_peak, fig, "host_link", deep), [], deep,
            )  # fmt: skip


def _floor(
    peak: float | None, fig: GpuFigures | None, metric: str, deep: DeepChecks
) -> float | None:
    """The figure below which a GPU is slow: peak x healthy share x ``slow_fraction``."""
    if peak is None or fig is None:
        return None
    return peak * fig.healthy_share(metric) * deep.slow_fraction


def _judge_speed(
    m: DeviceMeasurement,
    code: str,
    what: str,
    unit: str,
    value: float,
    floor: float | None,
    siblings: list[float],
    deep: DeepChecks,
) -> Iterator[Finding]:
    reasons = []
    if floor is not None and value < floor:
        reasons.append(f"below the {floor:.4g} {unit} expected of a healthy {m.device.name}")
    if len(siblings) >= 2:
        median = statistics.median(siblings)
        if value < median * (1 - deep.sibling_tolerance):
            reasons.append(
                f"{value / median:.0%} of the median of its {len(siblings)} sibling GPUs"
                f" ({median:.4g} {unit})"
            )
    if reasons:
        yield finding(code, component_of(m), f"{what} slow: {value:.4g} {unit}", "; ".join(reasons))


def _interconnect(
    node: NodeMeasurement, figures: dict[int, GpuFigures | None], deep: DeepChecks
) -> Iterator[Finding]:
    by_index = {m.device.index: m for m in node.devices}
    values = list(node.peer_gb_s.values())
    for (src, dst), value in sorted(node.peer_gb_s.items()):
        m = by_index[src]
        fig = figures[src]
        # Datasheets give both directions together; one copy uses one direction.
        one_way = fig.nvlink_gb_s / 2 if fig and fig.nvlink_gb_s else None
        yield from _judge_speed(
            m, "DEEP_PEER_BANDWIDTH_LOW", f"peer copy to GPU {by_index[dst].device.pci_bus_id}",
            "GB/s", value, _floor(one_way, fig, "nvlink", deep), values, deep,
        )  # fmt: skip
    if node.all_reduce_error:
        yield finding("DEEP_ALL_REDUCE_FAILED", NODE, f"all-reduce failed: {node.all_reduce_error}")
    bus = node.all_reduce_bus_gb_s
    fig = next(iter(figures.values()), None)
    if bus is not None and fig is not None and fig.nvlink_gb_s:
        floor = _floor(fig.nvlink_gb_s / 2, fig, "nvlink", deep)
        if floor is not None and bus < floor:
            yield finding(
                "DEEP_ALL_REDUCE_SLOW",
                NODE,
                f"all-reduce bus bandwidth {bus:.4g} GB/s",
                f"below the {floor:.4g} GB/s expected across {len(node.devices)} GPUs",
            )


# -- what was measured -----------------------------------------------------------------


def _summaries(node: NodeMeasurement, figures: dict[int, GpuFigures | None]) -> Iterator[Finding]:
    for m in node.devices:
        if figures[m.device.index] is None:
            yield finding(
                "DEEP_MODEL_UNKNOWN",
                component_of(m),
                f"no expected figures for {m.device.name!r}: judged against siblings only",
                "add it to deep.expected in the config",
            )
        parts = [f"{d} {v:.1f} TFLOP/s" for d, v in sorted(m.tflops.items())]
        if m.memory_gb_s is not None:
            parts.append(f"memory {m.memory_gb_s:.0f} GB/s")
        if m.h2d_gb_s is not None and m.d2h_gb_s is not None:
            parts.append(f"H2D {m.h2d_gb_s:.1f} GB/s, D2H {m.d2h_gb_s:.1f} GB/s")
        if m.pattern is not None:
            parts.append(f"pattern test {m.pattern.tested_bytes / 2**30:.2f} GiB")
        evidence = f"{m.device.name}; matmuls {m.matmuls}; reference error {m.reference_error}"
        yield finding("DEEP_GPU_MEASURED", component_of(m), "; ".join(parts) or "nothing", evidence)
    peers = ", ".join(f"{s}->{t} {v:.0f} GB/s" for (s, t), v in sorted(node.peer_gb_s.items()))
    bus = node.all_reduce_bus_gb_s
    reduce = f"all-reduce bus {bus:.0f} GB/s" if bus is not None else node.all_reduce_note
    message = (
        f"{len(node.devices)} GPUs on {node.backend}, {node.matmul_size}^3 matmuls,"
        f" {node.elapsed_s:.1f} s"
    )
    yield finding("DEEP_SUITE_MEASURED", NODE, message, "; ".join(p for p in (peers, reduce) if p))
    if node.skipped:
        yield finding(
            "DEEP_PHASE_SKIPPED", NODE, f"out of budget before: {', '.join(node.skipped)}"
        )


def _by_model(node: NodeMeasurement) -> dict[str, list[DeviceMeasurement]]:
    groups: dict[str, list[DeviceMeasurement]] = defaultdict(list)
    for m in node.devices:
        groups[m.device.name].append(m)
    return groups
