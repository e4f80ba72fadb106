"""Silence is judged on the controller's clock, from when each report was first seen."""

from __future__ import annotations

import math

from gpuguard.contract.report import LayerReport
from gpuguard.controller.silence import Silence
from gpuguard.remediation.model import NodeObservation

T0 = 1_796_000_000.0


def node(name: str, reported_at: float | None) -> NodeObservation:
    layers = {"gpu": LayerReport("True", "Healthy", T0 - 3600)}
    return NodeObservation(name=name, pool="p", layers=layers, reported_at=reported_at)


def test_a_report_that_keeps_changing_is_never_silent_however_old_its_stamp():
    silence = Silence(timeout_s=600)
    for minute in range(60):
        now = T0 + 60 * minute
        silence.heard("a", T0 - 86400 + minute, now)  # an agent a day behind, alive
        silent, upcoming = silence.silent({"a": node("a", T0 - 86400 + minute)}, now)
        assert silent == {} and now <= upcoming <= now + 600  # look again by then


def test_a_report_that_stops_changing_is_silent_after_the_timeout():
    silence = Silence(timeout_s=600)
    silence.heard("a", T0, T0)
    silence.heard("a", T0, T0 + 500)  # the same report read again: no news
    nodes = {"a": node("a", T0)}
    assert silence.silent(nodes, T0 + 600) == ({}, T0 + 600)
    assert silence.silent(nodes, T0 + 601) == ({"a": T0 + 600}, math.inf)
    assert silence.newly(["a"]) == {"a"} and silence.newly(["a"]) == set()
    silence.heard("a", T0 + 700, T0 + 700)  # it is back
    assert silence.silent(nodes, T0 + 701) == ({}, T0 + 1300)


def test_no_agent_yet_and_forgotten_nodes_are_never_silent():
    silence = Silence(timeout_s=600)
    silence.heard("fresh", None, T0)
    silence.heard("gone", T0, T0)
    silence.keep_only({"fresh"})
    nodes = {"fresh": node("fresh", None), "gone": node("gone", T0)}
    assert silence.silent(nodes, T0 + 10_000) == ({}, math.inf)


def test_a_scan_that_finds_no_agent_does_not_switch_silence_off():
    # The controller installed first: no node has a report yet, so the first scan finds
    # nothing to watch. Agents that start later, then die, must still be noticed.
    silence = Silence(timeout_s=600)
    silence.heard("a", None, T0)
    assert silence.silent({"a": node("a", None)}, T0) == ({}, math.inf)
    silence.heard("a", T0 + 30, T0 + 30)  # the agent's first report
    nodes = {"a": node("a", T0 + 30)}
    assert silence.silent(nodes, T0 + 600) == ({}, T0 + 630)
    assert silence.silent(nodes, T0 + 631) == ({"a": T0 + 630}, math.inf)
    assert silence.newly(["a"]) == {"a"}


def test_a_pool_scaled_to_zero_and_back_is_watched_again():
    silence = Silence(timeout_s=600)
    silence.heard("a", T0, T0)
    silence.keep_only(set())  # scaled to zero
    assert silence.silent({}, T0 + 10) == ({}, math.inf)
    silence.heard("b", T0 + 100, T0 + 100)  # a new node of the pool, its agent dies
    assert silence.silent({"b": node("b", T0 + 100)}, T0 + 701) == ({"b": T0 + 700}, math.inf)


def test_a_new_process_holds_a_node_with_an_open_episode_until_its_agent_reports():
    silence = Silence(timeout_s=600)
    silence.heard("dead", T0 - 5000, T0)  # what a dead agent last said: all True
    silence.heard("alive", T0 - 60, T0)
    silence.presume({"dead", "alive"})
    nodes = {"dead": node("dead", T0 - 5000), "alive": node("alive", T0 - 60)}
    silent, _ = silence.silent(nodes, T0)
    assert silent == {"dead": T0, "alive": T0}  # held from the first look
    assert silence.newly(silent) == set()  # not said silent: its time is not up
    silence.heard("alive", T0 + 120, T0 + 120)  # a heartbeat: the agent lives
    for at in (T0 + 121, T0 + 599):
        silent, _ = silence.silent(nodes, at)
        assert silent == {"dead": T0}, at  # never released in between
    silent, _ = silence.silent(nodes, T0 + 601)
    assert silent == {"dead": T0}  # Unknown from the same moment: no grace started over
    assert silence.newly(silent) == {"dead"}  # now it is said, once
