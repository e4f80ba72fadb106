"""Session fixture: one real etcd + kube-apiserver for every Kubernetes test."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuguard.controller.loop import Controller
from gpuguard.kube.rest import KubeApi, load_api
from tests.support.cluster import finish_terminating_pods, install_crds, scratch_namespace
from tests.support.controllers import Running, new_controller
from tests.support.controlplane import REPO, ControlPlane, testenv_bin
from tests.support.jobsystem import JobSystem
from tests.support.karpenter import KARPENTER_TOLERATION_S, TRAIN_NAMESPACE, KarpenterCluster


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(Path(tmp_path_factory.mktemp("controlplane")), testenv_bin()) as plane:
        yield plane


@pytest.fixture(scope="session")
def karpenter_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A second plane (its audit log tells gpuguard's writes from Karpenter's), the real
    Karpenter on it (tests/support/karpenter.py); shared by the modules that need it."""
    workdir = Path(tmp_path_factory.mktemp("karpenter"))
    with ControlPlane(workdir, testenv_bin(), audit=True) as plane:
        karpenter = KarpenterCluster(plane, workdir, repair_toleration=f"{KARPENTER_TOLERATION_S}s")
        try:
            with load_api(plane.admin_kubeconfig) as api:
                karpenter.start(api, namespaces=(TRAIN_NAMESPACE, "gpuguard"))
                yield plane
        finally:
            karpenter.stop()


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[KubeApi]:
    """An admin client, with gpuguard's CRDs (and a stand-in NodeClaim CRD) installed."""
    with load_api(control_plane.admin_kubeconfig) as client:
        install_crds(client)
        yield client


@pytest.fixture(scope="module")
def job_system(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JobSystem]:
    """The Job controller, kube-scheduler and KWOK (the kubelet of KWOK's nodes), for the
    modules whose pods must be scheduled, run and end."""
    system = JobSystem(control_plane, Path(tmp_path_factory.mktemp("jobsystem")))
    try:
        system.start()
        yield system
    finally:
        system.stop()


@pytest.fixture
def jobs(api: KubeApi, job_system: JobSystem) -> Iterator[str]:
    """A namespace for the test's Jobs; KWOK, not a stand-in thread, ends their pods.
    Afterwards its Jobs and pods are deleted at once: no namespace controller runs here
    to empty it, and a finished GPU Job left behind would count in the next test's SLIs."""
    job_system.check_running()
    with scratch_namespace(api) as name:
        yield name
        # Background: Orphan (a Job's default) leaves a finalizer only the garbage
        # collector, not running here either, would remove.
        now = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "propagationPolicy": "Background",
        }
        api.delete(f"/apis/batch/v1/namespaces/{name}/jobs", now)
        api.delete(f"/api/v1/namespaces/{name}/pods", now)


@pytest.fixture
def namespace(api: KubeApi) -> Iterator[str]:
    """A namespace for one test's pods, with a stand-in kubelet that finishes deleted
    pods. Afterwards the test's nodes and episodes go too: a sick node or an episode left
    behind would count in the next test's budget and breaker."""
    with scratch_namespace(api) as name:
        stop = threading.Event()
        kubelet = threading.Thread(
            target=finish_terminating_pods, args=(api, name, stop), daemon=True
        )
        kubelet.start()
        yield name
        stop.set()
        kubelet.join(5)


# The chart requires an image repository; every chart test gets a stand-in (an install on
# the kubelet overrides it with the image it built).
TEST_VALUES = REPO / "tests" / "support" / "chart-test-values.yaml"


@pytest.fixture(scope="module")
def helm() -> Callable[..., str]:
    """Runs the helm built by hack/testenv in the repository; checks its exit status."""
    binary = testenv_bin() / "helm"

    def run(*args: str, ok: bool = True) -> str:
        if args and args[0] in ("template", "lint", "install", "upgrade"):
            args = (args[0], f"--values={TEST_VALUES}", *args[1:])  # first: others override
        proc = subprocess.run(
            [str(binary), *args], cwd=REPO, capture_output=True, text=True, check=False
        )
        if ok:
            assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
            return proc.stdout
        assert proc.returncode != 0, f"helm {' '.join(args)} should have failed"
        return proc.stderr

    return run


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane) -> Callable[..., str]:
    """Runs the kubectl built by hack/testenv as the admin; checks its exit status."""
    binary = testenv_bin() / "kubectl"

    def run(*args: str) -> str:
        command = [str(binary), f"--kubeconfig={control_plane.admin_kubeconfig}", *args]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"kubectl {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout

    return run


@pytest.fixture
def start_controller(api: KubeApi, namespace: str) -> Iterator[Callable[..., Controller]]:
    """Starts controllers (fast test policy; keyword arguments override policy fields) on
    threads in the test's namespace; stops them afterwards."""
    running: list[Running] = []

    def start(provider: str = "karpenter", dry_run: bool = False, **policy: Any) -> Controller:
        controller = new_controller(api, namespace, provider, dry_run, **policy)
        running.append(Running(controller.run))
        return controller

    yield start
    for item in running:
        item.halt()


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[str]:
    """A bare Node, deleted afterwards (nothing runs on it: no kubelet here)."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    control_plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    yield name
    control_plane.request("DELETE", f"/api/v1/nodes/{name}")
