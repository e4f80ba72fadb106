"""Two ``gpuguard controller`` replicas while kube-apiserver is frozen: SIGSTOP for
``--pause-s`` (20 s), then SIGCONT, ``--rounds`` times (20). chaos_findings.md row 14.

Everything is real except the machines: etcd and kube-apiserver from ``hack/testenv``
(``tests/support/controlplane.py``, with its audit log of every write), two controller
processes with a client certificate each (so the log tells them apart; Lease 15 s, renew
deadline 10 s: a 20 s pause outlasts both), and the project's RepairExecutor with
BundleRepair answering repair requests the way the agent would.

Each round, on fresh nodes:

1. **A node draining.** It turns ``False`` (``REBOOT``) with 4 running pods under a
   PodDisruptionBudget that lets one pod go at a time (there is no disruption controller
   here: this script sets the budget's ``disruptionsAllowed`` back to 1 every
   ``--refill-s``, 0.5 s). The pause starts once its first pod is evicted.
2. **A node turning bad during the pause.** Its ``False`` report is sent while the API
   server is frozen and retried until it lands, as an agent's would.
3. **After the thaw** the draining node is drained, rebooted and reported healthy again,
   the other quarantined and then reported healthy; the round ends when both episodes are
   closed and both nodes released (``--settle-s`` at most).

Counted per round from the audit log: Lease changes (``leaseTransitions``) across the
pause; episodes (NodeRemediations created) per node, goal exactly one; writes by a replica
after another took the Lease and before it took it back, goal zero; repair requests and
evictions of one pod written more than once, goal zero.

Run: ``.venv/bin/python bench/apiserver_pause.py [--rounds 20] [--pause-s 20]``
(``--workdir DIR`` keeps the logs, the audit log and results.json). Results:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.agent.repair import BundleRepair, RepairExecutor  # noqa: E402
from gpuguard.controller.loop import LEASE_NAME  # noqa: E402
from gpuguard.kube.rest import LEASES, KubeApi, load_api  # noqa: E402
from tests.chaos.conftest import (  # noqa: E402
    Replica,
    phase,
    pod_budget,
    released,
    running_pods,
    start_replica,
)
from tests.support.audit import (  # noqa: E402
    AuditLog,
    Write,
    episodes_created,
    evictions,
    repair_requests,
)
from tests.support.cluster import (  # noqa: E402
    finish_terminating_pods,
    install_crds,
    make_node,
    set_health,
    wait_for,
)
from tests.support.controllers import POOL, PROCESS_POLICY, tainted  # noqa: E402
from tests.support.controlplane import ControlPlane, testenv_bin  # noqa: E402

NAMESPACE = "gpuguard"  # the Lease, the pods and their budget
PODS = 4


@dataclass
class Round:
    index: int
    holder_before: str
    holder_after: str
    lease_changes: int
    episodes: dict[str, int]  # "drain" / "late": NodeRemediations created for the node
    stale_writes: list[str]
    duplicate_requests: int
    duplicate_evictions: int
    settled: bool
    seconds: float


class BudgetPacer:
    """Plays the disruption controller: each budget lets one pod go at a time (its
    ``disruptionsAllowed``, which an eviction takes to 0, is set back to 1 every
    ``every_s``)."""

    STATUS = {
        "observedGeneration": 1,
        "disruptionsAllowed": 1,
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "expectedPods": PODS,
    }

    def __init__(self, api: KubeApi, every_s: float) -> None:
        self.api, self.every_s = api, every_s
        self.paths: set[str] = set()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def add(self, path: str) -> None:
        self._refill(path)
        self.paths.add(path)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            for path in list(self.paths):
                with contextlib.suppress(Exception):  # gone, or the API server frozen
                    self._refill(path)

    def _refill(self, path: str) -> None:
        self.api.patch(f"{path}/status", {"status": self.STATUS})


def lease(api: KubeApi) -> tuple[str, int]:
    spec = api.get(LEASES.path(LEASE_NAME, namespace=NAMESPACE))["spec"]
    return str(spec.get("holderIdentity") or ""), int(spec.get("leaseTransitions") or 0)


def stale(writes: Iterable[Write], replicas: set[str]) -> list[Write]:
    """Writes by a replica received after another replica's Lease write taking the Lease
    had completed, and before its own next one."""
    writes = sorted(writes, key=lambda w: w.received)
    takes = [
        (w.completed, str((w.body.get("spec") or {}).get("holderIdentity") or ""))
        for w in writes
        if w.resource == "leases" and w.user in replicas and w.succeeded
    ]
    found = []
    for write in writes:
        if write.user not in replicas or write.resource == "leases":
            continue
        holders = [holder for completed, holder in takes if completed < write.received]
        if not holders or holders[-1] != write.user:
            found.append(write)
    return found


def publish_when_back(api: KubeApi, node: str) -> None:
    """The agent's report sent into the pause, retried until the API server takes it."""
    deadline = time.monotonic() + 300
    while True:
        try:
            set_health(api, node, gpu="False", action="NONE", codes=("CHECK_TIMED_OUT",))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def one_round(
    index: int,
    args: argparse.Namespace,
    plane: ControlPlane,
    api: KubeApi,
    pacer: BudgetPacer,
    replicas: list[Replica],
) -> Round:
    started = time.time()
    tag = uuid.uuid4().hex[:4]
    drain, late = f"pause-{index}-{tag}-drain", f"pause-{index}-{tag}-late"
    for node in (drain, late):
        make_node(api, node, labels={POOL: "h100"})
        set_health(api, node)
    running_pods(api, NAMESPACE, drain, PODS, app=drain)
    budget = pod_budget(api, NAMESPACE, drain, max_unavailable=1)
    pacer.add(budget)
    agent_api = load_api(plane.client_kubeconfig(f"agent-{drain}"))
    agent_stop = threading.Event()
    executor = RepairExecutor(
        agent_api, drain, BundleRepair(args.workdir / f"{drain}.repairs"), lambda *_: None
    )
    threading.Thread(target=executor.run, args=(agent_stop,), daemon=True).start()
    audit = AuditLog(plane.audit_log or Path())
    try:
        set_health(api, drain, gpu="False", action="REBOOT", codes=("NVLINK_DOWN",))
        wait_for(lambda: evictions(audit.writes(after=started)), 60, "the first eviction")
        holder_before, transitions_before = lease(api)

        os.kill(plane.apiserver_pid, signal.SIGSTOP)
        publisher = threading.Thread(target=publish_when_back, args=(api, late), daemon=True)
        publisher.start()
        time.sleep(args.pause_s)  # the fault itself, not a wait for state
        os.kill(plane.apiserver_pid, signal.SIGCONT)

        settled = settle(api, drain, late, publisher, args.settle_s)
        holder_after, transitions_after = lease(api)
    finally:
        agent_stop.set()
        pacer.paths.discard(budget)
    names = {r.name for r in replicas}
    writes = audit.writes(after=started)
    ours = [w for w in writes if w.user in names]
    requests = collections.Counter(w.name for w in repair_requests(ours, drain))
    evicted = collections.Counter(w.name for w in evictions(writes))
    everything = AuditLog(plane.audit_log or Path()).writes()
    late_writes = [w for w in stale(everything, names) if w.received > started]
    with contextlib.suppress(Exception):
        api.delete(budget)
        agent_api.close()
    return Round(
        index=index,
        holder_before=holder_before,
        holder_after=holder_after,
        lease_changes=transitions_after - transitions_before,
        episodes={
            "drain": len(episodes_created(ours, drain)),
            "late": len(episodes_created(ours, late)),
        },
        stale_writes=[
            f"{w.user} {w.verb} {w.resource}/{w.subresource} {w.name}" for w in late_writes
        ],
        duplicate_requests=sum(n - 1 for n in requests.values()),
        duplicate_evictions=sum(n - 1 for n in evicted.values()),
        settled=settled,
        seconds=time.time() - started,
    )


