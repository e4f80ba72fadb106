"""What the agent and the controller make of a node's raw signals: the real code, cached.

A node's signals (kernel log lines since boot, GPU facts, RDMA ports, a hung check) go
through the same functions the agent runs: ``kernel_log.classify_log`` with the Xid
catalog, ``gpu_facts.evaluate_gpus``, ``network.evaluate_ports``, ``runner.assess`` (fail
closed), then ``contract.layer_reports`` (the conditions and report annotation the agent
publishes, as the controller reads them) and ``remediation.health.as_policy_reads``.
Identical signals give identical verdicts, so each distinct set is classified once per
run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass

from gpuguard.checks.gpu_facts import GpuFacts, NvLinkFacts, evaluate_gpus
from gpuguard.checks.load.backend import DeviceInfo
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.checks.load.figures import expected_for, load_table
from gpuguard.checks.load.judge import SOURCE as DEEP_CHECK
from gpuguard.checks.load.judge import judge
from gpuguard.checks.load.measure import DeviceMeasurement, NodeMeasurement
from gpuguard.checks.network.check import PortRecord, evaluate_ports
from gpuguard.checks.xid_catalog import rule_for
from gpuguard.config import DeepChecks
from gpuguard.contract.conditions import PROFILES
from gpuguard.contract.report import LayerReport, layer_reports
from gpuguard.kernel_log.check import classify_log, scan
from gpuguard.kernel_log.messages import parse_line
from gpuguard.model import CheckResult, Layer, Outcome, Severity
from gpuguard.remediation.health import as_policy_reads
from gpuguard.runner import assess, inconclusive_result
from gpuguard.sim.faults import GPU_BUS, Signal, gpu_bus_id
from gpuguard.sim.in_job_findings import InJobFinding, in_job_result

GPUS = 8
GPU_MODEL = "NVIDIA H100 80GB HBM3"
LINK_GBPS = 400.0
PROFILE = "gpuguard"
POOL_LABEL = "karpenter.sh/nodepool"

_PREFIX = "NVRM: Xid (PCI:0000:{bus}:00): "
_KERNEL_LINES: dict[Signal, str] = {
    Signal.XID_79: "79, pid=2712, name=python, GPU has fallen off the bus.",
    Signal.XID_74: (
        "74, pid=2712, name=python, NVLink: fatal error detected on link 5"
        "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
    ),
    Signal.XID_48: (
        "48, pid=2712, name=python, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 1, subpartition 0."
    ),
    Signal.XID_95: "95, pid=2712, name=python, Uncontained: SM. RST: Yes, D-RST: No",
    Signal.XID_119: (
        "119, pid=2712, name=python, Timeout after 6s of waiting for RPC response from "
        "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8)."
    ),
    Signal.XID_13: (
        "13, pid=2712, name=python, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
        "Out Of Range Address"
    ),
    Signal.XID_63: (
        "63, pid='<unknown>', name=<unknown>, Row Remapper: New row (0x0000000000a3f1c0) "
        "Marked for Remapping, reset gpu to activate."
    ),
}
_SAME_LINE = {Signal.XID_48_REMAP: Signal.XID_48, Signal.XID_48_REMAP_FAILED: Signal.XID_48}


def kernel_line(signal: Signal, gpu: int) -> str | None:
    """The kernel log line a signal writes, or None if it writes none."""
    bus = GPU_BUS[gpu]
    if signal is Signal.FALLEN_OFF:
        return f"NVRM: GPU at PCI:0000:{bus}:00: GPU has fallen off the bus."
    if signal is Signal.KERNEL_BUG:
        return "kernel BUG at mm/slub.c:4265!"
    text = _KERNEL_LINES.get(_SAME_LINE.get(signal, signal))
    return None if text is None else _PREFIX.format(bus=bus) + text


def is_application_line(line: str) -> bool:
    """Application Xids leave the agent's verdict after a time to live (as in
    kernel_log/state.py)."""
    event = parse_line(line)
    return event is not None and event.code is not None and rule_for(event.code).application


# Signals read by the periodic checks (NVML, sysfs) rather than from the kernel log.
FACT_SIGNALS = frozenset(
    {
        Signal.XID_79,
        Signal.XID_74,
        Signal.FALLEN_OFF,
        Signal.XID_48_REMAP,
        Signal.XID_48_REMAP_FAILED,
        Signal.XID_48,
        Signal.OVERHEAT,
        Signal.POWER_BRAKE,
    }
)
PORT_SIGNALS = frozenset({Signal.PORT_DOWN, Signal.RATE_DROP})
CHECKED_SIGNALS = FACT_SIGNALS | PORT_SIGNALS | {Signal.CHECK_TIMEOUT}


@dataclass(frozen=True, order=True)
class DeepFinding:
    """What one run of the deep suite measured on one GPU: its products wrong
    (``corrupt``), or its speed a share (``pace``) of a healthy GPU's (``slow``)."""

    kind: str  # "corrupt" or "slow"
    gpu: int
    pace: float = 1.0


