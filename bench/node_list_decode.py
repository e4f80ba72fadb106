"""Decoding a 5,000-Node list: ``json.loads``, lightkube's typed models, gpuguard's slim decoder.

The controller lists every Node at start-up and after each lost watch, so the decode of that
list is the largest CPU and memory cost it has. A synthetic list stands for a real GPU
fleet's: each Node carries ~40 container images (digest and tag names, sizes), managedFields
from the kubelet, the node controller, Karpenter and the gpuguard agent, 25 labels, the
kubelet's four conditions and gpuguard's three, capacity, addresses and nodeInfo. The Nodes
are generated from their index alone (fixed clock, seeded random), so every run decodes the
same bytes. They are served as the API server would with ``limit=500``: 10 pages, each page's
JSON built once before anything is timed.

Decoders, each keeping every item of every page, as a Node cache would:

- ``json.loads``: plain dicts of the whole object (the untyped client's path);
- lightkube: ``lightkube.core.decoders.decode_list(page, Node)``, what lightkube 1.x's
  ``Client.list`` runs on each page; its models are msgspec Structs;
- gpuguard: ``kube.fleet.list_nodes``, the controller's call, fed the same pages through a
  stand-in for ``KubeApi.list`` that hands each page to the decoder ``list_nodes`` chose
  (msgspec into the slim shape, skipped fields never become objects, then plain dicts).

Each decoder runs in a fresh interpreter: best of 3 wall times with tracing off, then one more
run under ``tracemalloc`` for the peak of Python allocations during the decode (the pages'
bytes excluded) and what stays held afterwards. The parent checks that gpuguard's result is
``slim_node`` of the ``json.loads`` result and that lightkube decoded every Node.

Run: ``.venv/bin/python bench/node_list_decode.py [--nodes N]``. Results go in
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import synthetic_nodes as synthetic

NODES = 5000
PAGE_SIZE = 500  # what the controller asks for (kube.rest.LIST_PAGE_SIZE)
REPEATS = 3
DECODERS = ("json.loads", "lightkube", "gpuguard")
EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: a fixed "now" keeps the bytes identical

REGISTRIES = (
    "nvcr.io/nvidia",
    "nvcr.io/nvidia/k8s",
    "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks",
    "public.ecr.aws/eks",
    "registry.k8s.io/sig-storage",
    "quay.io/prometheus",
    "docker.io/library",
    "ghcr.io/huggingface",
    "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml",
)
REPOSITORIES = (
    "pytorch", "nemo", "tritonserver", "cuda", "dcgm-exporter", "k8s-device-plugin",
    "gpu-operator", "gpu-feature-discovery", "k8s-driver-manager", "container-toolkit",
    "driver", "aws-efa-k8s-device-plugin", "amazon-k8s-cni", "amazon-k8s-cni-init",
    "aws-network-policy-agent", "kube-proxy", "pause", "coredns", "aws-ebs-csi-driver",
    "csi-node-driver-registrar", "livenessprobe", "node-feature-discovery", "node-exporter",
    "cilium", "fluent-bit", "promtail", "datadog-agent", "gpuguard", "python", "busybox",
    "ray-ml", "vllm-openai", "text-generation-inference", "llm-foundry", "train", "eval",
    "data-loader", "nccl-tests", "mpi-operator", "kube-state-metrics", "karpenter",
    "nvidia-mig-manager", "aws-node-termination-handler", "efa-installer",
)  # fmt: skip
GPUGUARD_CONDITIONS = (
    ("GpuguardGPUHealthy", "True", "Healthy", "checked by dcgm, nvml, nvidia-smi"),
    ("GpuguardNetworkHealthy", "True", "Healthy", "checked by network, ibstat"),
    ("GpuguardKernelHealthy", "True", "Healthy", "checked by kernel-log"),
)


# --- the synthetic fleet ------------------------------------------------------------------


def _time(offset_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH + offset_s))


def _images(rng: random.Random, count: int = 40) -> list[dict[str, Any]]:
    images = []
    for repo in rng.sample(REPOSITORIES, count):
        name = f"{rng.choice(REGISTRIES)}/{repo}"
        tag = f"v{rng.randint(0, 3)}.{rng.randint(0, 40)}.{rng.randint(0, 9)}-ubuntu22.04"
        images.append(
            {
                "names": [f"{name}@sha256:{synthetic.digest(name, tag)}", f"{name}:{tag}"],
                "sizeBytes": rng.randint(300_000, 18_000_000_000),
            }
        )
    images.sort(key=lambda image: -image["sizeBytes"])  # the kubelet lists the biggest first
    return images


def _topology(index: int) -> dict[str, str]:
    """EC2's network node layers: 16 nodes share a layer-3 switch, 64 a layer-2, 256 a
    layer-1."""
    spans = ((1, 256), (2, 64), (3, 16))
    return {
        f"topology.k8s.aws/network-node-layer-{layer}": "nn-"
        + synthetic.digest(f"l{layer}", index // span)[:17]
        for layer, span in spans
    }


def _fields(*paths: str) -> dict[str, Any]:
    """A managedFields ``fieldsV1`` tree: ``"f:metadata|f:labels|f:x"`` → nested dicts."""
    tree: dict[str, Any] = {}
    for path in paths:
        branch = tree
        for part in path.split("|"):
            branch = branch.setdefault(part, {})
    return tree


def _managed_fields(labels: dict[str, str]) -> list[dict[str, Any]]:
    def entry(manager: str, operation: str, fields: dict[str, Any], sub: str = "") -> Any:
        item = {
            "manager": manager,
            "operation": operation,
            "apiVersion": "v1",
            "time": _time(-3600),
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        }
        return {**item, "subresource": sub} if sub else item

    status = [
        f"f:status|f:conditions|k:{{\"type\":\"{kind}\"}}|{field}"
        for kind, *_ in synthetic.KUBELET_CONDITIONS
        for field in (".", "f:lastHeartbeatTime", "f:lastTransitionTime", "f:message",
                      "f:reason", "f:status", "f:type")
    ]  # fmt: skip
    addresses = [
        f'f:status|f:addresses|k:{{"type":"{kind}"}}|{field}'
        for kind in ("InternalIP", "InternalDNS", "Hostname")
        for field in (".", "f:address", "f:type")
    ]
    resources = [
        f"f:status|f:{side}|f:{name}"
        for side in ("allocatable", "capacity")
        for name in ("cpu", "memory", "pods", "ephemeral-storage", "nvidia.com/gpu",
                     "vpc.amazonaws.com/efa", "hugepages-1Gi", "hugepages-2Mi")
    ]  # fmt: skip
    agent = [
        f"f:status|f:conditions|k:{{\"type\":\"{kind}\"}}|{field}"
        for kind, *_ in GPUGUARD_CONDITIONS
        for field in (".", "f:lastHeartbeatTime", "f:lastTransitionTime", "f:message",
                      "f:reason", "f:status", "f:type")
    ]  # fmt: skip
    return [
        entry(
            "kubelet",
            "Update",
            _fields(
                "f:metadata|f:annotations|.",
                "f:metadata|f:annotations|f:alpha.kubernetes.io/provided-node-ip",
                "f:metadata|f:annotations|f:volumes.kubernetes.io/controller-managed-attach-detach",
                *(f"f:metadata|f:labels|f:{key}" for key in list(labels)[:11]),
                "f:spec|f:providerID",
            ),
        ),
        entry(
            "kubelet",
            "Update",
            _fields(
                *status,
                *addresses,
                *resources,
                "f:status|f:daemonEndpoints|f:kubeletEndpoint|f:Port",
                "f:status|f:images",
                "f:status|f:nodeInfo|f:bootID",
                "f:status|f:nodeInfo|f:containerRuntimeVersion",
                "f:status|f:nodeInfo|f:kernelVersion",
                "f:status|f:nodeInfo|f:kubeletVersion",
                "f:status|f:nodeInfo|f:machineID",
                "f:status|f:nodeInfo|f:osImage",
                "f:status|f:nodeInfo|f:systemUUID",
            ),
            "status",
        ),
        entry(
            "kube-controller-manager",
            "Update",
            _fields("f:metadata|f:annotations|f:node.alpha.kubernetes.io/ttl", "f:spec|f:podCIDR"),
        ),
        entry(
            "karpenter",
            "Update",
            _fields(
                "f:metadata|f:annotations|f:karpenter.k8s.aws/ec2nodeclass-hash",
                *(f"f:metadata|f:labels|f:{key}" for key in list(labels)[11:]),
                "f:metadata|f:ownerReferences|.",
                "f:metadata|f:finalizers|.",
            ),
        ),
        entry(
            "gpuguard-agent",
            "Update",
            _fields("f:metadata|f:annotations|f:gpuguard.io/report", *agent),
            "status",
        ),
    ]


def node(index: int) -> dict[str, Any]:
    """One Node as a kubelet registers it, Karpenter owns it and the gpuguard agent reports."""
    rng = random.Random(index)
    name = f"gpu-{index:05d}"
    zone = synthetic.ZONES[index % len(synthetic.ZONES)]
    ip, host = synthetic.ip_and_host(index)
    labels = synthetic.labels(index, zone, host, _topology(index))
    pool = labels[synthetic.POOL_LABEL]
    beat = _time(-rng.uniform(0, 60))
    layer = {"status": "Healthy", "action": "NONE", "codes": [], "gpus": []}
    report = {"layers": dict.fromkeys(("gpu", "network", "kernel"), layer), "reportedAt": beat}
    resources = synthetic.resources()
    conditions = synthetic.conditions(
        (*synthetic.KUBELET_CONDITIONS, *GPUGUARD_CONDITIONS), heartbeat=beat, since=_time(-86400)
    )
    spec: dict[str, Any] = {
        "podCIDR": f"100.64.{index % 256}.0/24",
        "podCIDRs": [f"100.64.{index % 256}.0/24"],
        "providerID": f"aws:///{zone}/i-{rng.getrandbits(68):017x}",
    }
    if index % 50 == 0:  # a few nodes carry someone's taint
        spec["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    return {
        "metadata": {
            "name": name,
            "uid": synthetic.uuid("uid", index),
            "resourceVersion": str(1_000_000 + index * 7),
            "creationTimestamp": _time(-86400 * rng.randint(1, 90)),
            "labels": labels,
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "karpenter.k8s.aws/ec2nodeclass-hash": str(rng.getrandbits(60)),
                "gpuguard.io/report": json.dumps(report, sort_keys=True),
            },
            "finalizers": ["karpenter.sh/termination"],
            "ownerReferences": [
                {
                    "apiVersion": "karpenter.sh/v1",
                    "kind": "NodeClaim",
                    "name": f"{pool}-{synthetic.digest('claim', index)[:5]}",
                    "uid": synthetic.uuid("claim", index),
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": _managed_fields(labels),
        },
        "spec": spec,
        "status": {
            "capacity": resources,
            "allocatable": synthetic.allocatable(resources),
            "conditions": conditions,
            "addresses": synthetic.addresses(ip, host),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": synthetic.node_info(index),
            "images": _images(rng),
        },
    }


def pages(nodes: int) -> list[bytes]:
    """The list as ``limit=500`` pages, each with the metadata the API server sends."""
    out = []
    for start in range(0, nodes, PAGE_SIZE):
        last = start + PAGE_SIZE >= nodes
        metadata = {"resourceVersion": "2000000"} | ({} if last else {"continue": f"c{start}"})
        indexes = range(start, min(start + PAGE_SIZE, nodes))
        items = [{"kind": "Node", "apiVersion": "v1", **node(i)} for i in indexes]
        body = {"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": items}
        out.append(json.dumps(body, separators=(",", ":")).encode())
    return out


# --- the decoders -------------------------------------------------------------------------


class PagesApi:
    """Stands in for ``KubeApi.list``: each page's bytes through the caller's decoder."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies

    def list(self, path: str, *, label_selector: str = "", decode_page: Any = None) -> Any:
        from gpuguard.kube.rest import Listing

        items: list[Any] = []
        metadata: dict[str, Any] = {}
        for body in self.bodies:
            page = decode_page(body) if decode_page else json.loads(body)
            items.extend(page["items"])
            metadata = page["metadata"]
        return Listing(items, str(metadata.get("resourceVersion", "")))


