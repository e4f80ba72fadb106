"""``gpuguard controller`` at fleet scale: quarantine latency, drain rate and memory.

Everything is real except the machines: one local etcd + kube-apiserver (from
``hack/testenv``, started by ``tests/support/controlplane.py``), the controller as the real
``gpuguard controller`` subprocess (so its memory is its own and its latency includes every
HTTP round trip), and Node and Pod objects written straight to the API server the way the
agent and the kubelet would write them.

Method
------

1. **Fleet.** ``--nodes`` Node objects are created from a thread pool, each as a kubelet
   and the gpuguard agent leave it: ~40 container images with realistic names, digests and
   sizes (most of a real Node's bytes), capacity with 8 GPUs and EFA, the kubelet's four
   conditions, gpuguard's three conditions ``True`` since an hour ago, a healthy
   ``gpuguard.io/report`` annotation, and labels spread over 10 pools
   (``karpenter.sh/nodepool``). The size of one Node as the API serves it is printed.
2. **Controller.** ``gpuguard controller --kubeconfig ... --policy ...`` starts on the full
   fleet. The policy holds every fault long enough (``tolerance_s: 3600``) that no action
   starts while quarantine is measured, opens the budget (``max_unavailable: 100000``,
   100 %) and keeps the circuit breaker out of the way (``min_nodes: 100000``). Start-up is
   timed to ``/readyz`` (Node cache filled) and the first reconcile.
3. **Quarantine latency.** The benchmark watches every Node (one ``watch``, each line
   timestamped as it arrives; only lines carrying our taint are parsed). A flip is what the
   agent writes: the ``GpuguardGPUHealthy`` condition ``False`` (``Xid48``) through
   ``nodes/status``, then the report annotation (``RESET_GPU`` on one GPU, code
   ``XID_48``). Latency = arrival of the first watch event showing
   ``gpuguard.io/unhealthy:NoSchedule`` on the node - the moment the condition write
   returned. Three series: ``--single`` flips one at a time on an otherwise quiet fleet
   (a random 0.2-0.7 s pause first, so flips do not fall into step with the controller's
   passes; it has no fixed resync, it runs a pass on each watch event that can matter and
   at the policy's next deadline); the same again while other nodes heartbeat
   (``--heartbeats`` Node writes a second, by default what N agents with the default
   180 s heartbeat write: 2 N / 180, ~56/s at 5,000 nodes; a real fleet is never
   quiet); then ``--flip`` nodes at once, written by ``--threads`` writers as fast as
   the API server takes them, each node's own write time kept.
4. **Drain.** ``--pods`` pods are bound to ``--drain-nodes`` other nodes (no
   PodDisruptionBudget) and set ``Running`` through ``pods/status`` as admin. Those nodes
   flip with ``XID_79`` / ``REBOOT``: tolerance 0 by default, so each goes straight to
   cordon and drain. A kubelet stand-in (``tests.support.cluster.finish_terminating_pods``)
   finalizes terminating pods. Evictions are timed by a watch on the pods (first event with
   a ``deletionTimestamp``) and cross-checked with the controller's
   ``gpuguard_controller_evictions_total``. Rate = (evictions - 1) / (last - first).
5. **Memory and CPU.** ``VmRSS`` / ``VmHWM`` from ``/proc/PID/status`` after start-up has
   settled (steady state on the whole fleet, nothing happening), and at the end (peak);
   CPU (utime + stime) and reconciles (passes) a second over a quiet window, CPU as % of
   one core.

Everything shares one machine: etcd, kube-apiserver, the controller and this benchmark's
writers and watchers. On a 2-core machine the API server is the busiest of them, so the
numbers are upper bounds for what the controller needs on its own.

Run: ``.venv/bin/python bench/controller_scale.py [--nodes 5000] [--flip 300] [--pods 500]``
(``--profile FILE`` runs the controller under cProfile and prints where its reconcile
loop's time went; do not take latencies from a profiled run). Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import platform
import pstats
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import synthetic_nodes as synthetic  # noqa: E402

from gpuguard.kube.rest import KubeApi, load_api  # noqa: E402
from tests.support.audit import AuditLog  # noqa: E402
from tests.support.cluster import finish_terminating_pods, install_crds  # noqa: E402
from tests.support.controlplane import ControlPlane, free_port, testenv_bin  # noqa: E402

GPUGUARD = REPO / ".venv" / "bin" / "gpuguard"
PYTHON = REPO / ".venv" / "bin" / "python"
NAMESPACE = "gpuguard"  # the controller's Lease and breaker state
POD_NAMESPACE = "bench"
TAINT = b"gpuguard.io/unhealthy"
REPORT = "gpuguard.io/report"
GPU_CONDITION = "GpuguardGPUHealthy"
WAIT_S = 180.0
RECONCILES = "gpuguard_controller_reconcile_seconds_count"
RECONCILE_SECONDS = "gpuguard_controller_reconcile_seconds_sum"
EVICTED = 'gpuguard_controller_evictions_total{outcome="evicted"}'
POLICY = """\
tolerance_s: 3600        # no fault acts during the quarantine measurement...
tolerances: {}           # ...except XID_79 (0 s by default): the drain phase uses it
min_action_interval_s: 0
action_timeout_s: 3600
drain_timeout_s: 900
budget: {max_unavailable: 100000, max_unavailable_percent: 100}
breaker: {threshold_percent: 100, min_nodes: 100000, close_percent: 5}
"""

# --- realistic Node objects ---------------------------------------------------------------
EKS = "602401143452.dkr.ecr.us-west-2.amazonaws.com"  # AWS's EKS add-on registry
OURS = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml"  # the training team's
# (repository, tag, size in bytes): what a GPU node's kubelet lists in status.images.
IMAGE_CATALOGUE: tuple[tuple[str, str, int], ...] = (
    ("nvcr.io/nvidia/pytorch", "24.05-py3", 9_871_234_567),
    ("nvcr.io/nvidia/pytorch", "24.08-py3", 10_112_884_213),
    ("nvcr.io/nvidia/nemo", "24.07", 17_922_113_409),
    ("nvcr.io/nvidia/tritonserver", "24.08-py3", 8_401_922_110),
    ("nvcr.io/nvidia/tritonserver", "24.08-trtllm-python-py3", 11_245_090_776),
    ("nvcr.io/nvidia/cuda", "12.4.1-devel-ubuntu22.04", 3_812_664_001),
    ("nvcr.io/nvidia/cuda", "12.4.1-runtime-ubuntu22.04", 1_551_230_442),
    ("nvcr.io/nvidia/k8s/dcgm-exporter", "3.3.7-3.5.0-ubuntu22.04", 356_112_009),
    ("nvcr.io/nvidia/k8s-device-plugin", "v0.16.2", 145_220_331),
    ("nvcr.io/nvidia/gpu-operator", "v24.6.1", 201_877_420),
    ("nvcr.io/nvidia/gpu-feature-discovery", "v0.16.2", 132_004_118),
    ("nvcr.io/nvidia/cloud-native/k8s-driver-manager", "v0.6.10", 298_441_016),
    ("nvcr.io/nvidia/cloud-native/dcgm", "3.3.7-1-ubuntu22.04", 1_210_334_877),
    ("nvcr.io/nvidia/k8s/container-toolkit", "v1.16.1-ubuntu20.04", 133_771_902),
    ("nvcr.io/nvidia/driver", "550.90.07-ubuntu22.04", 512_889_240),
    ("public.ecr.aws/eks/aws-efa-k8s-device-plugin", "v0.5.3", 32_110_442),
    (f"{EKS}/amazon-k8s-cni", "v1.18.3-eksbuild.2", 48_113_902),
    (f"{EKS}/amazon-k8s-cni-init", "v1.18.3-eksbuild.2", 62_802_113),
    (f"{EKS}/amazon/aws-network-policy-agent", "v1.1.2-eksbuild.2", 33_991_078),
    (f"{EKS}/eks/kube-proxy", "v1.30.3-minimal-eksbuild.5", 31_870_201),
    (f"{EKS}/eks/pause", "3.5", 298_001),
    (f"{EKS}/eks/coredns", "v1.11.1-eksbuild.11", 18_336_442),
    (f"{EKS}/eks/aws-ebs-csi-driver", "v1.34.0", 96_110_284),
    ("public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver", "v1.34.0", 96_230_010),
    ("registry.k8s.io/sig-storage/csi-node-driver-registrar", "v2.11.1", 12_004_220),
    ("registry.k8s.io/sig-storage/livenessprobe", "v2.13.1", 9_877_210),
    ("registry.k8s.io/nfd/node-feature-discovery", "v0.16.4", 84_332_901),
    ("registry.k8s.io/kube-state-metrics/kube-state-metrics", "v2.13.0", 19_771_023),
    ("quay.io/prometheus/node-exporter", "v1.8.2", 11_402_986),
    ("quay.io/cilium/cilium", "v1.16.1", 197_990_114),
    ("docker.io/fluent/fluent-bit", "3.1.7", 38_220_112),
    ("docker.io/grafana/promtail", "3.1.1", 78_003_441),
    ("docker.io/datadog/agent", "7.56.2", 412_883_019),
    ("ghcr.io/gpuguard/gpuguard", "v0.1.0", 88_120_442),
    ("docker.io/library/python", "3.11-slim", 46_221_870),
    ("docker.io/library/busybox", "1.36", 2_155_701),
    ("docker.io/rayproject/ray-ml", "2.34.0-py311-gpu", 13_602_117_441),
    ("docker.io/vllm/vllm-openai", "v0.5.5", 9_118_004_233),
    ("ghcr.io/huggingface/text-generation-inference", "2.2.0", 6_102_433_001),
    ("docker.io/mosaicml/llm-foundry", "2.4.0_cu124-latest", 12_441_090_118),
    (f"{OURS}/train", "2024-08-29-7f3c2e1", 14_220_113_004),
    (f"{OURS}/eval", "2024-08-27-a11b9d0", 9_902_441_226),
    (f"{OURS}/data-loader", "v3.2.1", 2_201_334_987),
    ("docker.io/nvidia/nccl-tests", "2.13.10-cuda12.4", 4_410_233_001),
    ("docker.io/mpioperator/mpi-operator", "0.5.0", 61_330_298),
)


def _images(rng: random.Random, count: int) -> list[dict[str, Any]]:
    chosen = rng.sample(IMAGE_CATALOGUE, min(count, len(IMAGE_CATALOGUE)))
    chosen.sort(key=lambda image: -image[2])  # the kubelet lists the biggest first
    return [
        {
            "names": [f"{repo}@sha256:{synthetic.digest(repo, tag)}", f"{repo}:{tag}"],
            "sizeBytes": size,
        }
        for repo, tag, size in chosen
    ]


def _rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def healthy_report(when: float) -> str:
    layer = {"status": "Healthy", "action": "NONE", "codes": [], "gpus": []}
    layers = {"gpu": layer, "network": layer, "kernel": layer}
    return json.dumps({"layers": layers, "reportedAt": _rfc3339(when)}, sort_keys=True)


def node_name(index: int) -> str:
    return f"gpu-{index:05d}"


def node_body(index: int, images: int) -> dict[str, Any]:
    """One Node as a kubelet registers it and the gpuguard agent decorates it."""
    rng = random.Random(index)
    name = node_name(index)
    zone = synthetic.ZONES[index % len(synthetic.ZONES)]
    ip, dns = synthetic.ip_and_host(index)
    instance = f"i-{rng.getrandbits(68):017x}"
    since = _rfc3339(time.time() - 3600)
    beat = _rfc3339(time.time() - rng.uniform(0, 60))
    gpuguard_conditions = [
        (kind, "True", "Healthy", f"gpuguard: {layer} checks pass")
        for kind, layer in (
            (GPU_CONDITION, "gpu"),
            ("GpuguardNetworkHealthy", "network"),
            ("GpuguardKernelHealthy", "kernel"),
        )
    ]
    resources = synthetic.resources()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": synthetic.labels(index, zone, dns),
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "karpenter.k8s.aws/ec2nodeclass-hash": str(rng.getrandbits(60)),
                REPORT: healthy_report(time.time() - rng.uniform(0, 180)),
            },
        },
        "spec": {"providerID": f"aws:///{zone}/{instance}"},
        "status": {
            "capacity": resources,
            "allocatable": synthetic.allocatable(resources),
            "conditions": synthetic.conditions(
                [*synthetic.KUBELET_CONDITIONS, *gpuguard_conditions], heartbeat=beat, since=since
            ),
            "addresses": synthetic.addresses(ip, dns),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": synthetic.node_info(index, uuid_prefix="ec2"),
            "images": _images(rng, images),
        },
    }


def flip_report(action: str, code: str) -> str:
    gpu = {"status": "Unhealthy", "action": action, "codes": [code], "gpus": ["0000:91:00.0"]}
    ok = {"status": "Healthy", "action": "NONE", "codes": [], "gpus": []}
    layers = {"gpu": gpu, "network": ok, "kernel": ok}
    return json.dumps({"layers": layers, "reportedAt": _rfc3339(time.time())}, sort_keys=True)


def flip(api: KubeApi, name: str, *, code: str, action: str, reason: str) -> float:
    """Write what the agent writes when a GPU turns bad; the time the condition write
    returned (the latency's start). The report annotation follows, as from the agent."""
    now = _rfc3339(time.time())
    condition = {
        "type": GPU_CONDITION,
        "status": "False",
        "reason": reason,
        "message": f"gpuguard: {code}",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [condition]}}, "strategic")
    written = time.monotonic()
    api.patch(
        f"/api/v1/nodes/{name}",
        {"metadata": {"annotations": {REPORT: flip_report(action, code)}}},
    )
    return written


