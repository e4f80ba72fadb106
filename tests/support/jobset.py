"""The real JobSet controller (sigs.k8s.io/jobset, built by ``hack/testenv``) on a test
control plane: its webhooks served on loopback with a certificate from the plane's CA,
registered as the release registers them but addressed by URL, and the example JobSet
(examples/jobs/jobset.yaml) with what the gang's pods look like once running.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpuguard.kube.rest import Json, KubeApi
from tests.support.cluster import install_crd, serving, wait_for
from tests.support.controlplane import START_TIMEOUT_S, ControlPlane, free_port, terminate
from tests.support.jobsystem import example, released_crd
from tests.support.karpenter import CONTROLLERS

# A JobSet restart deletes its Jobs in the foreground: the garbage collector removes their
# pods (and only then the Jobs), so it runs beside what Karpenter needs.
JOBSET_CONTROLLERS = (*CONTROLLERS, "garbage-collector")
JOBSET_USER = "jobset-controller"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/{kind}s"


class JobSetController:
    """``start`` installs the JobSet CRD, runs the controller and registers its webhooks;
    ``stop`` ends the process."""

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane = plane
        self.workdir = workdir
        self.log = workdir / "jobset-controller.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, api: KubeApi) -> None:
        install_crd(api, released_crd("jobset.x-k8s.io_jobsets.yaml"))
        webhook, health = free_port(), free_port()
        config = self.workdir / "jobset-config.yaml"
        config.write_text(yaml.safe_dump(self._config(webhook, health)))
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(self.plane.bin / "jobset-controller"),
                    f"--config={config}",
                    # A client of its own: an audit log tells its writes apart.
                    f"--kubeconfig={self.plane.client_kubeconfig(JOBSET_USER)}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Ready once its webhook server serves: only then may the API server call it.
        ready = f"http://127.0.0.1:{health}/readyz"
        wait_for(lambda: serving(self._proc, ready, self.log), START_TIMEOUT_S, "JobSet ready")
        # Their failurePolicy is Fail: from here on a JobSet or its pod exists only if the
        # webhooks answered.
        for hook in self._webhooks(webhook):
            api.create(WEBHOOKS.format(kind=hook["kind"].lower()), hook)

    def stop(self) -> None:
        terminate(self._proc)
        self._proc = None

    def _config(self, webhook: int, health: int) -> Json:
        """Everything on loopback; certificates ours, not the controller's own rotator (it
        writes a Secret for a Service address the API server could not reach here)."""
        certs = self.workdir / "jobset-certs"
        certs.mkdir(exist_ok=True)
        self.plane.certs.issue("jobset-webhook", "jobset-webhook", server=True)  # SAN 127.0.0.1
        for suffix in ("crt", "key"):
            shutil.copy(self.plane.certs.path(f"jobset-webhook.{suffix}"), certs / f"tls.{suffix}")
        return {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},  # off: nothing scrapes it here
        }

    def _webhooks(self, port: int) -> list[Json]:
        """The module's webhook configurations with the release's patches applied (the pod
        hooks see only a JobSet's pods) and its name prefix, each hook sent to the URL."""
        released = self.plane.bin / "crds" / "jobset"
        ca = base64.b64encode(self.plane.certs.path("ca.crt").read_bytes()).decode()
        hooks = []
        for config in yaml.safe_load_all((released / "manifests.yaml").read_text()):
            stem = config["kind"].removesuffix("WebhookConfiguration").lower()
            for op in yaml.safe_load((released / f"{stem}-patch.yaml").read_text()):
                _replace(config, op)
            config["metadata"]["name"] = "jobset-" + config["metadata"]["name"]
            for hook in config["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            hooks.append(config)
        return hooks


def _replace(document: Json, op: dict[str, Any]) -> None:
    """One JSON-patch ``replace`` (the only op the release's webhook patches use)."""
    if op["op"] != "replace":
        raise ValueError(f"unexpected patch op {op['op']!r}")
    *parents, last = op["path"].strip("/").split("/")
    target: Any = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[int(last) if isinstance(target, list) else last] = op["value"]


# --- the example JobSet ------------------------------------------------------------------
def training_jobset() -> Json:
    """examples/jobs/jobset.yaml for the test cluster: every rule as written, no checkpoint
    volume (nothing provisions its claim here); KWOK runs the pods, the image is unused."""
    jobset = example("jobset.yaml")
    for replicated in jobset["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]["spec"]
        del pod["volumes"]
        for container in pod["containers"]:
            del container["volumeMounts"]
    return jobset


def create_jobset(api: KubeApi, namespace: str, jobset: Json) -> str:
    api.create(JOBSETS.format(namespace=namespace), jobset)
    return str(jobset["metadata"]["name"])


def jobset_status(api: KubeApi, namespace: str, name: str) -> Json:
    return dict(api.get(f"{JOBSETS.format(namespace=namespace)}/{name}").get("status") or {})


def jobset_finished(api: KubeApi, namespace: str, name: str) -> tuple[str, str] | None:
    """(type, reason) of the JobSet's Completed or Failed condition, once it has one."""
    for condition in jobset_status(api, namespace, name).get("conditions") or []:
        if condition["type"] in ("Completed", "Failed") and condition["status"] == "True":
            return condition["type"], condition.get("reason", "")
    return None


def gang_pods(api: KubeApi, namespace: str, name: str) -> list[Json]:
    path = f"/api/v1/namespaces/{namespace}/pods"
    return list(api.list(path, label_selector=f"{NAME_LABEL}={name}").items)


def running_gang(api: KubeApi, namespace: str, name: str, size: int, attempt: int) -> list[Json]:
    """The pods of restart ``attempt``, once all ``size`` of them run (else empty)."""
    pods = [
        pod
        for pod in gang_pods(api, namespace, name)
        if pod["metadata"]["labels"].get(RESTART_LABEL) == str(attempt)
        and (pod.get("status") or {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    ]
    return pods if len(pods) == size else []


def gang_size(jobset: Json) -> int:
    return sum(
        r["replicas"] * r["template"]["spec"]["parallelism"]
        for r in jobset["spec"]["replicatedJobs"]
    )