@dataclass(frozen=True)
class NodeSignals:
    """Everything the agent would read on a node right now (hashable: the cache key)."""

    kernel: tuple[str, ...] = ()
    checked: tuple[tuple[Signal, int], ...] = ()  # (signal, GPU or NIC index), sorted
    deep: tuple[DeepFinding, ...] = ()  # the last deep run's measurement, sorted
    in_job: tuple[InJobFinding, ...] = ()  # in-job verdicts and passive findings, sorted


@dataclass(frozen=True)
class Verdict:
    """The controller's view of a node's layers (``since`` filled in by the caller)."""

    layers: dict[str, LayerReport]

    @functools.cached_property  # read on every report; a verdict is shared by every node showing it
    def healthy(self) -> bool:
        return all(layer.status == "True" for layer in self.layers.values())


class AgentView:
    """Classifies node signals with the real agent and controller code, once per set."""

    def __init__(self) -> None:
        self._cache: dict[NodeSignals, Verdict] = {}
        self._deep: dict[tuple[DeepFinding, ...], DeepRun] = {}
        self._flagged: dict[tuple[DeepFinding, ...], frozenset[int]] = {}
        self._kernel_events: dict[tuple[str, ...], int] = {}
        # The periodic checks' results by what they read: a set of signals differs from
        # one seen before mostly in its kernel lines, and NVML's verdict is the costly one.
        self._checked: dict[tuple[tuple[Signal, int], ...], tuple[CheckResult, CheckResult]] = {}

    def verdict(self, signals: NodeSignals) -> Verdict:
        cached = self._cache.get(signals)
        if cached is None:
            cached = self._cache[signals] = self._classify(signals)
        return cached

    def _classify(self, signals: NodeSignals) -> Verdict:
        deep = [self.deep_run(signals.deep).result] if signals.deep else []
        if signals.in_job:
            deep.append(in_job_result(signals.in_job))
        # No line is no log here (the agent follows one that has other lines), not garbage.
        kernel = classify_log("\n".join(signals.kernel)) if signals.kernel else []
        gpu, network = self._checked_results(signals.checked)
        results = [*deep, CheckResult("kernel-log", Layer.KERNEL, Outcome.OK, kernel), gpu, network]
        report = assess(results, fail_closed=True)
        layers = layer_reports(report, PROFILE)
        assert set(layers) == {str(layer) for layer in PROFILES[PROFILE]}
        return Verdict({name: as_policy_reads(layer) for name, layer in layers.items()})

    def _checked_results(
        self, checked: tuple[tuple[Signal, int], ...]
    ) -> tuple[CheckResult, CheckResult]:
        """NVML's and the RDMA ports' results (read, never changed, by ``assess``)."""
        cached = self._checked.get(checked)
        if cached is None:
            ports = evaluate_ports(_ports(checked), GPUS, LINK_GBPS, "sysfs")
            network = CheckResult("network", Layer.NETWORK, Outcome.OK, ports)
            cached = self._checked[checked] = (_gpu_result(checked), network)
        return cached

    def deep_run(self, measured: tuple[DeepFinding, ...]) -> DeepRun:
        """The deep suite's verdict on a measurement, judged by the real rules."""
        cached = self._deep.get(measured)
        if cached is None:
            cached = self._deep[measured] = DeepRun("verify", _deep_result(measured), 0.0)
        return cached

    def deep_flagged(self, measured: tuple[DeepFinding, ...]) -> frozenset[int]:
        """The GPUs the judge names in a finding above INFO."""
        flagged = self._flagged.get(measured)
        if flagged is None:
            findings = self.deep_run(measured).result.findings
            flagged = self._flagged[measured] = frozenset(
                _GPU_INDEX[f.component.id]
                for f in findings
                if f.severity > Severity.INFO and f.component.id in _GPU_INDEX
            )
        return flagged

    def kernel_events(self, lines: Iterable[str]) -> int:
        """How many kernel events a node-problem-detector-style rule would match."""
        key = tuple(lines)
        count = self._kernel_events.get(key)
        if count is None:
            count = self._kernel_events[key] = len(scan("\n".join(key)))
        return count


