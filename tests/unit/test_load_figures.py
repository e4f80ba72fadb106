"""The expected-figure table, its overrides, and the thresholds and verdicts drawn from it."""

from __future__ import annotations

import pytest

from gpuguard.checks.load.backend import DeviceInfo
from gpuguard.checks.load.figures import expected_for, load_table, pcie_gb_s
from gpuguard.checks.load.judge import judge
from gpuguard.checks.load.measure import DeviceMeasurement, NodeMeasurement, PatternResult
from gpuguard.checks.load.telemetry import GpuSamples, judge_telemetry
from gpuguard.config import Config, DeepChecks
from gpuguard.errors import ConfigError
from gpuguard.model import Severity

H200 = "NVIDIA H200"


def test_every_row_has_a_source_and_the_models_the_fleet_runs():
    table = load_table()
    for label, row in table.models.items():
        assert row.source.startswith("NVIDIA") or "aws.amazon.com" in row.source, label
    names = {n for row in table.models.values() for n in row.names}
    for name in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", H200, "NVIDIA B200"):
        assert name in names
    for name in ("NVIDIA L4", "NVIDIA L40S", "NVIDIA A10G", "Tesla T4"):
        assert name in names


def test_h200_row_matches_the_published_figures():
    fig = expected_for(H200, load_table(), DeepChecks())
    assert fig is not None
    assert fig.memory_gb_s == 4800
    assert fig.peak_tflops("bf16") == pytest.approx(989.5)
    # Set from the measured H200 run (docs/evidence/), not the 0.8 default.
    assert fig.healthy_share("matmul") == 0.68
    assert fig.healthy_share("nvlink") == 0.75  # not measured: the default fills in


def test_pool_override_replaces_only_what_it_sets():
    deep = DeepChecks(expected={H200: {"tflops": {"bf16": 700}, "healthy": {"memory": 0.7}}})
    fig = expected_for(H200, load_table(), deep)
    assert fig is not None
    assert fig.peak_tflops("bf16") == 700
    assert fig.peak_tflops("tf32") == pytest.approx(494.5)
    assert fig.healthy_share("memory") == 0.7
    assert fig.healthy_share("matmul") == 0.68
    assert "overridden by config" in fig.source
    by_label = DeepChecks(expected={"H200 SXM 141GB": {"memory_gb_s": 4000}})
    assert expected_for(H200, load_table(), by_label).memory_gb_s == 4000  # type: ignore[union-attr]
    assert expected_for("NVIDIA Unknown", load_table(), DeepChecks()) is None


def test_a_bad_override_names_the_key():
    with pytest.raises(ConfigError, match=r"deep\.expected\.X\.tflops\.int8"):
        from gpuguard.config import build_config

        build_config({"deep": {"expected": {"X": {"tflops": {"int8": 1}}}}}, "test")


def test_a_bad_table_names_the_row(tmp_path):
    path = tmp_path / "table.yaml"
    path.write_text("models:\n  X:\n    names: [X]\n    memory_gb_s: -1\n")
    with pytest.raises(ConfigError, match=r"models\.X\.memory_gb_s"):
        load_table(path)


def test_pcie_rates():
    assert pcie_gb_s(5, 16) == pytest.approx(63.0, abs=0.1)
    assert pcie_gb_s(4, 16) == pytest.approx(31.5, abs=0.1)
    assert pcie_gb_s(3, 8) == pytest.approx(7.9, abs=0.1)


def measured(index: int, **values: object) -> DeviceMeasurement:
    m = DeviceMeasurement(DeviceInfo(index, H200, f"0000:{0x20 + index:02x}:00.0"))
    for key, value in values.items():
        setattr(m, key, value)
    return m


@pytest.mark.parametrize(
    ("bf16", "slow"),
    [(989.5 * 0.68 * 0.8 + 1, False), (989.5 * 0.68 * 0.8 - 1, True), (450, True)],
)
def test_threshold_is_peak_times_healthy_times_slow_fraction(bf16, slow):
    node = NodeMeasurement("test", [measured(0, tflops={"bf16": bf16})], 8192)
    codes = {f.code for f in judge(node, load_table(), DeepChecks())}
    assert ("DEEP_MATMUL_SLOW" in codes) is slow


def test_memory_pattern_errors_report_the_failing_addresses():
    pattern = PatternResult(1 << 30, errors=2, offsets=[0x40, 0x1000], failed_patterns=["x"])
    node = NodeMeasurement("test", [measured(0, pattern=pattern)], 8192)
    bad = [f for f in judge(node, load_table(), DeepChecks()) if f.severity is Severity.CRITICAL]
    assert [f.code for f in bad] == ["DEEP_MEMORY_PATTERN_ERRORS"]
    assert "0x40, 0x1000" in bad[0].evidence


def test_device_error_under_load_is_critical_for_that_gpu():
    node = NodeMeasurement("test", [measured(0), measured(1, errors=["bf16 matmul: CUDA"])], 64)
    bad = [f for f in judge(node, load_table(), Config().deep) if f.severity > Severity.INFO]
    assert [(f.code, f.component.id) for f in bad] == [("DEEP_DEVICE_ERROR", "0000:21:00.0")]


def test_throttling_and_xids_during_the_load_are_findings():
    busy = GpuSamples("00000000:19:00.0", [1980, 1400], [70, 88], [690, 700], {"hw_slowdown"})
    calm = GpuSamples("00000000:1a:00.0", [1980], [60], [650], {"sw_power_cap"})
    findings = judge_telemetry([busy, calm], [("00000000:19:00.0", 79)], "")
    by_code = {f.code: f for f in findings}
    assert by_code["DEEP_THROTTLED_UNDER_LOAD"].component.id == "0000:19:00.0"
    assert by_code["DEEP_THROTTLED_UNDER_LOAD"].severity is Severity.WARNING
    assert by_code["DEEP_LOAD_TELEMETRY"].severity is Severity.INFO
    xid = [f for f in findings if f.component.id == "0000:19:00.0" and "79" in f.evidence]
    assert xid and xid[0].severity is Severity.CRITICAL
    unavailable = judge_telemetry([], [], "pynvml is not installed")
    assert [f.code for f in unavailable] == ["DEEP_TELEMETRY_UNAVAILABLE"]
