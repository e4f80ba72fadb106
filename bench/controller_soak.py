"""``gpuguard controller`` soaked: a fleet at steady heartbeat load for an hour, its memory
sampled throughout, single flips under the load, and 300 flips at once at the end.

The same real parts as ``controller_scale.py`` (whose fleet, controller process, watches
and writers this reuses): a local etcd + kube-apiserver, the real ``gpuguard controller``
subprocess, Node objects as a kubelet and the agent leave them.

Method
------

1. ``--nodes`` Nodes are created and the controller starts on them (ready and first
   reconcile timed, then the idle window, as in ``controller_scale.py``).
2. For ``--soak-s`` seconds every node heartbeats, as its agent would, at ``--heartbeats``
   Node writes a second in all (default 2 N / 180: the agents' 180 s heartbeat on N nodes;
   a node between its flip and its healing is skipped: its agent reports the fault), and every
   ``--flip-every-s`` one node (a new one each time) flips as the agent writes a GPU
   fault; the latency is the flip's condition write returning to our taint arriving on a
   Node watch. ``--heal-after-s`` later the node reports healthy again, as the agent
   does when the fault clears, so episodes open and close all hour long.
3. Every ``--sample-s`` the controller's VmRSS is read. Growth = the last sample over the
   sample at ``--warm-s`` (10 minutes): the goal is at most 5 %.
4. Then ``--flip`` nodes flip at once (heartbeats stopped), as in ``controller_scale.py``.

``--plot FILE`` writes the RSS curve as an SVG (docs/img/controller-soak-rss.svg).
Run: ``.venv/bin/python bench/controller_soak.py [--nodes 20000] [--soak-s 3600]``.
Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controller_scale as scale

from gpuguard.kube.rest import KubeApi
from gpuguard.sim import svg
from tests.support.cluster import install_crds
from tests.support.controlplane import ControlPlane, testenv_bin


@dataclass
class Soak:
    rss: list[tuple[float, float]] = field(default_factory=list)  # (s since soak start, MiB)
    # Beside each RSS sample: open episodes and silent agents (what memory may rightly hold)
    episodes: list[tuple[float, float, float]] = field(default_factory=list)
    flips_ms: list[float] = field(default_factory=list)
    tainted_before: int = 0  # flipped nodes already tainted (by silence, say): not timed
    heartbeat_rate: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)


def heal(api: KubeApi, name: str) -> None:
    """What the agent writes once the GPU passes its checks again."""
    now = scale._rfc3339(time.time())
    condition = {
        "type": scale.GPU_CONDITION,
        "status": "True",
        "reason": "Healthy",
        "message": "gpuguard: gpu checks pass",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    api.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [condition]}}, "strategic")
    report = scale.healthy_report(time.time())
    api.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": {scale.REPORT: report}}})


def flips_under_load(
    args: argparse.Namespace,
    api: KubeApi,
    names: list[str],
    tainted: scale.FirstSeen,
    controller: scale.ControllerProcess,
    soak: Soak,
    stop: threading.Event,
    busy: set[str],
) -> None:
    rng = random.Random(7)
    healing: list[tuple[float, str]] = []
    for i, name in enumerate(names):
        if stop.wait(args.flip_every_s * rng.uniform(0.5, 1.5)):
            break
        busy.add(name)
        written = scale.flip(api, name, code="XID_48", action="RESET_GPU", reason="Xid48")
        tainted.wait_all([name], 60)
        if tainted.times[name] < written - 1.0:
            soak.tainted_before += 1
        else:
            soak.flips_ms.append(1000 * (tainted.times[name] - written))
        healing.append((time.monotonic() + args.heal_after_s, name))
        while healing and healing[0][0] <= time.monotonic():
            healed = healing.pop(0)[1]
            heal(api, healed)
            busy.discard(healed)
        controller.check_alive()
        if (i + 1) % 25 == 0:
            print(f"  {i + 1} flips: last {soak.flips_ms[-1]:.0f} ms", flush=True)


def soak_phase(
    args: argparse.Namespace,
    clients: scale.Clients,
    plane: ControlPlane,
    controller: scale.ControllerProcess,
    flippers: list[str],
    everyone: list[str],
    tainted: scale.FirstSeen,
) -> Soak:
    soak, stop, busy = Soak(), threading.Event(), set[str]()
    print(
        f"soak: {args.soak_s:.0f} s, {args.heartbeats:.0f} heartbeat writes/s, a flip every "
        f"~{args.flip_every_s:.0f} s",
        flush=True,
    )
    meter, started = scale.CpuMeter(plane, controller), time.monotonic()
    flipper = threading.Thread(
        target=flips_under_load,
        args=(args, clients.get(), flippers, tainted, controller, soak, stop, busy),
        daemon=True,
    )
    with scale.Heartbeats(clients, everyone, args.heartbeats, busy, args.writers) as beats:
        flipper.start()
        while (elapsed := time.monotonic() - started) < args.soak_s:
            controller.check_alive()
            rss, _ = controller.memory_mib()
            soak.rss.append((elapsed, rss))
            opened, silent = open_episodes(controller)
            soak.episodes.append((elapsed, opened, silent))
            if len(soak.rss) % 10 == 1:
                print(
                    f"  {elapsed:6.0f} s: RSS {rss:.1f} MiB, {opened:.0f} open episodes, "
                    f"{silent:.0f} silent agents",
                    flush=True,
                )
            time.sleep(min(args.sample_s, max(0.0, args.soak_s - elapsed)))
        stop.set()
        flipper.join(120)
    soak.heartbeat_rate = beats.achieved
    soak.cpu = meter.percent()
    rss, _ = controller.memory_mib()
    soak.rss.append((time.monotonic() - started, rss))
    return soak


def open_episodes(controller: scale.ControllerProcess) -> tuple[float, float]:
    """(open episodes, silent agents) as the controller's metrics say."""
    metrics = controller.scrape()
    opened = sum(v for k, v in metrics.items() if k.startswith("gpuguard_controller_nodes{"))
    return opened, metrics.get("gpuguard_controller_silent_agents", 0.0)