# --- plumbing -----------------------------------------------------------------------------
class Clients:
    """One API client per thread (each with its own connection pool)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._local = threading.local()
        self._all: list[KubeApi] = []
        self._lock = threading.Lock()

    def get(self) -> KubeApi:
        api = getattr(self._local, "api", None)
        if api is None:
            api = load_api(self.kubeconfig)
            self._local.api = api
            with self._lock:
                self._all.append(api)
        return api

    def close(self) -> None:
        for api in self._all:
            api.close()


def parallel(
    clients: Clients, threads: int, work: Callable[[KubeApi, Any], Any], items: Iterable[Any]
) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda item: work(clients.get(), item), items))


class Watch:
    """One raw ``watch`` stream; ``take(line, arrived)`` sees each line that contains
    ``needle`` (cheap pre-filter: most Node events are 12 KB of JSON we do not need)."""

    def __init__(
        self,
        plane: ControlPlane,
        path: str,
        needle: bytes,
        take: Callable[[dict[str, Any], float], None],
    ) -> None:
        self.plane, self.path, self.needle, self.take = plane, path, needle, take
        self.version = str(plane.request("GET", f"{path}?limit=1")["metadata"]["resourceVersion"])
        threading.Thread(target=self._run, name=f"watch {path}", daemon=True).start()

    def _run(self) -> None:
        context = self.plane.ssl_context()
        while True:
            url = (
                f"{self.plane.url}{self.path}?watch=1&resourceVersion={self.version}"
                "&allowWatchBookmarks=true&timeoutSeconds=1800"
            )
            try:
                with urllib.request.urlopen(url, context=context, timeout=None) as stream:
                    for raw in stream:
                        arrived = time.monotonic()
                        if self.needle in raw or b'"BOOKMARK"' in raw:
                            event = json.loads(raw)
                            meta = event["object"].get("metadata", {})
                            self.version = meta.get("resourceVersion", self.version)
                            if event["type"] != "BOOKMARK":
                                self.take(event, arrived)
            except OSError:
                time.sleep(0.1)


@dataclass
class FirstSeen:
    """The first arrival time of something per object name."""

    times: dict[str, float] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def mark(self, name: str, arrived: float) -> None:
        with self.changed:
            if name not in self.times:
                self.times[name] = arrived
                self.changed.notify_all()

    def wait_all(self, names: Iterable[str], timeout_s: float = WAIT_S) -> None:
        wanted = set(names)
        with self.changed:
            if not self.changed.wait_for(lambda: wanted <= self.times.keys(), timeout_s):
                missing = sorted(wanted - self.times.keys())
                raise TimeoutError(f"{len(missing)} not seen after {timeout_s}s: {missing[:5]}")


def is_tainted(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == TAINT.decode() for t in taints)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class CpuMeter:
    """CPU used by each process of the run over a window, as % of one core (2 cores: 200 %
    in all): who competes with whom on the shared machine."""

    def __init__(self, plane: ControlPlane, controller: ControllerProcess) -> None:
        self.pids = {
            "controller": controller.proc.pid,
            "kube-apiserver": plane._apiserver.pid if plane._apiserver else 0,
            "etcd": plane._etcd.pid if plane._etcd else 0,
            "benchmark": os.getpid(),
        }
        self.started = time.monotonic()
        self.used = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def percent(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        return {
            name: 100 * (cpu_seconds(pid) - self.used[name]) / elapsed
            for name, pid in self.pids.items()
        }


def describe_cpu(percent: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.0f} %" for name, value in percent.items())


@dataclass
class ControllerProcess:
    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            sys.exit(f"the controller exited with {self.proc.returncode}:\n{tail}")

    def scrape(self) -> dict[str, float]:
        """The controller's /metrics as {'name{labels}': value}."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2
            ) as answer:
                return answer.status == 200
        except OSError:
            return False

    def memory_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        values = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmRSS"], values["VmHWM"]

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_controller(plane: ControlPlane, workdir: Path, profile: Path | None) -> ControllerProcess:
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    argv = [
        "controller",
        f"--kubeconfig={plane.admin_kubeconfig}",
        f"--policy={policy}",
        f"--namespace={NAMESPACE}",
        "--identity=bench-controller",
        "--provider=delete-node",
        f"--metrics-port={port}",
    ]
    if profile is None:
        command = [str(GPUGUARD), *argv]
    else:  # cProfile follows the main thread: the reconcile loop
        command = [str(PYTHON), "-m", "cProfile", "-o", str(profile), "-m", "gpuguard.cli", *argv]
    log = workdir / "controller.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return ControllerProcess(proc, port, log)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (``statistics.quantiles`` inclusive)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not after {timeout_s}s")
        time.sleep(0.05)
    return time.monotonic() - started


