"""Issue 25's figures from one ``gpuguard simulate --json`` output: replacements against
where the faults live, false drains and availability, per policy, mean [95 % interval].

    .venv/bin/gpuguard simulate --seeds 10 --trace infinitehbd --trace-seeds 10 \\
        --json --no-progress > out.json
    .venv/bin/python bench/locus.py out.json

The default scenario's figures come first, then the trace replay's (``trace_replay``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROWS = (
    ("automatic replacements", "locus", "automatic_replacements", 1, 1.0),
    ("machine-locus faults", "locus", "machine_faults", 1, 1.0),
    ("  of which need new hardware", "locus", "machine_faults_needing_replace", 1, 1.0),
    ("replacements / machine-locus faults", "locus", "replacements_per_machine_fault", 3, 1.0),
    ("max replacements of one position in 7 d", "locus", "max_replacements_per_position_7d", 1, 1),
    ("false drains per node-day", "locus", "false_drains_per_node_day", 5, 1.0),
    ("physical availability %", "over", "gpu_node_availability", 3, 100.0),
    ("slot availability %", "over", "slot_availability", 3, 100.0),
)


def _cell(interval: dict[str, Any] | None, digits: int, scale: float) -> str:
    if interval is None:
        return "-"
    mean = f"{scale * interval['mean']:.{digits}f}"
    if interval["low"] is None:
        return mean
    return f"{mean} [{scale * interval['low']:.{digits}f}, {scale * interval['high']:.{digits}f}]"


def table(data: dict[str, Any], title: str) -> list[str]:
    names = list(data["policies"])
    seeds = data["seeds"]
    lines = [f"{title}, seeds {seeds[0]}-{seeds[-1]}", "| | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---:|" * len(names))
    for label, where, metric, digits, scale in ROWS:
        block = data["locus_over_seeds"] if where == "locus" else data["over_seeds"]
        cells = [_cell(block[name][metric], digits, scale) for name in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(path: str) -> None:
    data = json.loads(Path(path).read_text())
    scenario = data["scenario"]
    print("\n".join(table(data, f"scenario {scenario['name']}")))
    replay = data.get("trace_replay")
    if replay is not None:
        print()
        print("\n".join(table(replay, f"trace {replay['trace']['name']}")))


if __name__ == "__main__":
    main(sys.argv[1])
