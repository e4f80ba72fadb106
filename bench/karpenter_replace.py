"""A GPU node's fatal fault, replaced through the real Karpenter: gpuguard's REPLACE beside
Karpenter's own node repair acting alone on the same fault, in one run.

Everything but the machines is real: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK and Karpenter v1.14.1 with its KWOK provider and the AWS provider's
repair policies (``hack/karpenter``; ``tests/support/karpenter.py``), a GPU NodePool, and
the training Job of examples/jobs/job.yaml. Each scenario gets a fresh Job on a node
Karpenter launched for it, then a fault at t = 0:

- ``gpuguard``: the agent's report says Xid 79 (``GpuguardGPUHealthy=False``), and
  gpuguard's controller (only REPLACE left on its ladder) quarantines, drains the node
  through the eviction API and deletes its NodeClaim;
- ``karpenter-repair``: no gpuguard; the node's ``AcceleratedHardwareReady`` turns False
  (what the EKS node monitoring agent, or gpuguard's ``eks`` profile, writes), and
  Karpenter's node repair deletes the NodeClaim after its toleration (``--toleration``,
  default 30 s here; the AWS provider ships 10 min) and force-terminates the node.

Measured from t = 0: a replacement Node (one not there at t = 0) Ready, the Job's pod
running again on another node, and the old Node gone. Run:
``.venv/bin/python bench/karpenter_replace.py [--toleration 30s]``. Results:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from gpuguard.kube.rest import KubeApi, load_api  # noqa: E402
from tests.support.cluster import set_health, stamp, wait_for  # noqa: E402
from tests.support.controllers import Running, new_controller, only_rung  # noqa: E402
from tests.support.controlplane import ControlPlane, testenv_bin  # noqa: E402
from tests.support.jobsystem import create_job, running_pod, training_job  # noqa: E402
from tests.support.karpenter import KarpenterCluster, node_gone  # noqa: E402

NAMESPACE = "train"


def scenario(api: KubeApi, name: str) -> dict[str, float]:
    job = create_job(api, NAMESPACE, training_job())
    first = wait_for(lambda: running_pod(api, NAMESPACE, job), 120, f"{name}: the first pod")
    node = str(first["spec"]["nodeName"])
    set_health(api, node)
    running = None
    before = {n["metadata"]["name"] for n in api.list("/api/v1/nodes").items}
    if name == "gpuguard":
        attempts = only_rung("REPLACE")
        running = Running(new_controller(api, "gpuguard", "karpenter", max_attempts=attempts).run)
    start = time.monotonic()
    if name == "gpuguard":
        set_health(api, node, gpu="False", action="REBOOT", codes=("XID_79",))
    else:
        condition = {
            "type": "AcceleratedHardwareReady",
            "status": "False",
            "reason": "Xid79",
            "lastTransitionTime": stamp(),
        }
        api.patch(
            f"/api/v1/nodes/{node}/status", {"status": {"conditions": [condition]}}, "strategic"
        )
    uid = first["metadata"]["uid"]
    try:
        wait_for(lambda: new_node_ready(api, before), 900, f"{name}: a replacement Ready")
        ready = time.monotonic() - start
        resumed = wait_for(
            lambda: running_pod(api, NAMESPACE, job, not_uid=uid), 900, f"{name}: resumed"
        )
        again = time.monotonic() - start
        set_health(api, str(resumed["spec"]["nodeName"]))
        wait_for(lambda: node_gone(api, node), 900, f"{name}: the old Node gone")
        removed = time.monotonic() - start
    finally:
        if running is not None:
            running.halt()
    return {"replacement ready": ready, "job running again": again, "old node gone": removed}


def new_node_ready(api: KubeApi, before: set[str]) -> bool:
    for node in api.list("/api/v1/nodes").items:
        if node["metadata"]["name"] in before:
            continue
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toleration", default="30s", help="Karpenter's repair toleration")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuguard-karpenter-bench-") as tmp:
        workdir = Path(tmp)
        with ControlPlane(workdir, testenv_bin()) as plane:
            karpenter = KarpenterCluster(plane, workdir, repair_toleration=args.toleration)
            try:
                with load_api(plane.admin_kubeconfig) as api:
                    karpenter.start(api, namespaces=(NAMESPACE, "gpuguard"))
                    scenarios = ("gpuguard", "karpenter-repair")
                    results = {name: scenario(api, name) for name in scenarios}
            finally:
                karpenter.stop()
    print(f"Karpenter repair toleration: {args.toleration}")
    print(f"{'from the fault to':24} {'gpuguard':>10} {'karpenter-repair':>18} {'ratio':>7}")
    for measure in ("replacement ready", "job running again", "old node gone"):
        ours, theirs = results["gpuguard"][measure], results["karpenter-repair"][measure]
        print(f"{measure:24} {ours:9.1f}s {theirs:17.1f}s {theirs / ours:6.1f}x")


if __name__ == "__main__":
    main()
