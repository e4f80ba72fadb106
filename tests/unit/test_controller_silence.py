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
