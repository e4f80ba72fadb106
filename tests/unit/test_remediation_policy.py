"""The remediation policy: defaults, validation, YAML errors, budget and breaker arithmetic."""

from __future__ import annotations

import re

import pytest

from gpuguard.errors import ConfigError
from gpuguard.model import Action
from gpuguard.remediation.breaker import next_breaker
from gpuguard.remediation.model import BreakerState
from gpuguard.remediation.policy import Policy, load_policy
from gpuguard.remediation.policy_sections import Breaker, Budget
from tests.unit.remediation_builders import T0, episode, fleet, kinds, node, run, unknown


def test_defaults():
    policy = Policy()
    assert policy.pool_label == "karpenter.sh/nodepool"
    assert (policy.unknown_grace_s, policy.tolerance_s, policy.clear_after_s) == (300, 120, 60)
    assert policy.tolerances == {"XID_79": 0, "GPU_FALLEN_OFF_BUS": 0}
    assert [policy.attempts_allowed(a) for a in Action] == [0, 2, 1, 1, 1]
    assert policy.on_drain_timeout == "quarantine"
    assert (policy.lemon_episodes, policy.lemon_window_s) == (3, 7 * 86400)
    assert policy.budget == Budget(max_unavailable=2, max_unavailable_percent=10)
    assert policy.breaker.threshold_percent == 10
    assert policy.breaker.close_percent == 5


def test_policy_is_frozen():
    with pytest.raises(ValueError, match="frozen"):
        Policy().tolerance_s = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("pool_size", "allowed"), [(0, 1), (1, 1), (9, 1), (10, 1), (20, 2), (100, 2), (1000, 2)]
)
def test_budget_is_the_smaller_of_absolute_and_percent_but_at_least_one(pool_size, allowed):
    assert Budget().allowed(pool_size) == allowed


def test_budget_percent_can_bind_below_the_absolute_cap():
    assert Budget(max_unavailable=50, max_unavailable_percent=25).allowed(40) == 10


def test_tolerance_is_the_most_urgent_code_or_the_default():
    policy = Policy(tolerance_s=200, tolerances={"XID_74": 600})
    assert policy.tolerance_for(()) == 200
    assert policy.tolerance_for(("XID_74",)) == 600
    assert policy.tolerance_for(("XID_74", "OTHER")) == 200
    assert policy.tolerance_for(("XID_74", "XID_79")) == 0


def test_attempts_merge_over_defaults_and_accept_any_case():
    policy = Policy(max_attempts={"reboot": 3})
    assert policy.attempts_allowed(Action.REBOOT) == 3
    assert policy.attempts_allowed(Action.KILL_JOB) == 2


def test_load_policy_reads_yaml(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(
        "tolerance_s: 30\nmax_attempts:\n  REPLACE: 0\nbudget:\n  max_unavailable: 5\n"
        "breaker:\n  window_s: 900\non_drain_timeout: force\n"
    )
    policy = load_policy(path)
    assert policy.tolerance_s == 30
    assert policy.attempts_allowed(Action.REPLACE) == 0
    assert policy.budget.max_unavailable == 5
    assert policy.breaker.window_s == 900
    assert policy.on_drain_timeout == "force"


def test_empty_file_gives_the_defaults(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("")
    assert load_policy(path) == Policy()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("tolerence_s: 3\n", "tolerence_s: unknown key (did you mean 'tolerance_s'?)"),
        (
            "budget:\n  max_unavailble: 3\n",
            "budget.max_unavailble: unknown key (did you mean 'max_unavailable'?)",
        ),
        ("breaker:\n  window: 3\n", "breaker.window: unknown key (did you mean 'window_s'?)"),
        ("tolerance_s: -1\n", "tolerance_s: Input should be greater than or equal to 0"),
        ("tolerances:\n  XID_74: soon\n", "tolerances.XID_74"),
        ("max_attempts:\n  REBOOOT: 1\n", "max_attempts: unknown rung REBOOOT"),
        ("max_attempts:\n  REBOOT: -1\n", "max_attempts.REBOOT"),
        ("on_drain_timeout: panic\n", "on_drain_timeout"),
        ("pool_label: ''\n", "pool_label"),
        ("budget:\n  max_unavailable_percent: 120\n", "budget.max_unavailable_percent"),
        ("breaker:\n  close_percent: 50\n", "breaker: close_percent must not exceed"),
        ("- a\n- list\n", "expected a mapping"),
        ("budget: [\n", "not valid YAML"),
    ],
)
def test_bad_policy_names_the_file_and_key(tmp_path, text, named):
    path = tmp_path / "bad-policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert str(path) in str(info.value)
    assert named in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


