"""``gpuguard controller`` starting on 100,000 Nodes: time to ready and memory.

This machine cannot hold 100,000 Nodes in a real etcd and kube-apiserver beside the
controller (2 cores), so the list is recorded from the real API server and served back
on loopback, 100,000 strong:

1. **Record.** A real kube-apiserver (``tests/support/controlplane.py``) is given
   ``--record`` Nodes built as ``controller_scale.py`` builds them (a kubelet's and the
   gpuguard agent's, ~40 container images each), and one page of ``GET /api/v1/nodes`` is
   kept as the server sent it (uid, resourceVersion, managedFields and all; re-encoded as
   compact JSON in the same field order).
   The control plane is then stopped.
2. **Serve.** A loopback HTTP server answers the controller's requests: Node list pages of
   the size it asks for, each item a recorded Node with its name and uid renumbered (a
   byte substitution in the recorded bytes), ``continue`` tokens and
   ``remainingItemCount`` as kube-apiserver gives them; empty lists for NodeRemediations,
   Pods and Jobs; watches held open with nothing to say (a quiet fleet); the Lease as
   the coordination API answers a first campaign (404, then 201 on create, 200 on update);
   Events accepted (201) and counted by reason; anything else 404, counted and printed.
3. **Measure.** ``gpuguard controller`` starts on that server (the real binary and
   kubeconfig path); start to ``/readyz`` (the Node cache filled) and to the first
   reconcile, then VmRSS and VmHWM, and CPU seconds used until ready.

Run: ``.venv/bin/python bench/controller_start.py [--nodes 100000]``. Results:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controller_scale as scale

from tests.support.controlplane import ControlPlane, free_port, testenv_bin

LIST_VERSION = "424242"


def record(count: int, images: int, workdir: Path) -> list[bytes]:
    """``count`` Nodes as kube-apiserver serves them in a list page, one bytes each."""
    plane = ControlPlane(workdir / "plane", testenv_bin())
    plane.start()
    clients = scale.Clients(plane.admin_kubeconfig)
    try:
        api = clients.get()
        for i in range(count):
            api.create("/api/v1/nodes", scale.node_body(i, images))
        items = plane.request("GET", f"/api/v1/nodes?limit={count}")["items"]
    finally:
        clients.close()
        plane.stop()
    return [json.dumps(item, separators=(",", ":")).encode() for item in items]


class Fleet:
    """Recorded Nodes, renumbered: item ``i`` is recording ``i % len`` named ``gpu-<i>``."""

    def __init__(self, recorded: list[bytes], nodes: int) -> None:
        self.nodes = nodes
        self.templates = []
        for i, item in enumerate(recorded):
            meta = json.loads(item)["metadata"]
            name, uid = meta["name"].encode(), meta["uid"].encode()
            assert name == scale.node_name(i).encode()
            self.templates.append(item.replace(name, b"@NAME@").replace(uid, b"@UID@"))

    def item(self, i: int) -> bytes:
        template = self.templates[i % len(self.templates)]
        uid = f"00000000-0000-4000-8000-{i:012d}".encode()
        return template.replace(b"@NAME@", f"gpu-{i:06d}".encode()).replace(b"@UID@", uid)

    def page(self, start: int, limit: int) -> bytes:
        end = min(self.nodes, start + limit) if limit else self.nodes
        meta: dict[str, object] = {"resourceVersion": LIST_VERSION}
        if end < self.nodes:
            meta["continue"] = str(end)
            meta["remainingItemCount"] = self.nodes - end
        head = json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": meta})
        items = b",".join(self.item(i) for i in range(start, end))
        return head[:-1].encode() + b',"items":[' + items + b"]}"


def empty_list(kind: str) -> bytes:
    meta = {"resourceVersion": LIST_VERSION}
    return json.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": []}).encode()


def not_found(path: str) -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound"}
    return json.dumps({**status, "message": f"{path} not found", "code": 404}).encode()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.unknown: Counter[str] = Counter()
        self.events: Counter[str] = Counter()  # Events the controller gave, by reason
        self.lease: bytes | None = None
        self.closing = threading.Event()
        self.pages = 0
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, *_: object) -> None:
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _hold_watch(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self.server.closing.wait()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if query.get("watch") in ("1", "true"):
            self._hold_watch()
        elif url.path == "/api/v1/nodes":
            self.server.pages += 1
            start = int(query.get("continue") or 0)
            self._send(200, self.server.fleet.page(start, int(query.get("limit") or 0)))
        elif re.fullmatch(r"/apis?/.*/(noderemediations|pods|jobs)", url.path):
            self._send(200, empty_list("List"))
        elif url.path.endswith("/leases/" + scale.NAMESPACE + "-controller") and self.server.lease:
            self._send(200, self.server.lease)
        else:
            if "/leases/" not in url.path:
                self.server.unknown[f"GET {url.path}"] += 1
            self._send(404, not_found(url.path))

    def _store_lease(self, code: int) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if body.get("kind") != "Lease":
            self.server.unknown[f"{self.command} {urlsplit(self.path).path}"] += 1
            self._send(404, not_found(self.path))
            return
        body.setdefault("metadata", {})["resourceVersion"] = str(time.monotonic_ns())
        self.server.lease = json.dumps(body).encode()
        self._send(code, self.server.lease)

    def do_POST(self) -> None:
        if urlsplit(self.path).path.endswith("/events"):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.server.events[str(body.get("reason"))] += 1
            self._send(201, json.dumps(body).encode())
            return
        self._store_lease(201)

    def do_PUT(self) -> None:
        self._store_lease(200)


def kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "b", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "b", "user": {"token": "bench"}}],
                "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
                "current-context": "b",
            }
        )
    )
    return path


def start(args: argparse.Namespace, server: Server, workdir: Path) -> dict[str, float]:
    policy = workdir / "policy.yaml"
    policy.write_text(scale.POLICY)
    metrics = free_port()
    config = kubeconfig(workdir / "kubeconfig", server.server_address[1])
    log = (workdir / "controller.log").open("wb")
    argv = [
        f"--kubeconfig={config}",
        f"--policy={policy}",
        f"--namespace={scale.NAMESPACE}",
        "--identity=bench-controller",
        "--provider=delete-node",
        f"--metrics-port={metrics}",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(args.gpuguard), "controller", *argv], stdout=log, stderr=subprocess.STDOUT
    )
    controller = scale.ControllerProcess(proc, metrics, workdir / "controller.log")
    try:
        found: dict[str, float] = {}
        scale.wait_until(lambda: controller.check_alive() or controller.ready(), 600, "ready")
        found["ready_s"] = time.monotonic() - started
        found["cpu_to_ready_s"] = controller.cpu_seconds()
        found["rss_ready_mib"], found["hwm_ready_mib"] = controller.memory_mib()
        scale.wait_until(
            lambda: controller.scrape().get(scale.RECONCILES, 0) > 0, 600, "first reconcile"
        )
        found["first_reconcile_s"] = time.monotonic() - started
        time.sleep(args.settle_s)
        found["rss_settled_mib"], found["hwm_settled_mib"] = controller.memory_mib()
        return found
    finally:
        controller.stop()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--record", type=int, default=50, help="Nodes recorded from the API")
    parser.add_argument("--images", type=int, default=40, help="container images per Node")
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--gpuguard",
        type=Path,
        default=scale.GPUGUARD,
        help="the gpuguard to start (another checkout's, to compare)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-controller-start-"))
    try:
        recorded = record(args.record, args.images, workdir)
        fleet = Fleet(recorded, args.nodes)
        size = sum(len(fleet.item(i)) for i in range(len(recorded))) / len(recorded)
        print(f"recorded {len(recorded)} Nodes, {size / 1024:.1f} KiB each as served")
        server = Server(fleet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        runs = []
        for run in range(args.runs):
            found = start(args, server, workdir)
            runs.append(found)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()))
        server.closing.set()
        server.shutdown()
        print(
            f"list pages served: {server.pages}; Events: {dict(server.events)}; "
            f"unknown requests: {dict(server.unknown)}"
        )
        for key in runs[0]:
            values = sorted(r[key] for r in runs)
            print(f"{key:<20} median {values[len(values) // 2]:8.1f}  (runs: {values})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
