"""``gpuguard simulate --sensitivity``: one assumption changed per row, on the same seeds."""

from __future__ import annotations

import json

from gpuguard.cli import main
from gpuguard.sim.run import remediation_policy, simulate
from gpuguard.sim.scenario import load_scenario
from gpuguard.sim.sensitivity import BASE, CHANGES, changed, sensitivity


def _small():
    return load_scenario().with_overrides(nodes=160, days=4, warmup_days=0)


def test_every_row_runs_on_every_core_and_the_base_row_is_the_plain_run():
    scenario = _small()
    policy = remediation_policy(scenario, None)
    rows = sensitivity(scenario, policy, seeds=2, workers=2)
    assert [row.change for row in rows] == list(CHANGES)
    plain = simulate(scenario, policy, seeds=2)
    for name in ("none", "reactive", "gpuguard"):
        shown = rows[0].figures[name]["ettr"]
        assert shown is not None and shown.values == plain.over_seeds(name)["ettr"].values
    # The in-job inputs are gpuguard's alone: the baselines' rows stay as the base's.
    adoption = next(row for row in rows if row.change.label == "in-job adoption 0.25")
    for name in ("none", "reactive"):
        assert adoption.figures[name] == rows[0].figures[name]


def test_a_row_changes_only_its_own_keys():
    scenario = _small()
    budget = next(change for change in CHANGES if change.label == "retry budget 2")
    assert changed(scenario, budget).jobs.retry_budget == 2
    assert changed(scenario, budget).fleet == scenario.fleet
    assert changed(scenario, BASE) == scenario


def test_the_cli_prints_the_table_and_puts_the_rows_in_the_json(capsys):
    args = ["simulate", "--nodes", "160", "--days", "2", "--seeds", "2", "--no-progress"]
    assert main([*args, "--sensitivity"]) == 0
    text = capsys.readouterr().out
    assert "Sensitivity: one assumption changed per row (seeds 1-2" in text
    assert "hardware fault rate x1.715 (RSC-1)" in text
    assert main([*args, "--sensitivity", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["sensitivity"]
    assert data["seeds"] == [1, 2] and len(data["rows"]) == len(CHANGES)
    assert data["rows"][1]["scenario"] == {"jobs": {"retry_budget": 2}}