# -- breaker arithmetic --------------------------------------------------------------

CONFIG = Breaker(threshold_percent=10, window_s=600, min_nodes=3, close_percent=5)


def test_breaker_opens_at_the_threshold_with_enough_nodes():
    state, notes = next_breaker(BreakerState(), [T0] * 3, 30, CONFIG, T0)
    assert state.open and state.opened_at == T0
    assert notes and "opened" in notes[0] and "3 of 30" in notes[0]


def test_breaker_stays_shut_below_min_nodes_or_threshold():
    assert not next_breaker(BreakerState(), [T0] * 2, 10, CONFIG, T0)[0].open  # 20 %, 2 nodes
    assert not next_breaker(BreakerState(), [T0] * 3, 31, CONFIG, T0)[0].open  # 9.7 %
    assert not next_breaker(BreakerState(), [T0 - 601] * 9, 10, CONFIG, T0)[0].open  # old


def test_breaker_closes_only_below_close_percent():
    opened = BreakerState(open=True, opened_at=T0 - 100)
    assert next_breaker(opened, [T0] * 2, 30, CONFIG, T0)[0].open  # 6.7 %: hysteresis
    state, notes = next_breaker(opened, [T0] * 1, 30, CONFIG, T0)  # 3.3 %
    assert not state.open and "closed" in notes[0]


def test_breaker_reset_closes_and_the_acknowledged_storm_no_longer_counts():
    opened = BreakerState(open=True, opened_at=T0 - 100)
    state, notes = next_breaker(opened, [T0 - 50] * 9, 10, CONFIG, T0, reset=True)
    assert not state.open and state.reset_at == T0 and "operator" in notes[0]
    assert not next_breaker(state, [T0 - 50] * 9, 10, CONFIG, T0 + 30)[0].open
    assert next_breaker(state, [T0 + 10] * 3, 10, CONFIG, T0 + 30)[0].open  # a new wave


def test_breaker_counts_episodes_opened_in_this_call_and_notes_in_the_plan():
    nodes = fleet(*(node(f"n{i}", unknown(since=0.0)) for i in range(3)), node("ok"))
    plan = run(nodes)
    assert plan.breaker.open
    assert any("circuit breaker opened" in note for note in plan.notes)
    assert kinds(plan).count(kinds(plan)[1]) == 3  # three taints, no more


def test_breaker_counts_history_within_the_window():
    history = [episode(f"h{i}", opened_at=T0 - 100) for i in range(3)]
    plan = run(fleet(*(node(f"h{i}") for i in range(3))), history=history)
    assert plan.breaker.open


@pytest.mark.parametrize(
    ("key", "said"),
    [("XID79", "XID79 (did you mean XID_79?)"), ("SXID20034", "did you mean SXID_20034"), ("", "")],
)
def test_a_tolerance_key_that_is_no_finding_code_is_refused_and_named(tmp_path, key, said):
    path = tmp_path / "policy.yaml"
    path.write_text(f"tolerances: {{'{key}': 0}}\n")
    with pytest.raises(ConfigError, match=rf"tolerances: not a finding code: .*{re.escape(said)}"):
        load_policy(path)


def test_a_lower_case_tolerance_key_means_the_code():
    assert Policy(tolerances={"xid_48": 0}).tolerance_for(("XID_48",)) == 0


def test_every_code_the_checks_emit_has_the_shape_tolerances_accept():
    import gc

    import gpuguard.checks.registry  # noqa: F401  (every check's rule table)
    from gpuguard.checks.rules import Rule
    from gpuguard.remediation.policy_sections import CODE_SHAPE
    from gpuguard.runner import OUTCOME_CODES

    codes = {o.code for o in gc.get_objects() if isinstance(o, Rule)} | set(OUTCOME_CODES.values())
    assert len(codes) > 40
    assert [code for code in codes if not CODE_SHAPE.fullmatch(code)] == []
