"""The parts of a synthetic GPU Node that bench/controller_scale.py and
bench/node_list_decode.py build alike: a p5.48xlarge's capacity, the kubelet's conditions,
the labels a kubelet, Karpenter and NVIDIA's feature discovery leave, and the hashes that
stand for digests and UUIDs. Each benchmark keeps what it builds differently (images,
managedFields, annotations, its clock).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

INSTANCE_TYPE = "p5.48xlarge"
POOL_LABEL = "karpenter.sh/nodepool"
POOLS = 10
ZONES = ("us-west-2a", "us-west-2b", "us-west-2c")
# (type, status, reason, message): what a healthy kubelet reports.
KUBELET_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)  # fmt: skip


def digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def uuid(*parts: object, prefix: str = "") -> str:
    """A UUID-shaped hash of ``parts`` (EC2's system UUIDs start with ``prefix`` "ec2")."""
    hexa = prefix + digest(*parts)[: 32 - len(prefix)]
    return f"{hexa[:8]}-{hexa[8:12]}-{hexa[12:16]}-{hexa[16:20]}-{hexa[20:]}"


def node_info(index: int, *, uuid_prefix: str = "") -> dict[str, str]:
    """An EKS node's ``status.nodeInfo`` (the system UUID optionally EC2-style)."""
    return {
        "machineID": digest("machine", index)[:32],
        "systemUUID": uuid("system", index, prefix=uuid_prefix),
        "bootID": uuid("boot", index),
        "kernelVersion": "5.10.223-212.873.amzn2.x86_64",
        "osImage": "Amazon Linux 2",
        "containerRuntimeVersion": "containerd://1.7.20",
        "kubeletVersion": "v1.30.2-eks-1552ad0",
        "kubeProxyVersion": "v1.30.2-eks-1552ad0",
        "operatingSystem": "linux",
        "architecture": "amd64",
    }


def ip_and_host(index: int) -> tuple[str, str]:
    """The node's private IP (from its index) and the EC2 host name made of it."""
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    return ip, f"ip-{ip.replace('.', '-')}.us-west-2.compute.internal"


def addresses(ip: str, host: str) -> list[dict[str, str]]:
    """``status.addresses``."""
    return [
        {"type": "InternalIP", "address": ip},
        {"type": "InternalDNS", "address": host},
        {"type": "Hostname", "address": host},
    ]


def resources() -> dict[str, str]:
    """A p5.48xlarge's ``status.capacity``: 8 GPUs, 32 EFA interfaces."""
    return {
        "cpu": "192",
        "memory": "2097152000Ki",
        "pods": "737",
        "ephemeral-storage": "30408000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }


def allocatable(capacity: Mapping[str, str]) -> dict[str, str]:
    """``status.allocatable``: the capacity less what the kubelet reserves."""
    return {**capacity, "cpu": "191450m", "memory": "2061234176Ki"}


def conditions(
    rows: Iterable[tuple[str, str, str, str]], *, heartbeat: str, since: str
) -> list[dict[str, str]]:
    """``status.conditions`` from (type, status, reason, message) rows."""
    return [
        {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": since,
            "reason": reason,
            "message": message,
        }
        for kind, status, reason, message in rows
    ]


def labels(
    index: int, zone: str, host: str, topology: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Node's labels, in the order a real one lists them; ``topology`` (EC2's network
    node layers, say) goes after the zone id."""
    return {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": INSTANCE_TYPE,
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "us-west-2",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": host,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": INSTANCE_TYPE,
        "topology.kubernetes.io/region": "us-west-2",
        "topology.kubernetes.io/zone": zone,
        "topology.k8s.aws/zone-id": f"usw2-az{index % 3 + 1}",
        **(topology or {}),
        "karpenter.sh/capacity-type": "reserved",
        "karpenter.sh/initialized": "true",
        "karpenter.sh/registered": "true",
        POOL_LABEL: f"pool-{index % POOLS:02d}",
        "karpenter.k8s.aws/instance-gpu-count": "8",
        "karpenter.k8s.aws/instance-gpu-name": "h100",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/cuda.driver.major": "550",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
