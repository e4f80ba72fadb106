"""Peak memory of the agent parsing the largest nvidia-smi XML the tool-output cap lets
through, against the chart's memory limit.

The cap (``tool_process.MAX_OUTPUT_BYTES``, 4 MiB) bounds what is read; the XML parser then
takes a multiple of it. This fills the cap with GPUs of the largest real capture in
tests/data (RTX PRO 6000 Blackwell, ~120 KB per GPU: its clock tables) and parses it in a
fresh process that first imports the agent, reading the kernel's ``VmHWM`` before and
after. Run: ``.venv/bin/python bench/smi_parse_memory.py``. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests/data/nvidia-smi-q-x_rtx-pro-6000-blackwell_590.44.01_v13.xml"
CHART_LIMIT_MIB = 128  # deploy/helm/gpuguard/values.yaml resources.limits.memory

CHILD = """
import json, sys
import gpuguard.agent.daemon  # the agent's imports, as in the DaemonSet's process
from gpuguard.checks.nvidia_smi import xml_format

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024

text = sys.stdin.read()
before = hwm()
gpus = xml_format.parse_smi_xml(text)
print(json.dumps({"before": before, "after": hwm(), "gpus": len(gpus), "bytes": len(text)}))
"""


def at_the_cap() -> str:
    sys.path.insert(0, str(REPO / "src"))
    from gpuguard.tool_process import MAX_OUTPUT_BYTES

    text = CAPTURE.read_text()
    head, rest = text.split("<gpu ", 1)
    gpu = "<gpu " + rest.rsplit("</gpu>", 1)[0] + "</gpu>\n"
    count = (MAX_OUTPUT_BYTES - len(head) - 32) // len(gpu)
    head = re.sub(
        r"<attached_gpus>\d+</attached_gpus>", f"<attached_gpus>{count}</attached_gpus>", head
    )
    return head + gpu * count + "</nvidia_smi_log>\n"


def main() -> None:
    document = at_the_cap()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], input=document, capture_output=True, text=True, check=True
    )
    result = json.loads(proc.stdout)
    peak = result["after"]
    print(f"{result['gpus']} GPUs, {result['bytes'] / 2**20:.2f} MiB of nvidia-smi -q -x")
    print(f"peak RSS: {result['before']:.1f} MiB after the agent's imports, {peak:.1f} MiB parsed")
    print(f"chart limit {CHART_LIMIT_MIB} MiB: peak is {peak / CHART_LIMIT_MIB:.2f} of it")


if __name__ == "__main__":
    main()
