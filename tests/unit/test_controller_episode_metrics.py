"""The controller's per-episode series: one per open episode, gone once it closes."""

from __future__ import annotations

from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.model import Action
from gpuguard.remediation.model import BreakerState, Episode, Phase, Plan

SINCE = "gpuguard_controller_episode_phase_since_timestamp_seconds"


def plan(*episodes: Episode) -> Plan:
    return Plan(decisions=[], episodes={e.node: e for e in episodes}, breaker=BreakerState())


def test_each_open_episode_has_its_phase_rung_and_time_in_phase():
    metrics = ControllerMetrics()
    draining = Episode("gpu-a", opened_at=100.0, phase=Phase.DRAINING, rung=Action.REBOOT)
    draining.phase_since = 160.0
    waiting = Episode("gpu-b", opened_at=200.0, phase_since=200.0)
    metrics.observe_plan(plan(draining, waiting), {})
    value = metrics.registry.get_sample_value
    assert value(SINCE, {"node": "gpu-a", "phase": "Draining", "rung": "REBOOT"}) == 160.0
    assert value(SINCE, {"node": "gpu-b", "phase": "Quarantined", "rung": "NONE"}) == 200.0

    draining.phase, draining.closed_at = Phase.CLOSED, 300.0
    draining.phase_since = 300.0
    metrics.observe_plan(plan(draining, waiting), {})
    samples = [s for m in metrics.registry.collect() if m.name == SINCE for s in m.samples]
    assert [s.labels["node"] for s in samples] == ["gpu-b"]  # the closed one is gone
