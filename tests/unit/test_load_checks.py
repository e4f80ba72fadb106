"""The deep GPU check on simulated GPUs, through the real runner: each injected fault is
caught and named, a clean run passes, a hang is a timeout (fail closed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.load.checks import DeepGpuCheck
from gpuguard.checks.load.faults import CorruptingBackend, HangingBackend, SlowBackend
from gpuguard.checks.load.figures import expected_for, load_table
from gpuguard.checks.load.numpy_backend import NumpyBackend, SimulatedSpeeds
from gpuguard.config import Config
from gpuguard.model import Outcome, Severity, Status
from gpuguard.runner import assess, run_check
from gpuguard.sources import BundleSources, LiveSources

MODEL = "NVIDIA H100 80GB HBM3"
SMALL = {"matmul_size": 48, "budget_s": 1, "memory_test_fraction": 0.5}


def healthy_speeds() -> SimulatedSpeeds:
    """What a healthy H100 measures: the table's figure for each metric, 5 % to spare."""
    fig = expected_for(MODEL, load_table(), Config().deep)
    assert fig is not None and fig.memory_gb_s and fig.nvlink_gb_s
    share = fig.healthy_share
    return SimulatedSpeeds(
        tflops={d: p * share("matmul") * 0.95 for d, p in fig.tflops.items()},
        memory_gb_s=fig.memory_gb_s * share("memory") * 0.95,
        host_link_gb_s=63.0 * share("host_link") * 0.95,
        peer_gb_s=fig.nvlink_gb_s / 2 * share("nvlink") * 0.95,
    )


def run(backend: NumpyBackend, timeout_s: float = 31.0, **deep: object):
    config = Config(deep={**SMALL, **deep})
    ctx = CheckContext(LiveSources(config), config, timeout_s)
    return run_check(DeepGpuCheck(backend=backend, nvml=None), ctx)


def problems(result) -> list:
    return [f for f in result.findings if f.severity > Severity.INFO]


def test_clean_run_passes_and_reports_what_it_measured():
    result = run(NumpyBackend(4, MODEL, healthy_speeds(), free_bytes=1 << 20))
    assert result.outcome is Outcome.OK
    assert problems(result) == []
    measured = [f for f in result.findings if f.code == "DEEP_GPU_MEASURED"]
    assert len(measured) == 4
    assert "bf16" in measured[0].message and "TFLOP/s" in measured[0].message
    assert "memory" in measured[0].message and "H2D" in measured[0].message
    assert assess([result], fail_closed=True).layers[result.layer].status is Status.HEALTHY


def test_corrupted_element_on_one_gpu_is_silent_data_corruption_naming_that_gpu():
    backend = CorruptingBackend(4, MODEL, healthy_speeds(), free_bytes=1 << 20, bad_device=2)
    result = run(backend)
    bad = problems(result)
    assert bad and {f.code for f in bad} == {"DEEP_SILENT_DATA_CORRUPTION"}
    assert {f.component.id for f in bad} == {"0000:12:00.0"}
    assert all(f.severity is Severity.CRITICAL for f in bad)
    assert any("differs from 3 of 3" in f.evidence for f in bad)
    assert any("CPU reference" in f.message and "(3, 5)" in f.evidence for f in bad)


def test_two_gpus_that_disagree_are_both_named():
    backend = CorruptingBackend(2, MODEL, healthy_speeds(), free_bytes=1 << 20, bad_device=1)
    result = run(backend, dtypes=["bf16"])
    sibling = [f for f in problems(result) if "identical GPUs" in f.message]
    assert {f.component.id for f in sibling} == {"0000:10:00.0", "0000:11:00.0"}
    assert all("no majority" in f.evidence for f in sibling)


