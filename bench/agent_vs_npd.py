"""The gpuguard agent next to node-problem-detector: a kernel-log Xid to a Node condition.

Both run as the real programs, side by side, against one local kube-apiserver (etcd and
kube-apiserver from ``hack/testenv``, started by ``tests/support/controlplane.py``), and
follow the SAME log file, each publishing to its own Node:

- ``gpuguard agent --bundle`` on Node ``node-gpuguard``: a copy of examples/healthy-h100
  whose ``kmsg.log`` is the shared log. Condition ``GpuguardGPUHealthy``; an Xid 79 makes
  it ``False`` with reason ``Xid79``.
- ``node-problem-detector`` (built by ``hack/testenv npd``) on Node ``node-npd``, with
  one system-log monitor, bench/npd/xid-monitor.json: NPD's ``filelog`` reader on the
  shared log and one permanent rule per Xid used here. Condition ``XidError``; an Xid 79
  makes it ``True`` with reason ``Xid79``.

The log is syslog-style (``Nov 29 19:00:00 host kernel: [  5.10] NVRM: ...``), which NPD's
filelog config parses and gpuguard reads through (it finds NVRM lines anywhere in a line).

One iteration:

1. A new boot: a new ``boot_id`` in the bundle, and the log rotated the way logrotate does
   it (renamed away, a fresh file with the example's boot lines created in its place).
   gpuguard starts over on a new file and goes back to healthy; NPD reopens the new file.
2. A random pause of 0.6-1.6 s, so the write lands at a random phase of both agents'
   timers (gpuguard reads the file when inotify says it changed, a version before
   2026-12-04 polled it every 100 ms; NPD polls it every 500 ms at end of file and writes
   conditions on a 1 s tick).
3. One real Xid line is appended (the code cycles through 79, 48, 119) and the time is
   taken when the write returns.
4. Both Nodes are watched (one ``watch`` on the Node list, timestamped as each event
   arrives) until gpuguard's condition says ``False``/``Xid<code>`` and NPD's says
   ``True``/``Xid<code>``. Latency = arrival of that watch event - time of the write.

NPD keeps a permanent condition until it restarts: nothing in its log can clear it. So
instead of restarting it (which would time its start-up, not its detection), each
iteration's Xid differs from the last, and NPD's rule for it changes the condition's
reason; NPD counts that as a condition change, and it takes the same path as a first
failure (read the line, match the rule, next 1 s sync). NPD is left running; both agents
are measured in steady state on every iteration.

Then, with nothing written to the log, each agent's CPU (utime+stime from
``/proc/PID/stat``) is measured over a quiet window as a percentage of one core, and its
resident memory (``VmRSS``, and the peak ``VmHWM``) is read from ``/proc/PID/status``.
Both keep their metrics endpoints on (free local ports), as deployed. gpuguard's
NodeRemediation CRD is installed, as the chart does: without it the agent's watch of its
repair requests is refused and it reads them every 2 s instead (runs before 2026-12-04's
last did that, which was about half of the agent's idle CPU).

Run: ``.venv/bin/python bench/agent_vs_npd.py [--iterations 50] [--quiet-s 60]
[--gpuguard PATH]`` (the agent's program; its ``PYTHONPATH`` picks the sources); needs Go
and the Go module proxy the first time (``hack/testenv npd`` builds NPD, ~5 min cold).
Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.config import CHECK_NAMES  # noqa: E402
from gpuguard.kube.rest import load_api  # noqa: E402
from tests.support.cluster import install_gpuguard_crd  # noqa: E402
from tests.support.controlplane import ControlPlane, free_port  # noqa: E402

EXAMPLE = REPO / "examples" / "healthy-h100"
NPD_CONFIG = REPO / "bench" / "npd" / "xid-monitor.json"
GPUGUARD = REPO / ".venv" / "bin" / "gpuguard"

GPUGUARD_NODE, NPD_NODE = "node-gpuguard", "node-npd"
GPUGUARD_TYPE, NPD_TYPE = "GpuguardGPUHealthy", "XidError"
# Real lines from tests/data, all on the example bundle's GPU (0000:91:00).
XID_LINES = {
    79: "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.",
    48: "NVRM: Xid (PCI:0000:91:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
    "0x12bac1c3e0 partition 2, subpartition 1.",
    119: "NVRM: Xid (PCI:0000:91:00): 119, pid=1240590, name=gpud, Timeout after 6s of waiting "
    "for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).",
}
CODES = (79, 48, 119)
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
WAIT_S = 15.0


# --- the shared log -----------------------------------------------------------------------
class SharedLog:
    """The kernel log both agents follow, written the way syslog writes kern.log."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.path = bundle / "kmsg.log"
        self.boot_lines = EXAMPLE.joinpath("kmsg.log").read_text().splitlines()
        self.started = time.monotonic()

    @staticmethod
    def stamp() -> str:
        now = time.localtime()  # NPD parses "Jan _2 15:04:05" in local time too
        clock = f"{now.tm_hour:02d}:{now.tm_min:02d}:{now.tm_sec:02d}"
        return f"{MONTHS[now.tm_mon - 1]} {now.tm_mday:2d} {clock}"

    def syslog(self, dmesg_line: str) -> str:
        return f"{self.stamp()} gpu-node-1 kernel: {dmesg_line}\n"

    def new_boot(self) -> None:
        """New boot id; the old log renamed away and a fresh one created (as logrotate)."""
        (self.bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        fresh = "".join(self.syslog(line) for line in self.boot_lines)
        if self.path.exists():
            self.path.rename(self.path.with_name("kmsg.log.1"))
        tmp = self.path.with_name("kmsg.log.tmp")
        tmp.write_text(fresh)
        tmp.rename(self.path)
        self.started = time.monotonic()

    def append_xid(self, code: int) -> float:
        """Append one Xid line; returns the monotonic time when the write returned."""
        uptime = 600 + time.monotonic() - self.started
        line = self.syslog(f"[{uptime:12.6f}] {XID_LINES[code]}")
        with self.path.open("a") as handle:
            handle.write(line)
        return time.monotonic()


# --- watching both Nodes ------------------------------------------------------------------
@dataclass
class Seen:
    status: str
    reason: str
    since: float  # monotonic arrival of the watch event that brought this (status, reason)


@dataclass
class NodeWatch:
    """One watch on the Node list; remembers when each condition last changed."""

    plane: ControlPlane
    state: dict[tuple[str, str], Seen] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> None:
        threading.Thread(target=self._run, name="node-watch", daemon=True).start()

    def _run(self) -> None:
        context = self.plane.ssl_context()
        while True:  # the API server ends a watch after timeoutSeconds; start another
            url = f"{self.plane.url}/api/v1/nodes?watch=1&timeoutSeconds=1800"
            try:
                with urllib.request.urlopen(url, context=context, timeout=None) as stream:
                    for raw in stream:
                        self._take(json.loads(raw), time.monotonic())
            except OSError:
                time.sleep(0.1)

    def _take(self, event: dict, arrived: float) -> None:
        node = event["object"]
        name = node["metadata"]["name"]
        with self.changed:
            for condition in node.get("status", {}).get("conditions", []):
                key = (name, condition["type"])
                status, reason = condition["status"], condition.get("reason", "")
                old = self.state.get(key)
                if old is None or (old.status, old.reason) != (status, reason):
                    self.state[key] = Seen(status, reason, arrived)
            self.changed.notify_all()

    def wait(self, node: str, kind: str, status: str, reason: str | None = None) -> float:
        """Block until the condition says ``status`` (and ``reason``); its arrival time."""

        def matches() -> bool:
            seen = self.state.get((node, kind))
            return (
                seen is not None
                and seen.status == status
                and (reason is None or seen.reason == reason)
            )

        with self.changed:
            if not self.changed.wait_for(matches, timeout=WAIT_S):
                seen = self.state.get((node, kind))
                raise TimeoutError(
                    f"{node} {kind}: wanted {status}/{reason}, have "
                    f"{(seen.status, seen.reason) if seen else None} after {WAIT_S}s"
                )
            return self.state[(node, kind)].since


# --- the processes ------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def testenv_bin_with_npd() -> Path:
    proc = subprocess.run(
        [str(REPO / "hack" / "testenv"), "npd"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"hack/testenv npd failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def version_of(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "?"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


# --- the benchmark ------------------------------------------------------------------------
@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    latencies: list[float] = field(default_factory=list)
    active_cpu_pct: float = 0.0
    quiet_cpu_pct: float = 0.0
    rss_mib: float = 0.0
    hwm_mib: float = 0.0

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            sys.exit(f"{self.name} exited with {self.proc.returncode}:\n{tail}")


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (``statistics.quantiles`` inclusive)."""
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(q * 100) - 1]


def run(
    iterations: int,
    quiet_s: float,
    workdir: Path,
    *,
    like_npd: bool = False,
    program: Path = GPUGUARD,
) -> None:
    bin_dir = testenv_bin_with_npd()
    npd_bin = bin_dir / "node-problem-detector"
    plane = ControlPlane(workdir, bin_dir)
    plane.start()
    agents: list[Agent] = []
    try:
        with load_api(plane.admin_kubeconfig) as api:
            install_gpuguard_crd(api)  # as the chart does: the agent watches its requests
        for name in (GPUGUARD_NODE, NPD_NODE):
            plane.request(
                "POST",
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
            )
        watch = NodeWatch(plane)
        watch.start()

        bundle = workdir / "bundle"
        shutil.copytree(EXAMPLE, bundle)
        shared = SharedLog(bundle)
        shared.new_boot()

        config = workdir / "gpuguard.yaml"
        text = f"metrics_port: {free_port()}\n"
        if like_npd:  # the other checks once at start, then hourly: the kernel log alone
            hourly = {name: 3600 for name in CHECK_NAMES if name != "kernel-log"}
            text += f"check_intervals: {json.dumps(hourly)}\n"
        config.write_text(text)
        npd_config = json.loads(NPD_CONFIG.read_text())
        npd_config["logPath"] = str(shared.path)
        npd_config_path = workdir / "xid-monitor.json"
        npd_config_path.write_text(json.dumps(npd_config, indent=2))
        override = f"{plane.url}?inClusterConfig=false&auth={plane.admin_kubeconfig}"

        gpuguard = Agent(
            "gpuguard agent",
            start(
                [
                    str(program),
                    "agent",
                    f"--node-name={GPUGUARD_NODE}",
                    f"--kubeconfig={plane.admin_kubeconfig}",
                    f"--bundle={bundle}",
                    f"--config={config}",
                ],
                workdir / "gpuguard.log",
            ),
            workdir / "gpuguard.log",
        )
        npd = Agent(
            "node-problem-detector",
            start(
                [
                    str(npd_bin),
                    f"--config.system-log-monitor={npd_config_path}",
                    f"--apiserver-override={override}",
                    f"--hostname-override={NPD_NODE}",
                    "--address=127.0.0.1",
                    f"--port={free_port()}",
                    "--prometheus-address=127.0.0.1",
                    f"--prometheus-port={free_port()}",
                ],
                workdir / "npd.log",
            ),
            workdir / "npd.log",
        )
        agents = [gpuguard, npd]

        # Both have published their first, healthy, conditions.
        watch.wait(GPUGUARD_NODE, GPUGUARD_TYPE, "True")
        watch.wait(NPD_NODE, NPD_TYPE, "False")
        time.sleep(3)  # let start-up settle before timing anything

        rng = random.Random(7)
        cpu0 = {a.name: cpu_seconds(a.proc.pid) for a in agents}
        active_started = time.monotonic()
        for i in range(iterations):
            code = CODES[i % len(CODES)]
            shared.new_boot()
            watch.wait(GPUGUARD_NODE, GPUGUARD_TYPE, "True")
            time.sleep(rng.uniform(0.6, 1.6))
            written = shared.append_xid(code)
            for agent, node, kind, status in (
                (gpuguard, GPUGUARD_NODE, GPUGUARD_TYPE, "False"),
                (npd, NPD_NODE, NPD_TYPE, "True"),
            ):
                agent.check_alive()
                agent.latencies.append(watch.wait(node, kind, status, f"Xid{code}") - written)
            print(
                f"  {i + 1:3d}/{iterations} Xid {code:<3d} gpuguard "
                f"{gpuguard.latencies[-1] * 1000:6.0f} ms   npd {npd.latencies[-1] * 1000:6.0f} ms",
                flush=True,
            )
        active_s = time.monotonic() - active_started
        for agent in agents:
            used = cpu_seconds(agent.proc.pid) - cpu0[agent.name]
            agent.active_cpu_pct = 100 * used / active_s

        print(f"  quiet window: {quiet_s:.0f} s with nothing written", flush=True)
        time.sleep(5)
        cpu0 = {a.name: cpu_seconds(a.proc.pid) for a in agents}
        quiet_started = time.monotonic()
        time.sleep(quiet_s)
        quiet = time.monotonic() - quiet_started
        for agent in agents:
            agent.check_alive()
            agent.quiet_cpu_pct = 100 * (cpu_seconds(agent.proc.pid) - cpu0[agent.name]) / quiet
            agent.rss_mib, agent.hwm_mib = memory_mib(agent.proc.pid)

        report(agents, iterations, bin_dir, npd_bin)
    finally:
        for agent in agents:
            stop(agent.proc)
        plane.stop()


def report(agents: list[Agent], iterations: int, bin_dir: Path, npd_bin: Path) -> None:
    print()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, {iterations} iterations")
    print(f"gpuguard {importlib.metadata.version('gpuguard')}")
    print(f"node-problem-detector {version_of([str(npd_bin), '--version'])}")
    # Built from source, kube-apiserver reports v0.0.0; hack/testenv names the version.
    print(f"kube-apiserver, etcd, helm: {bin_dir.name}")
    go = shutil.which("go")
    if go:
        print(f"built with {version_of([go, 'version', str(npd_bin)]).split(': ', 1)[-1]}")
    print()
    header = (
        f"{'agent':<23}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'min ms':>8}"
        f"{'RSS MiB':>9}{'peak MiB':>10}{'CPU quiet':>11}{'CPU active':>12}"
    )
    print(header)
    for agent in agents:
        ms = [s * 1000 for s in agent.latencies]
        print(
            f"{agent.name:<23}{statistics.median(ms):>8.0f}{quantile(ms, 0.99):>8.0f}"
            f"{max(ms):>8.0f}{min(ms):>8.0f}{agent.rss_mib:>9.1f}{agent.hwm_mib:>10.1f}"
            f"{agent.quiet_cpu_pct:>10.2f}%{agent.active_cpu_pct:>11.2f}%"
        )
    print()
    print("latency: Xid line written -> Node condition change seen on a watch")
    print("CPU: % of one core (quiet: nothing written; active: during the iterations)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--quiet-s", type=float, default=60.0, help="CPU window, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument(
        "--like-npd",
        action="store_true",
        help="the agent's other checks hourly (after the first round): the kernel log alone, "
        "the one job this NPD is given",
    )
    parser.add_argument(
        "--gpuguard",
        type=Path,
        default=GPUGUARD,
        help="the gpuguard program to run (default: the repository's .venv/bin/gpuguard)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-vs-npd-"))
    try:
        run(args.iterations, args.quiet_s, workdir, like_npd=args.like_npd, program=args.gpuguard)
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