def growth(soak: Soak, warm_s: float) -> tuple[float, float, float]:
    """(RSS at ``warm_s``, at the end, growth in %)."""
    warm = next((rss for t, rss in soak.rss if t >= warm_s), soak.rss[0][1])
    end = soak.rss[-1][1]
    return warm, end, 100 * (end - warm) / warm


def plot(path: Path, soak: Soak, nodes: int, warm_s: float) -> None:
    minutes = [(t / 60, rss) for t, rss in soak.rss]
    warm, end, grew = growth(soak, warm_s)
    title = f"gpuguard controller RSS, {nodes:,} Nodes, {soak.heartbeat_rate:.0f} heartbeats/s"
    body = [svg.text(20, 24, title, size=14)]
    body += svg.line_chart(
        (60, 40, 620, 260),
        {"VmRSS (MiB)": minutes},
        lambda y: f"{y:.0f}",
        lambda x: f"{x:.0f} min",
    )
    note = f"after {warm_s / 60:.0f} min {warm:.1f} MiB, end {end:.1f} MiB: {grew:+.1f} %"
    body.append(svg.text(60, 330, note))
    path.write_text(svg.document(body, title, 720, 350))


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    order = list(range(args.nodes))
    random.Random(1).shuffle(order)
    flips_at_most = int(args.soak_s / args.flip_every_s * 1.6) + 10
    if flips_at_most + args.flip >= args.nodes:
        sys.exit("--nodes must exceed the nodes the soak and the mass flip flip")
    take = iter(order)
    flippers = [scale.node_name(next(take)) for _ in range(flips_at_most)]
    masses = [scale.node_name(next(take)) for _ in range(args.flip)]
    everyone = [scale.node_name(i) for i in range(args.nodes)]
    plane = ControlPlane(workdir, testenv_bin())
    plane.start()
    clients = scale.Clients(plane.admin_kubeconfig)
    controller = None
    results = scale.Results(nodes=args.nodes)
    try:
        api = clients.get()
        install_crds(api)
        api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": scale.NAMESPACE}},
        )
        scale.create_fleet(args, plane, clients, results)
        tainted = scale.FirstSeen()

        def on_node(event: dict[str, Any], arrived: float) -> None:
            if scale.is_tainted(event["object"]):
                tainted.mark(event["object"]["metadata"]["name"], arrived)

        scale.Watch(plane, "/api/v1/nodes", scale.TAINT, on_node)
        controller = scale.start_controller(plane, workdir, None)
        scale.settle(args, controller, results)
        soak = soak_phase(args, clients, plane, controller, flippers, everyone, tainted)
        time.sleep(2)
        scale.mass_flip(args, clients, masses, tainted, results)
        results.end_rss, results.end_hwm = controller.memory_mib()
        controller.check_alive()
        if args.plot:
            plot(args.plot, soak, args.nodes, args.warm_s)
        warm, end, grew = growth(soak, args.warm_s)
        return {
            "nodes": args.nodes,
            "ready_s": results.ready_s,
            "first_reconcile_s": results.first_reconcile_s,
            "steady_rss_mib": results.steady_rss,
            "soak_s": args.soak_s,
            "heartbeats_per_s": soak.heartbeat_rate,
            "soak_cpu_pct": soak.cpu,
            "rss_warm_mib": warm,
            "rss_end_mib": end,
            "rss_growth_pct": grew,
            "flips": len(soak.flips_ms),
            "flipped_nodes_tainted_before": soak.tainted_before,
            "flips_p50_ms": statistics.median(soak.flips_ms),
            "flips_p99_ms": scale.quantile(soak.flips_ms, 0.99),
            "flips_max_ms": max(soak.flips_ms),
            "mass": len(results.mass_ms),
            "mass_p50_ms": statistics.median(results.mass_ms),
            "mass_p99_ms": scale.quantile(results.mass_ms, 0.99),
            "end_rss_mib": results.end_rss,
            "end_hwm_mib": results.end_hwm,
            "rss": soak.rss,
            "most_open_episodes": max((e[1] for e in soak.episodes), default=0.0),
            "most_silent_agents": max((e[2] for e in soak.episodes), default=0.0),
            "episodes": soak.episodes,
        }
    finally:
        if controller is not None:
            controller.stop()
        clients.close()
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--soak-s", type=float, default=3600.0)
    parser.add_argument("--warm-s", type=float, default=600.0, help="growth is counted from")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--flip-every-s", type=float, default=10.0)
    parser.add_argument("--heal-after-s", type=float, default=30.0)
    parser.add_argument("--flip", type=int, default=300, help="nodes flipped at once at the end")
    parser.add_argument("--heartbeats", type=float, help="default: 2 x nodes / 180")
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--threads", type=int, default=16, help="writers creating the fleet")
    parser.add_argument("--writers", type=int, default=8, help="heartbeat writers")
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--quiet-s", type=float, default=20.0)
    parser.add_argument("--plot", type=Path, help="write the RSS curve as an SVG here")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if args.heartbeats is None:
        args.heartbeats = 2 * args.nodes / 180
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-controller-soak-"))
    try:
        found = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    for key, value in found.items():
        if isinstance(value, list):
            continue  # the samples: in --json
        print(f"{key:<22} {value:.1f}" if isinstance(value, float) else f"{key:<22} {value}")


if __name__ == "__main__":
    main()
