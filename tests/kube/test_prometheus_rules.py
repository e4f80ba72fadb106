"""The chart's PrometheusRule and ServiceMonitors with the real tools: rules rendered by
helm, checked and unit-tested by promtool (tests/data/prometheus/rules_test.yaml: a case
per alert that fires and one that must not), the per-alert switches, and every monitoring
object accepted by the real API server against the Prometheus Operator's CRDs."""

from __future__ import annotations

import urllib.error
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.kube.rest import KubeApi
from tests.conftest import DATA
from tests.support.cluster import install_crd, scratch_namespace
from tests.support.controlplane import REPO, ControlPlane
from tests.support.prometheus import (
    chart_rules,
    operator_crds,
    prometheus_bin,
    promtool,
    rendered,
    rules_of,
)

RULES_TEST = DATA / "prometheus" / "rules_test.yaml"
ALERTS = {
    "agentNotPublishing": "GpuguardAgentNotPublishing",
    "agentSilent": "GpuguardAgentSilent",
    "nodeUnhealthy": "GpuguardNodeUnhealthy",
    "episodeStuck": "GpuguardEpisodeStuck",
    "drainBlocked": "GpuguardDrainBlocked",
    "breakerOpen": "GpuguardBreakerOpen",
    "noLeader": "GpuguardNoControllerLeader",
    "positionAtFault": "GpuguardPositionAtFault",
    "lemonNode": "GpuguardLemonNode",
    "checkTimeouts": "GpuguardCheckTimeouts",
}


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return prometheus_bin()


