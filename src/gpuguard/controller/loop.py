"""``gpuguard controller``: watch the fleet, run the policy, apply its plan; leader only.

The Node watch keeps a slim projection of every Node; a reconcile runs on every change
(and at least every ``resync_s``) while this replica holds the Lease. The Node cache and a
Job watch also feed the service-level metrics (controller/slis.py). Episodes are read
from their NodeRemediation objects when leadership starts (so a new leader continues where
the last one stopped) and kept in memory after that; any failed write drops that memory so
the next reconcile reads the cluster again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from gpuguard.controller.apply import Applier
from gpuguard.controller.breaker_store import BreakerStore
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.observe import project_node
from gpuguard.controller.providers import Provider
from gpuguard.controller.slis import DEFAULT_GPU_NODES, Selector, ServiceLevels
from gpuguard.kube import drain
from gpuguard.kube.errors import KubeError
from gpuguard.kube.fleet import slim_node
from gpuguard.kube.jobs import JOBS, slim_job
from gpuguard.kube.lease import LeaderElector, start_leader_election
from gpuguard.kube.remediations import delete_closed_before, list_episodes, read_result
from gpuguard.kube.rest import NODES, Json, KubeApi, WatchEvent
from gpuguard.kube.watch import WATCH_JOIN_S, Snapshot, keep_watching, list_then_watch
from gpuguard.remediation.decide import decide
from gpuguard.remediation.health import deferred_repair, named_gpus
from gpuguard.remediation.history import History
from gpuguard.remediation.model import (
    DecisionKind,
    Episode,
    NodeObservation,
    Phase,
    Plan,
)
from gpuguard.remediation.policy import Policy

log = logging.getLogger("gpuguard.controller")
LEASE_NAME = "gpuguard-controller"
RETRY_S = 2.0
KEEP_CLOSED_S = 30 * 86400.0  # closed episodes are the audit trail: a month by default
COLLECT_EVERY_S = 3600.0


def _needs_attention(observed: NodeObservation) -> bool:
    """Not plainly healthy, or carrying our taint, our cordon or our verify request."""
    return (
        observed.tainted
        or observed.cordoned_by_us
        or observed.verify_request is not None
        or any(layer.status != "True" for layer in observed.layers.values())
    )


class Controller:
    def __init__(
        self,
        api: KubeApi,
        policy: Policy,
        provider: Provider,
        *,
        namespace: str,
        identity: str,
        dry_run: bool = False,
        metrics: ControllerMetrics | None = None,
        gpu_nodes: Selector = DEFAULT_GPU_NODES,
        clock: Callable[[], float] = time.time,
        keep_closed_s: float = KEEP_CLOSED_S,
        resync_s: float = 1.0,
        lease_s: float = 15.0,
        renew_s: float = 5.0,
        retry_s: float = RETRY_S,
    ) -> None:
        self.api = api
        self.policy = policy
        self.identity = identity
        self.metrics = metrics or ControllerMetrics()
        self.slis = ServiceLevels(gpu_nodes)
        self.metrics.registry.register(self.slis)
        self.clock = clock
        # Never shorter than the history the policy reads (lemons, breaker).
        self.keep_closed_s = max(keep_closed_s, policy.history_s)
        self._collected_at = float("-inf")
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.elector = LeaderElector(
            api, namespace, LEASE_NAME, identity, lease_s=lease_s, renew_s=renew_s
        )
        self.breakers = BreakerStore(api, namespace)
        self.applier = Applier(
            api, provider, EventRecorder(api, identity), self.metrics, dry_run=dry_run
        )
        self._nodes: dict[str, Json] = {}
        self._observed: dict[str, NodeObservation] = {}
        self._attention: set[str] = set()  # not plainly healthy, or ours to clean up
        self._population: Counter[str] = Counter()  # nodes per pool
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._synced = threading.Event()
        self.leading = threading.Event()
        self._episodes: dict[str, Episode] | None = None
        self._history = History()

    # --- running ------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        watches = [
            threading.Thread(
                target=self._follow,
                args=(stop, path, project, take),
                name=f"watch-{what}",
                daemon=True,
            )
            for what, path, project, take in (
                ("nodes", NODES.path(), slim_node, self._take),
                ("jobs", JOBS.path(), slim_job, self._take_jobs),
            )
        ]
        for thread in watches:
            thread.start()
        start_leader_election(
            self.elector, stop, on_started_leading=self._lead, on_stopped_leading=self._step_down
        )
        threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True).start()
        while not stop.is_set():
            self.metrics.alive()
            self._wake.wait(self.resync_s)
            self._wake.clear()
            if stop.is_set() or not self.leading.is_set() or not self._synced.is_set():
                continue
            try:
                self.reconcile()
            except KubeError as exc:
                self._episodes = None
                log.warning("reconcile failed, retrying in %.0fs: %s", self.retry_s, exc)
                stop.wait(self.retry_s)
        for thread in watches:  # ended by _wake_on_stop; none is left reading the client
            thread.join(WATCH_JOIN_S)

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        self.api.end_watches(stop)
        self._wake.set()

    def _lead(self) -> None:
        log.info("%s leads", self.identity)
        self._episodes = None  # read the episodes the previous leader wrote
        self.metrics.leader.set(1)
        self.slis.leading = True
        self.leading.set()
        self._wake.set()

    def _step_down(self) -> None:
        log.info("%s no longer leads", self.identity)
        self.leading.clear()
        self.slis.leading = False
        self.metrics.leader.set(0)

    def _follow(
        self,
        stop: threading.Event,
        path: str,
        project: Callable[[Json], Json],
        take: Callable[[Snapshot | WatchEvent], str],
    ) -> None:
        version = ""

        def stream() -> Iterator[Snapshot | WatchEvent]:
            return list_then_watch(
                self.api, path, project=project, resource_version=version, stop=stop
            )

        def fold(item: Snapshot | WatchEvent) -> None:
            nonlocal version
            version = take(item) or version

        keep_watching(stream, fold, stop, log=log, what=path, retry_s=self.retry_s)

    def _take(self, item: Snapshot | WatchEvent) -> str:
        """Fold a watch item into the cache, projecting each changed Node once here so
        that a reconcile never walks the whole fleet."""
        with self._lock:
            if isinstance(item, Snapshot):
                self._nodes, self._observed = {}, {}
                self._attention, self._population = set(), Counter()
                for node in item.items:
                    self._put(node)
                self.slis.nodes_listed(item.items)
            else:
                name = item.object["metadata"]["name"]
                if item.type == "DELETED":
                    self._drop(name)
                    self.slis.node_gone(name)
                else:
                    self._put(item.object)
                    self.slis.node_seen(item.object)
            version = item.resource_version
        self._synced.set()
        self.metrics.ready.set()
        self._wake.set()
        return version

    def _take_jobs(self, item: Snapshot | WatchEvent) -> str:
        if isinstance(item, Snapshot):
            self.slis.jobs_listed(item.items)
        elif item.type == "DELETED":
            self.slis.job_gone(item.object)
        else:
            self.slis.job_seen(item.object)
        return item.resource_version

    def _put(self, node: Json) -> None:
        name = node["metadata"]["name"]
        self._drop(name)
        observed = project_node(node, self.policy.pool_label, self.policy.correlation.domain_label)
        self._nodes[name], self._observed[name] = node, observed
        self._population[observed.pool] += 1
        if _needs_attention(observed):
            self._attention.add(name)

    def _drop(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._attention.discard(name)
        old = self._observed.pop(name, None)
        if old is not None:
            self._population[old.pool] -= 1

    # --- one pass -----------------------------------------------------------------
    def reconcile(self) -> Plan:
        now = self.clock()
        if self._episodes is None:
            self._episodes, closed = list_episodes(self.api)
            self._history = History(closed)
            self._history.forget_before(self._history_horizon())
            self.breakers.load()
        episodes = self._refresh_results(self._episodes)
        with self._lock:
            # Only nodes that can need a decision; the population sizes budgets and breaker.
            wanted = (self._attention | episodes.keys()) & self._nodes.keys()
            nodes = {name: self._nodes[name] for name in wanted}
            observations = {name: self._observed[name] for name in wanted}
            population = {pool: count for pool, count in self._population.items() if count}
        for name, episode in episodes.items():
            if episode.phase is Phase.DRAINING and name in observations:
                moving = drain.evictable_count(self.api, name, episode.gpus)
                observations[name] = dataclasses.replace(observations[name], pods_to_move=moving)
        for name, observed in observations.items():
            # A deferred repair (drain and reset) waits for the pods on its GPUs; counted
            # for a node about to open its episode too, so it never starts under them.
            current = episodes.get(name)
            waiting = current is None or current.phase is Phase.QUARANTINED
            if waiting and deferred_repair(observed):
                running = drain.gpu_pods_running(self.api, name, named_gpus(observed))
                observations[name] = dataclasses.replace(observed, pods_on_gpus=running)
        plan = decide(
            observations,
            episodes,
            self._history,
            self.breakers.state,
            self.policy,
            now,
            breaker_reset=self.breakers.reset_requested(now),
            population=population,
        )
        opened = plan.episodes.keys() - episodes.keys()
        failures = self.applier.apply(plan, nodes, now, opened)
        self._remember(plan, failures)
        self.breakers.save(plan.breaker)
        self._observe_metrics(plan, observations, now)
        if now - self._collected_at >= COLLECT_EVERY_S:
            self.collect_closed(now)
        return plan

    def collect_closed(self, now: float) -> int:
        """Delete NodeRemediations of episodes closed more than ``keep_closed_s`` ago, so
        the objects (and the controller's start-up list) do not grow without bound."""
        self._collected_at = now
        deleted = delete_closed_before(self.api, now - self.keep_closed_s)
        if deleted:
            log.info("deleted %d NodeRemediations closed before the retention window", deleted)
        return deleted

    def _refresh_results(self, episodes: dict[str, Episode]) -> dict[str, Episode]:
        """Episodes waiting for the agent get the agent's latest answer."""
        refreshed = dict(episodes)
        for name, episode in episodes.items():
            if episode.phase is Phase.ACTING and episode.action_result is None:
                result = read_result(self.api, episode)
                if result is not None:
                    refreshed[name] = dataclasses.replace(episode, action_result=result)
        return refreshed

    def _remember(self, plan: Plan, failures: set[str]) -> None:
        if failures:
            self._episodes = None  # what the cluster holds is now the truth
            return
        closed = [e for e in plan.episodes.values() if e.phase is Phase.CLOSED]
        self._episodes = {n: e for n, e in plan.episodes.items() if e.phase is not Phase.CLOSED}
        self._history.add(closed)
        self._history.forget_before(self._history_horizon())

    def _history_horizon(self) -> float:
        """Closed episodes older than this matter to no policy rule (lemons, breaker)."""
        return self.clock() - self.policy.history_s

    def _observe_metrics(
        self, plan: Plan, observations: dict[str, NodeObservation], now: float
    ) -> None:
        self.metrics.observe_plan(plan, {n: o.pool for n, o in observations.items()})
        for decision in plan.decisions:
            observed = observations.get(decision.node)
            if decision.kind is DecisionKind.TAINT and observed is not None:
                bad = [lay.since for lay in observed.layers.values() if lay.status != "True"]
                if bad:
                    self.metrics.to_quarantine.observe(max(0.0, self.clock() - min(bad)))
            if decision.kind is DecisionKind.RECORD:
                episode = plan.episodes.get(decision.node)
                if episode is not None and episode.phase is Phase.CLOSED:
                    self.metrics.to_close.labels(str(episode.resolution)).observe(
                        max(0.0, now - episode.opened_at)
                    )
        self.metrics.reconcile.observe(self.clock() - now)