# --- the benchmark ------------------------------------------------------------------------
@dataclass
class Results:
    nodes: int = 0
    node_bytes: int = 0
    setup_s: float = 0.0
    create_rate: float = 0.0
    ready_s: float = 0.0
    first_reconcile_s: float = 0.0
    reconcile_ms: float = 0.0  # mean over the idle window
    idle_reconciles: float = 0.0  # per second, over the idle window
    idle_cpu_pct: float = 0.0
    steady_rss: float = 0.0
    steady_hwm: float = 0.0
    single_ms: list[float] = field(default_factory=list)
    loaded_ms: list[float] = field(default_factory=list)
    heartbeat_rate: float = 0.0
    loaded_cpu: dict[str, float] = field(default_factory=dict)
    mass_cpu: dict[str, float] = field(default_factory=dict)
    drain_cpu: dict[str, float] = field(default_factory=dict)
    loaded_reconciles: float = 0.0  # per second
    mass_ms: list[float] = field(default_factory=list)
    mass_write_s: float = 0.0
    # With --audit, per flipped node (ms): from the flip's write completing in the API
    # server to the controller's taint request arriving there, and that request's own time.
    mass_to_taint_ms: list[float] = field(default_factory=list)
    mass_taint_ms: list[float] = field(default_factory=list)
    pods: int = 0
    drain_nodes: int = 0
    first_eviction_s: float = 0.0
    eviction_span_s: float = 0.0
    all_gone_s: float = 0.0
    metric_evictions: float = 0.0
    end_rss: float = 0.0
    end_hwm: float = 0.0


