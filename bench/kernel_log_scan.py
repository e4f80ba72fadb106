"""Kernel log scanning throughput, side by side with a per-line regex baseline.

Builds a synthetic boot-and-runtime log of LINES lines, mostly the ordinary chatter of
other drivers, with one NVIDIA line in RATE taken from the real captured logs in
tests/data. Measures (best of REPEATS, one core):

- gpuguard: ``classify_log`` (find relevant lines, parse, turn into incidents) on the log's
  bytes, as the check and the agent read it, and on an already decoded ``str``;
- per-line rules: the approach of node-problem-detector-style monitors: loop over every
  line in Python and try each rule's regex on it (here gpuguard's own five patterns, so
  both find the same lines);
- per-line Xid only: the same loop with only the Xid regex (``NVRM: Xid.*?: (\\d+),``,
  gpud's); it finds far less, and is shown as the floor of a Python line loop;
- grep: ``grep -c NVRM`` on the same file, a C reference for "just find the lines".

Run: ``.venv/bin/python bench/kernel_log_scan.py [LINES]``. Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuguard.kernel_log.check import classify_log
from gpuguard.kernel_log.messages import _EFA, _KERNEL, _SXID, _XID, DRIVER_MESSAGES

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
LINES = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
NVIDIA_EVERY = 1000
REPEATS = 3

CHATTER = [
    "ACPI: PCI Interrupt Link [LNKC] enabled at IRQ 11",
    "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "ena 0000:00:05.0 eth0: Elastic Network Adapter (ENA) found at mem c0400000",
    'audit: type=1400 audit(1700000000.123:42): apparmor="STATUS" operation="profile_load"',
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping",
    "systemd[1]: Started Journal Service.",
    "cgroup: fork rejected by pids controller in /kubepods.slice/kubepods-burstable.slice",
    "eth0: renamed from veth3f2a9c1",
    "mlx5_core 0000:3b:00.0: E-Switch: Total vports 18, per vport: max uc(128) max mc(2048)",
    "br0: port 2(veth12ab34) entered forwarding state",
    "nvme nvme0: 32/0/0 default/read/poll queues",
]


def nvidia_lines() -> list[str]:
    lines = []
    for name in sorted(DATA.glob("*.log")):
        lines += [line for line in name.read_text().splitlines() if "NVRM" in line]
    return lines


def build_log(count: int) -> str:
    rng = random.Random(42)
    nvidia = nvidia_lines()
    out = []
    for i in range(count):
        stamp = f"[{i * 0.0137:12.6f}] "
        if i % NVIDIA_EVERY == 0:
            body = rng.choice(nvidia).split("NVRM:", 1)[1]
            out.append(f"{stamp}NVRM:{body}")
        else:
            out.append(stamp + rng.choice(CHATTER))
    return "\n".join(out) + "\n"


XID_ONLY = re.compile(r"NVRM: Xid.*?: (\d+),")
RULES = [_XID, _SXID, *(pattern for _, pattern in DRIVER_MESSAGES), _EFA, _KERNEL]


def per_line_rules(text: str) -> int:
    hits = 0
    for line in text.splitlines():
        for rule in RULES:
            if rule.search(line):
                hits += 1
                break
    return hits


def per_line_xid_only(text: str) -> list[int]:
    codes = []
    for line in text.splitlines():
        match = XID_ONLY.search(line)
        if match:
            codes.append(int(match.group(1)))
    return codes


def best_of(fn, *args) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    text = build_log(LINES)
    data = text.encode()
    size_mb = len(data) / 1e6
    ours = best_of(classify_log, data)
    ours_text = best_of(classify_log, text)
    rules = best_of(per_line_rules, text)
    xid_only = best_of(per_line_xid_only, text)
    with tempfile.NamedTemporaryFile("w", suffix=".log") as handle:
        handle.write(text)
        handle.flush()
        grep = best_of(
            lambda: subprocess.run(
                ["grep", "-c", "NVRM", handle.name], capture_output=True, check=True
            )
        )
    findings = classify_log(data)
    print(f"log: {LINES:,} lines, {size_mb:.1f} MB, one NVIDIA line in {NVIDIA_EVERY}")
    print(f"{'scanner':<34}{'seconds':>9}{'lines/s':>14}{'vs gpuguard':>13}")
    for name, seconds in (
        ("gpuguard classify_log (bytes)", ours),
        ("gpuguard classify_log (str)", ours_text),
        ("per-line rules (same coverage)", rules),
        ("per-line Xid regex only", xid_only),
        ("grep -c NVRM (C, find only)", grep),
    ):
        print(f"{name:<34}{seconds:>9.3f}{LINES / seconds:>14,.0f}{seconds / ours:>12.2f}x")
    print(f"gpuguard findings: {len(findings)} ({', '.join(sorted({f.code for f in findings}))})")
    print(f"gpuguard (bytes) is {ours / grep:.1f}x grep's time (goal: within 10x)")


if __name__ == "__main__":
    main()
