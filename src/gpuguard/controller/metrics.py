"""The controller's metrics: phases, actions, latencies, budget and breaker."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuguard.contract.conditions import TRUE
from gpuguard.contract.remediation import Resolution
from gpuguard.metrics_server import Probes
from gpuguard.remediation.model import DecisionKind, Episode, NodeObservation, Phase, Plan

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60, 300, 900, 3600, 14400)


class ControllerMetrics(Probes):
    """Readiness is set once the Node cache is filled; the reconcile loop beats liveness."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = CollectorRegistry()
        self._add_episodes()
        self._add_readings()
        self._add_workloads()

    def _add_episodes(self) -> None:
        self.nodes_by_phase = Gauge(
            "gpuguard_controller_nodes",
            "Nodes with an open episode, by phase",
            ["phase"],
            registry=self.registry,
        )
        # One series per open episode (so bounded by the nodes under repair): its rung for
        # the dashboards, and the time in its phase for the stuck-episode alert.
        self.phase_since = Gauge(
            "gpuguard_controller_episode_phase_since_timestamp_seconds",
            "When each open episode entered its current phase (rung NONE: none chosen yet)",
            ["node", "phase", "rung"],
            registry=self.registry,
        )
        self.actions = Counter(
            "gpuguard_controller_actions_total",
            "Decisions applied, by kind and result",
            ["kind", "result"],
            registry=self.registry,
        )
        self.evictions = Counter(
            "gpuguard_controller_evictions_total",
            "Pod evictions, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.to_quarantine = Histogram(
            "gpuguard_controller_detection_to_quarantine_seconds",
            "From a condition turning bad to our taint being on the Node",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.to_close = Histogram(
            "gpuguard_controller_episode_seconds",
            "From detection to the episode closing",
            ["resolution"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # Every resolution's series from the start: increase() over a series counts only
        # what came after its first sample, so a series born at the first repair loses it.
        for resolution in Resolution:
            self.to_close.labels(resolution.value)
        self.budget_in_use = Gauge(
            "gpuguard_controller_disruptions_in_progress",
            "Nodes draining, acting or verifying, by pool",
            ["pool"],
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "gpuguard_controller_breaker_open",
            "1 while the fleet circuit breaker is open",
            registry=self.registry,
        )

    def _add_readings(self) -> None:
        """What could not be read, and what the nodes' reports and labels leave open."""
        self.unreadable = Counter(
            "gpuguard_controller_unreadable_objects_total",
            "Objects read from the cluster that gpuguard could not read, by kind "
            "(each is logged with the object and field; a node whose episode is unreadable "
            "is held)",
            ["kind"],
            registry=self.registry,
        )
        self.held_nodes = Gauge(
            "gpuguard_controller_held_nodes",
            "Nodes held because their episode cannot be read: no new episode, no repair",
            registry=self.registry,
        )
        self.silent_agents = Gauge(
            "gpuguard_controller_silent_agents",
            "Nodes whose agent's last report is older than the policy's agent_timeout_s",
            registry=self.registry,
        )
        self.nodes_without_position = Gauge(
            "gpuguard_controller_nodes_without_position",
            "Nodes the agent reports on whose position labels (policy positions.labels) are "
            "missing or incomplete: the policy uses the node's name for its position",
            ["reason"],
            registry=self.registry,
        )
        self.shared_positions = Gauge(
            "gpuguard_controller_shared_positions",
            "Positions claimed by more than one live Node (no reboot or replace there)",
            registry=self.registry,
        )
        # One series per node held for its position's fault: bounded by the nodes held.
        self.position_at_fault = Gauge(
            "gpuguard_position_at_fault",
            "1 while the node's open episode holds its position at fault (a cable, an optic, "
            "a switch port): no reboot or replace there until a person marks it fixed",
            ["position", "node"],
            registry=self.registry,
        )

    def _add_workloads(self) -> None:
        """Crash attribution, and the loop's own."""
        self.pod_failures = Counter(
            "gpuguard_controller_pod_failures_total",
            "Failed training pods judged: whether the infrastructure ended them (then not "
            "charged to the job), and the cause (NotAttributed: the job's own)",
            ["attributed", "cause"],
            registry=self.registry,
        )
        # One series per suspect node: bounded by the nodes pods keep crashing on.
        self.crash_suspect = Gauge(
            "gpuguard_controller_crash_suspect",
            "Nodes held suspect because pods of different jobs crashed there with no cause "
            "found; the value is how many jobs",
            ["node"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "gpuguard_controller_leader",
            "1 on the replica that holds the Lease",
            registry=self.registry,
        )
        self.reconcile = Histogram(
            "gpuguard_controller_reconcile_seconds",
            "Wall time of one reconcile",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe_pass(
        self, plan: Plan, observations: Mapping[str, NodeObservation], started: float, ended: float
    ) -> None:
        """A pass's plan, the latency of its taints and of its closed episodes, its time."""
        self.observe_plan(plan, {n: o.pool for n, o in observations.items()})
        for decision in plan.decisions:
            observed = observations.get(decision.node)
            if decision.kind is DecisionKind.TAINT and observed is not None:
                bad = [lay.since for lay in observed.layers.values() if lay.status != TRUE]
                if bad:
                    self.to_quarantine.observe(max(0.0, ended - min(bad)))
            if decision.kind is DecisionKind.RECORD:
                episode = plan.episodes.get(decision.node)
                if episode is not None and episode.phase is Phase.CLOSED:
                    self.to_close.labels(str(episode.resolution)).observe(
                        max(0.0, started - episode.opened_at)
                    )
        self.reconcile.observe(ended - started)

    def observe_plan(self, plan: Plan, pools: Mapping[str, str]) -> None:
        open_episodes = [e for e in plan.episodes.values() if e.phase is not Phase.CLOSED]
        phases = Tally(e.phase for e in open_episodes)
        for phase in Phase:
            if phase is not Phase.CLOSED:
                self.nodes_by_phase.labels(str(phase)).set(phases.get(phase, 0))
        self.phase_since.clear()
        for episode in open_episodes:
            rung = str(episode.rung) if episode.rung is not None else "NONE"
            self.phase_since.labels(episode.node, str(episode.phase), rung).set(episode.phase_since)
        active = Tally(pools.get(e.node, "") for e in open_episodes if _active(e))
        self.budget_in_use.clear()
        for pool, count in active.items():
            self.budget_in_use.labels(pool).set(count)
        self.breaker_open.set(plan.breaker.open)


def _active(episode: Episode) -> bool:
    return episode.phase in (Phase.DRAINING, Phase.ACTING, Phase.VERIFYING)
