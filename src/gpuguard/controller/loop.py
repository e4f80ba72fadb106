"""``gpuguard controller``: watch the fleet, run the policy, apply its plan; leader only.

Four watches feed it, each its own concern: Nodes (``nodes.py``: a slim projection of
each, folded into the reconciler's attention set and population, and quarantined at once
when unhealthy, ``quarantine.py``), NodeRemediations (the agents' answers to requested
actions, here), Pods and Jobs (``workloads.py``: how drains and deferred repairs progress,
crash attribution, and the service levels of ``slis.py``). Cleanup runs on its own thread
(``cleanup.py``). While this replica holds the Lease a pass runs on every
change that can matter and at the reconciler's deadline, the next time one of the
policy's own clocks runs out; ``resync_s`` is only a safety net. Episodes are read from
their NodeRemediation objects when leadership starts (so a new leader continues where the
last one stopped) and kept in memory after that; any failed write drops that memory so
the next pass reads the cluster again.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping

from gpuguard import threads
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.errors import ContractError
from gpuguard.contract.times import format_time
from gpuguard.controller.apply import Applier
from gpuguard.controller.attribution import Attributor
from gpuguard.controller.breaker_store import BreakerStore
from gpuguard.controller.cleanup import KEEP_CLOSED_S, ClosedEpisodes
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.nodes import NodeCache, NodeParts
from gpuguard.controller.pods import PodCache, slim_pod
from gpuguard.controller.position_faults import PositionFaults
from gpuguard.controller.preflight import PreflightOutcomes
from gpuguard.controller.providers import provider_for
from gpuguard.controller.quarantine import Quarantine
from gpuguard.controller.replacements import Replacements
from gpuguard.controller.slis import DEFAULT_GPU_NODES, Selector, ServiceLevels
from gpuguard.controller.watches import Watched
from gpuguard.controller.watches import start as watches_start
from gpuguard.controller.workloads import Wake, Workloads
from gpuguard.kube.errors import KubeError, KubeFenced
from gpuguard.kube.fleet import decode_node, decode_node_page
from gpuguard.kube.jobs import JOBS, slim_job
from gpuguard.kube.lease import LeaderElector, start_leader_election
from gpuguard.kube.remediations import NODE_REMEDIATIONS, StoredEpisodes, answer_in, read_episodes
from gpuguard.kube.rest import NODES, PODS, KubeApi, WatchEvent
from gpuguard.kube.watch import WATCH_JOIN_S, Snapshot
from gpuguard.metrics_server import LIVENESS_S
from gpuguard.remediation.health import AGENT_SILENT, silenced
from gpuguard.remediation.model import NodeObservation, Plan
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Reconciler

log = logging.getLogger("gpuguard.controller")
LEASE_NAME = "gpuguard-controller"
RETRY_S = 2.0
RESYNC_S = 300.0  # a pass at least this often, whatever the deadline says
POD_SETTLE_S = 1.0  # pod changes are looked at this long after the first (one pass)
BEAT_S = LIVENESS_S / 4  # the loop shows it is alive this often, even with nothing to do
EVICTION_RETRY_S = 5.0  # evictions a disruption budget refused are tried again (kubectl drain: 5 s)


class Controller:
    def __init__(
        self,
        api: KubeApi,
        policy: Policy,
        provider: str,
        *,
        namespace: str,
        identity: str,
        dry_run: bool = False,
        metrics: ControllerMetrics | None = None,
        gpu_nodes: Selector = DEFAULT_GPU_NODES,
        clock: Clock = SYSTEM_CLOCK,
        keep_closed_s: float = KEEP_CLOSED_S,
        resync_s: float = RESYNC_S,
        lease_s: float = 15.0,
        renew_s: float = 5.0,
        retry_s: float = RETRY_S,
        preflight: bool = False,  # read the preflight gate's outcomes (preflight.py)
        gpu_quarantine: Callable[[Controller], object] | None = None,
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
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.elector = LeaderElector(
            api, namespace, LEASE_NAME, identity, lease_s=lease_s, renew_s=renew_s, clock=clock
        )
        # Every write but the Lease's goes through this view: fenced by leadership.
        self.writer = api.fenced(self.holds_lease, f"{identity} does not hold the Lease")
        self.breakers = BreakerStore(self.writer, namespace)
        self.applier = Applier(
            self.writer,
            provider_for(provider, self.writer),
            EventRecorder(self.writer, identity),
            self.metrics,
            dry_run=dry_run,
        )
        self.reconciler = Reconciler(policy)
        self.quarantine = Quarantine(self.writer, self.metrics, policy)
        self.replacements = Replacements(self.applier)
        self._add_watched_parts(policy, dry_run, preflight)
        self.closed = ClosedEpisodes(self.writer, self.keep_closed_s, clock)
        self._wake = threading.Event()
        self._urgent = False  # something woke the loop that wants a pass at once
        self._pods_due = math.inf  # when pod changes seen since the last pass are looked at
        self._listed: set[str] = set()  # the watches that have delivered their first list
        self.leading = threading.Event()
        self.deadline = math.inf  # the last pass's: when it must run again at the latest
        self._held_told: set[str] = set()  # held nodes already announced by an Event
        self.watch_threads: list[threading.Thread] = []
        self.failed = ""  # why run() ended by itself ("": it did not)
        if gpu_quarantine is not None:  # DRA device taints (controller/gpu_quarantine.py)
            gpu_quarantine(self)

    def _add_watched_parts(self, policy: Policy, dry_run: bool, preflight: bool) -> None:
        """What the watches feed: the Node cache and the parts it tells of a change, and
        the workloads (pods, jobs)."""
        events = self.applier.events
        registry, now = self.metrics.registry, self.clock.now
        self.preflight = PreflightOutcomes(events, registry, policy, now) if preflight else None
        self.position_faults = PositionFaults(self.writer, events, self.metrics, dry_run=dry_run)
        self.attribution = Attributor(self.writer, events, self.metrics, policy, dry_run=dry_run)
        self.workloads = Workloads(
            PodCache(), self.attribution, self.slis, self.applier, self.reconciler, self.preflight
        )
        parts = NodeParts(
            self.reconciler,
            self.quarantine,
            self.attribution,
            self.position_faults,
            self.slis,
            self.metrics,
            self.preflight,
        )

        def may_quarantine() -> bool:
            return not dry_run and self.leading.is_set()

        self.nodes = NodeCache(policy, parts, self.clock, may_quarantine)

    # --- running ------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set, or until one of its threads dies (``failed`` says which):
        then it sets ``stop`` itself, which gives the Lease up, and returns; the process
        exits non-zero, so a broken replica never keeps the fleet's leadership."""
        self.watch_threads = watches = watches_start(
            self.api,
            [
                Watched(
                    "nodes", NODES.path(), self._take_nodes, None, decode_node_page, decode_node
                ),
                Watched("noderemediations", NODE_REMEDIATIONS.path(), self._take_answers),
                Watched("pods", PODS.path(), self._take_pods, slim_pod),
                Watched("jobs", JOBS.path(), self.workloads.take_jobs, slim_job),
                *(self.preflight.watched() if self.preflight is not None else []),
            ],
            stop,
            self.metrics,
            self.retry_s,
        )
        election = start_leader_election(
            self.elector, stop, on_started_leading=self._lead, on_stopped_leading=self._step_down
        )
        cleanup = threads.start(
            "cleanup", functools.partial(self.closed.run, leading=self.leading), stop
        )
        threads.start("wake-on-stop", self._wake_on_stop, stop)
        while not stop.is_set():
            self.failed = threads.dead([*watches, election, cleanup])
            if self.failed:
                log.error("%s: stopping (the Lease is given up)", self.failed)
                stop.set()  # ends the election (releasing the Lease) and the watches
                break
            self.metrics.alive()
            woke = self._wake.wait(self._wait_s())
            self._wake.clear()
            if woke and not self._urgent and self.clock.now() < self._pods_due:
                continue  # pod changes only, not yet due: wait for more of them
            self._urgent, self._pods_due = False, math.inf
            if stop.is_set() or not self.leading.is_set() or not self.synced:
                continue
            try:
                self.reconcile()
            except KubeFenced as exc:
                self.reconciler.stale = True  # a new leader may have moved every episode on
                log.info("plan abandoned: %s", exc)
            except KubeError as exc:
                self.reconciler.stale = True
                log.warning("reconcile failed, retrying in %.0fs: %s", self.retry_s, exc)
                stop.wait(self.retry_s)
            except Exception:  # a bug or an object no model caught: the pass, not the loop
                self.reconciler.stale = True
                self.metrics.unreadable.labels("reconcile").inc()
                log.exception("reconcile failed, retrying in %.0fs", self.retry_s)
                stop.wait(self.retry_s)
        for thread in watches:  # ended by _wake_on_stop; none is left reading the client
            thread.join(WATCH_JOIN_S)
        election.join(WATCH_JOIN_S)  # its release of the Lease lets the standby lead now
        self.quarantine.close()

    def wake(self) -> None:
        """Run a pass now rather than at the deadline (something changed that no watch
        sees)."""
        self._wake_now()

    def _wake_now(self) -> None:
        self._urgent = True
        self._wake.set()

    def _wake_soon(self) -> None:
        """Pods leave a draining node one by one: their changes are gathered for
        ``POD_SETTLE_S`` into one pass rather than a pass (and a round of re-sent
        evictions) each."""
        if self._pods_due == math.inf:
            self._pods_due = self.clock.now() + POD_SETTLE_S
            self._wake.set()

    @property
    def synced(self) -> bool:
        """Nodes, answers and pods have each been listed once: a pass sees the cluster."""
        return {"nodes", "answers", "pods"} <= self._listed

    def _wait_s(self) -> float:
        """Until the deadline (the liveness beat and ``resync_s`` bound it)."""
        left = min(self.deadline, self._pods_due) - self.clock.now()
        return max(0.0, min(left, self.resync_s, BEAT_S))

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        self.api.end_watches(stop)
        self._wake_now()

    def holds_lease(self) -> bool:
        """Leading, and within the renew deadline of the last renewal: checked before every
        write, so a replica frozen past its Lease (a paused VM, a long GC, SIGSTOP) writes
        nothing after it thaws, even before its election thread has noticed the loss."""
        return self.leading.is_set() and self.elector.is_leader()

    def _lead(self) -> None:
        log.info("%s leads", self.identity)
        self.quarantine.forget()
        self.reconciler.stale = True  # read the episodes the previous leader wrote
        self.metrics.leader.set(1)
        self.slis.leading = True
        self.leading.set()
        self._wake_now()

    def _step_down(self) -> None:
        log.info("%s no longer leads", self.identity)
        self.quarantine.forget()
        self.leading.clear()
        self.slis.leading = False
        self.metrics.leader.set(0)

    def _take_nodes(self, item: Snapshot | WatchEvent) -> str:
        relevant = self.nodes.take(item)
        self._listed.add("nodes")
        self.metrics.ready.set()
        if relevant:
            self._wake_now()
        return item.resource_version

    def _take_pods(self, item: Snapshot | WatchEvent) -> str:
        wake = self.workloads.take_pods(item)
        self._listed.add("pods")
        if wake is Wake.NOW:
            self._wake_now()
        elif wake is Wake.SOON:
            self._wake_soon()
        return item.resource_version

    def _take_answers(self, item: Snapshot | WatchEvent) -> str:
        """Answers to requested actions, as the agents (or providers) write them."""
        objects = item.items if isinstance(item, Snapshot) else [item.object]
        if isinstance(item, WatchEvent) and item.type == "DELETED":
            self.applier.forget_version(item.object)
            if (item.object.get("spec") or {}).get("nodeName") in self.reconciler.held:
                self.reconciler.stale = True
                self._wake_now()
            objects = []
        news = isinstance(item, Snapshot)
        for obj in objects:
            self.applier.note_object(obj)
            if (obj.get("spec") or {}).get("nodeName") in self.reconciler.held:
                self.reconciler.stale = news = True  # mended or replaced: read it again
            try:
                answer = answer_in(obj)
            except ContractError as exc:
                log.warning("ignoring an answer: %s", exc)
                continue
            if answer is not None:
                news |= self.reconciler.take_result(answer.node, answer.opened_at, answer.result)
        self._listed.add("answers")
        if news:  # not for the controller's own writes of the episode
            self._wake_now()
        return item.resource_version

    # --- one pass -----------------------------------------------------------------
    def reconcile(self) -> Plan:
        now = self.clock.now()
        reconciler = self.reconciler
        cache = self.nodes
        if reconciler.stale:
            stored = read_episodes(self.api)
            self.applier.versions.clear()
            for name, version in stored.versions.items():
                self.applier.note_version(name, version)
            self.breakers.load()
            reconciler.load(stored.open, stored.closed, self.breakers.state, held=stored.held)
            with cache.lock:
                cache.silence.presume(stored.open.keys())
            self._report_unreadable(stored)
            reconciler.history.forget_before(now - self.policy.history_s)
            self.replacements.reload(reconciler.history, now)
        cache.attribute(now)  # after a takeover's reload: a repair read back spends a failure
        with cache.lock:
            silent, next_silence = cache.silence.silent(cache.observed, now)
            # Only nodes that can need a decision; the population sizes budgets and breaker.
            ahead = self.quarantine.waiting()  # tainted, their episodes not opened yet
            wanted = (reconciler.wanted() | silent.keys() | ahead) & cache.nodes.keys()
            nodes = {name: cache.nodes[name] for name in wanted}
            observations = {
                name: self.workloads.with_pods(
                    self._read(cache.observed[name], silent.get(name)), now
                )
                for name in wanted
            }
            population = {pool: n for pool, n in reconciler.population.items() if n}
            notices = cache.positions.untold(self.metrics)
        self._tell_silent(silent, now)
        for notice in notices:
            self.applier.events.about_node(notice.node, notice.reason, notice.note, now)
        done = reconciler.reconcile(
            observations,
            now,
            self.applier.for_pass(nodes, now),
            breaker_reset=self.breakers.reset_requested(now),
            population=population,
        )
        self.breakers.save(done.plan.breaker)
        self.quarantine.settled(reconciler.episodes.keys() & ahead)
        self.workloads.mark_ahead(observations, cache.take_lost(), now)
        self.replacements.take(done.plan, now)
        if self.replacements.awaiting:
            with cache.lock:
                registered = list(cache.observed.values())
            self.replacements.name(reconciler.history, registered, now)
        self.deadline = min(done.deadline, next_silence)
        if not self.position_faults.publish(reconciler.episodes.values(), now):
            self.deadline = min(self.deadline, now + self.retry_s)
        if self.applier.evictions_blocked:  # a budget frees up with no event we watch
            self.applier.evictions_blocked = False
            self.deadline = min(self.deadline, now + EVICTION_RETRY_S)
        self.metrics.observe_pass(done.plan, observations, now, self.clock.now())
        return done.plan

    def _read(self, observed: NodeObservation, silent_since: float | None) -> NodeObservation:
        """The node as a pass sees it: with our quarantine's taint, silenced if quiet."""
        episode = observed.name in self.reconciler.episodes
        observed = self.quarantine.as_pass_sees(observed, episode=episode)
        return observed if silent_since is None else silenced(observed, silent_since)

    def _tell_silent(self, silent: Mapping[str, float], now: float) -> None:
        self.metrics.silent_agents.set(len(silent))
        for name in sorted(self.nodes.silence.newly(silent)):
            observed = self.nodes.observed.get(name)
            reported = observed.reported_at if observed is not None else None
            last = format_time(reported) if reported is not None else "(never)"
            timeout = self.policy.agent_timeout_s
            note = (
                f"the gpuguard agent on {name} has not reported for {timeout:g}s (its last "
                f"report is stamped {last}): what it said was True now reads Unknown"
            )
            log.warning("%s", note)
            self.applier.events.about_node(name, AGENT_SILENT, note, now)

    def _report_unreadable(self, stored: StoredEpisodes) -> None:
        """Count what could not be read, and tell about each node newly held (an Event
        on the Node: a person must mend or delete the object)."""
        self.metrics.unreadable.labels("NodeRemediation").inc(len(stored.unreadable))
        self.metrics.held_nodes.set(len(stored.held))
        for node, why in stored.held.items():
            if node not in self._held_told:
                note = f"held (no repair) until its NodeRemediation is mended or deleted: {why}"
                self.applier.events.about_node(node, "EpisodeUnreadable", note, self.clock.now())
        self._held_told = set(stored.held)
