"""The gpuguard command end to end: example bundles, JSON shape, exit status, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from gpuguard.cli import EXIT_USAGE, main
from gpuguard.training.verdicts import Verdict, VerdictKind, write_verdict
from tests.conftest import DATA, EXAMPLES

EXPECT = ["--expected-gpus", "1", "--expected-nics", "3", "--expected-link-gbps", "400"]


def check_json(capsys, *args: str) -> tuple[int, dict]:
    status = main(["check", "--json", *args])
    return status, json.loads(capsys.readouterr().out)


def test_healthy_example_is_healthy_with_exit_0(capsys):
    status, report = check_json(capsys, "--bundle", str(EXAMPLES / "healthy-h100"), *EXPECT)
    assert status == 0
    assert report["status"] == "Healthy"
    assert set(report["layers"]) == {"gpu", "network", "kernel"}
    assert report["layers"]["gpu"]["answered_by"] == ["nvidia-smi"]


def test_xid79_example_recommends_reboot(capsys):
    status, report = check_json(capsys, "--bundle", str(EXAMPLES / "xid79-fallen-off-bus"), *EXPECT)
    assert status == 2
    assert report["status"] == "Unhealthy"
    gpu = report["layers"]["gpu"]
    xid79 = next(f for f in gpu["findings"] if f["code"] == "XID_79")
    assert xid79["action"] == "REBOOT"
    assert xid79["source"] == "kernel-log"
    assert "fallen off the bus" in xid79["evidence"]
    assert set(xid79) == {
        "layer",
        "code",
        "severity",
        "action",
        "component",
        "source",
        "message",
        "evidence",
    }


def test_half_rate_link_example_is_caught(capsys):
    status, report = check_json(capsys, "--bundle", str(EXAMPLES / "ib-link-half-rate"), *EXPECT)
    assert status == 2
    codes = [f["code"] for f in report["layers"]["network"]["findings"]]
    assert codes == ["LINK_RATE_DEGRADED"]


def test_a_directory_with_no_bundle_file_is_a_usage_error(tmp_path, capsys):
    assert main(["check", "--bundle", str(tmp_path)]) == 64
    assert "none of a bundle's files" in capsys.readouterr().err


def test_empty_bundle_is_unhealthy_under_fail_closed_and_unknown_without(tmp_path, capsys):
    (tmp_path / "sysfs").mkdir()  # a bundle whose every capture failed
    status, report = check_json(capsys, "--bundle", str(tmp_path))
    assert status == 2
    assert report["layers"]["gpu"]["answered_by"] == []
    status, report = check_json(capsys, "--bundle", str(tmp_path), "--no-fail-closed")
    assert status == 3
    assert report["status"] == "Unknown"


def test_truncated_nvidia_smi_in_a_bundle_never_reads_healthy(tmp_path, capsys):
    shutil.copy(
        DATA / "nvidia-smi-q_h100_535.183.01_truncated_invalid.txt", tmp_path / "nvidia-smi.txt"
    )
    shutil.copy(EXAMPLES / "clean-boot.log", tmp_path / "kmsg.log")
    status, report = check_json(capsys, "--bundle", str(tmp_path))
    assert status == 2
    codes = [f["code"] for f in report["layers"]["gpu"]["findings"]]
    assert "OUTPUT_UNPARSEABLE" in codes


def test_table_output_names_each_layer(capsys):
    assert main(["check", "--bundle", str(EXAMPLES / "healthy-h100"), *EXPECT]) == 0
    out = capsys.readouterr().out
    for layer in ("gpu", "network", "kernel"):
        assert f"] {layer}" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--expected-gpus", "eight"],
        ["check", "--bogus"],
        ["nonsense"],
        ["controller", "--keep-closed-days", "0"],
        ["controller", "--keep-closed-days", "a month"],
    ],
)
def test_usage_errors_exit_64(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == EXIT_USAGE


def test_bad_config_is_one_line_naming_the_key(tmp_path, capsys):
    config = tmp_path / "gpuguard.yaml"
    config.write_text("expected_gpu: 8\n")
    assert main(["check", "--config", str(config), "--bundle", str(tmp_path)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "expected_gpu: unknown key" in error
    assert error.count("\n") == 1


def test_bundle_that_is_not_a_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["check", "--bundle", str(tmp_path / "absent")]) == EXIT_USAGE
    assert "not a directory" in capsys.readouterr().err


def test_xid_explains_the_rule(capsys):
    assert main(["xid", "13"]) == 0
    out = capsys.readouterr().out
    assert "RESTART_APP" in out and "KILL_JOB" in out and "one incident" in out


def test_bundle_collect_then_check_gives_the_live_verdict(tmp_path):
    """Capture with fake tools printing real outputs, then triage the bundle offline."""
    tools = tmp_path / "bin"
    tools.mkdir()
    xml = DATA / "nvidia-smi-q-x_rtx4000-sff-ada_595.84_v13.xml"
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\ncat '{xml}'\n")
    (tools / "ibstat").write_text(f"#!/bin/sh\ncat '{DATA / 'ibstat_h100_some_ports_down.txt'}'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "kern.log"
    shutil.copy(DATA / "dmesg_xid119_gsp_rpc_timeout_h100.log", log)
    config = tmp_path / "gpuguard.yaml"
    in_job = tmp_path / "in-job"  # a job's rank found its GPU slow
    in_job.mkdir()
    now = time.time()
    slow = Verdict(
        VerdictKind.FAIL_SLOW, "ml/train", 2, 8, "node-1", "00000000:01:00.0",
        now - 60, now, 1.2, (100, 130), "compute 1.2x", ttl_s=3600,
    )  # fmt: skip
    write_verdict(in_job, slow)
    config.write_text(
        f"kernel_log: {log}\ninfiniband_sysfs: {tmp_path / 'no-ib'}\ncounter_sample_interval_s: 0\n"
        f"in_job: {{directory: {in_job}}}\n"
    )
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin"}
    bundle = tmp_path / "bundle"

    def gpuguard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuguard.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    collected = gpuguard("bundle", "collect", str(bundle), "--config", str(config))
    assert collected.returncode == 0, collected.stderr
    assert (bundle / "nvidia-smi.xml").read_text() == xml.read_text()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["dcgmi-health.json"].startswith("not collected")
    live = gpuguard("check", "--json", "--config", str(config))
    offline = gpuguard("check", "--json", "--bundle", str(bundle))
    live_codes = sorted(
        f["code"]
        for layer in json.loads(live.stdout)["layers"].values()
        for f in layer["findings"]
        if f["severity"] != "info"
    )
    offline_codes = sorted(
        f["code"]
        for layer in json.loads(offline.stdout)["layers"].values()
        for f in layer["findings"]
        if f["severity"] != "info"
    )
    # The fixture's down ports are Disabled front-end Ethernet beside InfiniBand: not judged.
    assert manifest["in-job"] == f"from {in_job}: 1 verdict files"
    assert "XID_119" in offline_codes and "IB_LINK_DOWN" not in offline_codes
    assert "IN_JOB_FAIL_SLOW" in offline_codes
    assert offline_codes == live_codes
    assert live.returncode == offline.returncode == 2


def test_agent_print_conditions_needs_no_kubernetes(capsys):
    status = main(
        ["agent", "--print-conditions", "--bundle", str(EXAMPLES / "xid79-fallen-off-bus")]
    )
    assert status == 2
    printed = json.loads(capsys.readouterr().out)
    gpu = next(c for c in printed["conditions"] if c["type"] == "GpuguardGPUHealthy")
    assert gpu["status"] == "False"
    assert "XID_79 gpu 0000:91:00.0" in gpu["message"]


def test_agent_without_node_name_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["agent", "--bundle", str(EXAMPLES / "healthy-h100")]) == EXIT_USAGE
    assert "--node-name" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["controller"],
        ["agent", "--node-name", "gpu-1", "--bundle", str(EXAMPLES / "healthy-h100")],
    ],
    ids=["controller", "agent"],
)
def test_unusable_credentials_are_a_usage_error_naming_the_file(tmp_path, command):
    kubeconfig = tmp_path / "kubeconfig"
    # Clusters, users and contexts, but none of them current.
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuguard.cli", *command, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [text for text in done.stderr.splitlines() if "credentials" in text]
    assert str(kubeconfig) in line and "context" in line


def test_json_output_names_its_schema(capsys):
    status, report = check_json(capsys, "--bundle", str(EXAMPLES / "xid79-fallen-off-bus"))
    assert status == 2  # the example's GPU fell off the bus
    assert report["schema"] == "gpuguard.io/check/v1"
    assert {"status", "action", "layers", "checks", "origin"} <= set(report)


def test_every_option_of_every_subcommand_has_help():
    import argparse

    from gpuguard.cli import build_parser

    def missing(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += missing(sub, f"{path} {name}")
            elif action.help is None:
                found.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return found

    assert missing(build_parser(), "gpuguard") == []
