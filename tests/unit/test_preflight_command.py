"""``gpuguard preflight`` on simulated GPUs: a corrupting GPU fails the pod's start naming
that GPU, a healthy node passes, a warning passes with its code listed, and fail closed:
no GPU, a hung check and a stalled command are failures, within the hard deadline, in
real processes where a hang is involved."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.load.checks import DeepGpuCheck
from gpuguard.checks.load.faults import CorruptingBackend
from gpuguard.checks.load.nic_loopback import DeepNetworkCheck
from gpuguard.checks.load.numpy_backend import NumpyBackend
from gpuguard.cli import build_parser, main
from gpuguard.contract.preflight import FAILED, NOT_EQUIPPED, PASSED, read_result
from gpuguard.errors import ToolMissing
from gpuguard.model import Action, Finding, Layer, Severity, gpu
from gpuguard.preflight.command import run_preflight
from tests.unit.test_load_checks import MODEL, healthy_speeds

REPO = Path(__file__).resolve().parents[2]
SMALL = "deep:\n  matmul_size: 48\n  memory_test_fraction: 0.5\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(SMALL + "timeouts:\n  deep-gpu: 2\n  deep-network: 2\n")
    return path


def preflight(tmp_path: Path, config: Path, checks: list, *extra: str) -> tuple[int, object]:
    log = tmp_path / "termination-log"
    argv = ["preflight", "--budget", "1", "--config", str(config), "--termination-log", str(log)]
    code = run_preflight(build_parser().parse_args([*argv, *extra]), checks=checks)
    return code, read_result(log.read_text())


def simulated(backend: NumpyBackend) -> list:
    return [DeepGpuCheck(backend=backend, nvml=None), DeepNetworkCheck()]


def test_a_healthy_simulated_node_passes(tmp_path, config, capsys):
    code, result = preflight(tmp_path, config, simulated(NumpyBackend(4, MODEL, healthy_speeds())))
    assert code == 0
    assert result.status == PASSED and not result.codes and not result.gpus
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpuguard preflight: Passed")
    assert "no active RDMA port" in result.message  # the loopback check: a note, not a failure


def test_a_corrupting_gpu_fails_naming_that_gpu(tmp_path, config, capsys):
    backend = CorruptingBackend(4, MODEL, healthy_speeds(), bad_device=2)
    code, result = preflight(tmp_path, config, simulated(backend), "--json")
    assert code == 1
    assert result.status == FAILED
    assert result.codes == ("DEEP_SILENT_DATA_CORRUPTION",)
    assert result.gpus == ("0000:12:00.0",)
    assert read_result(capsys.readouterr().out.strip()) == result


class WarningCheck:
    """A check that finds a warning only (Degraded), as a worn but working GPU would."""

    name: ClassVar[str] = "deep-gpu"
    layer: ClassVar[Layer] = Layer.GPU

    def run(self, ctx: CheckContext) -> list[Finding]:
        message = "0000:10:00.0: warm"
        component = gpu("00000000:10:00.0")
        return [
            Finding(Layer.GPU, "DEEP_WARM", Severity.WARNING, Action.NONE, component, "t", message)
        ]


def test_a_degraded_gpu_passes_with_its_code_listed(tmp_path, config):
    code, result = preflight(tmp_path, config, [WarningCheck()])
    assert code == 0
    assert result.status == PASSED
    assert result.codes == ("DEEP_WARM",) and result.gpus == ("0000:10:00.0",)
    assert "with warnings" in result.message


def test_no_gpu_seen_is_a_failure_without_a_verdict(tmp_path, config):
    code, result = preflight(tmp_path, config, simulated(NumpyBackend(0, MODEL, healthy_speeds())))
    assert code == 2
    assert result.status == FAILED and result.codes == ("NOT_APPLICABLE",)


class TorchlessCheck:
    """The GPU check as an image without PyTorch runs it."""

    name: ClassVar[str] = "deep-gpu"
    layer: ClassVar[Layer] = Layer.GPU

    def run(self, ctx: CheckContext) -> list[Finding]:
        raise ToolMissing("PyTorch is not installed (pip install 'gpuguard[torch]')")


def test_an_image_without_pytorch_fails_as_not_equipped(tmp_path, config):
    code, result = preflight(tmp_path, config, [TorchlessCheck(), DeepNetworkCheck()])
    assert code == 2
    assert result.status == FAILED and result.codes == (NOT_EQUIPPED,), result
    assert "PyTorch is not installed" in result.message and "preflight.image" in result.message


def test_an_unwritable_termination_log_is_one_clear_line(tmp_path, config, capsys):
    log = tmp_path / "missing" / "termination-log"
    argv = ["preflight", "--budget", "1", "--config", str(config), "--termination-log", str(log)]
    checks = simulated(NumpyBackend(2, MODEL, healthy_speeds()))
    assert run_preflight(build_parser().parse_args(argv), checks=checks) == 0
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"gpuguard preflight: cannot write the result to {log}: No such file or directory"
    )


def test_a_gang_check_without_a_gang_to_join_passes_with_a_note(tmp_path, config, monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "JOB_COMPLETION_INDEX"):
        monkeypatch.delenv(name, raising=False)
    checks = simulated(NumpyBackend(2, MODEL, healthy_speeds()))
    code, result = preflight(tmp_path, config, checks, "--gang")
    assert code == 0 and result.status == PASSED
    assert "gang check skipped: MASTER_ADDR, MASTER_PORT, WORLD_SIZE" in result.message


@pytest.mark.parametrize("budget", ["0", "soon"])
def test_a_bad_budget_is_a_usage_error(budget, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["preflight", "--budget", budget])
    assert exit_info.value.code == 64
    assert "--budget" in capsys.readouterr().err


def run_node(tmp_path: Path, config: Path, kind: str) -> tuple[int, object, float, str]:
    """The command in a process of its own, on a simulated node of ``kind``."""
    log = tmp_path / "termination-log"
    argv = [sys.executable, "-m", "tests.support.preflight_node", kind, "--budget", "1"]
    argv += ["--config", str(config), "--termination-log", str(log)]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    return proc.returncode, read_result(log.read_text()), elapsed, proc.stdout + proc.stderr


def test_a_hung_check_fails_at_its_limit(tmp_path, config):
    code, result, elapsed, output = run_node(tmp_path, config, "hang")
    assert code == 2, output
    assert result.status == FAILED and result.codes == ("CHECK_TIMED_OUT",)
    assert "no result after 2s" in result.message
    assert elapsed < 2 + 20  # its limit, and the interpreter's start on a busy machine


def test_a_stalled_command_is_ended_by_the_hard_deadline(tmp_path, config):
    code, result, elapsed, output = run_node(tmp_path, config, "stall")
    assert code == 2, output
    assert result.status == FAILED and result.codes == ("CHECK_TIMED_OUT",)
    assert "hard deadline (12.5s)" in result.message  # 2 s limit + 0.5 s grace + 10 s margin
    assert elapsed < 12.5 + 20
