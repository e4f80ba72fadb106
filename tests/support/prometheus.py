"""Prometheus in tests: Debian's prometheus and promtool (hack/prometheus-env), the chart's
rules and dashboards as helm renders them, and a real server on loopback that scrapes the
tests' own metrics endpoints with those rules loaded."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import serving, wait_for
from tests.support.controlplane import REPO, free_port, terminate

CHART = REPO / "deploy" / "helm" / "gpuguard"
RULES_TEMPLATE = "templates/prometheusrule.yaml"
START_TIMEOUT_S = 30.0
# Grafana's own variables, as Grafana would fill them in for a short dashboard range.
GRAFANA_VARIABLES = {"$__rate_interval": "1m"}

Helm = Callable[..., str]


def prometheus_bin() -> Path:
    """Fetch (when the cache is cold) and locate prometheus and promtool."""
    proc = subprocess.run(
        [str(REPO / "hack" / "prometheus-env")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/prometheus-env failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def operator_crds(bin_dir: Path) -> list[dict[str, Any]]:
    """The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs."""
    return [yaml.safe_load(path.read_text()) for path in sorted((bin_dir / "crds").glob("*.yaml"))]


def rendered(
    helm: Helm, *settings: str, namespace: str = "gpuguard", template: str = ""
) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them with ``settings`` (each a
    ``--set``), only ``template``'s if named."""
    only = ("-s", template) if template else ()
    sets = [arg for value in settings for arg in ("--set", value)]
    out = helm("template", "gpuguard", str(CHART), "--namespace", namespace, *only, *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def chart_rules(helm: Helm, *settings: str, namespace: str = "gpuguard") -> dict[str, Any]:
    """The rendered PrometheusRule's spec: a Prometheus rule file ({"groups": [...]})."""
    values = ("prometheusRule.enabled=true", *settings)
    (rule,) = rendered(helm, *values, namespace=namespace, template=RULES_TEMPLATE)
    return dict(rule["spec"])


def rules_of(rules: dict[str, Any], key: str) -> dict[str, str]:
    """``key`` "alert" or "record": each such rule's name and expression."""
    return {r[key]: r["expr"] for group in rules["groups"] for r in group["rules"] if key in r}


def dashboards() -> dict[str, dict[str, Any]]:
    """The chart's dashboards by file name."""
    return {
        p.name: json.loads(p.read_text()) for p in sorted((CHART / "dashboards").glob("*.json"))
    }


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of ``dashboard``, rows' panels included."""
    for panel in dashboard["panels"]:
        yield from [panel, *panel.get("panels", [])]


def expression(target: dict[str, Any]) -> str:
    """A panel target's PromQL with Grafana's own variables filled in."""
    expr = str(target["expr"])
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], expression(target)


def promtool(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class PrometheusServer:
    """A real Prometheus on 127.0.0.1, its data under ``workdir``; a context manager.

    ``jobs``: job name -> [(host:port, target labels)], scraped every ``interval``, which
    is also the rule evaluation interval (a group's own ``interval`` still wins)."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        jobs: dict[str, list[tuple[str, dict[str, str]]]],
        rules: dict[str, Any],
        interval: str = "1s",
    ) -> None:
        self.workdir = workdir
        self.bin = bin_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [
                        {"targets": [address], "labels": labels} for address, labels in targets
                    ],
                }
                for job, targets in jobs.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(self.bin / "prometheus"),
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(
                lambda: serving(self._proc, f"{self.url}/-/ready", self.log),
                START_TIMEOUT_S,
                "Prometheus ready",
            )
        except BaseException:
            terminate(self._proc)
            raise
        return self

    def __exit__(self, *_: object) -> None:
        terminate(self._proc)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else AssertionError
        with Prometheus' error (a query that does not parse answers 400)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` gives now (a scalar result counts as one series)."""
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [data]


def selector_names(expr: str) -> set[str]:
    """The gpuguard metric names an expression reads (recorded ones included)."""
    return set(re.findall(r"\bgpuguard[:_][A-Za-z0-9_:]*", expr))
