"""The rest of a cluster for the Job tests, on the session's API server: the Job controller
(kube-controller-manager running that controller alone), kube-scheduler, and KWOK as the
kubelet of the nodes that carry KWOK's annotation.

Only what Jobs need runs, because every Kubernetes test shares the API server: a node
lifecycle controller would taint the other tests' kubelet-less nodes NotReady and evict
their pods, a namespace controller would empty their namespaces. KWOK likewise manages
only the annotated nodes; its pod stages are in ``kwok-stages.yaml`` next to this file.
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

from gpuguard.kube.rest import Json, KubeApi, KubeNotFound
from tests.support.cluster import CREATED_NODES, wait_for
from tests.support.controllers import POOL
from tests.support.controlplane import (
    REPO,
    START_TIMEOUT_S,
    ControlPlane,
    free_port,
    terminate,
    testenv_bin,
)

KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # KWOK's own convention, value "fake"
EXIT_CODE_ANNOTATION = "test.gpuguard.io/exit-code"  # read by the pod-exit stage
EXIT_MESSAGE_ANNOTATION = "test.gpuguard.io/exit-message"  # its termination message
STAGES = Path(__file__).with_name("kwok-stages.yaml")
EXAMPLES = REPO / "examples" / "jobs"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


class JobSystem:
    """kube-controller-manager (Job controller), kube-scheduler and KWOK, all on loopback,
    each with a log in ``workdir``; ``stop`` ends whichever of them started."""

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        controllers: tuple[str, ...] = ("job",),
        feature_gates: str = "",
    ) -> None:
        """``controllers``: kube-controller-manager's, by name without ``-controller``
        (only the Job controller on the shared API server; see the module's docstring).
        ``feature_gates``: kube-controller-manager's and kube-scheduler's
        (``DRADeviceTaints=true``)."""
        self.plane = plane
        self.workdir = workdir
        self.controllers = controllers
        self.gates = [f"--feature-gates={feature_gates}"] if feature_gates else []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        # The admin credentials: the controller manager's own role only suits it with
        # per-controller ServiceAccounts, which would need the token controllers too.
        kubeconfig = f"--kubeconfig={self.plane.admin_kubeconfig}"
        port = free_port()
        self._start(
            "kube-controller-manager",
            [
                kubeconfig,
                "--controllers=" + ",".join(f"{name}-controller" for name in self.controllers),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--v=2",
                *self.gates,
            ],
            f"https://127.0.0.1:{port}/healthz",
        )
        port = free_port()
        self._start(
            "kube-scheduler",
            [
                kubeconfig,
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--v=2",
                *self.gates,
            ],
            f"https://127.0.0.1:{port}/healthz",
        )
        port = free_port()
        self._start(
            "kwok",
            [
                kubeconfig,
                f"--config={STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{port}",
                "--node-lease-duration-seconds=40",
            ],
            f"http://127.0.0.1:{port}/healthz",
        )

    def stop(self) -> None:
        for proc in self._procs.values():
            terminate(proc)
        self._procs.clear()

    def check_running(self) -> None:
        """Raise, naming the log, if a component has exited (a wait would only time out)."""
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}); see {self._log(name)}")

    def _start(self, name: str, args: list[str], health_url: str) -> None:
        with self._log(name).open("ab") as log:
            self._procs[name] = subprocess.Popen(
                [str(self.plane.bin / name), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_healthy(name, health_url)

    def _wait_healthy(self, name: str, url: str) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # each serves a self-signed certificate
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_running()
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, context=context, timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{name} not healthy after {START_TIMEOUT_S}s; see {self._log(name)}")

    def _log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"


def make_kwok_node(api: KubeApi, name: str, labels: dict[str, str], gpus: int = 8) -> None:
    """A GPU node KWOK runs the pods of; deleted after the test like ``make_node``'s.
    Its capacity comes with it (a Node may be created with its status): KWOK keeps it."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "status": {"capacity": resources, "allocatable": resources},
    }
    api.create("/api/v1/nodes", body)
    CREATED_NODES.append(name)
    # The API server taints a new Node not-ready; the node lifecycle controller, which is
    # not running here, would lift it once KWOK reports the node Ready.
    api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})


def end_pod(api: KubeApi, pod: Json, exit_code: int, message: str = "") -> None:
    """Make the pod's containers exit with ``exit_code`` and, if given, leave ``message``
    as their termination message (KWOK's pod-exit stage reads both)."""
    meta = pod["metadata"]
    annotations = {EXIT_CODE_ANNOTATION: str(exit_code)}
    if message:
        annotations[EXIT_MESSAGE_ANNOTATION] = message
    api.patch(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        {"metadata": {"annotations": annotations}},
    )


