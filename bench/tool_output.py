"""Bounded diagnostic tools, side by side: this tree's ``run_tool`` and a baseline revision's.

Two measurements, each run with ``PYTHONPATH`` at one side's ``src`` (the baseline is
extracted with ``git archive`` into a temporary directory):

- flood: the peak RSS (VmHWM) of a process that runs ``run_tool`` once on a fake tool
  printing OUTPUT_MB megabytes, and what the call ended with;
- hung: a process running a ``RepeatingCheck`` of the nvidia-smi check for SECONDS against a
  fake nvidia-smi that is stuck for good and whose child leaves its process group (setsid)
  holding stdout, as a tool stuck in the driver outlives its kill (interval and timeout
  1 s). Counted at the end: the tool's live processes, and that process's threads and open
  file descriptors. Both sides run at the same time.

Run: ``.venv/bin/python bench/tool_output.py [--baseline REV] [--seconds 40]``.
Results go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FLOOD_TOOL = """#!{python}
import sys
chunk = b"x" * (1 << 20)
for _ in range({megabytes}):
    sys.stdout.buffer.write(chunk)
"""

ESCAPING_TOOL = """#!{python}
import os, time
if os.fork() == 0:
    os.setsid()
time.sleep(100000)
"""

FLOOD_PROBE = """
import json, sys, time
from gpuguard.sources import run_tool

def peak_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

before = peak_mib()
started = time.monotonic()
try:
    output = run_tool([sys.argv[1]], 120)
    ended = f"returned {len(output.text) / 2**20:.0f} MiB of text"
except Exception as exc:
    ended = f"{type(exc).__name__}: {str(exc).split(': ', 1)[-1][:60]}"
print(json.dumps({"start_mib": before, "peak_mib": peak_mib(), "ended": ended,
                  "seconds": time.monotonic() - started}))
"""

HUNG_PROBE = """
import json, os, sys, threading, time
from gpuguard.checks.base import CheckContext
from gpuguard.checks.nvidia_smi.check import SmiCheck
from gpuguard.config import Config
from gpuguard.runner import RepeatingCheck
from gpuguard.sources import LiveSources

tool, seconds, interval, timeout = sys.argv[1], *map(float, sys.argv[2:5])
config = Config(tools={"nvidia-smi": tool})
runner = RepeatingCheck(SmiCheck(), CheckContext(LiveSources(config), config, timeout))
end = time.monotonic() + seconds
runs = 0
last = ""
while time.monotonic() < end:
    last = runner.run_once().detail
    runs += 1
    threading.Event().wait(interval)

def live(pid):
    if not pid.isdigit() or int(pid) == os.getpid():  # its own argv names the tool too
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/stat") as stat:
            named = tool.encode() in cmdline.read()
            return named and stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

print(json.dumps({"runs": runs, "threads": len(os.listdir("/proc/self/task")),
                  "fds": len(os.listdir("/proc/self/fd")), "last": last,
                  "processes": sum(live(pid) for pid in os.listdir("/proc"))}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", default="9d93b22", help="git revision to compare with")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--output-mb", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuguard-tool-bench-") as scratch:
        work = Path(scratch)
        baseline_src = extract(args.baseline, work / "baseline")
        sides = {f"baseline {args.baseline}": baseline_src, "current": ROOT / "src"}
        flood = make_tool(
            work / "flood", FLOOD_TOOL.format(python=sys.executable, megabytes=args.output_mb)
        )
        floods = {name: probe(src, FLOOD_PROBE, [str(flood)]) for name, src in sides.items()}
        hung = hung_runs(work, sides, args)
    print_table(args, floods, hung)
    return 0


def extract(revision: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def make_tool(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True)
    path = directory / "nvidia-smi"
    path.write_text(body)
    path.chmod(0o755)
    return path


def environment(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def probe(src: Path, code: str, argv: list[str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=environment(src),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"probe failed with {src}:\n{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def hung_runs(work: Path, sides: dict[str, Path], args: argparse.Namespace) -> dict[str, dict]:
    tools = {
        name: make_tool(work / f"hung-{index}", ESCAPING_TOOL.format(python=sys.executable))
        for index, name in enumerate(sides)
    }
    timing = [str(args.seconds), str(args.interval), str(args.timeout)]
    running = {
        name: subprocess.Popen(
            [sys.executable, "-c", HUNG_PROBE, str(tools[name]), *timing],
            env=environment(src),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the current side logs each hung run
            text=True,
        )
        for name, src in sides.items()
    }
    results = {}
    try:
        for name, proc in running.items():
            stdout, _ = proc.communicate(timeout=args.seconds + 120)
            results[name] = json.loads(stdout)
    finally:
        for tool in tools.values():
            for pid in live_processes(str(tool)):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    return results


def live_processes(marker: str) -> list[int]:
    """Processes (not zombies) whose command line names ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def print_table(args: argparse.Namespace, floods: dict, hung: dict) -> None:
    baseline, current = floods
    rows = [
        (f"flood {args.output_mb} MB: peak RSS, MiB", "peak_mib", floods),
        (f"flood {args.output_mb} MB: growth over start, MiB", "growth", floods),
        (f"hung {args.seconds:g} s: tool processes left", "processes", hung),
        (f"hung {args.seconds:g} s: threads", "threads", hung),
        (f"hung {args.seconds:g} s: open fds", "fds", hung),
        (f"hung {args.seconds:g} s: check runs", "runs", hung),
    ]
    for result in floods.values():
        result["growth"] = result["peak_mib"] - result["start_mib"]
    print(f"| measure | {baseline} | {current} | ratio {baseline.split()[0]}/{current} |")
    print("|---|---:|---:|---:|")
    for label, key, table in rows:
        old, new = table[baseline][key], table[current][key]
        ratio = f"{old / new:.1f}x" if new else "-"
        print(f"| {label} | {_fmt(old)} | {_fmt(new)} | {ratio} |")
    print()
    for name in floods:
        print(f"- {name}, flood: {floods[name]['ended']} ({floods[name]['seconds']:.2f} s)")
    for name in hung:
        print(f"- {name}, hung, last result: {hung[name]['last']}")


def _fmt(value: float) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