def run(args: argparse.Namespace, workdir: Path) -> Results:
    order = list(range(args.nodes))
    random.Random(1).shuffle(order)  # which nodes each phase flips, spread over the pools
    counts = (args.single, args.single * bool(args.heartbeats), args.flip, args.drain_nodes)
    if sum(counts) >= args.nodes:
        sys.exit(f"--nodes must exceed the {sum(counts)} nodes the phases flip")
    take = iter(order)
    singles, loaded, masses, drains = ([node_name(next(take)) for _ in range(n)] for n in counts)
    spares = [node_name(i) for i in take]  # never flipped: the heartbeats go to these
    plane = ControlPlane(workdir, testenv_bin(), audit=args.audit)
    plane.start()
    clients = Clients(plane.admin_kubeconfig)
    controller: ControllerProcess | None = None
    results = Results(nodes=args.nodes, pods=args.pods, drain_nodes=args.drain_nodes)
    try:
        api = clients.get()
        install_crds(api)
        for namespace in (NAMESPACE, POD_NAMESPACE):
            api.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
        create_fleet(args, plane, clients, results)

        tainted, evicted, gone = FirstSeen(), FirstSeen(), FirstSeen()

        def on_node(event: dict[str, Any], arrived: float) -> None:
            if is_tainted(event["object"]):
                tainted.mark(event["object"]["metadata"]["name"], arrived)

        def on_pod(event: dict[str, Any], arrived: float) -> None:
            name = event["object"]["metadata"]["name"]
            if event["type"] == "DELETED":
                gone.mark(name, arrived)
            if event["object"]["metadata"].get("deletionTimestamp"):
                evicted.mark(name, arrived)

        Watch(plane, "/api/v1/nodes", TAINT, on_node)
        Watch(plane, f"/api/v1/namespaces/{POD_NAMESPACE}/pods", b'"deletionTimestamp"', on_pod)

        controller = start_controller(plane, workdir, args.profile)
        settle(args, controller, results)

        print("single flips on a quiet fleet ...", flush=True)
        results.single_ms = single_flips(api, singles, tainted, controller)
        if loaded:
            print(f"single flips while {args.heartbeats:.0f} heartbeat writes/s ...", flush=True)
            meter, started, before = (
                CpuMeter(plane, controller),
                time.monotonic(),
                controller.scrape(),
            )
            with Heartbeats(clients, spares, args.heartbeats) as beats:
                results.loaded_ms = single_flips(api, loaded, tainted, controller)
            elapsed = time.monotonic() - started
            results.heartbeat_rate = beats.achieved
            results.loaded_cpu = meter.percent()
            results.loaded_reconciles = (
                controller.scrape()[RECONCILES] - before[RECONCILES]
            ) / elapsed
            print(
                f"  {results.loaded_reconciles:.1f} reconciles/s; CPU: "
                f"{describe_cpu(results.loaded_cpu)}",
                flush=True,
            )
        time.sleep(2)
        meter = CpuMeter(plane, controller)
        mass_flip(args, clients, masses, tainted, results)
        results.mass_cpu = meter.percent()
        print(f"  CPU: {describe_cpu(results.mass_cpu)}", flush=True)
        if plane.audit_log is not None:
            split_by_audit(AuditLog(plane.audit_log), masses, results)
        if args.pods and drains:
            drain_phase(args, plane, clients, controller, drains, evicted, gone, results)

        results.end_rss, results.end_hwm = controller.memory_mib()
        controller.check_alive()
        return results
    finally:
        if controller is not None:
            controller.stop()
        clients.close()
        plane.stop()


