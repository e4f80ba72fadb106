"""The fault-injection suite.

The Kubernetes tests' control plane fixtures are shared (control_plane, api, namespace,
node). The controller-fault tests get a control plane of their own with an audit log
(``audited_*``), so that log holds only their writes, and each controller replica and
stand-in agent a client certificate of its own, so the log tells them apart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.controller.loop import LEASE_NAME
from gpuguard.kube.rest import LEASES, NODES, PODS, KubeApi, load_api
from tests.kube.conftest import api, control_plane, namespace, node  # noqa: F401
from tests.support.audit import AuditLog
from tests.support.cluster import (
    finish_terminating_pods,
    install_crds,
    make_pod,
    scratch_namespace,
    wait_for,
)
from tests.support.controllers import remediations, tainted
from tests.support.controlplane import ControlPlane, testenv_bin

T = TypeVar("T")


@pytest.fixture(scope="module")
def audited_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(Path(tmp_path_factory.mktemp("audited")), testenv_bin(), audit=True) as plane:
        yield plane


@pytest.fixture(scope="module")
def audited_api(audited_plane: ControlPlane) -> Iterator[KubeApi]:
    """An admin client of the audited plane, with gpuguard's CRDs installed."""
    with load_api(audited_plane.admin_kubeconfig) as client:
        install_crds(client)
        yield client


@pytest.fixture
def audit(audited_plane: ControlPlane) -> AuditLog:
    assert audited_plane.audit_log is not None
    return AuditLog(audited_plane.audit_log)


@pytest.fixture
def audited_namespace(audited_api: KubeApi) -> Iterator[str]:
    """The test's namespace (its controllers' Lease lives there), with a stand-in kubelet
    that finishes deleted pods; the test's nodes and episodes go afterwards."""
    with scratch_namespace(audited_api) as name:
        stop = threading.Event()
        kubelet = threading.Thread(
            target=finish_terminating_pods, args=(audited_api, name, stop), daemon=True
        )
        kubelet.start()
        yield name
        stop.set()
        kubelet.join(5)


# --- controller replicas ----------------------------------------------------------------
@dataclass
class Replica:
    """One ``gpuguard controller`` process; ``name`` is its identity in the Lease and its
    user name in the audit log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM (thawed first), SIGKILL if it is still there after 15 s."""
        if self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def has_logged(self, text: str) -> bool:
        return text in self.output()


