"""A user's first install, end to end, from an OCI registry (issue 29): the image built by
``make image`` and pushed to a registry, the chart packaged and pushed there by ``make
chart``, ``helm install oci://...`` with nothing but the image repository and what a
loopback-only node needs, on the real kubelet, which pulls the image from the registry.
The controller is in its default dry run; a Node condition is visible with kubectl.

The registry is Debian's docker-registry (CNCF Distribution) on loopback, plain HTTP.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.support import controlplane  # not testenv_bin by name: pytest would collect it
from tests.support.chart_cluster import NAMESPACE, NODE, Cluster, chart_cluster
from tests.support.controlplane import REPO
from tests.support.node import IMAGE_REPOSITORY, buildah_command, chart_app_version
from tests.support.registry import Registry

RELEASE = "first-install"
GPU_COLUMN = 'GPU:.status.conditions[?(@.type=="GpuguardGPUHealthy")].status'


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, helm: Callable[..., str]
) -> Iterator[tuple[Cluster, Registry]]:
    workdir = Path(tmp_path_factory.mktemp("from-registry"))
    (workdir / "registry").mkdir()
    with chart_cluster(workdir, helm) as made, Registry(workdir / "registry") as registry:
        made.node.registry_hosts.mkdir(parents=True, exist_ok=True)
        registry.containerd_hosts(made.node.registry_hosts)
        yield made, registry


def test_a_first_install_from_the_registry_runs_in_dry_run_and_shows_conditions(
    cluster, helm, tmp_path
):
    made, registry = cluster
    version = chart_app_version()
    image = f"{IMAGE_REPOSITORY}:{version}"  # what chart_cluster's `make image` built
    pushed = f"{registry.host}/gpuguard:{version}"
    subprocess.run(
        [*buildah_command(), "push", "--tls-verify=false", image, f"docker://{pushed}"],
        check=True,
        capture_output=True,
    )
    chart = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "chart",
            f"HELM={controlplane.testenv_bin() / 'helm'}",
            f"CHART_DIR={tmp_path}",
            f"CHART_REGISTRY=oci://{registry.host}/charts",
            "HELM_PUSH_FLAGS=--plain-http",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert chart.returncode == 0, chart.stdout + chart.stderr

    # The user's values: the image repository; the loopback node's needs (host network,
    # the API server's address, no NVIDIA runtime, the fixture GPU backend). The
    # controller's dry run is the chart's default: not set here.
    values = yaml.safe_load(made.values.read_text())
    values["image"] = {"repository": f"{registry.host}/gpuguard", "pullPolicy": "Always"}
    del values["controller"]["dryRun"]
    mine = tmp_path / "values.yaml"
    mine.write_text(yaml.safe_dump(values))
    out = helm(
        "install",
        RELEASE,
        f"oci://{registry.host}/charts/gpuguard",
        f"--version={version}",
        "--plain-http",
        f"--namespace={NAMESPACE}",
        f"--values={mine}",
        f"--kubeconfig={made.plane.admin_kubeconfig}",
    )
    assert "DRY RUN" in out and "kubectl get noderemediations" in out  # NOTES: how to go on

    agent = made.wait(lambda: made.ready_pod("agent"), "the agent Ready")
    (status,) = agent["status"]["containerStatuses"]
    assert status["image"] == pushed
    assert status["imageID"].startswith(f"{registry.host}/gpuguard@sha256:")  # pulled
    controller = made.wait(lambda: made.ready_pod("controller"), "the controller Ready")
    assert "--dry-run" in controller["spec"]["containers"][0]["command"]

    kubectl = [
        str(controlplane.testenv_bin() / "kubectl"),
        f"--kubeconfig={made.plane.admin_kubeconfig}",
    ]

    def shown() -> str:
        columns = f"custom-columns=NODE:.metadata.name,{GPU_COLUMN}"
        proc = subprocess.run(
            [*kubectl, "get", "node", NODE, "-o", columns, "--no-headers"],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stdout if proc.stdout.split()[1:] == ["True"] else ""

    assert made.wait(shown, "GpuguardGPUHealthy=True in kubectl").split() == [NODE, "True"]
    helm(
        "uninstall",
        RELEASE,
        f"--namespace={NAMESPACE}",
        f"--kubeconfig={made.plane.admin_kubeconfig}",
        "--wait",
    )
