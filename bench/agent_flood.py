"""The agent under a hostile kernel log: peak memory, and an Xid 79 behind a flood.

Two revisions side by side in one run: this working tree's ``src`` and a baseline
(``--baseline``, default ``9d93b22``, before the kernel log was bounded), exported with
``git archive`` into a temporary directory and run with ``PYTHONPATH`` pointing at it.
Everything is real: one local etcd + kube-apiserver (``hack/testenv``, started by
``tests/support/controlplane.py``), and ``gpuguard agent --bundle`` as its own process on
a copy of examples/healthy-h100, whose ``kmsg.log`` is the followed kernel log.

The cases are chaos_findings.md rows 39-42:

- ``xid13``: ``--lines`` (1,000,000) Xid 13 lines written over ``--seconds`` (10 s), in
  100 paced batches; then one Xid 79 line.
- ``xid48``: the same with Xid 48 (on another GPU address), then the Xid 79.
- ``200MB-no-newline``: 200 MB of junk with no newline, as fast as it can be written;
  then a newline and the Xid 79.
- ``10MB-line-xid79``: one 10 MB line of junk whose end is an Xid 79 line.

Peak RSS is the agent's ``VmHWM`` (``/proc/PID/status``; the kernel's own peak, every
page counted), read after the Xid 79 was seen. Latency = from the moment the write of
the Xid 79 returned to the moment a poll of the Node (every 20 ms) shows
``GpuguardGPUHealthy`` ``False``/``Xid79``; it includes catching up with the flood. The
chart's limit is ``resources.limits.memory: 128Mi``; the agent idles at about 57 MiB.

Run: ``.venv/bin/python bench/agent_flood.py [--baseline REV] [--lines N] [--seconds S]
[--cases xid13,...]``. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.controlplane import ControlPlane, testenv_bin  # noqa: E402

EXAMPLE = REPO / "examples" / "healthy-h100"
GPU = "GpuguardGPUHealthy"
XID79 = (
    b"[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
    b"GPU has fallen off the bus.\n"
)
FLOOD = {
    "xid13": "NVRM: Xid (PCI:0000:91:00): 13, pid=4242, name=python, Graphics Exception: "
    "ESR 0x514648=0x1000e 0x514650=0x0 0x514644=0xd3eff2 0x51464c=0x17f",
    "xid48": "NVRM: Xid (PCI:0000:38:00): 48, pid=4242, name=python, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
}
LATENCY_TIMEOUT_S = 180.0


@dataclass
class Result:
    peak_mib: float
    latency_s: float | None


def flood(code: str, lines: int, seconds: float) -> Callable[[Path], float]:
    def write(log: Path) -> float:
        batches = 100
        per = lines // batches
        start = time.monotonic()
        with log.open("ab") as handle:
            for batch in range(batches):
                stamp = 6782000 + batch
                chunk = "".join(f"[{stamp}.{i:06d}] {FLOOD[code]}\n" for i in range(per)).encode()
                handle.write(chunk)
                handle.flush()
                pause = start + seconds * (batch + 1) / batches - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            handle.write(XID79)
        return time.monotonic()

    return write


def no_newline(total_mb: int) -> Callable[[Path], float]:
    def write(log: Path) -> float:
        junk = b"\x01junk-without-a-newline " * ((1 << 20) // 24 + 1)
        with log.open("ab") as handle:
            for _ in range(total_mb):
                handle.write(junk[: 1 << 20])
                handle.flush()
            handle.write(b"\n" + XID79)
        return time.monotonic()

    return write


def long_line_ending_in_xid(total_mb: int) -> Callable[[Path], float]:
    def write(log: Path) -> float:
        with log.open("ab") as handle:
            handle.write(b"x" * (total_mb << 20) + XID79)
        return time.monotonic()

    return write


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def condition(plane: ControlPlane, node: str) -> tuple[str, str] | None:
    answer = plane.request("GET", f"/api/v1/nodes/{node}")
    for c in answer.get("status", {}).get("conditions", []):
        if c["type"] == GPU:
            return c["status"], c.get("reason", "")
    return None


def wait_condition(plane: ControlPlane, node: str, want: tuple[str, str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition(plane, node) == want:
            return True
        time.sleep(0.02)
    return False


def run_case(
    plane: ControlPlane, src: Path, write: Callable[[Path], float], workdir: Path
) -> Result:
    node = f"flood-{uuid.uuid4().hex[:8]}"
    plane.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    )
    bundle = workdir / node
    shutil.copytree(EXAMPLE, bundle)
    (bundle / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
    config = workdir / f"{node}.yaml"
    config.write_text("check_interval_s: 1\nmetrics_port: 0\nexpected_gpus: 1\n")
    argv = [sys.executable, "-m", "gpuguard.cli", "agent", "--node-name", node]
    argv += ["--config", str(config), "--kubeconfig", str(plane.admin_kubeconfig)]
    argv += ["--bundle", str(bundle)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    with (workdir / f"{node}.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        if not wait_condition(plane, node, ("True", "Healthy"), 60):
            raise RuntimeError(f"agent for {node} never reported healthy")
        written = write(bundle / "kmsg.log")
        seen = wait_condition(plane, node, ("False", "Xid79"), LATENCY_TIMEOUT_S)
        latency = time.monotonic() - written if seen else None
        peak = peak_mib(proc.pid) if proc.poll() is None else float("nan")
        return Result(peak, latency)
    finally:
        proc.kill()
        proc.wait(10)
        plane.request("DELETE", f"/api/v1/nodes/{node}")


def export(revision: str, into: Path) -> Path:
    """The baseline's ``src``, from git, without touching the working tree."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def fmt(value: float | None, unit: str) -> str:
    return f"timeout >{LATENCY_TIMEOUT_S:.0f}" if value is None else f"{value:.2f}{unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="9d93b22")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cases", default="xid13,xid48,200MB-no-newline,10MB-line-xid79")
    args = parser.parse_args()
    cases: dict[str, Callable[[Path], float]] = {
        "xid13": flood("xid13", args.lines, args.seconds),
        "xid48": flood("xid48", args.lines, args.seconds),
        "200MB-no-newline": no_newline(200),
        "10MB-line-xid79": long_line_ending_in_xid(10),
    }
    chosen = args.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="agent-flood-") as tmp:
        workdir = Path(tmp)
        revisions = {"current": REPO / "src", args.baseline: export(args.baseline, workdir)}
        plane = ControlPlane(workdir / "plane", testenv_bin())
        plane.start()
        results: dict[tuple[str, str], Result] = {}
        try:
            for case in chosen:
                for name, src in revisions.items():
                    results[case, name] = run_case(plane, src, cases[case], workdir)
                    r = results[case, name]
                    print(f"# {case} {name}: {r.peak_mib:.1f} MiB, {fmt(r.latency_s, ' s')}")
        finally:
            plane.stop()
    base = args.baseline
    print(f"\nagent under kernel-log floods ({args.lines:,} lines in {args.seconds:g} s)")
    print(f"{'case':<18}{'peak RSS now':>14}{base:>12}{'ratio':>8}{'Xid 79 now':>12}{base:>14}")
    for case in chosen:
        now, old = results[case, "current"], results[case, base]
        ratio = old.peak_mib / now.peak_mib
        print(
            f"{case:<18}{now.peak_mib:>10.1f} MiB{old.peak_mib:>8.1f} MiB{ratio:>7.1f}x"
            f"{fmt(now.latency_s, ' s'):>12}{fmt(old.latency_s, ' s'):>14}"
        )


if __name__ == "__main__":
    main()