def _gpu_result(checked: tuple[tuple[Signal, int], ...]) -> CheckResult:
    if any(signal is Signal.CHECK_TIMEOUT for signal, _ in checked):
        return inconclusive_result("nvml", Layer.GPU, Outcome.TIMED_OUT, "nvml timed out", 10.0)
    facts = [_healthy_gpu(index) for index in range(GPUS)]
    for signal, index in checked:
        gpu = facts[index]
        if signal in (Signal.XID_79, Signal.FALLEN_OFF):
            facts[index] = dataclasses.replace(gpu, error="GPU_IS_LOST")
        elif signal is Signal.XID_74:
            links = [dataclasses.replace(link, active=link.link != 5) for link in gpu.nvlinks]
            facts[index] = dataclasses.replace(gpu, nvlinks=links)
        elif signal in (Signal.XID_48, Signal.XID_48_REMAP, Signal.XID_48_REMAP_FAILED):
            facts[index] = dataclasses.replace(
                gpu,
                ecc_uncorrected_volatile=1,
                remap_pending=signal is Signal.XID_48_REMAP,
                remap_failure=signal is Signal.XID_48_REMAP_FAILED,
            )
        elif signal is Signal.OVERHEAT:
            facts[index] = dataclasses.replace(
                gpu, temperature_c=92.0, clock_event_reasons=frozenset({"hw_thermal_slowdown"})
            )
        elif signal is Signal.POWER_BRAKE:
            facts[index] = dataclasses.replace(
                gpu, clock_event_reasons=frozenset({"hw_power_brake_slowdown"})
            )
    return CheckResult("nvml", Layer.GPU, Outcome.OK, evaluate_gpus(facts, GPUS, "nvml"))


_GPU_INDEX = {gpu_bus_id(index): index for index in range(GPUS)}
_AGENT_DEEP = DeepChecks()  # the agent's defaults: dtypes, thresholds
_table = functools.cache(load_table)


def _deep_result(measured: tuple[DeepFinding, ...]) -> CheckResult:
    """What ``deep-gpu`` reports for a measurement: healthy H100s at the share of their
    peaks the figure table expects, except where a finding says otherwise."""
    figures = expected_for(GPU_MODEL, _table(), _AGENT_DEEP)
    assert figures is not None and figures.memory_gb_s is not None
    devices = []
    for index in range(GPUS):
        pace = min((f.pace for f in measured if f.gpu == index and f.kind == "slow"), default=1.0)
        corrupt = any(f.gpu == index and f.kind == "corrupt" for f in measured)
        matmul = figures.healthy_share("matmul") * pace
        devices.append(
            DeviceMeasurement(
                device=DeviceInfo(index, GPU_MODEL, gpu_bus_id(index), _healthy_gpu(index).uuid),
                tflops={d: (figures.peak_tflops(d) or 0.0) * matmul for d in _AGENT_DEEP.dtypes},
                matmuls={d: 100 for d in _AGENT_DEEP.dtypes},
                digests={d: "wrong" if corrupt else "right" for d in _AGENT_DEEP.dtypes},
                reference_error=0.05 if corrupt else 1e-7,
                reference_index=(3, 5) if corrupt else None,
                memory_gb_s=figures.memory_gb_s * figures.healthy_share("memory") * pace,
            )
        )
    node = NodeMeasurement(
        "simulated", devices, _AGENT_DEEP.matmul_size, all_reduce_note="not simulated"
    )
    return CheckResult(DEEP_CHECK, Layer.GPU, Outcome.OK, judge(node, _table(), _AGENT_DEEP))


def _healthy_gpu(index: int) -> GpuFacts:
    return GpuFacts(
        pci_bus_id=gpu_bus_id(index),
        uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        index=index,
        ecc_uncorrected_volatile=0,
        remap_pending=False,
        remap_failure=False,
        temperature_c=45.0,
        slowdown_temp_c=87.0,
        shutdown_temp_c=92.0,
        pcie_gen_current=5,
        pcie_gen_max=5,
        pcie_width_current=16,
        pcie_width_max=16,
        nvlinks=[NvLinkFacts(link, True) for link in range(18)],
        recovery_action="None",
    )


def _ports(checked: tuple[tuple[Signal, int], ...]) -> list[PortRecord]:
    ports = [
        PortRecord(
            f"mlx5_{index}", 1, "ACTIVE", "LinkUp", LINK_GBPS, "InfiniBand", ca_type="MT4129"
        )
        for index in range(GPUS)
    ]
    for signal, index in checked:
        if signal is Signal.PORT_DOWN:
            ports[index] = dataclasses.replace(
                ports[index], state="DOWN", phys_state="Polling", rate_gbps=None
            )
        elif signal is Signal.RATE_DROP:
            ports[index] = dataclasses.replace(ports[index], rate_gbps=LINK_GBPS / 2)
    return ports
