"""A real Prometheus (Debian's 2.42) on loopback scraping the real agent and controller,
their metrics served by gpuguard.metrics_server as in production, with the chart's rules
loaded: every dashboard panel query and every rule expression parses and returns series.

The test makes each watched situation real, on the shared API server: an agent whose
kernel log shows an Xid 79 (unhealthy, a lemon once it was healthy first), an agent that
cannot publish (its Node does not exist) and whose nvidia-smi hangs (check timeouts), a
drain a PodDisruptionBudget blocks (stuck Draining), two episodes at once (the breaker
opens), one of them cleared (a closed episode for the time-to-repair panels), and a node
whose reports stopped (a silent agent). Bounds that would take hours are rendered short
(TEST_VALUES). Last, the controller stops and the no-leader alert's expression must
return its series.

Both dashboards are then drawn from their own queries over the scenario
(tests/support/dashboard_image.py); ``make dashboard-images`` keeps those drawings in
docs/img/ (DASHBOARD_IMAGES names the folder).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.checks.registry import default_checks
from gpuguard.config import Config
from gpuguard.contract.keys import EXCLUDE_LABEL
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kube.client import NodeApi
from gpuguard.kube.rest import load_api
from gpuguard.metrics_server import Served, serve
from gpuguard.sources import BundleSources, LiveSources
from tests.support.cluster import make_node, pod_held_by_a_budget, set_health, wait_for
from tests.support.controllers import POOL, Running, append, new_controller, node_name, status_of
from tests.support.controlplane import REPO, ControlPlane
from tests.support.dashboard_image import Window, render
from tests.support.metrics import sample
from tests.support.prometheus import (
    PrometheusServer,
    chart_rules,
    dashboards,
    panel_queries,
    prometheus_bin,
    rules_of,
)

GPU_NODE = {POOL: "h100", "nvidia.com/gpu.present": "true"}
TEST_VALUES = (
    "prometheusRule.alerts.lemonNode.interval=1s",  # default 5m: one evaluation per 5 min
    "controller.policy.lemon_episodes=1",  # the one rise the test makes
    "prometheusRule.alerts.episodeStuck.maxSeconds.Draining=1",  # default 1 h
)
# The expressions that may return nothing while the controller leads, and why.
EMPTY_WHILE_LEADING = {
    "GpuguardNoControllerLeader": "a replica leads: checked once the controller stops",
}
# The expressions this scenario leaves empty, and where their series are seen instead.
EMPTY_HERE = {
    "GpuguardPositionAtFault": "no position at fault here: tests/kube/test_positions.py",
}
SCENARIO_TIMEOUT_S = 60.0
IMAGE_AFTERMATH_S = 40.0


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    return prometheus_bin()


@contextlib.contextmanager
def endpoint(metrics: Served) -> Iterator[str]:
    """The metrics served on 127.0.0.1 as the daemons serve them; "host:port"."""
    server: ThreadingHTTPServer = serve(metrics, 0, host="127.0.0.1")
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def agent(plane: ControlPlane, node: str, sources: Any, follow: Path, **settings: Any) -> Agent:
    config = Config(
        **{
            "check_interval_s": 0.5,
            "heartbeat_interval_s": 2,
            "metrics_port": 0,
            "expected_gpus": 1,
            **settings,
        }
    )
    follower = FileFollower(follow, 0.05)
    api = NodeApi(load_api(plane.admin_kubeconfig))
    return Agent(config, sources, default_checks(), follower, node, api)


def every_query(rules: dict[str, Any]) -> dict[str, str]:
    """Name -> PromQL: each rule's expression, and each dashboard panel's queries."""
    queries = {**rules_of(rules, "alert"), **rules_of(rules, "record")}
    for file, dashboard in dashboards().items():
        for index, (title, expr) in enumerate(panel_queries(dashboard)):
            queries[f"{file}: {title} #{index}"] = expr
    return queries


def empty_ones(prometheus: PrometheusServer, queries: dict[str, str]) -> list[str]:
    """The names whose query returns no series now (a query that does not parse fails)."""
    return [name for name, expr in queries.items() if not prometheus.query(expr)]


def draw_dashboards(prometheus: PrometheusServer, started: float, folder: Path) -> None:
    """Each dashboard drawn into ``folder`` (and DASHBOARD_IMAGES when set) over the time
    since ``started``: every panel drew a series for each of its queries, and the drawing
    is well-formed SVG."""
    keep = os.environ.get("DASHBOARD_IMAGES")
    if keep:
        time.sleep(IMAGE_AFTERMATH_S)  # the documentation's drawings show the aftermath too
    window = Window(started, time.time())
    for file, dashboard in dashboards().items():
        drawn = render(dashboard, prometheus, window)
        blank = {title: counts for title, counts in drawn.series.items() if 0 in counts}
        assert not blank, f"{file}: panels with a query that drew nothing: {blank}"
        ElementTree.fromstring(drawn.svg)
        image = f"dashboard-{Path(file).stem.removeprefix('gpuguard-')}.svg"
        for where in [folder, *([Path(keep)] if keep else [])]:
            where.mkdir(parents=True, exist_ok=True)
            (where / image).write_text(drawn.svg + "\n")


def test_every_dashboard_and_rule_query_parses_and_returns_series(
    api, control_plane, namespace, helm, bin_dir, tmp_path
):
    # The agents: one on a real Node with a captured healthy bundle, and one for a Node
    # that does not exist, on this machine's (absent) tools with a hanging nvidia-smi.
    sick_agent_node = node_name()
    make_node(api, sick_agent_node, labels={EXCLUDE_LABEL: "true"})  # no repair here
    bundle = tmp_path / "bundle"
    shutil.copytree(REPO / "examples" / "healthy-h100", bundle)
    (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
    watched = agent(control_plane, sick_agent_node, BundleSources(bundle), bundle / "kmsg.log")
    hanging = tmp_path / "nvidia-smi"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    (tmp_path / "kmsg.log").write_text("")
    settings = {"tools": {"nvidia-smi": str(hanging)}, "default_timeout_s": 0.5}
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    lost = agent(
        control_plane, ghost, LiveSources(Config(**settings)), tmp_path / "kmsg.log", **settings
    )

    # The controller's fleet: a node to drain, one to clear, one whose agent went quiet
    # (reports written once, by the test: each goes silent after agent_timeout_s).
    draining, clearing, quiet = node_name(), node_name(), node_name()
    for name in (draining, clearing, quiet):
        make_node(api, name, labels=GPU_NODE)
        set_health(api, name)
    pod_held_by_a_budget(api, namespace, draining, "guarded")
    controller = new_controller(
        api,
        namespace,
        tolerance_s=300,  # NVLINK_DOWN waits; XID_79's own tolerance is 0
        drain_timeout_s=600,
        agent_timeout_s=3,
        breaker={"threshold_percent": 1, "window_s": 600, "min_nodes": 2, "close_percent": 1},
    )
    rules = chart_rules(helm, *TEST_VALUES)
    queries = every_query(rules)

    with contextlib.ExitStack() as stack:
        for daemon in (watched, lost):
            stack.callback(Running(daemon.run).halt)
        leader = Running(controller.run)
        stack.callback(leader.halt)
        jobs = {
            "gpuguard-agent": [
                (stack.enter_context(endpoint(watched.metrics)), {"node": sick_agent_node}),
                (stack.enter_context(endpoint(lost.metrics)), {"node": ghost}),
            ],
            "gpuguard-controller": [(stack.enter_context(endpoint(controller.metrics)), {})],
        }
        prometheus = stack.enter_context(
            PrometheusServer(tmp_path / "prometheus", bin_dir, jobs, rules)
        )
        wait_for(lambda: len(prometheus.query("up == 1")) == 3, 20, "every target up")
        started = time.time()
        # Healthy first, so the Xid below is a rise of the lemon count.
        wait_for(
            lambda: prometheus.query(
                f'gpuguard:node_unhealthy:max{{node="{sick_agent_node}"}} == 0'
            ),
            20,
            "the agent's healthy report recorded",
        )

        set_health(api, draining, gpu="False", action="REBOOT", codes=("XID_79",))
        wait_for(
            lambda: sample(
                controller.metrics.registry,
                "gpuguard_controller_evictions_total",
                outcome="blocked",
            ),
            20,
            "an eviction refused by the budget",
        )
        assert status_of(api, draining)["phase"] == "Draining"
        # Seen rising by Prometheus before the breaker opens and stops the retries.
        wait_for(
            lambda: prometheus.query(queries["GpuguardDrainBlocked"]),
            20,
            "Prometheus to see evictions blocked",
        )
        set_health(api, clearing, gpu="False", action="RESET_GPU", codes=("NVLINK_DOWN",))
        wait_for(
            lambda: sample(controller.metrics.registry, "gpuguard_controller_breaker_open"),
            20,
            "the breaker open (two episodes at once)",
        )
        set_health(api, clearing)
        wait_for(
            lambda: status_of(api, clearing).get("resolution") == "Transient",
            20,
            "the cleared node's episode closed",
        )
        append(bundle, 79, "GPU has fallen off the bus.")

        expected_empty = EMPTY_WHILE_LEADING.keys() | EMPTY_HERE.keys()

        def all_answered() -> bool:
            return not [n for n in empty_ones(prometheus, queries) if n not in expected_empty]

        try:
            wait_for(all_answered, SCENARIO_TIMEOUT_S, "every query to return series")
        except AssertionError:
            missing = [n for n in empty_ones(prometheus, queries) if n not in expected_empty]
            raise AssertionError(f"no series for: {missing}") from None
        # The node's first Xid 79 is what starts its series: the panel still counts it.
        (xid_panel,) = [q for n, q in queries.items() if ": Xid events by code #" in n]
        assert [float(s["value"][1]) for s in prometheus.query(xid_panel)] == [1.0]
        # So is the controller's first closed episode in the time-to-repair panels.
        (mean_panel,) = [q for n, q in queries.items() if ": Mean time to repair by " in n]
        assert [s["metric"] for s in prometheus.query(f"({mean_panel}) >= 0")] == [
            {"resolution": "Transient"}
        ]

        draw_dashboards(prometheus, started, tmp_path / "dashboards")

        leader.halt()
        for name in EMPTY_WHILE_LEADING:
            wait_for(
                lambda name=name: prometheus.query(queries[name]), 20, f"{name} once none leads"
            )
        alerts = {a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]}
        groups = prometheus.api("rules")["groups"]
        assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
        assert alerts <= set(rules_of(rules, "alert"))