def settle(
    api: KubeApi, drain: str, late: str, publisher: threading.Thread, limit_s: float
) -> bool:
    """Play the agents after the thaw until both episodes are closed and both nodes
    released; False if that takes longer than ``limit_s``."""
    try:
        wait_for(lambda: phase(api, drain) == "Verifying", limit_s, "the drained node rebooted")
        set_health(api, drain)  # the fresh report after the reboot
        publisher.join(limit_s)
        wait_for(lambda: tainted(api, late) and phase(api, late), limit_s, "the late node")
        set_health(api, late)
        wait_for(lambda: released(api, drain) and released(api, late), limit_s, "both released")
    except AssertionError as exc:
        print(f"  round did not settle: {exc}", flush=True)
        return False
    return True


def table(rounds: list[Round]) -> str:
    head = (
        f"{'round':>5}  {'lease before -> after':<34} {'changes':>7}  {'episodes':>8}  "
        f"{'stale':>5}  {'dup req':>7}  {'dup evict':>9}  {'settled':>7}  {'s':>5}"
    )
    lines = [head]
    for r in rounds:
        lines.append(
            f"{r.index:>5}  {r.holder_before + ' -> ' + r.holder_after:<34} {r.lease_changes:>7}"
            f"  {r.episodes['drain']:>3} {r.episodes['late']:>3}  {len(r.stale_writes):>5}"
            f"  {r.duplicate_requests:>7}  {r.duplicate_evictions:>9}  {r.settled!s:>7}"
            f"  {r.seconds:>5.1f}"
        )
    not_one = sum(n != 1 for r in rounds for n in r.episodes.values())
    lines.append(
        f"total: {len(rounds)} rounds; the Lease changed hands in "
        f"{sum(r.lease_changes > 0 for r in rounds)}; nodes without exactly one episode: "
        f"{not_one} of {2 * len(rounds)}; stale writes: {sum(len(r.stale_writes) for r in rounds)}"
        f"; duplicate requests: {sum(r.duplicate_requests for r in rounds)}; duplicate "
        f"evictions: {sum(r.duplicate_evictions for r in rounds)}; unsettled rounds: "
        f"{sum(not r.settled for r in rounds)}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> list[Round]:
    plane = ControlPlane(args.workdir, testenv_bin(), audit=True)
    replicas: list[Replica] = []
    stop = threading.Event()
    plane.start()
    try:
        with load_api(plane.admin_kubeconfig) as api:
            install_crds(api)
            api.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            )
            threading.Thread(
                target=finish_terminating_pods, args=(api, NAMESPACE, stop), daemon=True
            ).start()
            policy = args.workdir / "policy.yaml"
            policy.write_text(json.dumps(PROCESS_POLICY))
            for name in ("controller-a", "controller-b"):
                replicas.append(start_replica(plane, name, NAMESPACE, policy, args.workdir))
            wait_for(lambda: lease(api)[0], 60, "a leader")
            pacer = BudgetPacer(api, args.refill_s)
            rounds = []
            for index in range(1, args.rounds + 1):
                rounds.append(one_round(index, args, plane, api, pacer, replicas))
                print(table(rounds).splitlines()[-2], flush=True)
                for replica in replicas:
                    if replica.proc.poll() is not None:
                        raise SystemExit(f"{replica.name} exited:\n{replica.output()[-2000:]}")
            pacer.stop.set()
    finally:
        stop.set()
        for replica in replicas:
            replica.stop()
        plane.stop()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pause-s", type=float, default=20.0)
    parser.add_argument("--refill-s", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=90.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="apiserver-pause-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {args.workdir}", flush=True)
    rounds = run(args)
    (args.workdir / "results.json").write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    print(table(rounds))
    for r in rounds:
        for line in r.stale_writes:
            print(f"  round {r.index} stale write: {line}")


if __name__ == "__main__":
    main()
