"""The remediation controller in tests: a fast policy, a controller running on a thread,
and the questions the tests ask of the cluster about a node."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuguard.controller.loop import RETRY_S, Controller
from gpuguard.kube.remediations import NODE_REMEDIATIONS
from gpuguard.kube.rest import KubeApi
from gpuguard.remediation.policy import Policy
from tests.support.cluster import wait_for
from tests.support.metrics import sample

POOL = "karpenter.sh/nodepool"
FAST_POLICY: dict[str, Any] = {
    "tolerance_s": 0,
    "clear_after_s": 1,
    "min_action_interval_s": 0,
    "drain_timeout_s": 4,
    "action_timeout_s": 10,
    "verify_timeout_s": 4,
    # Tests share one API server: only the storm test may trip the breaker.
    "breaker": {"min_nodes": 1000},
}
# For real `gpuguard controller` processes, whose crashes and takeovers take seconds: fast
# to act, but no drain or verify times out while a test freezes or kills a replica.
PROCESS_POLICY: dict[str, Any] = {
    "tolerance_s": 0,
    "clear_after_s": 1,
    "min_action_interval_s": 0,
    "drain_timeout_s": 600,
    "verify_timeout_s": 600,
    "breaker": {"min_nodes": 1000},
}


class Running:
    def __init__(self, target: Callable[[threading.Event], None]) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=target, args=(self.stop,), daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(15)
        # A controller left running would share the next test's client and budget.
        assert not self.thread.is_alive(), "the controller did not stop within 15 s"


def only_rung(rung: str) -> dict[str, int]:
    """A ``max_attempts`` policy leaving one attempt of ``rung`` and nothing else."""
    return {name: int(name == rung) for name in ("KILL_JOB", "RESET_GPU", "REBOOT", "REPLACE")}


def new_controller(
    api: KubeApi,
    namespace: str,
    provider: str = "karpenter",
    dry_run: bool = False,
    *,
    retry_s: float = RETRY_S,
    resync_s: float = 0.2,
    preflight: bool = False,
    **policy: Any,
) -> Controller:
    """A controller with the fast test policy (``policy`` overrides its fields);
    ``resync_s``: a long one makes passes run only at deadlines and on watch events."""
    return Controller(
        api,
        Policy(**{**FAST_POLICY, **policy}),
        provider,
        namespace=namespace,
        identity=f"test-{uuid.uuid4().hex[:6]}",
        dry_run=dry_run,
        resync_s=resync_s,
        retry_s=retry_s,
        lease_s=3,
        renew_s=1,
        preflight=preflight,
    )


def reconciles(controller: Controller) -> float:
    """How many reconciles the controller has finished."""
    return sample(controller.metrics.registry, "gpuguard_controller_reconcile_seconds_count")


def reconciled(controller: Controller, *, after: float | None = None, times: int = 2) -> None:
    """Wait until ``controller`` has finished ``times`` more reconciles, counted once the
    wall clock passed ``after`` (default: now): what it would do about the cluster as of
    then, it has done. The controller runs on the wall clock, so a moment in the future
    (a policy timer running out) is waited for in real time."""
    if after is not None:
        wait_for(lambda: time.time() >= after, max(0.0, after - time.time()) + 5, "the moment")
    start = reconciles(controller)

    def done() -> bool:
        controller.wake()  # passes run at deadlines and on changes: ask for one now
        return reconciles(controller) >= start + times

    wait_for(done, 20, f"{times} reconciles")


def node_name() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


def node(api: KubeApi, name: str) -> dict[str, Any]:
    return api.get(f"/api/v1/nodes/{name}")


def tainted(api: KubeApi, name: str) -> bool:
    taints = node(api, name).get("spec", {}).get("taints") or []
    return any(t["key"] == "gpuguard.io/unhealthy" for t in taints)


def kernel_condition(api: KubeApi, name: str) -> dict[str, str]:
    """The node's kernel-layer condition (gpuguard's profile), or {} before the agent's first."""
    found = [
        c
        for c in node(api, name)["status"].get("conditions", [])
        if c["type"] == "GpuguardKernelHealthy"
    ]
    return found[0] if found else {}


def remediations(api: KubeApi, name: str) -> list[dict[str, Any]]:
    found = api.list(NODE_REMEDIATIONS.path()).items
    return [r for r in found if r["spec"]["nodeName"] == name]


def status_of(api: KubeApi, name: str) -> dict[str, Any]:
    (found,) = remediations(api, name)
    return dict(found.get("status") or {})


XID = "NVRM: Xid (PCI:0000:91:00): {code}, pid='<unknown>', name=<unknown>, {text}\n"


def append(bundle: Path, code: int, text: str) -> None:
    with (bundle / "kmsg.log").open("a") as handle:
        handle.write(XID.format(code=code, text=text))


def repairs(bundle: Path) -> list[str]:
    """The repairs the bundle node's agent carried out, in order (none yet: empty)."""
    path = bundle / "repairs.log"
    return path.read_text().splitlines() if path.exists() else []