def create_fleet(
    args: argparse.Namespace, plane: ControlPlane, clients: Clients, results: Results
) -> None:
    print(f"creating {args.nodes} nodes with {args.threads} writers ...", flush=True)
    started = time.monotonic()
    parallel(
        clients,
        args.threads,
        lambda api, i: api.create("/api/v1/nodes", node_body(i, args.images)),
        range(args.nodes),
    )
    results.setup_s = time.monotonic() - started
    results.create_rate = args.nodes / results.setup_s
    served = plane.request("GET", f"/api/v1/nodes/{node_name(0)}")
    results.node_bytes = len(json.dumps(served, separators=(",", ":")))
    print(
        f"  {results.setup_s:.1f} s ({results.create_rate:.0f} nodes/s), "
        f"{results.node_bytes / 1024:.1f} KiB per Node as served",
        flush=True,
    )


def settle(args: argparse.Namespace, controller: ControllerProcess, results: Results) -> None:
    """Start-up times, then the idle cost of the whole fleet: CPU, reconcile, memory."""
    started = time.monotonic()
    results.ready_s = wait_until(
        lambda: controller.check_alive() or controller.ready(), 300, "controller ready"
    )
    wait_until(lambda: controller.scrape().get(RECONCILES, 0) > 0, 300, "first reconcile")
    results.first_reconcile_s = time.monotonic() - started
    print(
        f"controller: ready (Node cache filled) {results.ready_s:.1f} s, first reconcile "
        f"done {results.first_reconcile_s:.1f} s after start",
        flush=True,
    )
    time.sleep(args.settle_s)
    before = controller.scrape()
    cpu0, quiet0 = controller.cpu_seconds(), time.monotonic()
    time.sleep(args.quiet_s)
    after = controller.scrape()
    quiet = time.monotonic() - quiet0
    results.idle_cpu_pct = 100 * (controller.cpu_seconds() - cpu0) / quiet
    reconciles = after[RECONCILES] - before[RECONCILES]
    spent = after[RECONCILE_SECONDS] - before[RECONCILE_SECONDS]
    results.reconcile_ms = 1000 * spent / max(reconciles, 1)
    results.idle_reconciles = reconciles / quiet
    results.steady_rss, results.steady_hwm = controller.memory_mib()
    print(
        f"  steady: RSS {results.steady_rss:.1f} MiB (peak {results.steady_hwm:.1f}), idle CPU "
        f"{results.idle_cpu_pct:.2f} %, {reconciles:.0f} reconciles in {quiet:.0f} s, "
        f"{results.reconcile_ms:.1f} ms each",
        flush=True,
    )


