"""Configuration: defaults, YAML files and errors that name the bad key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuguard.checks.registry import default_checks
from gpuguard.config import CHECK_NAMES, TOOL_NAMES, Config, build_config, load_config
from gpuguard.errors import ConfigError

REPO_SRC = Path(__file__).resolve().parents[2] / "src"


def test_defaults_fail_closed_with_no_expectations():
    config = load_config(None)
    assert config.fail_closed
    assert config.expectations.gpus is None


def test_yaml_file_sets_expectations_and_timeouts(tmp_path):
    path = tmp_path / "gpuguard.yaml"
    path.write_text("expected_gpus: 8\nexpected_link_gbps: 400\ntimeouts:\n  dcgm: 30\n")
    config = load_config(path)
    assert config.expectations.gpus == 8
    assert config.expectations.link_gbps == 400
    assert config.timeout_for("dcgm") == 30
    assert config.timeout_for("nvml") == config.default_timeout_s


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("expcted_gpus: 8\n", "expcted_gpus: unknown key"),
        ("expected_gpus: eight\n", "expected_gpus"),
        ("expected_gpus: -1\n", "expected_gpus"),
        ("timeouts:\n  dcgm: 0\n", "timeouts.dcgm"),
        ("timeouts:\n  nvidia_smi: 5\n", "timeouts: unknown check nvidia_smi"),
        ("check_intervals:\n  dcmg: 300\n", "check_intervals: unknown check dcmg"),
        ("- just\n- a list\n", "expected a mapping"),
        ("expected_gpus: [\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_file_and_key(tmp_path, text, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value)
    assert named in str(error.value)


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_command_line_overrides_win_and_are_validated():
    config = Config(expected_gpus=4).with_overrides(expected_gpus=8, expected_nics=None)
    assert config.expected_gpus == 8
    with pytest.raises(ConfigError, match="command line: invalid configuration: expected_gpus"):
        Config().with_overrides(expected_gpus=-3)


def test_the_checks_settings_may_name_are_the_registered_checks():
    assert sorted(CHECK_NAMES) == sorted(check.name for check in default_checks())
    deep = build_config({"timeouts": {"deep-gpu": 900}}, origin="test")
    assert deep.timeout_for("deep-gpu") == 900


@pytest.mark.parametrize("name", ["nvidia_smi", "dcgm", "NVIDIA-SMI"])
def test_tools_names_only_tools_the_agent_runs(name):
    with pytest.raises(ConfigError, match=f"tools: unknown tool {name} .*nvidia-smi"):
        build_config({"tools": {name: "/opt/bin/x"}}, origin="test")
    assert build_config({"tools": {"nvidia-smi": "/opt/bin/x"}}, origin="test").tools


def test_every_tool_the_agent_runs_may_be_named_in_tools():
    """The names the sources and the NIC loopback ask for (a literal in the code), so a new
    tool cannot be added without its name being accepted."""
    source = "\n".join(p.read_text() for p in (REPO_SRC / "gpuguard").rglob("*.py"))
    asked = set(re.findall(r"\.tool\(\"([^\"]+)\"\)", source))
    asked |= set(re.findall(r"LoopbackPlan\(\s*port,\s*\"([^\"]+)\"", source))
    assert {"nvidia-smi", "ib_write_bw", "fi_pingpong"} <= asked
    assert asked <= set(TOOL_NAMES)