def decoder(name: str) -> Callable[[list[bytes]], list[Any]]:
    if name == "json.loads":
        return lambda bodies: [item for body in bodies for item in json.loads(body)["items"]]
    if name == "lightkube":
        from lightkube.core.decoders import decode_list
        from lightkube.resources.core_v1 import Node

        return lambda bodies: [item for body in bodies for item in decode_list(body, Node)[2]]
    if name == "gpuguard":
        from gpuguard.kube.fleet import list_nodes

        return lambda bodies: list_nodes(PagesApi(bodies)).items
    raise ValueError(name)


def child(name: str, folder: Path) -> None:
    """One decoder in this fresh interpreter; prints one JSON line of figures."""
    bodies = [path.read_bytes() for path in sorted(folder.glob("page-*.json"))]
    decode = decoder(name)
    decode(bodies[:1])  # first-call costs (lightkube builds its list model) out of the timing
    times = []
    for _ in range(REPEATS):
        gc.collect()
        began = time.perf_counter()
        items = decode(bodies)
        times.append(time.perf_counter() - began)
        count = len(items)
        del items
    gc.collect()
    tracemalloc.start()
    items = decode(bodies)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(items) == count
    print(json.dumps({"best_s": min(times), "peak": peak, "held": held, "count": count}))


# --- the run ------------------------------------------------------------------------------