def released_crd(filename: str) -> Json:
    """A workload CRD as its project released it (JobSet, Kubeflow), from hack/testenv."""
    return dict(yaml.safe_load((testenv_bin() / "crds" / filename).read_text()))


# --- the example Job and its pods ---------------------------------------------------
def example(name: str) -> Json:
    return dict(yaml.safe_load((EXAMPLES / name).read_text()))


def training_job(*, failure_policy: bool = True) -> Json:
    """examples/jobs/job.yaml for the test cluster: every rule as written, no volume."""
    job = example("job.yaml")
    job["metadata"]["name"] = f"train-{uuid.uuid4().hex[:6]}"
    job["spec"]["backoffLimit"] = 0
    if not failure_policy:
        del job["spec"]["podFailurePolicy"]
    pod = job["spec"]["template"]["spec"]
    del pod["volumes"]
    for container in pod["containers"]:
        del container["volumeMounts"]
    return job


def create_job(api: KubeApi, namespace: str, job: Json) -> str:
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    return str(job["metadata"]["name"])


def job_status(api: KubeApi, namespace: str, name: str) -> Json:
    return dict(api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}").get("status", {}))


def finished_as(api: KubeApi, namespace: str, name: str) -> tuple[str, str] | None:
    """(type, reason) of the Job's Complete or Failed condition, once it has one."""
    for condition in job_status(api, namespace, name).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return condition["type"], condition.get("reason", "")
    return None


def job_pods(api: KubeApi, namespace: str, job: str) -> list[Json]:
    return list(
        api.list(
            f"/api/v1/namespaces/{namespace}/pods", label_selector=f"{JOB_NAME_LABEL}={job}"
        ).items
    )


def running_pod(api: KubeApi, namespace: str, job: str, *, not_uid: str = "") -> Json | None:
    """The Job's running pod (other than ``not_uid``), once KWOK has started it."""
    for pod in job_pods(api, namespace, job):
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running" and pod["metadata"]["uid"] != not_uid:
            return pod
    return None


def job_state(api: KubeApi, namespace: str, job: str) -> str:
    """Where the Job's pods are, and what their nodes say: why a wait on the Job timed out."""
    seen = []
    for pod in job_pods(api, namespace, job):
        where = pod["spec"].get("nodeName")
        try:
            node = api.get(f"/api/v1/nodes/{where}") if where else {"spec": {}}
        except KubeNotFound:
            node = {"spec": {"taints": [{"key": "(node deleted)"}]}}
        seen.append(
            {
                "pod": pod["metadata"]["name"],
                "phase": (pod.get("status") or {}).get("phase"),
                "deleting": pod["metadata"].get("deletionTimestamp"),
                "node": where,
                "cordoned": node["spec"].get("unschedulable", False),
                "taints": [t["key"] for t in node["spec"].get("taints") or []],
            }
        )
    return f"pods {seen}, job status {job_status(api, namespace, job)}"


def resumed(api: KubeApi, namespace: str, job: str, first: Json) -> Json:
    """The pod that took over from ``first``; fails at once if the Job ended instead."""
    uid = first["metadata"]["uid"]
    try:
        outcome = wait_for(
            lambda: (
                running_pod(api, namespace, job, not_uid=uid) or finished_as(api, namespace, job)
            ),
            60,
            "the job's pod running again",
        )
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; {job_state(api, namespace, job)}") from None
    assert isinstance(outcome, dict), f"the job ended instead: {job_status(api, namespace, job)}"
    return outcome


def node_names() -> tuple[str, str, str]:
    """Names for a sick node, a healthy node, and the pool only this test's nodes are in."""
    tag = uuid.uuid4().hex[:6]
    return f"kwok-sick-{tag}", f"kwok-healthy-{tag}", f"kwok-{tag}"


def start_on_sick_node(api: KubeApi, namespace: str, job: Json) -> tuple[str, Json, str]:
    """The Job running on a node that will fall sick; a healthy node ready to take it over.
    The healthy node comes after the pod is placed, so the pod lands on the sick one."""
    sick, healthy, pool = node_names()
    make_kwok_node(api, sick, {POOL: pool})
    job["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool}
    name = create_job(api, namespace, job)
    first = wait_for(lambda: running_pod(api, namespace, name), 30, "the job's pod running")
    assert first["spec"]["nodeName"] == sick
    make_kwok_node(api, healthy, {POOL: pool})
    return name, first, healthy
