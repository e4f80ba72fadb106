"""Configuration: defaults, YAML files and errors that name the bad key."""

from __future__ import annotations

import pytest

from gpuguard.checks.registry import default_checks
from gpuguard.config import CHECK_NAMES, Config, build_config, load_config
from gpuguard.errors import ConfigError


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