def check_equivalence(first: bytes) -> None:
    from gpuguard.kube.fleet import slim_node

    expected = [slim_node(item) for item in json.loads(first)["items"]]
    assert decoder("gpuguard")([first]) == expected, "slim decoder differs from slim_node"
    typed = decoder("lightkube")([first])
    assert [n.metadata.name for n in typed] == [n["metadata"]["name"] for n in expected]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--child", choices=DECODERS, help=argparse.SUPPRESS)
    parser.add_argument("--pages", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pages)
        return
    with tempfile.TemporaryDirectory(prefix="node-list-") as tmp:
        folder = Path(tmp)
        began = time.perf_counter()
        bodies = pages(args.nodes)
        for number, body in enumerate(bodies):
            (folder / f"page-{number:03d}.json").write_bytes(body)
        size = sum(map(len, bodies))
        print(
            f"{args.nodes} Nodes, {len(bodies)} pages, {size / 1e6:.1f} MB of JSON "
            f"({size / args.nodes / 1024:.1f} KiB a Node; built in "
            f"{time.perf_counter() - began:.1f} s)"
        )
        check_equivalence(bodies[0])
        del bodies
        results = {}
        for name in DECODERS:
            command = [sys.executable, __file__, "--child", name, "--pages", str(folder)]
            answer = subprocess.run(command, check=True, capture_output=True, text=True)
            results[name] = json.loads(answer.stdout.strip().splitlines()[-1])
            assert results[name]["count"] == args.nodes, (name, results[name]["count"])
    ours = results["gpuguard"]
    packages = ("lightkube", "lightkube-models", "msgspec")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in packages)
    print(f"Python {platform.python_version()}, {versions}")
    print(f"best of {REPEATS}, one fresh interpreter per decoder; memory from tracemalloc\n")
    print("| decoder | seconds | time vs gpuguard | peak MiB | peak vs gpuguard | held MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in DECODERS:
        r = results[name]
        print(
            f"| {name} | {r['best_s']:.3f} | {r['best_s'] / ours['best_s']:.1f}x "
            f"| {r['peak'] / 2**20:.0f} | {r['peak'] / ours['peak']:.1f}x "
            f"| {r['held'] / 2**20:.0f} |"
        )


if __name__ == "__main__":
    main()