def single_flips(
    api: KubeApi, names: list[str], tainted: FirstSeen, controller: ControllerProcess
) -> list[float]:
    """Flip one node, wait for its taint, pause, next: latencies in ms."""
    rng = random.Random(len(names))
    latencies: list[float] = []
    for i, name in enumerate(names):
        time.sleep(rng.uniform(0.2, 0.7))  # out of step with whatever the controller does
        written = flip(api, name, code="XID_48", action="RESET_GPU", reason="Xid48")
        tainted.wait_all([name], 30)
        latencies.append(1000 * (tainted.times[name] - written))
        controller.check_alive()
        if (i + 1) % 10 == 0 or i + 1 == len(names):
            print(f"  {i + 1}/{len(names)}: last {latencies[-1]:.0f} ms", flush=True)
    return latencies


def mass_flip(
    args: argparse.Namespace,
    clients: Clients,
    names: list[str],
    tainted: FirstSeen,
    results: Results,
) -> None:
    print(f"flipping {len(names)} nodes at once ...", flush=True)
    started = time.monotonic()
    written = parallel(
        clients,
        args.threads,
        lambda api, name: flip(api, name, code="XID_48", action="RESET_GPU", reason="Xid48"),
        names,
    )
    written_at = dict(zip(names, written, strict=True))
    results.mass_write_s = max(written) - started
    tainted.wait_all(names)
    results.mass_ms = [1000 * (tainted.times[n] - written_at[n]) for n in names]
    print(
        f"  written in {results.mass_write_s:.2f} s; all tainted "
        f"{max(tainted.times[n] for n in names) - started:.2f} s after the first write",
        flush=True,
    )


def split_by_audit(audit: AuditLog, names: list[str], results: Results) -> None:
    """Where a mass flip's latency went, from the API server's own clock: the flip's
    condition write completing, the first write carrying our taint arriving, and done."""
    flips: dict[str, float] = {}
    taints: dict[str, tuple[float, float]] = {}
    for write in audit.writes(resource="nodes"):
        if write.name not in names or not write.succeeded:
            continue
        if write.subresource == "status" and "Xid48" in json.dumps(write.body):
            flips.setdefault(write.name, write.completed)
        elif not write.subresource and TAINT.decode() in json.dumps(write.body):
            taints.setdefault(write.name, (write.received, write.completed))
    both = [n for n in names if n in flips and n in taints]
    results.mass_to_taint_ms = [1000 * (taints[n][0] - flips[n]) for n in both]
    results.mass_taint_ms = [1000 * (taints[n][1] - taints[n][0]) for n in both]
    print(f"  audit: {len(both)} of {len(names)} flips and taints found", flush=True)


