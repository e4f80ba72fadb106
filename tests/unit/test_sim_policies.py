"""The simulated policies: same failures for all, the real policy code, honest reporting."""

from __future__ import annotations

import gc
import json

import numpy as np

from gpuguard.cli import main
from gpuguard.remediation.policy import Policy, build_policy
from gpuguard.sim.fault_stream import generate_faults
from gpuguard.sim.report import table
from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import FaultClasses, Scenario, build_scenario, load_scenario
from gpuguard.sim.targets import targets

SMALL = {"days": 10, "warmup_days": 0, "fleet": {"nodes": 160}}


def _scenario(**changes: object) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    for key, value in {**SMALL, **changes}.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return build_scenario(data, "test")


def test_same_seed_same_run_and_another_seed_another_run():
    first = simulate(_scenario())
    again = simulate(_scenario())
    other = simulate(_scenario(seed=2))
    assert {n: r.to_dict() for n, r in first.results.items()} == {
        n: r.to_dict() for n, r in again.results.items()
    }
    assert first.results["gpuguard"].to_dict() != other.results["gpuguard"].to_dict()


def test_the_failure_stream_does_not_depend_on_the_policy():
    scenario = _scenario()
    one = generate_faults(scenario, np.random.default_rng([scenario.seed, 0]))
    two = generate_faults(scenario, np.random.default_rng([scenario.seed, 0]))
    assert [(f.slot, f.start, f.cls, f.fix) for f in one] == [
        (f.slot, f.start, f.cls, f.fix) for f in two
    ]
    results = simulate(scenario).results
    assert len({r.faults for r in results.values()}) <= 3  # faults on machines gone differ
    assert all(r.faults > 0 for r in results.values())


def test_a_policy_run_does_not_depend_on_the_runs_before_it():
    # Every policy starts from its own copy of the seed's workload: a job one run finished
    # or failed must be unstarted in the next.
    scenario = _scenario()
    together = simulate(scenario).results
    alone = simulate(scenario, policies=("gpuguard",)).results
    assert together["gpuguard"].to_dict() == alone["gpuguard"].to_dict()


def test_the_cycle_collector_is_off_during_a_run_with_nothing_to_free():
    # Off, it frees no cycle: a run must make none, nor keep the run before it alive.
    enabled, unreachable = set(), []

    def look(_name: str, _share: float) -> None:
        enabled.add(gc.isenabled())
        unreachable.append(gc.collect())

    simulate(_scenario(), progress=look)
    assert enabled == {False} and gc.isenabled()
    assert len(unreachable) > 100 and not any(unreachable)
    gc.disable()
    try:
        simulate(_scenario(), policies=("none",))
        assert not gc.isenabled()  # a caller's setting stays the caller's
    finally:
        gc.enable()


def test_one_policy_setting_changes_the_outcome_through_the_real_policy():
    scenario = _scenario(days=30, fleet={"nodes": 256})
    default = simulate(scenario, Policy(), policies=("gpuguard",)).results["gpuguard"]
    no_replace = build_policy({"max_attempts": {"REPLACE": 0}}, "test")
    held = simulate(scenario, no_replace, policies=("gpuguard",)).results["gpuguard"]
    assert default.actions.get("replace", 0) > 0
    assert held.actions.get("replace", 0) == 0  # the rung is off: the ladder never reaches it
    # Broken machines wait for a person instead: more manual replacements, longer repairs.
    assert held.actions.get("manual_replace", 0) > default.actions.get("manual_replace", 0)
    assert held.mttr_hours > default.mttr_hours


def test_a_benign_xid_drains_under_the_reactive_rule_but_not_under_the_xid_catalog():
    quiet = {name: {"rate": 0, "fix": {"restart": 1}} for name in FaultClasses.model_fields}
    scenario = _scenario(
        failures={
            "classes": quiet,
            "fail_slow_per_1000_node_days": 0,
            "benign_signals_per_node_day": 0.05,
        },
        deep_checks={"false_positive_probability": 0},  # the deep suite's own: elsewhere
    )
    results = simulate(scenario).results
    assert results["reactive"].false_drains_per_node_day > 0  # any "NVRM: Xid" line drains
    assert results["gpuguard"].false_drains_per_node_day == 0  # Xid 63 is IGNORE in the catalog
    assert results["gpuguard"].actions.get("drain", 0) == 0
    # The device plugin skips no Xid 63: it withdraws the GPU, and only a person's reboot
    # gives it back.
    assert set(results["none"].actions) == {"manual_reboot"}


