"""Replaying a recorded fault trace: the formats, their errors, the bundled StepFun trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpuguard.cli import main
from gpuguard.errors import ConfigError
from gpuguard.sim.faults import DAY, Fix, Signal
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.trace import TRACE_CLASSES
from gpuguard.sim.trace_files import load_trace

SHIPPED = Path(__file__).parents[2] / "src/gpuguard/data/traces/infinitehbd/fault_trace.json"
HEADER = "node,start_days,end_days,class,description,fix\n"


def test_the_bundled_trace_is_the_published_one_and_every_fault_maps():
    trace = load_trace("infinitehbd")
    events = json.loads(SHIPPED.read_text())
    assert len(trace.records) == sum(e["event_type"] == "fault_start" for e in events) == 584
    assert len({r.node for r in trace.records}) == 231
    assert (trace.nodes, trace.days) == (400, max(e["event_time"] for e in events))
    assert {r.cls for r in trace.records} <= set(TRACE_CLASSES)


def test_the_recorded_availability_counts_overlapping_faults_once():
    # The trace's own figure, 97.68 %: its downtime over 400 servers and its span.
    assert load_trace("infinitehbd").recorded_availability() == pytest.approx(0.9768, abs=1e-4)


def test_a_csv_trace_replays_its_faults_on_its_nodes(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(
        "# nodes: 3\n# days: 4\n" + HEADER + "a,1.0,1.5,nic_slow,NIC at half rate,\n"
        "b,2.0,3.0,fabric,cable,self\n"
        "a,1.2,9,hbm,DBE,replace\n"
    )
    trace = load_trace(path)
    assert (trace.nodes, trace.days) == (3, 4.0)
    # Node a is down from 1.0 to the end (4), its two faults overlapping; b for a day.
    assert trace.recorded_availability() == pytest.approx(1 - (3.0 + 1.0) / 12)
    faults = trace.faults(load_scenario(), np.random.default_rng(1))
    assert [(f.slot, f.start / DAY, f.signal) for f in faults] == [
        (0, 1.0, Signal.RATE_DROP),
        (0, 1.2, Signal.XID_48_REMAP_FAILED),
        (1, 2.0, Signal.PORT_DOWN),
    ]
    assert faults[2].fix is Fix.SELF and faults[2].end == 3.0 * DAY  # as recorded
    assert faults[1].fix is Fix.REPLACE and faults[1].end is None  # a policy clears it


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("node,start,end\n", "the header must be node,start_days,end_days,class,description"),
        (HEADER + "a,1,2,gpu\n", "record 1: 4 fields, expected 5 to 7"),
        (HEADER + "a,1,2,gpu,x,\nb,soon,2,gpu,x,\n", "record 2: field start_days: 'soon'"),
        (HEADER + "a,3,2,gpu,x,\n", "record 1: field end_days: 2 is before start_days 3"),
        (HEADER + "a,1,2,warp_core,x,\n", "record 1: field class: 'warp_core' is not one of"),
        (HEADER + "a,1,2,gpu,x,fix_it\n", "record 1: field fix: 'fix_it' is not one of"),
        (HEADER + ",1,2,gpu,x,\n", "record 1: field node: empty"),
        ("# nodes: 1\n" + HEADER + "a,1,2,gpu,x,\nb,1,2,gpu,x,\n", "header nodes 1 but 2"),
        ("# colour: red\n" + HEADER, "unknown header line 'colour'"),
        (HEADER, "no fault records"),
    ],
)
def test_a_malformed_csv_trace_names_the_file_record_and_field(tmp_path, text, named):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_trace(path)
    assert str(path) in str(caught.value) and named in str(caught.value)


def _event(kind: str, time: object = 1.0, cls: str = "GPU", desc: str = "GPU Lost") -> dict:
    return {
        "node_id": "n1",
        "event_time": time,
        "event_type": kind,
        "fault_type": {"Level": "Hardware Failure", "Class": cls, "Desc": desc},
    }


@pytest.mark.parametrize(
    ("events", "named"),
    [
        ({"a": 1}, "expected a list of events"),
        ([_event("fault_end")], "record 1: field event_type: fault_end with no fault_start"),
        ([_event("fault_start"), _event("fault_stop")], "record 2: field event_type"),
        ([_event("fault_start", time="noon")], "record 1: field event_time"),
        ([{"node_id": "n1"}], "record 1: field event_time: missing"),
        ([_event("fault_start", cls="GPU", desc="Haunted")], "no mapping for Class 'GPU'"),
    ],
)
def test_a_malformed_stepfun_trace_names_the_record_and_field(tmp_path, events, named):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(events))
    with pytest.raises(ConfigError) as caught:
        load_trace(path)
    assert str(path) in str(caught.value) and named in str(caught.value)


def test_a_replay_runs_every_policy_on_the_trace_and_the_cli_reports_it(tmp_path, capsys):
    path = tmp_path / "short.csv"
    rows = [f"n{i},{0.5 + i * 0.4:.2f},{1.5 + i * 0.4:.2f},gpu,lost,replace" for i in range(12)]
    path.write_text("# nodes: 160\n# days: 6\n" + HEADER + "\n".join(rows) + "\n")
    replay = simulate(load_scenario(), trace=load_trace(path))
    assert replay.scenario.fleet.nodes == 160 and replay.scenario.days == 6
    assert all(result.faults == 12 for result in replay.results.values())
    code = main(
        [
            *("simulate", "--days", "3", "--nodes", "160", "--seeds", "1"),
            *("--trace", str(path), "--no-progress", "--json"),
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)["trace_replay"]
    assert data["trace"]["as_recorded"]["availability"] == pytest.approx(1 - 12 / (160 * 6))
    assert set(data["policies"]) == {"none", "reactive", "gpuguard"}


def test_a_missing_trace_is_a_usage_error(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "nope.csv"), "--no-progress"]) == 64
    assert "cannot read trace" in capsys.readouterr().err


def _replay(tmp_path, rows: list[str], days: int = 6):
    nodes = 160  # the smallest fleet the default job mix fits
    path = tmp_path / "kept.csv"
    path.write_text(f"# nodes: {nodes}\n# days: {days}\n" + HEADER + "\n".join(rows) + "\n")
    trace = load_trace(path)
    return trace, simulate(load_scenario(), trace=trace)


def test_people_repair_a_replayed_fault_when_the_record_says_so_none_matches_the_trace(tmp_path):
    # Hardware faults the operators repaired in 0.3 to 1.4 days: without a policy of its
    # own, the node is back when the record's end says, not after the scenario's figures
    # (12 h to a visit, a week away for a new machine).
    rows = [f"n{i},{0.5 + i * 0.4:.2f},{0.8 + i * 0.5:.2f},gpu,lost,replace" for i in range(8)]
    trace, replay = _replay(tmp_path, rows)
    none = replay.results["none"]
    assert none.gpu_node_availability == pytest.approx(trace.recorded_availability(), abs=5e-4)
    assert none.actions["manual_recorded_repair"] == 8 and "manual_replace" not in none.actions


def test_a_record_the_operators_held_offline_is_out_of_service_in_every_policy(tmp_path):
    # A machine taken offline while a job was troubleshot, and a failed stress test: no
    # signal on the node, yet the trace has both out for their spans, job or no job.
    rows = ["a,1.0,2.0,unattributed,Suspect Machine Offline,", "b,2.0,2.5,fail_slow,stress,"]
    trace, replay = _replay(tmp_path, rows, days=4)
    for name, result in replay.results.items():
        assert result.actions["manual_offline"] == 2, name
        assert result.gpu_node_availability <= trace.recorded_availability() + 1e-9, name
    assert replay.results["none"].gpu_node_availability == pytest.approx(
        trace.recorded_availability(), abs=1e-4
    )


def test_a_machine_replaced_for_a_replayed_fault_is_back_from_repair_when_the_record_ends(
    tmp_path,
):
    # gpuguard replaces at once and a spare fills the slot; the machine itself is away
    # until the operators had it repaired (2 days here), not the scenario's 7-day RMA.
    _, replay = _replay(tmp_path, ["a,1.0,3.0,hbm,DBE,replace"])
    gpuguard = replay.results["gpuguard"]
    assert gpuguard.actions["replace"] == 1
    lost = (1 - gpuguard.gpu_node_availability) * 160 * 6
    assert 1.9 < lost < 2.5  # node-days: the two recorded, plus the spare's arrival
