"""The agent's repair executor on the real API server: woken by a watch of its node's
NodeRemediations rather than by polling, polling where RBAC refuses the watch, an answer
that could not be written is written later without repeating the repair, and a reboot
waits until its answer can be written."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuguard.agent.repair import BundleRepair, RepairExecutor
from gpuguard.kube import remediations
from gpuguard.kube.rest import KubeApi, load_api
from gpuguard.model import Action
from gpuguard.remediation.model import Episode, Phase
from tests.support.cluster import wait_for
from tests.support.controllers import Running, node_name
from tests.support.controlplane import ControlPlane

GPU = "0000:91:00.0"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def request_action(api: KubeApi, node: str, action: Action = Action.RESET_GPU) -> str:
    """What the controller writes: an episode in ACTING with a request (RESET_GPU of one
    GPU unless told otherwise)."""
    ep = Episode(node=node, opened_at=time.time(), phase=Phase.ACTING, rung=action)
    ep.attempts = {action: 1}
    gpus = (GPU,) if action is Action.RESET_GPU else ()
    remediations.save_episode(api, ep, new=True)
    assert remediations.set_request(api, ep, action, 1, gpus, now=time.time())
    return remediations.object_name(node, ep.opened_at)


def answer(api: KubeApi, name: str) -> dict[str, object] | None:
    stored = api.get(remediations.NODE_REMEDIATIONS.path(name))
    result = (stored.get("status") or {}).get("result")
    return dict(result) if result else None


def executor_for(client: KubeApi, node: str, repairs: Path, **reads_s: float) -> RepairExecutor:
    """``reads_s``: the executor's ``poll_s`` and ``resync_s``."""
    return RepairExecutor(client, node, BundleRepair(repairs), lambda *_: None, **reads_s)


def failed_reads(caplog: pytest.LogCaptureFixture) -> int:
    return sum("reading repair requests failed" in r.getMessage() for r in caplog.records)


def test_a_request_is_performed_when_it_is_written_not_at_the_next_poll(
    api, control_plane, tmp_path
):
    # Reads an hour apart: only the watch can wake the executor in time.
    node, repairs = node_name(), tmp_path / "repairs.log"
    with load_api(control_plane.admin_kubeconfig) as client:
        executor = executor_for(client, node, repairs, poll_s=3600.0, resync_s=3600.0)
        running = Running(executor.run)
        wait_for(executor.watching.is_set, 5, "the watch open")
        written = time.monotonic()
        name = request_action(api, node)
        wait_for(repairs.exists, 5, "the reset")
        result = wait_for(lambda: answer(api, name), 5, "the answer")
        assert time.monotonic() - written < 5
        running.halt()
    assert repairs.read_text() == f"reset {GPU}\n"
    assert result["action"] == "RESET_GPU" and result["succeeded"] is True


@pytest.fixture
def limited_account(api: KubeApi, namespace: str, control_plane: ControlPlane, tmp_path: Path):
    """A ServiceAccount that may read NodeRemediations but not watch them (an older chart),
    and whose right to answer (patch the status) the test grants when it likes."""
    account = f"old-agent-{uuid.uuid4().hex[:6]}"
    api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    created: list[str] = []

    def grant(resource: str, verbs: list[str]) -> None:
        role = f"{account}-{resource.replace('/', '-')}"
        rule = {"apiGroups": ["gpuguard.io"], "resources": [resource], "verbs": verbs}
        api.create(f"{RBAC}/clusterroles", {"metadata": {"name": role}, "rules": [rule]})
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
        binding = {"metadata": {"name": role}, "subjects": [subject], "roleRef": ref}
        api.create(f"{RBAC}/clusterrolebindings", binding)
        created.append(role)

    grant("noderemediations", ["get", "list"])
    kubeconfig = tmp_path / "old-agent.kubeconfig"
    token = control_plane.service_account_token(namespace, account)
    kubeconfig.write_text(yaml.safe_dump(control_plane.kubeconfig_for_token(token)))
    yield kubeconfig, grant
    for role in created:
        api.delete(f"{RBAC}/clusterrolebindings/{role}")
        api.delete(f"{RBAC}/clusterroles/{role}")


def test_without_watch_rights_it_polls_and_an_unwritten_answer_is_written_later(
    api, limited_account, tmp_path, caplog
):
    kubeconfig, grant = limited_account
    node, repairs = node_name(), tmp_path / "repairs.log"
    name = request_action(api, node)
    with (
        caplog.at_level(logging.INFO, logger="gpuguard.agent"),
        load_api(kubeconfig) as client,
    ):
        running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
        wait_for(repairs.exists, 10, "the reset, found by polling")
        wait_for(lambda: failed_reads(caplog) >= 3, 10, "several polls, each refused the answer")
        assert answer(api, name) is None
        grant("noderemediations/status", ["patch"])
        result = wait_for(lambda: answer(api, name), 10, "the answer, once allowed")
        running.halt()
    assert result["succeeded"] is True
    assert repairs.read_text() == f"reset {GPU}\n", "the repair must not be repeated"
    warnings = [r.getMessage() for r in caplog.records if "cannot watch" in r.getMessage()]
    assert len(warnings) == 1 and "403" in warnings[0], warnings


def test_a_reboot_waits_until_its_answer_can_be_written(api, limited_account, tmp_path, caplog):
    # Once the reboot starts the agent may not get to write, so it answers first; an
    # answer the API server refuses means no reboot yet, and a later read tries both again.
    kubeconfig, grant = limited_account
    node, repairs = node_name(), tmp_path / "repairs.log"
    name = request_action(api, node, Action.REBOOT)
    with (
        caplog.at_level(logging.INFO, logger="gpuguard.agent"),
        load_api(kubeconfig) as client,
    ):
        running = Running(executor_for(client, node, repairs, poll_s=0.2).run)
        wait_for(lambda: failed_reads(caplog) >= 3, 10, "several reads, each answer refused")
        assert not repairs.exists(), "rebooted without having said so"
        grant("noderemediations/status", ["patch"])
        result = wait_for(lambda: answer(api, name), 10, "the answer, once allowed")
        wait_for(repairs.exists, 5, "the reboot")
        running.halt()
    assert result["action"] == "REBOOT" and result["message"] == "reboot started"
    assert repairs.read_text() == "reboot\n"


@pytest.fixture
def namespace(api: KubeApi) -> Iterator[str]:
    """A namespace for the ServiceAccount (no pods run here: no stand-in kubelet)."""
    name = f"repairs-{uuid.uuid4().hex[:6]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    api.delete(f"/api/v1/namespaces/{name}")