def test_a_missed_target_is_reported_with_what_would_have_to_change():
    simulation = simulate(_scenario(), seeds=3)
    text = table(simulation)
    physical = simulation.over_seeds("gpuguard")["gpu_node_availability"]
    assert physical is not None and physical.high < 0.9995  # machines away for repair count
    assert "physical GPU-node availability" in text and "MISSED" in text
    assert "99.95 % allows" in text


def test_a_missed_slot_target_names_what_held_the_slots_longest():
    quiet = {name: {"rate": 0, "fix": {"restart": 1}} for name in FaultClasses.model_fields}
    switches = {"rate": 2, "fix": {"self": 1}, "self_clear_h": 2}
    hosts = {"rate": 2, "fix": {"self": 1}, "self_clear_h": 0.5}
    scenario = _scenario(
        failures={
            "classes": {**quiet, "fabric": switches, "host": hosts},
            "fail_slow_per_1000_node_days": 0,
            "benign_signals_per_node_day": 0,
        },
        deep_checks={"interval_h": None},
    )
    simulation = simulate(scenario, policies=("gpuguard",))
    held = simulation.results["gpuguard"].repair_node_hours_by_class
    assert list(held) == ["fabric", "host"]  # a whole rack for 2 h outweighs a node for 0.5
    text = "\n".join(targets(simulation))
    assert f"Most of it: fabric faults, {held['fabric']:,.0f} of" in text
    assert "fabric.self_clear_h" in text


def test_json_has_the_documented_shape(capsys, tmp_path):
    report = tmp_path / "out" / "report.html"
    code = main(
        [
            "simulate",
            "--days",
            "5",
            "--nodes",
            "160",
            "--json",
            "--no-progress",
            "--seeds",
            "2",
            "--html",
            str(report),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert set(data["policies"]) == {"none", "reactive", "gpuguard"}
    for result in data["policies"].values():
        for key in (
            "gpu_node_availability",
            "slot_availability",
            "job_success_rate",
            "ettr",
            "mttr_hours",
            "false_drains_per_node_day",
        ):
            assert 0 <= result[key] <= (1 if key != "mttr_hours" else 1e6)
    assert data["seed"] == 1 and data["scenario"]["fleet"]["nodes"] == 160
    assert data["seeds"] == [1, 2] and [run["seed"] for run in data["runs"]] == [1, 2]
    for name, figures in data["over_seeds"].items():
        slots = figures["slot_availability"]
        values = [run["policies"][name]["slot_availability"] for run in data["runs"]]
        assert slots["values"] == values
        assert slots["low"] <= slots["mean"] <= slots["high"]
    assert set(data["targets"]["verdicts"].values()) <= {"met", "MISSED", "not settled"}
    assert data["trace_replay"] is None
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 6
    # The answer first (the summary before any plot), the full text report last.
    assert html.index('<table class="summary">') < html.index("<svg")
    assert html.rindex("<svg") < html.index('<pre class="wide">')
    assert "512+ GPU jobs succeeded" in html and "ETTR (Meta)" in html
    for cls in ("fail_slow", "sdc"):
        found = data["in_job"][cls]
        parts = ("found_in_job", "found_by_deep_suite", "found_by_passive_telemetry", "missed")
        assert sum(found[k] for k in parts) == found["faults"]
    assert "with_vs_without" not in data["in_job"]
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")  # self-contained
    assert str(report.resolve()) in captured.err


def test_a_bad_scenario_file_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("fleet: {nodes: 0}\n")
    assert main(["simulate", "--scenario", str(path), "--no-progress"]) == 64
    assert "fleet.nodes" in capsys.readouterr().err