def test_half_speed_gpu_is_fail_slow_against_table_and_siblings():
    backend = SlowBackend(4, MODEL, healthy_speeds(), free_bytes=1 << 20, slow_device=1)
    result = run(backend)
    slow = [f for f in problems(result) if f.code == "DEEP_MATMUL_SLOW"]
    assert {f.component.id for f in slow} == {"0000:11:00.0"}
    assert {f.message.split(": ")[1].split()[0] for f in slow} == {"bf16", "tf32"}
    for f in slow:
        assert "expected of a healthy NVIDIA H100 80GB HBM3" in f.evidence
        assert "50% of the median of its 4 sibling GPUs" in f.evidence
    codes = {f.code for f in problems(result)}
    assert {"DEEP_MEMORY_BANDWIDTH_LOW", "DEEP_HOST_LINK_SLOW", "DEEP_PEER_BANDWIDTH_LOW"} <= codes
    others = {f.component.id for f in problems(result) if f.component.kind == "gpu"}
    assert others == {"0000:11:00.0"}


def test_a_whole_node_at_half_speed_is_slow_against_the_table_though_siblings_agree():
    speeds = healthy_speeds()
    halved = SimulatedSpeeds(
        {k: v / 2 for k, v in speeds.tflops.items()},
        speeds.memory_gb_s,
        speeds.host_link_gb_s,
        speeds.peer_gb_s,
    )
    result = run(NumpyBackend(2, MODEL, halved, free_bytes=1 << 20), dtypes=["bf16"])
    slow = [f for f in problems(result) if f.code == "DEEP_MATMUL_SLOW"]
    assert len(slow) == 2
    assert all("sibling" not in f.evidence for f in slow)


def test_unknown_model_is_judged_against_siblings_only():
    backend = SlowBackend(3, "NVIDIA Mystery", healthy_speeds(), free_bytes=1 << 20)
    result = run(backend, dtypes=["bf16"])
    codes = {(f.code, f.component.id) for f in result.findings}
    assert ("DEEP_MODEL_UNKNOWN", "0000:10:00.0") in codes
    slow = [f for f in problems(result) if f.code == "DEEP_MATMUL_SLOW"]
    assert [f.component.id for f in slow] == ["0000:10:00.0"]
    assert "expected of a healthy" not in slow[0].evidence


@pytest.fixture
def hanging() -> Iterator[HangingBackend]:
    backend = HangingBackend(2, MODEL, healthy_speeds(), free_bytes=1 << 20)
    yield backend
    backend.release_hang.set()  # let the abandoned thread finish


def test_hung_backend_is_a_timeout_through_the_real_runner(hanging):
    result = run(hanging, timeout_s=1.0)
    assert result.outcome is Outcome.TIMED_OUT
    assert [f.code for f in result.findings] == ["CHECK_TIMED_OUT"]
    report = assess([result], fail_closed=True)
    assert report.layers[result.layer].status is Status.UNHEALTHY


def test_without_torch_or_gpu_the_check_says_so_never_healthy():
    config = Config(deep=SMALL)
    result = run_check(DeepGpuCheck(), CheckContext(LiveSources(config), config, 31.0))
    assert result.outcome in (Outcome.TOOL_MISSING, Outcome.NOT_APPLICABLE)
    assert "PyTorch" in result.detail
    no_gpus = run(NumpyBackend(0, MODEL, healthy_speeds()))
    assert no_gpus.outcome is Outcome.NOT_APPLICABLE
    expected = Config(expected_gpus=8, deep=SMALL)
    ctx = CheckContext(LiveSources(expected), expected, 31.0)
    missing = run_check(DeepGpuCheck(backend=NumpyBackend(0, MODEL, healthy_speeds())), ctx)
    assert missing.outcome is Outcome.FAILED and "8 are expected" in missing.detail


def test_bundle_is_not_a_live_node(tmp_path):
    config = Config(deep=SMALL)
    ctx = CheckContext(BundleSources(tmp_path), config, 31.0)
    backend = NumpyBackend(1, MODEL, healthy_speeds())
    assert run_check(DeepGpuCheck(backend=backend), ctx).outcome is Outcome.TOOL_MISSING