def start_replica(
    plane: ControlPlane,
    name: str,
    lease_namespace: str,
    policy: Path,
    workdir: Path,
    clock_offset_s: float = 0.0,
) -> Replica:
    """A controller process; ``clock_offset_s`` sets its wall clock wrong by that much."""
    kubeconfig = plane.client_kubeconfig(name)
    log = workdir / f"{name}.log"
    argv = [
        sys.executable,
        "-m",
        "gpuguard.cli",
        "controller",
        *("--kubeconfig", str(kubeconfig), "--namespace", lease_namespace, "--identity", name),
        *("--provider", "delete-node", "--policy", str(policy), "--metrics-port", "0"),
        *("--clock-offset-s", str(clock_offset_s)),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return Replica(name, proc, log)


def lease_holder(client: KubeApi, lease_namespace: str) -> str:
    lease = client.get(LEASES.path(LEASE_NAME, namespace=lease_namespace))
    return str(lease["spec"].get("holderIdentity") or "")


@dataclass
class Controllers:
    """The test's controller replicas, each named ``<role>-<random>`` (the audit log
    outlives tests, and counts by name)."""

    plane: ControlPlane
    api: KubeApi
    namespace: str
    workdir: Path
    started: list[Replica] = field(default_factory=list)

    def start(self, role: str, policy: Mapping[str, Any], clock_offset_s: float = 0.0) -> Replica:
        name = f"{role}-{uuid.uuid4().hex[:6]}"
        path = self.workdir / f"{name}-policy.yaml"
        path.write_text(yaml.safe_dump(dict(policy)))
        replica = start_replica(
            self.plane, name, self.namespace, path, self.workdir, clock_offset_s
        )
        self.started.append(replica)
        return replica

    def holder(self) -> str:
        return lease_holder(self.api, self.namespace)

    def wait_leading(self, replica: Replica, timeout_s: float = 30) -> None:
        def leads() -> str | bool:
            if replica.proc.poll() is not None:
                return "exited"
            return self.holder() == replica.name

        if wait_for(leads, timeout_s, f"{replica.name} to lead") == "exited":
            raise AssertionError(
                f"controller {replica.name} exited {replica.proc.returncode}:\n"
                f"{replica.output()[-3000:]}"
            )

    def stop_all(self) -> None:
        for replica in self.started:
            replica.stop()


@pytest.fixture
def controllers(
    audited_plane: ControlPlane, audited_api: KubeApi, audited_namespace: str, tmp_path: Path
) -> Iterator[Controllers]:
    started = Controllers(audited_plane, audited_api, audited_namespace, tmp_path)
    yield started
    started.stop_all()


# --- stand-in agents ----------------------------------------------------------------------
@dataclass
class Agent:
    """The agent's repair side only: the project's RepairExecutor, with BundleRepair
    writing each repair it performs to ``repairs``."""

    user: str
    repairs: Path
    executor: RepairExecutor
    client: KubeApi
    stop: threading.Event = field(default_factory=threading.Event)

    def performed(self) -> list[str]:
        return self.repairs.read_text().splitlines() if self.repairs.exists() else []


@pytest.fixture
def agents(audited_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[[str], Agent]]:
    running: list[tuple[Agent, threading.Thread]] = []

    def start(on_node: str) -> Agent:
        user = f"agent-{on_node}-{len(running)}"
        client = load_api(audited_plane.client_kubeconfig(user))
        repairs = tmp_path / f"{user}-repairs.log"
        executor = RepairExecutor(client, on_node, BundleRepair(repairs), lambda *_: None)
        agent = Agent(user, repairs, executor, client)
        thread = threading.Thread(target=executor.run, args=(agent.stop,), daemon=True)
        thread.start()
        running.append((agent, thread))
        return agent

    yield start
    for agent, thread in running:
        agent.stop.set()
        thread.join(10)
        agent.client.close()


def quiet_for(seconds: float, find: Callable[[], list[T]]) -> list[T]:
    """What ``find`` turns up within ``seconds``, or nothing: the observation window for
    something that must not happen (it returns as soon as it does)."""
    deadline = time.monotonic() + seconds
    while True:
        found = find()
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


# --- what the tests and bench/apiserver_pause.py ask of the cluster ------------------------
def status(client: KubeApi, name: str) -> dict[str, Any]:
    """The status of node ``name``'s newest episode ({} while it has none)."""
    found = sorted(remediations(client, name), key=lambda r: r["spec"]["openedAt"])
    return dict(found[-1].get("status") or {}) if found else {}


def phase(client: KubeApi, name: str) -> str:
    return str(status(client, name).get("phase", ""))


def cordoned(client: KubeApi, name: str) -> bool:
    return bool(client.get(NODES.path(name)).get("spec", {}).get("unschedulable"))


def released(client: KubeApi, name: str) -> bool:
    """Closed, untainted and uncordoned (the close is written before the release)."""
    return bool(status(client, name).get("resolution")) and not (
        tainted(client, name) or cordoned(client, name)
    )


def running_pods(client: KubeApi, pod_namespace: str, name: str, count: int, app: str) -> list[str]:
    """``count`` pods ``<app>-<i>`` bound to node ``name`` and set Running (as the kubelet
    would), labelled ``app``."""
    pods = [f"{app}-{i}" for i in range(count)]
    for pod in pods:
        make_pod(client, pod_namespace, pod, name, labels={"app": app})
        client.patch(
            PODS.path(pod, namespace=pod_namespace, sub="status"), {"status": {"phase": "Running"}}
        )
    return pods