def unit_test(bin_dir: Path, rules: dict[str, Any], cases: str, workdir: Path) -> Any:
    """promtool test rules on ``cases`` with ``rules`` as its rules.yaml."""
    (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
    (workdir / "rules_test.yaml").write_text(cases)
    return promtool(bin_dir, "test", "rules", "rules_test.yaml", cwd=workdir)


def test_promtool_accepts_the_rendered_rules(helm, bin_dir, tmp_path):
    rules = chart_rules(helm)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    done = promtool(bin_dir, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert f"SUCCESS: {count} rules found" in done.stdout
    assert set(rules_of(rules, "alert")) == set(ALERTS.values())
    records = rules_of(rules, "record")
    for window in ("1h", "1d", "30d"):
        # The PromQL of docs/simulator.md ("Same numbers in production"), over each window.
        assert (
            records[f"gpuguard:gpu_node_availability:ratio_{window}"].split()
            == (
                f'sum(increase(gpuguard_gpu_node_seconds_total{{state="in_service"}}[{window}])) '
                f"/ sum(increase(gpuguard_gpu_node_seconds_total[{window}]))"
            ).split()
        )
        assert (
            records[f"gpuguard:job_success:ratio_{window}"].split()
            == (
                f'sum(increase(gpuguard_jobs_finished_total{{outcome="succeeded"}}[{window}])) '
                f"/ sum(increase(gpuguard_jobs_finished_total[{window}]))"
            ).split()
        )


def test_promtool_unit_tests_pass_with_a_firing_and_a_quiet_case_per_alert(helm, bin_dir, tmp_path):
    cases = yaml.safe_load(RULES_TEST.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in cases["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == quiet == set(ALERTS.values())
    done = unit_test(bin_dir, chart_rules(helm), RULES_TEST.read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("right", "wrong"),
    [
        ("value: 0.9995}]", "value: 0.999}]"),  # a recorded value
        ("node: gpu-a, layer: gpu}", "node: gpu-b, layer: gpu}"),  # who fires
        ("summary: 2 gpuguard agents", "summary: 3 gpuguard agents"),  # the leader's count
        ("eval_time: 12m ", "eval_time: 17m "),  # a case that must not fire, once it does
    ],
)
def test_a_wrong_expectation_fails(helm, bin_dir, tmp_path, right, wrong):
    text = RULES_TEST.read_text()
    assert text.count(right) == 1
    done = unit_test(bin_dir, chart_rules(helm), text.replace(right, wrong), tmp_path)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


@pytest.mark.parametrize("key", sorted(ALERTS))
def test_each_alert_switches_off_alone(helm, key):
    alerts = rules_of(chart_rules(helm, f"prometheusRule.alerts.{key}.enabled=false"), "alert")
    assert set(alerts) == set(ALERTS.values()) - {ALERTS[key]}


def test_without_the_controller_only_the_agent_alerts_remain(helm):
    alerts = rules_of(chart_rules(helm, "controller.enabled=false"), "alert")
    assert set(alerts) == {
        "GpuguardAgentNotPublishing",
        "GpuguardNodeUnhealthy",
        "GpuguardCheckTimeouts",
        "GpuguardLemonNode",
    }


def test_values_shape_the_rules(helm):
    rules = chart_rules(
        helm,
        "prometheusRule.alertLabels.team=gpu-infra",
        "prometheusRule.alerts.episodeStuck.maxSeconds.Quarantined=null",
        "prometheusRule.alerts.episodeStuck.maxSeconds.Draining=120",
        "controller.policy.lemon_episodes=5",
        "controller.policy.lemon_window_s=86400",
        "prometheusRule.additionalRules[0].alert=Mine",
        "prometheusRule.additionalRules[0].expr=vector(1)",
    )
    alerts = {r["alert"]: r for group in rules["groups"] for r in group["rules"] if "alert" in r}
    assert all(
        alert["labels"]["team"] == "gpu-infra" for name, alert in alerts.items() if name != "Mine"
    )
    stuck = alerts["GpuguardEpisodeStuck"]["expr"]
    assert 'phase="Quarantined"' not in stuck and 'phase="Draining"' in stuck and "> 120" in stuck
    lemon = alerts["GpuguardLemonNode"]["expr"]
    assert "[86400s]" in lemon and ">= 5" in lemon
    assert alerts["Mine"]["expr"] == "vector(1)"
    (extra,) = [g for g in rules["groups"] if g["name"] == "gpuguard.additional"]
    assert [r["alert"] for r in extra["rules"]] == ["Mine"]


# --- server side ------------------------------------------------------------------------

KINDS = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


def dry_run(plane: ControlPlane, obj: dict[str, Any]) -> tuple[int, Any]:
    """A server-side dry-run create: validated and admitted, never stored; a field the
    CRD does not know is refused (Strict), not pruned."""
    namespace = obj["metadata"]["namespace"]
    path = f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/{KINDS[obj['kind']]}"
    query = urllib.parse.urlencode({"dryRun": "All", "fieldValidation": "Strict"})
    try:
        return 201, plane.request("POST", f"{path}?{query}", obj)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def monitoring_crds(api: KubeApi, bin_dir: Path) -> None:
    for crd in operator_crds(bin_dir):
        install_crd(api, crd)


def monitoring_objects(helm: Callable[..., str], namespace: str, *values: str) -> list[Any]:
    settings = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true", *values)
    return [doc for doc in rendered(helm, *settings, namespace=namespace) if doc["kind"] in KINDS]


def test_monitors_and_rules_validate_against_the_operator_crds(
    api, control_plane, helm, monitoring_crds
):
    values = (
        "serviceMonitor.scrapeTimeout=15s",
        "serviceMonitor.labels.release=kube-prometheus-stack",
        "serviceMonitor.relabelings[0].targetLabel=cluster",
        "serviceMonitor.relabelings[0].replacement=gpu-east",
        "serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
        "serviceMonitor.metricRelabelings[0].regex=.*_created",
        "serviceMonitor.metricRelabelings[0].action=drop",
        "prometheusRule.additionalRules[0].record=mine:up:sum",
        "prometheusRule.additionalRules[0].expr=sum(up)",
    )
    with scratch_namespace(api) as namespace:
        objects = monitoring_objects(helm, namespace, *values)
        kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects)
        assert kinds == [
            ("PrometheusRule", "gpuguard"),
            ("ServiceMonitor", "gpuguard"),
            ("ServiceMonitor", "gpuguard-controller"),
        ]
        for obj in objects:
            code, body = dry_run(control_plane, obj)
            assert code == 201, f"{obj['kind']}/{obj['metadata']['name']} refused: {body}"
            assert body["metadata"]["name"] == obj["metadata"]["name"]
        # The schema is really applied: a malformed duration is refused.
        (monitor,) = [o for o in objects if o["metadata"]["name"] == "gpuguard-controller"]
        monitor["spec"]["endpoints"][0]["scrapeTimeout"] = "15 seconds"
        code, body = dry_run(control_plane, monitor)
        assert code == 422 and "scrapeTimeout" in body


def test_each_component_has_its_monitor(helm):
    objects = monitoring_objects(helm, "gpuguard")
    monitors = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "ServiceMonitor"}
    agent, controller = monitors["gpuguard"], monitors["gpuguard-controller"]
    assert agent["selector"]["matchLabels"]["app.kubernetes.io/name"] == "gpuguard"
    assert controller["selector"]["matchLabels"]["app.kubernetes.io/name"] == "gpuguard-controller"
    (agent_endpoint,) = agent["endpoints"]
    assert agent_endpoint["relabelings"][0]["targetLabel"] == "node"
    (controller_endpoint,) = controller["endpoints"]
    assert "relabelings" not in controller_endpoint  # its series name their nodes themselves
    for endpoint in (agent_endpoint, controller_endpoint):
        assert (endpoint["port"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
            "metrics",
            "30s",
            "10s",
        )
    no_controller = monitoring_objects(helm, "gpuguard", "controller.enabled=false")
    assert [o["metadata"]["name"] for o in no_controller if o["kind"] == "ServiceMonitor"] == [
        "gpuguard"
    ]


def test_every_alert_links_its_own_runbook_section(helm):
    rules = [r for g in chart_rules(helm)["groups"] for r in g["rules"] if "alert" in r]
    headings = {
        line[3:].strip().lower()
        for line in (REPO / "docs" / "runbooks.md").read_text().splitlines()
        if line.startswith("## ")
    }
    assert {r["alert"] for r in rules} == set(ALERTS.values())
    for rule in rules:
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/runbooks.md" and anchor == rule["alert"].lower()
        assert anchor in headings, f"docs/runbooks.md has no section for {rule['alert']}"
    custom = chart_rules(helm, "prometheusRule.runbookBaseUrl=https://wiki.example/gg")
    urls = {
        r["annotations"]["runbook_url"]
        for g in custom["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert all(u.startswith("https://wiki.example/gg#gpuguard") for u in urls)
