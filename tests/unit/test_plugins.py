"""Custom check plugins with real processes: what they say becomes findings on their layer;
a plugin that hangs, crashes, prints garbage or too much is Unknown on time, never healthy."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.plugins.check import plugin_checks
from gpuguard.checks.registry import FALLBACKS, configured_checks, default_checks
from gpuguard.config import Config, build_config
from gpuguard.errors import ConfigError
from gpuguard.model import (
    CHECK_FAILED,
    CHECK_TIMED_OUT,
    OUTPUT_UNPARSEABLE,
    Action,
    Layer,
    Outcome,
    Severity,
    Status,
)
from gpuguard.runner import RepeatingCheck, assess, run_all, run_check
from gpuguard.sources import BundleSources
from tests.conftest import EXAMPLES
from tests.support.cluster import wait_for
from tests.unit.test_fail_closed import MARGIN_S, make_tool

PLUGINS = EXAMPLES / "plugins"
TIMEOUT_S = 1.0
BROKEN = {
    "hangs": ("#!/bin/sh\nexec sleep 1000\n", Outcome.TIMED_OUT, "no result after 1s"),
    # A grandchild left holding stdout: the kill of the group must still end the run.
    "hangs_in_a_child": ("#!/bin/sh\nsleep 1000 &\nwait\n", Outcome.TIMED_OUT, "no result"),
    "crashes": ("#!/bin/sh\nkill -SEGV $$\n", Outcome.FAILED, "SIGSEGV"),
    "exits_2": ("#!/bin/sh\necho 'cannot read /proc'\nexit 2\n", Outcome.FAILED, "exit status 2"),
    "prints_1_mb": (
        "#!/bin/sh\nhead -c 1048576 /dev/zero | tr '\\0' x\n",
        Outcome.FAILED,
        "output too large (over 64 KiB)",
    ),
    "prints_garbage": ("#!/bin/sh\necho '{\"findings\": [oops'\n", Outcome.UNPARSEABLE, "JSON"),
    "nests_too_deep": (
        f"#!{sys.executable}\nprint('[' * 60000)\n",
        Outcome.UNPARSEABLE,
        "nested too deep",
    ),
    "missing": ("", Outcome.FAILED, "not found"),
}


def plugin_config(tmp_path: Path, behaviour: str, **settings: object) -> Config:
    body = BROKEN[behaviour][0] if behaviour in BROKEN else behaviour
    program = tmp_path / "absent" if not body else make_tool(tmp_path, "plugin", body)
    entry = {"name": "team-check", "command": [str(program)], "timeout_s": TIMEOUT_S}
    return build_config({"plugins": [{**entry, **settings}]}, "test")


def run_plugin(config: Config):
    (check,) = plugin_checks(config.plugins)
    context = CheckContext(BundleSources(EXAMPLES / "healthy-h100"), config, TIMEOUT_S)
    return run_check(check, context)


@pytest.mark.parametrize("output", ["exit-code", "json"])
@pytest.mark.parametrize("behaviour", sorted(BROKEN))
def test_a_broken_plugin_is_unknown_on_time_never_healthy(tmp_path, behaviour, output):
    _, outcome, words = BROKEN[behaviour]
    if output == "exit-code" and outcome is Outcome.UNPARSEABLE:
        outcome, words = Outcome.OK, ""  # exit 0: its words are not read
    config = plugin_config(tmp_path, behaviour, output=output, layer="network")
    started = time.monotonic()
    result = run_plugin(config)
    assert time.monotonic() - started < TIMEOUT_S + MARGIN_S
    assert result.outcome is outcome, result.detail
    if outcome is Outcome.OK:
        return
    assert words in result.detail
    (finding,) = result.findings
    assert finding.inconclusive and finding.layer is Layer.NETWORK
    assert finding.code in (CHECK_TIMED_OUT, CHECK_FAILED, OUTPUT_UNPARSEABLE)
    layer = assess([result], fail_closed=False).layers[Layer.NETWORK]
    assert layer.status is Status.UNKNOWN


# node-problem-detector's own plugin cases (pkg/custompluginmonitor/plugin/plugin_test.go):
# the same program, the same verdict (its Unknown is gpuguard's no-verdict finding).
NPD_CASES = {
    "ok": ("#!/bin/sh\necho OK\nexit 0\n", Outcome.OK, 0),
    "non-ok": ("#!/bin/sh\necho NonOK\nexit 1\n", Outcome.OK, 1),
    "unknown": ("#!/bin/sh\necho UNKNOWN\nexit 2\n", Outcome.FAILED, 1),
    "non-defined exit status": ("#!/bin/sh\necho X\nexit 100\n", Outcome.FAILED, 1),
    "longer than 80 with ok": (f"#!/bin/sh\necho {'0123456789' * 9}\nexit 0\n", Outcome.OK, 0),
    "16 KiB stdout with ok": ("#!/bin/sh\nhead -c 16384 /dev/zero | tr '\\0' a\n", Outcome.OK, 0),
    "sleep past the timeout": ("#!/bin/sh\nsleep 3\nexit 0\n", Outcome.TIMED_OUT, 1),
}


@pytest.mark.parametrize("case", sorted(NPD_CASES))
def test_node_problem_detectors_plugin_cases_read_the_same(tmp_path, case):
    body, outcome, findings = NPD_CASES[case]
    result = run_plugin(plugin_config(tmp_path, body))
    assert result.outcome is outcome, result.detail
    assert len(result.findings) == findings


def test_a_plugin_that_is_not_executable_is_unknown(tmp_path):
    program = make_tool(tmp_path, "plugin", "#!/bin/sh\nexit 0\n", executable=False)
    config = build_config({"plugins": [{"name": "x", "command": [str(program)]}]}, "test")
    result = run_plugin(config)
    assert result.outcome is Outcome.FAILED and "not executable" in result.detail


def test_exit_status_1_is_the_problem_stdout_names(tmp_path):
    config = plugin_config(tmp_path, "#!/bin/sh\necho '/data is not mounted'\nexit 1\n")
    (finding,) = run_plugin(config).findings
    assert finding.code == "PLUGIN_TEAM_CHECK"
    assert finding.severity is Severity.CRITICAL and finding.action is Action.NONE
    assert finding.message == "/data is not mounted"
    assert finding.layer is Layer.KERNEL and finding.source == "plugin-team-check"


def test_the_operators_mapping_sets_severity_and_action(tmp_path):
    config = plugin_config(
        tmp_path,
        "#!/bin/sh\nexit 1\n",
        problem_code="NFS_STALE",
        codes={"NFS_STALE": {"severity": "warning", "action": "REBOOT"}},
    )
    (finding,) = run_plugin(config).findings
    assert (finding.code, finding.severity, finding.action) == (
        "NFS_STALE",
        Severity.WARNING,
        Action.REBOOT,
    )
    assert finding.message == "exit status 1"


def test_a_json_document_becomes_findings_on_the_parts_it_names(tmp_path):
    document = (
        '{"findings": ['
        '{"code": "GPU_FAN", "severity": "warning", "message": "fan 3 slow",'
        ' "gpu": "00000000:19:00.0"},'
        '{"code": "PORT_FLAPS", "severity": "critical", "message": "12 flaps", "nic": "mlx5_0/1"}'
        "]}"
    )
    config = plugin_config(
        tmp_path,
        f"#!/bin/sh\necho '{document}'\n",
        output="json",
        codes={"PORT_FLAPS": {"severity": "critical", "action": "REBOOT"}},
    )
    fan, port = run_plugin(config).findings
    assert (str(fan.component), fan.severity, fan.action) == (
        "gpu 0000:19:00.0",
        Severity.WARNING,
        Action.NONE,  # unmapped: the plugin's severity, never its own repair
    )
    assert (str(port.component), port.action) == ("nic mlx5_0/1", Action.REBOOT)


@pytest.mark.parametrize(
    "spelling", ["00000000:19:00.0", "0000:19:00", "19:00.0", "PCI:0000:19:00.0"]
)
def test_a_gpu_in_any_bus_id_spelling_is_the_same_gpu(tmp_path, spelling):
    document = f'{{"findings": [{{"code": "X", "severity": "info", "gpu": "{spelling}"}}]}}'
    config = plugin_config(tmp_path, f"#!/bin/sh\necho '{document}'\n", output="json")
    (finding,) = run_plugin(config).findings
    assert str(finding.component) == "gpu 0000:19:00.0"


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ('{"checks": []}', 'no "findings" list'),
        ('{"findings": [{"code": "x", "severity": "warning"}]}', "findings[0].code"),
        ('{"findings": [{"code": "X", "severity": "fatal"}]}', "findings[0].severity"),
        ('{"findings": [{"code": "X", "severity": ["critical"]}]}', "findings[0].severity"),
        ('{"findings": [{"code": "X", "severity": "info", "gpu": 3}]}', "findings[0].gpu"),
        ('{"findings": [{"code": "X", "severity": "info", "gpu": "GPU-5e2c"}]}', "PCI bus id"),
        ('{"findings": [{"code": "X", "severity": "info", "gpu": "0"}]}', "findings[0].gpu"),
        ('{"findings": [' + ",".join(['{"code": "X", "severity": "info"}'] * 101) + "]}", "101"),
    ],
)
def test_a_document_outside_the_contract_is_unparseable(tmp_path, document, words):
    config = plugin_config(tmp_path, f"#!/bin/sh\necho '{document}'\n", output="json")
    result = run_plugin(config)
    assert result.outcome is Outcome.UNPARSEABLE and words in result.detail


def test_a_failing_plugin_never_vouches_and_never_hides_the_built_in_checks(tmp_path):
    config = plugin_config(tmp_path, "hangs", layer="gpu")
    sources = BundleSources(EXAMPLES / "healthy-h100")
    started = time.monotonic()
    config = config.with_overrides(expected_gpus=1)
    report = run_all(configured_checks(config), sources, config, FALLBACKS)
    assert time.monotonic() - started < 10
    gpu = report.layers[Layer.GPU]
    assert gpu.status is Status.UNHEALTHY  # fail closed: the plugin gave no verdict
    assert "plugin-team-check (timed_out)" in gpu.not_answered
    assert "plugin-team-check" not in gpu.answered_by
    assert report.layers[Layer.KERNEL].status is Status.HEALTHY


def test_a_plugin_saying_ok_adds_nothing_and_vouches_for_nothing(tmp_path):
    config = plugin_config(tmp_path, "#!/bin/sh\nexit 0\n", layer="kernel")
    result = run_plugin(config)
    assert result.outcome is Outcome.OK and result.findings == []
    report = assess([result], fail_closed=True)
    assert report.layers[Layer.KERNEL].status is Status.UNHEALTHY  # nothing built-in answered


def test_a_run_that_outlives_its_kill_is_not_started_again(tmp_path):
    # The grandchild leaves the process group, so the kill misses it and it holds stdout.
    config = plugin_config(tmp_path, "#!/bin/sh\nsetsid sleep 3 &\nexec sleep 1000\n")
    (check,) = plugin_checks(config.plugins)
    context = CheckContext(BundleSources(EXAMPLES / "healthy-h100"), config, TIMEOUT_S)
    repeating = RepeatingCheck(check, context)
    first = repeating.run_once()
    assert first.outcome is Outcome.TIMED_OUT and "has not exited" in first.detail
    second = repeating.run_once()
    assert second.outcome is Outcome.TIMED_OUT and "not started again" in second.detail
    later = wait_for(
        lambda: (
            (r := repeating.run_once()).detail.startswith(
                "plugin-team-check: " + config.plugins[0].command[0] + ": no result"
            )
            and r
        ),
        15,
        "the plugin started again once its stray child exited",
    )
    assert later.outcome is Outcome.TIMED_OUT
    repeating.close()


def test_a_hung_run_holds_back_its_own_plugin_not_another_on_the_same_program(tmp_path):
    # One program, two plugins: with "hang" it leaves a child outside its process group.
    program = make_tool(
        tmp_path,
        "probe",
        '#!/bin/sh\nif [ "$1" = hang ]; then setsid sleep 3 & exec sleep 1000; fi\nexit 0\n',
    )
    entries = [
        {"name": "stuck", "command": [str(program), "hang"], "timeout_s": TIMEOUT_S},
        {"name": "fine", "command": [str(program), "ok"], "timeout_s": TIMEOUT_S},
    ]
    config = build_config({"plugins": entries}, "test")
    stuck, fine = plugin_checks(config.plugins)
    context = CheckContext(BundleSources(EXAMPLES / "healthy-h100"), config, TIMEOUT_S)
    assert "has not exited" in run_check(stuck, context).detail
    assert "not started again" in run_check(stuck, context).detail
    assert run_check(fine, context).outcome is Outcome.OK


def test_the_example_plugins_keep_the_contract(tmp_path):
    mounted = build_config(
        {
            "plugins": [
                {"name": "mounts", "command": [str(PLUGINS / "mount-responsive.sh"), "/proc"]},
                {
                    "name": "gone",
                    "command": [str(PLUGINS / "mount-responsive.sh"), str(tmp_path)],
                    "problem_code": "MOUNT_GONE",
                },
                {
                    "name": "disk",
                    "output": "json",
                    "command": [str(PLUGINS / "disk-space.py"), "/", "--warn-percent", "101"],
                },
            ]
        },
        "test",
    )
    context = CheckContext(BundleSources(EXAMPLES / "healthy-h100"), mounted, 10)
    ok, gone, disk = (run_check(c, context) for c in plugin_checks(mounted.plugins))
    assert ok.outcome is Outcome.OK and ok.findings == []
    assert [f.code for f in gone.findings] == ["MOUNT_GONE"]
    assert f"{tmp_path} is not mounted" in gone.findings[0].message
    assert [(f.code, f.severity) for f in disk.findings] == [("DISK_LOW", Severity.WARNING)]


@pytest.mark.parametrize(
    ("plugins", "words"),
    [
        ([{"name": "x", "command": ["/bin/true"], "nmae": 1}], "plugins.0.nmae: unknown key"),
        ([{"name": "Bad_Name", "command": ["/bin/true"]}], "plugins.0.name"),
        ([{"name": "x", "command": []}], "plugins.0.command"),
        ([{"name": "x", "command": ["/bin/true"], "output": "xml"}], "plugins.0.output"),
        ([{"name": "x", "command": ["/bin/true"], "problem_code": "bad"}], "upper-case"),
        ([{"name": "x", "command": ["a"]}, {"name": "x", "command": ["b"]}], "used twice"),
        (
            [{"name": "x", "command": ["a"], "codes": {"A": {"severity": "bad"}}}],
            "plugins.0.codes.A.severity",
        ),
    ],
)
def test_a_bad_plugin_entry_is_named_in_one_line(plugins, words):
    with pytest.raises(ConfigError) as caught:
        build_config({"plugins": plugins}, "agent.yaml")
    message = str(caught.value)
    assert message.startswith("agent.yaml: invalid configuration: ") and words in message
    assert "\n" not in message


def test_plugins_take_their_own_timeout_and_interval():
    config = build_config(
        {"plugins": [{"name": "a", "command": ["x"], "timeout_s": 4, "interval_s": 300}]}, "t"
    )
    assert (config.timeout_for("plugin-a"), config.interval_for("plugin-a")) == (4, 300)
    assert [c.name for c in configured_checks(config)][-1] == "plugin-a"
    assert [c.name for c in configured_checks(Config())] == [c.name for c in default_checks()]
