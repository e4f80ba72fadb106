"""Scenario files: defaults, validation errors that name the bad key, command-line overrides."""

from __future__ import annotations

import pytest

from gpuguard.errors import ConfigError
from gpuguard.sim.scenario import Scenario, build_scenario, bundled_scenario, load_scenario


def test_the_default_scenario_is_the_documented_one():
    scenario = load_scenario()
    # A year measured in steady state, after a month's warm-up left out of the figures.
    assert (scenario.name, scenario.days, scenario.warmup_days) == ("default", 365, 30)
    assert scenario.fleet.nodes == 256
    classes = scenario.failures.classes
    total = sum(getattr(classes, name).rate for name in type(classes).model_fields)
    assert total == pytest.approx(3.79, abs=0.01)  # Llama 3: 419 in 110,592 node-days


@pytest.mark.parametrize("name", ["default", "llama3-16k", "meta-rsc1"])
def test_every_bundled_scenario_loads(name):
    assert bundled_scenario(name).name == name


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("fleet: {nodez: 3}\n", "fleet.nodez: unknown key (did you mean 'nodes'?)"),
        ("fleet: {nodes: -1}\n", "fleet.nodes: Input should be greater than or equal to 1"),
        ("failures: {classes: {gpu: {rate: 1, fix: {reboot: 0.5}}}}\n", "failures.classes.gpu.fix"),
        ("failures: {classes: {gpu: {rate: 1, fix: {rebot: 1}}}}\n", "rebot: unknown key"),
        (
            "failures: {classes: {warp_core: {rate: 1}}}\n",
            "failures.classes.warp_core: unknown key",
        ),
        ("jobs: {mix: [{nodes: 512, share: 1, hours: [1, 2]}]}\n", "a job of 512 nodes"),
        (
            "jobs: {mix: [{nodes: 1, share: 1, hours: [5, 2]}]}\n",
            "jobs.mix.0: hours: the first bound must not exceed the second",
        ),
        ("days: soon\n", "days: Input should be a valid number"),
        (
            "in_job: {ratio: 1.1, change_ratio: 1.2}\n",
            "in_job: change_ratio 1.2 must be above 1, at most ratio",
        ),
    ],
)
def test_bad_values_are_rejected_naming_the_file_and_key(tmp_path, text, named):
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert str(path) in str(caught.value)
    assert named in str(caught.value)


def test_fix_shares_must_add_up_to_one(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("failures: {classes: {gpu: {rate: 1, fix: {reboot: 0.5}}}}\n")
    with pytest.raises(ConfigError, match=r"add up to 1, they add up to 0\.5"):
        load_scenario(path)


def test_missing_and_non_mapping_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "absent.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_scenario(path)


def test_overrides_are_validated_too():
    scenario = Scenario().with_overrides(seed=7, days=2.5, nodes=300)
    assert (scenario.seed, scenario.days, scenario.fleet.nodes) == (7, 2.5, 300)
    with pytest.raises(ConfigError, match=r"command line: .*fleet.nodes: .*greater than"):
        Scenario().with_overrides(nodes=0)


@pytest.mark.parametrize("nodes", [1, 2, 7, 64, 255])
def test_a_smaller_fleet_gets_the_mix_scaled_to_it(nodes):
    base = Scenario()
    scaled = base.with_overrides(nodes=nodes)  # the default mix has 128-node jobs
    sizes = [size.nodes for size in scaled.jobs.mix]
    assert max(sizes) <= max(1, nodes // 2)
    assert sizes == sorted(sizes)  # the mix keeps its order of sizes
    assert [s.share for s in scaled.jobs.mix] == [s.share for s in base.jobs.mix]
    assert Scenario().with_overrides(nodes=300).jobs.mix == base.jobs.mix  # fits: unchanged


def test_a_scenario_error_about_the_whole_document_does_not_echo_it():
    data = Scenario().model_dump(by_alias=True)
    data["jobs"]["mix"] = [{"nodes": 999, "share": 1, "hours": [1, 2]}]
    with pytest.raises(ConfigError) as caught:
        build_scenario(data, "x.yaml")
    assert "cannot fit a fleet of 256" in str(caught.value)
    assert len(str(caught.value)) < 200
