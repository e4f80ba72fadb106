"""How faithfully the StepFun replay reproduces the trace: `none`'s and gpuguard's
availability on the whole trace and on the trace without one class at a time, beside
that trace's own recorded availability (docs/simulator.md, "A replay faithful to the
trace"). A class whose removal closes the gap is where the replay and the record differ.

    .venv/bin/python bench/trace_fidelity.py              # seeds 1-3 (about 2 min of CPU)
    .venv/bin/python bench/trace_fidelity.py --seeds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.trace import Trace
from gpuguard.sim.trace_files import load_trace

POLICIES = ("none", "gpuguard")


def _row(label: str, trace: Trace, seeds: int) -> None:
    replay = simulate(load_scenario(), policies=POLICIES, seeds=seeds, trace=trace)
    recorded = 100 * trace.recorded_availability()
    cells = []
    for name in POLICIES:
        over = replay.over_seeds(name)
        physical = 100 * over["gpu_node_availability"].mean
        slots = 100 * over["slot_availability"].mean
        cells.append(f"{name} {physical:.3f} % ({physical - recorded:+.3f}; slots {slots:.3f} %)")
    print(f"{label:<28} recorded {recorded:.3f} % | " + " | ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    started = time.process_time()
    trace = load_trace("infinitehbd")
    _row("the whole trace", trace, args.seeds)
    for cls in sorted({record.cls for record in trace.records}):
        kept = tuple(record for record in trace.records if record.cls != cls)
        _row(f"without {cls}", dataclasses.replace(trace, records=kept), args.seeds)
    print(f"CPU {time.process_time() - started:.0f} s")


if __name__ == "__main__":
    main()
