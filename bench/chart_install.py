"""The chart installed on a real kubelet, timed as a user sees it: ``helm install`` to the
agent's pod running, to its first conditions on the Node, and to a controller holding the
Lease.

The same cluster as tests/kube/test_chart_on_kubelet.py (tests/support/chart_cluster.py):
a real kube-apiserver, kube-controller-manager and kube-scheduler, one node run by
containerd and the kubelet, the image ``make image`` builds (imported, never pulled), the
agent reading the healthy-h100 bundle. Observed by polling the API server every 50 ms, so
each figure is good to about 0.1 s. Run: ``.venv/bin/python bench/chart_install.py``.
Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.chart_cluster import PATIENT_POLICY, Cluster, chart_cluster  # noqa: E402
from tests.support.controlplane import testenv_bin  # noqa: E402

CONDITIONS = ("GpuguardGPUHealthy", "GpuguardNetworkHealthy", "GpuguardKernelHealthy")


def helm(*args: str) -> str:
    proc = subprocess.run(
        [str(testenv_bin() / "helm"), *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def running(cluster: Cluster, component: str) -> bool:
    return any(p["status"].get("phase") == "Running" for p in cluster.pods(component))


def timed(cluster: Cluster) -> dict[str, float]:
    start = time.monotonic()
    cluster.install_or_upgrade("install", PATIENT_POLICY)
    installed = time.monotonic() - start
    cluster.wait(lambda: running(cluster, "agent"), "the agent pod running")
    agent_running = time.monotonic() - start
    cluster.wait(
        lambda: all(cluster.conditions().get(kind) == "True" for kind in CONDITIONS),
        "the agent's conditions",
    )
    conditions = time.monotonic() - start
    cluster.wait(lambda: cluster.leader(), "a controller holding the Lease")
    leader = time.monotonic() - start
    return {
        "helm install returns": installed,
        "agent pod running": agent_running,
        "agent's first conditions": conditions,
        "  of which from the pod running": conditions - agent_running,
        "controller holds the Lease": leader,
    }


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="gpuguard-chart-bench-") as tmp,
        chart_cluster(Path(tmp), helm) as cluster,
    ):
        figures = timed(cluster)
    print(f"{'from helm install to':36} {'seconds':>8}")
    for what, seconds in figures.items():
        print(f"{what:36} {seconds:8.1f}")


if __name__ == "__main__":
    main()
