"""The simulator's service levels (:mod:`gpuguard.sli`) measured on the live cluster.

GPU-node availability integrates, over time, how many GPU nodes the Node cache shows in
service; job success counts GPU Jobs as they finish. Every replica keeps these books from
its own start (a Job already finished then is counted once, at the first list); only the
leader exports them, so summing over replicas counts each node-second and each Job once.
docs/simulator.md ("Same numbers in production") gives the PromQL and how restarts read.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.conditions import LAYER_OF_TYPE
from gpuguard.kube.fleet import is_tainted
from gpuguard.kube.rest import Json
from gpuguard.sli import TimeShare, in_service

# The label NVIDIA's GPU feature discovery sets, and the chart's default agent nodeSelector.
DEFAULT_GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
OUTCOMES = ("succeeded", "failed")
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")

# (key, value) terms, all of which must hold; value None: the label only has to be there.
Selector = tuple[tuple[str, str | None], ...]


def parse_selector(text: str) -> Selector:
    """An equality label selector: ``key=value`` (or ``==``) and ``key`` terms, comma
    separated; "" selects every node. Set-based terms are refused by name."""
    if not text.strip():
        return ()
    terms: list[tuple[str, str | None]] = []
    for term in (part.strip() for part in text.split(",")):
        key, equals, value = term.partition("=")
        value = value.removeprefix("=") if equals else value
        key, value = key.strip(), value.strip()
        if not _KEY.match(key) or not _VALUE.match(value):
            raise ValueError(
                f"label selector term {term!r} in {text!r} is not key=value or key "
                "(only equality terms are supported)"
            )
        terms.append((key, value if equals else None))
    return tuple(terms)


DEFAULT_GPU_NODES = parse_selector(DEFAULT_GPU_NODE_SELECTOR)


def matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    return all(key in labels and value in (None, labels[key]) for key, value in selector)


def gpu_node_in_service(node: Json) -> bool:
    """:func:`gpuguard.sli.in_service` read off a Node: its Ready condition, its cordon,
    our quarantine taint, and the agent's layer conditions (``False`` is a fault; Unknown
    is no evidence of one, as in the policy). Foreign taints do not count: GPU nodes
    usually carry a dedicated-node taint for the whole of their life."""
    spec = node.get("spec") or {}
    status = {
        c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []
    }
    return in_service(
        ready=status.get("Ready") == "True",
        cordoned=bool(spec.get("unschedulable")),
        quarantined=is_tainted(node),
        faulty=any(status.get(kind) == "False" for kind in LAYER_OF_TYPE),
    )


class ServiceLevels:
    """A Prometheus collector fed by the controller's Node and Job watches.

    Node time accrues against the monotonic clock and is brought up to date at each
    scrape, so ``rate()`` is exact between changes too.
    """

    def __init__(
        self,
        gpu_nodes: Selector = DEFAULT_GPU_NODES,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.gpu_nodes = gpu_nodes
        self.leading = False  # only the leader exports
        self._clock = clock
        self._lock = threading.Lock()
        self._in_service: dict[str, bool] = {}  # GPU node name -> in service
        self._up = 0
        self._time = TimeShare(clock.monotonic())
        self._counted: set[str] = set()  # uids of the finished Jobs already counted
        self._finished: Counter[str] = Counter()

    # --- fed by the watches -----------------------------------------------------------
    def nodes_listed(self, nodes: Iterable[Json]) -> None:
        with self._lock:
            self._in_service, self._up = {}, 0
            for node in nodes:
                self._note(node)
            self._settle()

    def node_seen(self, node: Json) -> None:
        with self._lock:
            self._note(node)
            self._settle()

    def node_gone(self, name: str) -> None:
        with self._lock:
            self._up -= self._in_service.pop(name, False)
            self._settle()

    def jobs_listed(self, jobs: Iterable[Json]) -> None:
        """A (re)list: Jobs counted before are not counted again; the uids of Jobs no
        longer there are forgotten (a uid is never reused)."""
        jobs = list(jobs)
        with self._lock:
            self._counted &= {job["metadata"]["uid"] for job in jobs}
            for job in jobs:
                self._count(job)

    def job_seen(self, job: Json) -> None:
        with self._lock:
            self._count(job)

    def job_gone(self, job: Json) -> None:
        with self._lock:
            self._counted.discard(job["metadata"]["uid"])

    def _note(self, node: Json) -> None:
        name = node["metadata"]["name"]
        self._up -= self._in_service.pop(name, False)
        if matches(self.gpu_nodes, node["metadata"].get("labels") or {}):
            up = gpu_node_in_service(node)
            self._in_service[name] = up
            self._up += up

    def _settle(self) -> None:
        self._time.set(self._clock.monotonic(), up=self._up, total=len(self._in_service))

    def _count(self, job: Json) -> None:
        uid = job["metadata"]["uid"]
        if job["gpu"] and job["outcome"] and uid not in self._counted:
            self._counted.add(uid)
            self._finished[job["outcome"]] += 1

    # --- read by Prometheus -----------------------------------------------------------
    def collect(self) -> list[Metric]:
        if not self.leading:
            return []
        with self._lock:
            self._time.advance(self._clock.monotonic())
            seconds = CounterMetricFamily(
                "gpuguard_gpu_node_seconds",
                "GPU-node time in and out of service (gpuguard.sli), leader only",
                labels=["state"],
            )
            seconds.add_metric(["in_service"], self._time.up_seconds)
            seconds.add_metric(["out_of_service"], self._time.down_seconds)
            nodes = GaugeMetricFamily(
                "gpuguard_gpu_nodes", "GPU nodes in and out of service now", labels=["state"]
            )
            nodes.add_metric(["in_service"], self._up)
            nodes.add_metric(["out_of_service"], len(self._in_service) - self._up)
            jobs = CounterMetricFamily(
                "gpuguard_jobs_finished",
                "GPU Jobs seen finishing (Complete: succeeded, Failed: failed), leader only",
                labels=["outcome"],
            )
            for outcome in OUTCOMES:
                jobs.add_metric([outcome], self._finished[outcome])
        return [seconds, nodes, jobs]