class Heartbeats:
    """What a fleet's agents write while nothing is wrong: each node rewrites its
    conditions and its report every ``heartbeat_interval_s`` (180 s by default), so a
    fleet of N nodes makes about 2 N / 180 Node writes a second. Written here at ``rate``
    (both writes of a node's heartbeat, one after the other), the nodes taken in turn, so
    that each is heard again within N / (rate / 2) s even when the writers fall behind
    (a node chosen at random could wait past ``agent_timeout_s`` and go silent)."""

    def __init__(
        self,
        clients: Clients,
        names: list[str],
        rate: float,
        busy: Collection[str] = (),
        writers: int = 4,
    ) -> None:
        self.clients, self.names, self.rate = clients, names, rate
        self.busy = busy  # nodes whose agent is reporting a fault just now: skipped
        self.stop = threading.Event()
        self.written = [0] * writers  # per thread
        self.achieved = 0.0
        self._threads = [
            threading.Thread(target=self._run, args=(k, writers), daemon=True)
            for k in range(writers)
        ]

    def __enter__(self) -> Heartbeats:
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(10)
        self.achieved = sum(self.written) / (time.monotonic() - self._started)

    def _run(self, k: int, of: int) -> None:
        api = self.clients.get()
        period = 2 * of / self.rate
        due = time.monotonic() + k * period / of
        for name in itertools.cycle(self.names[k::of]):
            if self.stop.wait(max(0.0, due - time.monotonic())):
                return
            due += period
            if name in self.busy:
                continue
            now = _rfc3339(time.time())
            condition = {"type": GPU_CONDITION, "status": "True", "lastHeartbeatTime": now}
            body = {"status": {"conditions": [condition]}}
            api.patch(f"/api/v1/nodes/{name}/status", body, "strategic")
            report = healthy_report(time.time())
            api.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {REPORT: report}}})
            self.written[k] += 2


def pod_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "train", "batch.kubernetes.io/job-name": name.rsplit("-", 1)[0]},
        },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "main",
                    "image": f"{OURS}/train:2024-08-29",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def set_running(api: KubeApi, pod: dict[str, Any]) -> None:
    now = _rfc3339(time.time())
    status = {
        "phase": "Running",
        "startTime": now,
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "",
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
        ],
    }
    name = pod["metadata"]["name"]
    api.patch(f"/api/v1/namespaces/{POD_NAMESPACE}/pods/{name}/status", {"status": status})


def drain_phase(
    args: argparse.Namespace,
    plane: ControlPlane,
    clients: Clients,
    controller: ControllerProcess,
    drains: list[str],
    evicted: FirstSeen,
    gone: FirstSeen,
    results: Results,
) -> None:
    collection = f"/api/v1/namespaces/{POD_NAMESPACE}/pods"
    pods = [(f"train-{i:05d}-0", drains[i % len(drains)]) for i in range(args.pods)]
    print(f"creating {len(pods)} Running pods on {len(drains)} nodes ...", flush=True)

    def create_running(api: KubeApi, item: tuple[str, str]) -> None:
        set_running(api, api.create(collection, pod_body(*item)))

    parallel(clients, args.threads, create_running, pods)
    kubelet = load_api(plane.admin_kubeconfig)
    stop = threading.Event()
    threading.Thread(
        target=finish_terminating_pods, args=(kubelet, POD_NAMESPACE, stop), daemon=True
    ).start()
    evictions0 = controller.scrape().get(EVICTED, 0)
    time.sleep(2)
    print(f"flipping {len(drains)} nodes to XID_79 / REBOOT ...", flush=True)
    meter = CpuMeter(plane, controller)
    started = time.monotonic()
    parallel(
        clients,
        args.threads,
        lambda api, name: flip(api, name, code="XID_79", action="REBOOT", reason="Xid79"),
        drains,
    )
    names = [name for name, _ in pods]
    try:
        evicted.wait_all(names, WAIT_S)
        gone.wait_all(names, WAIT_S)
    finally:
        stop.set()
        kubelet.close()
    times = sorted(evicted.times[n] for n in names)
    results.first_eviction_s = times[0] - started
    results.eviction_span_s = times[-1] - times[0]
    results.all_gone_s = max(gone.times[n] for n in names) - started
    results.drain_cpu = meter.percent()
    evictions = controller.scrape().get(EVICTED, 0)
    results.metric_evictions = evictions - evictions0
    print(
        f"  first eviction {results.first_eviction_s:.2f} s after the flips began, last "
        f"{results.eviction_span_s:.2f} s later; all pods gone after {results.all_gone_s:.2f} s",
        flush=True,
    )


def report(args: argparse.Namespace, results: Results) -> None:
    print()
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cores, "
        f"gpuguard {importlib.metadata.version('gpuguard')}, control plane {testenv_bin().name}"
    )
    print(
        f"fleet: {results.nodes} nodes, {results.node_bytes / 1024:.1f} KiB each as served; "
        f"created in {results.setup_s:.1f} s ({results.create_rate:.0f}/s, "
        f"{args.threads} writers)"
    )
    print(
        f"controller start: ready {results.ready_s:.1f} s, first reconcile "
        f"{results.first_reconcile_s:.1f} s; idle: {results.idle_reconciles:.2f} reconciles/s "
        f"of {results.reconcile_ms:.1f} ms, CPU {results.idle_cpu_pct:.2f} % of a core"
    )
    print()
    print(f"{'measurement':<44}{'p50':>9}{'p99':>9}{'max':>9}{'goal':>22}")
    goal = "p50<25 p99<250 ms"
    for label, values in (
        (f"quarantine, single flips, quiet (n={len(results.single_ms)})", results.single_ms),
        (f"  same, {results.heartbeat_rate:.0f} heartbeat writes/s", results.loaded_ms),
        (f"quarantine, {len(results.mass_ms)} at once", results.mass_ms),
        ("  flip written -> taint request arrives", results.mass_to_taint_ms),
        ("  taint request handled", results.mass_taint_ms),
    ):
        if values:
            print(
                f"{label:<44}{statistics.median(values):>7.0f}ms{quantile(values, 0.99):>7.0f}ms"
                f"{max(values):>7.0f}ms{goal:>22}"
            )
    if results.loaded_ms:
        print(
            f"  (heartbeats: {results.loaded_reconciles:.1f} reconciles/s; CPU "
            f"{describe_cpu(results.loaded_cpu)})"
        )
    if results.mass_ms:
        print(
            f"  ({len(results.mass_ms)} flips written in {results.mass_write_s:.2f} s; CPU "
            f"{describe_cpu(results.mass_cpu)})"
        )
    if results.eviction_span_s:
        rate = (results.pods - 1) / results.eviction_span_s
        label = f"evictions/s ({results.pods} pods on {results.drain_nodes} nodes)"
        print(f"{label:<44}{rate:>9.1f}{'':>18}{'>= 50/s':>22}")
        print(
            f"  first eviction {results.first_eviction_s:.2f} s after the flips began, "
            f"last {results.eviction_span_s:.2f} s after the first; all gone "
            f"{results.all_gone_s:.2f} s; controller counted {results.metric_evictions:.0f}"
        )
        print(f"  (CPU {describe_cpu(results.drain_cpu)})")
    print(
        f"{'controller RSS, steady / end (MiB)':<44}{results.steady_rss:>9.1f}"
        f"{results.end_rss:>9.1f}{'':>9}{'< 300 MB':>22}"
    )
    print(
        f"{'controller peak RSS, VmHWM (MiB)':<44}{results.steady_hwm:>9.1f}"
        f"{results.end_hwm:>9.1f}{'':>9}{'< 300 MB':>22}"
    )


def print_profile(path: Path, lines: int) -> None:
    print(f"\ncProfile of the controller's main thread (the reconcile loop), top {lines}:")
    stats = pstats.Stats(str(path))
    stats.sort_stats("cumulative").print_stats(r"gpuguard/(controller|kube|remediation)", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--single", type=int, default=50, help="single flips, one at a time")
    parser.add_argument("--flip", type=int, default=300, help="nodes flipped at once")
    parser.add_argument("--pods", type=int, default=500, help="pods to drain (0: no drain)")
    parser.add_argument("--drain-nodes", type=int, default=100, help="nodes the pods run on")
    parser.add_argument(
        "--heartbeats",
        type=float,
        help="Node writes/s during a second series of single flips (default: 2 x nodes / 180, "
        "what the agents' 180 s heartbeat writes; 0: no such series)",
    )
    parser.add_argument("--images", type=int, default=40, help="container images per Node")
    parser.add_argument("--threads", type=int, default=16, help="benchmark writer threads")
    parser.add_argument("--settle-s", type=float, default=5.0, help="after start-up")
    parser.add_argument("--quiet-s", type=float, default=20.0, help="idle CPU window")
    parser.add_argument("--profile", type=Path, help="run the controller under cProfile")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument(
        "--audit",
        action="store_true",
        help="run kube-apiserver with an audit log of writes and split the mass flip's "
        "latency by it (adds load on the API server)",
    )
    args = parser.parse_args()
    if args.heartbeats is None:
        args.heartbeats = 2 * args.nodes / 180
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-controller-scale-"))
    started = time.monotonic()
    try:
        results = run(args, workdir)
        report(args, results)
        if args.profile is not None:
            print_profile(args.profile, 30)
        print(f"\nwhole run: {time.monotonic() - started:.0f} s")
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
