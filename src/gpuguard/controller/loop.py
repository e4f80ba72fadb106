"""``gpuguard controller``: watch the fleet, run the policy, apply its plan; leader only.

Four watches feed it: Nodes (a slim projection of each, folded into the reconciler's
attention set and population), NodeRemediations (the agents' answers to requested
actions), Pods (how drains and deferred repairs progress) and Jobs (the service-level
metrics, controller/slis.py). While this replica holds the Lease a pass runs on every
change that can matter and at the reconciler's deadline, the next time one of the
policy's own clocks runs out; ``resync_s`` is only a safety net. Episodes are read from
their NodeRemediation objects when leadership starts (so a new leader continues where the
last one stopped) and kept in memory after that; any failed write drops that memory so
the next pass reads the cluster again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Mapping

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.conditions import TRUE
from gpuguard.contract.errors import ContractError
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.contract.times import format_time
from gpuguard.controller.apply import Applier
from gpuguard.controller.attribution import Attributor, node_at, with_crash_layer
from gpuguard.controller.breaker_store import BreakerStore
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.controller.observe import project_node, read_position
from gpuguard.controller.pods import PodCache, slim_pod
from gpuguard.controller.position_faults import PositionFaults
from gpuguard.controller.positions import Positions
from gpuguard.controller.providers import provider_for
from gpuguard.controller.quarantine import Quarantine
from gpuguard.controller.replacements import Replacements
from gpuguard.controller.silence import Silence
from gpuguard.controller.slis import DEFAULT_GPU_NODES, Selector, ServiceLevels
from gpuguard.controller.watches import Watched
from gpuguard.controller.watches import start as watches_start
from gpuguard.kube.errors import KubeError, KubeFenced
from gpuguard.kube.fleet import decode_node_page, slim_node
from gpuguard.kube.jobs import JOBS, slim_job
from gpuguard.kube.lease import LeaderElector, start_leader_election
from gpuguard.kube.remediations import (
    NODE_REMEDIATIONS,
    StoredEpisodes,
    answer_in,
    delete_closed_before,
    read_episodes,
)
from gpuguard.kube.rest import NODES, PODS, Json, KubeApi, WatchEvent
from gpuguard.kube.watch import WATCH_JOIN_S, Snapshot
from gpuguard.metrics_server import LIVENESS_S
from gpuguard.remediation.attribution import Cause, NodeAtFailure
from gpuguard.remediation.crash_memory import CRASH_LAYER
from gpuguard.remediation.health import (
    AGENT_SILENT,
    deferred_repair,
    false_layers,
    named_gpus,
    silenced,
)
from gpuguard.remediation.model import DecisionKind, NodeObservation, Phase, Plan
from gpuguard.remediation.policy import Policy
from gpuguard.remediation.reconciler import Pass, Reconciler

log = logging.getLogger("gpuguard.controller")
LEASE_NAME = "gpuguard-controller"
RETRY_S = 2.0
KEEP_CLOSED_S = 30 * 86400.0  # closed episodes are the audit trail: a month by default
COLLECT_EVERY_S = 3600.0
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
        self.positions = Positions()
        self.position_faults = PositionFaults(
            self.writer, self.applier.events, self.metrics, dry_run=dry_run
        )
        self.pods = PodCache()
        self.attribution = Attributor(
            self.writer, self.applier.events, self.metrics, policy, dry_run=dry_run
        )
        self._nodes: dict[str, Json] = {}
        self._observed: dict[str, NodeObservation] = {}
        # Nodes lost (deleted) or not Ready: the pods still running there are marked.
        self._lost: set[str] = set()
        self._crash_layered: set[str] = set()  # nodes whose observation has crash memory's layer
        self._lock = threading.Lock()  # the Node cache and the reconciler's node tracking
        self._wake = threading.Event()
        self._urgent = False  # something woke the loop that wants a pass at once
        self._pods_due = math.inf  # when pod changes seen since the last pass are looked at
        self._listed: set[str] = set()  # the watches that have delivered their first list
        self.leading = threading.Event()
        self.deadline = math.inf  # the last pass's: when it must run again at the latest
        self._held_told: set[str] = set()  # held nodes already announced by an Event
        self.silence = Silence(policy.agent_timeout_s)
        self.watch_threads: list[threading.Thread] = []
        self.failed = ""  # why run() ended by itself ("": it did not)

    # --- running ------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set, or until one of its threads dies (``failed`` says which):
        then it sets ``stop`` itself, which gives the Lease up, and returns; the process
        exits non-zero, so a broken replica never keeps the fleet's leadership."""
        self.watch_threads = watches = watches_start(
            self.api,
            [
                # Nodes are listed through the decoder that skips what slim_node drops.
                Watched("nodes", NODES.path(), self._take, slim_node, decode_node_page),
                Watched("noderemediations", NODE_REMEDIATIONS.path(), self._take_answers),
                Watched("pods", PODS.path(), self._take_pods, slim_pod),
                Watched("jobs", JOBS.path(), self._take_jobs, slim_job),
            ],
            stop,
            self.metrics,
            self.retry_s,
        )
        election = start_leader_election(
            self.elector, stop, on_started_leading=self._lead, on_stopped_leading=self._step_down
        )
        threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True).start()
        while not stop.is_set():
            dead = [thread.name for thread in [*watches, election] if not thread.is_alive()]
            if dead:
                self.failed = f"thread {', '.join(dead)} died"
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

    def _take(self, item: Snapshot | WatchEvent) -> str:
        """Fold a watch item into the cache, projecting each changed Node once here so
        that a reconcile never walks the whole fleet."""
        relevant = True  # a list, a Node added or gone (the population changes)
        with self._lock:
            if isinstance(item, Snapshot):
                self._nodes, self._observed = {}, {}
                self.reconciler.forget_nodes()
                self.positions.clear()
                self.position_faults.clear()
                for node in item.items:
                    self._put(node)
                self.silence.keep_only(self._observed.keys())
                self.slis.nodes_listed(item.items)
            else:
                name = item.object["metadata"]["name"]
                if item.type == "DELETED":
                    self._drop(name)
                    self.slis.node_gone(name)
                else:
                    relevant = self._put(item.object)
                    self.slis.node_seen(item.object)
                    self._quarantine_now(name, item.object)
            version = item.resource_version
        self._listed.add("nodes")
        self.metrics.ready.set()
        if relevant:
            self._wake_now()
        return version

    def _quarantine_now(self, name: str, node: Json) -> None:
        """Taint at once a node this change makes unhealthy (``quarantine.py``)."""
        self.quarantine.seen(name, node)
        if self.applier.dry_run or not self.leading.is_set():
            return
        if self._nodes.get(name) is node:  # else unreadable: the last good reading stands
            episode = name in self.reconciler.episodes
            self.quarantine.offer(node, self._observed[name], self.clock.now(), episode=episode)

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

    def _take_pods(self, item: Snapshot | WatchEvent) -> str:
        changed = self.pods.take(item)
        self._listed.add("pods")
        if isinstance(item, Snapshot):
            pods = item.items
        else:
            pods = [item.object] if item.type != "DELETED" else []
        if any([self.attribution.take_pod(pod) for pod in pods]):  # every pod taken
            self._wake_now()
        reconciler = self.reconciler
        if isinstance(item, Snapshot) or any(
            node in reconciler.episodes or node in reconciler.attention for node in changed
        ):
            self._wake_soon()  # a drain or a deferred repair may have moved on
        return item.resource_version

    def _take_jobs(self, item: Snapshot | WatchEvent) -> str:
        if isinstance(item, Snapshot):
            self.slis.jobs_listed(item.items)
            for job in item.items:
                self.attribution.take_job(job)
        elif item.type == "DELETED":
            self.slis.job_gone(item.object)
            self.attribution.take_job(item.object, deleted=True)
        else:
            self.slis.job_seen(item.object)
            self.attribution.take_job(item.object)
        return item.resource_version

    def _put(self, node: Json) -> bool:
        """Cache one Node; True when the change can matter to a decision (a healthy
        node's heartbeat, 5,000 of them every few minutes, does not)."""
        name = node["metadata"]["name"]
        old = self._observed.get(name)
        attended = name in self.reconciler.attention  # the old projection needed attention
        policy = self.policy
        try:
            labels = node["metadata"].get("labels") or {}
            reading = read_position(labels, policy.positions.labels)
            observed = project_node(
                node, policy.pool_label, policy.correlation.domain_label, reading.position
            )
        except Exception:  # the last good projection stands; the rest of the list goes on
            self.metrics.unreadable.labels("Node").inc()
            log.exception("Node %s could not be read, its last reading kept", name)
            return False
        observed = self._with_crashes(observed, self.clock.now())
        self._nodes[name], self._observed[name] = node, observed
        if node_at(node, None).ready:
            self._lost.discard(name)
        else:
            self._lost.add(name)
        self.position_faults.seen(node)
        sharing = self.positions.put(name, reading, reporting=bool(observed.layers))
        moved = [other for other in sharing if self._share(other)]
        attended |= any(other in self.reconciler.episodes for other in moved)
        observed = self._share(name) or observed
        annotations = node["metadata"].get("annotations") or {}
        if observed.reported_at is None and REPORT_ANNOTATION in annotations:
            self.metrics.unreadable.labels("report").inc()  # logged by project_node
        self.silence.heard(name, observed.reported_at, self.clock.now())
        attended |= self.reconciler.track(name, observed)  # replaces the old one's pool
        return (
            attended or old is None or old.pool != observed.pool or name in self.reconciler.episodes
        )

    def _drop(self, name: str) -> None:
        self.quarantine.settled([name])
        self.attribution.forget_node(name)
        self._lost.add(name)
        self._nodes.pop(name, None)
        self._observed.pop(name, None)
        self.silence.forget(name)
        self.reconciler.track(name, None)
        self.position_faults.forget(name)
        for other in self.positions.drop(name):
            self._share(other)

    def _share(self, name: str) -> NodeObservation | None:
        """Give the cached node the other live Nodes now claiming its position; the new
        observation when that changed it."""
        observed = self._observed.get(name)
        shared = self.positions.shared_with(name)
        if observed is None or observed.position_shared_with == shared:
            return None
        observed = dataclasses.replace(observed, position_shared_with=shared)
        self._observed[name] = observed
        self.reconciler.track(name, observed)
        return observed

    def _with_crashes(self, observed: NodeObservation, now: float) -> NodeObservation:
        return with_crash_layer(observed, self.attribution.layer(observed.name, now))

    def _node_at(self, name: str) -> NodeAtFailure:
        with self._lock:
            return node_at(self._nodes.get(name), self._observed.get(name))

    def _attribute(self, now: float) -> None:
        """Judge the failures waiting; a node they made suspect (or whose suspicion
        lapsed) is read again with its crash layer."""
        raised = self.attribution.judge(self._node_at, now)
        with self._lock:
            for name in raised | self._crash_layered:
                observed = self._observed.get(name)
                if observed is not None:
                    self._observed[name] = self._with_crashes(observed, now)
                    self.reconciler.track(name, self._observed[name])
            self._crash_layered = {
                name
                for name in raised | self._crash_layered
                if name in self._observed and CRASH_LAYER in self._observed[name].layers
            }
        self.attribution.publish(now)

    def _mark_ahead(self, observations: Mapping[str, NodeObservation], now: float) -> None:
        """The training pods still running on a node at fault, or lost, are the
        infrastructure's should they fail: marked now, before the Job controller can
        count them."""
        for name, episode in self.reconciler.episodes.items():
            observed = observations.get(name)
            layers = false_layers(observed) if observed is not None else []
            if episode.phase is Phase.CLOSED or not layers:
                continue
            codes = ", ".join(sorted({c for layer in layers for c in layer.codes})) or "a fault"
            pods = self.pods.running_on(name, episode.gpus)
            cause = Cause.GPU_FAULT if episode.gpus else Cause.NODE_FAULT
            self.attribution.mark_ahead(pods, cause, f"node {name} at fault: {codes}", now)
        with self._lock:
            lost = [(name, name in self._nodes) for name in self._lost]
            self._lost = {name for name, there in lost if there}  # gone: marked once
        for name, there in lost:
            why = f"node {name} is not Ready" if there else f"node {name} is gone"
            self.attribution.mark_ahead(self.pods.running_on(name), Cause.NODE_LOST, why, now)

    # --- one pass -----------------------------------------------------------------
    def reconcile(self) -> Plan:
        now = self.clock.now()
        reconciler = self.reconciler
        self._attribute(now)
        if reconciler.stale:
            stored = read_episodes(self.api)
            self.applier.versions.clear()
            for name, version in stored.versions.items():
                self.applier.note_version(name, version)
            self.breakers.load()
            reconciler.load(stored.open, stored.closed, self.breakers.state, held=stored.held)
            with self._lock:
                self.silence.presume(stored.open.keys())
            self._report_unreadable(stored)
            reconciler.history.forget_before(now - self.policy.history_s)
            self.replacements.reload(reconciler.history, now)
        with self._lock:
            silent, next_silence = self.silence.silent(self._observed, now)
            # Only nodes that can need a decision; the population sizes budgets and breaker.
            ahead = self.quarantine.waiting()  # tainted, their episodes not opened yet
            wanted = (reconciler.wanted() | silent.keys() | ahead) & self._nodes.keys()
            nodes = {name: self._nodes[name] for name in wanted}
            observations = {
                name: self._with_pods(self._read(self._observed[name], silent.get(name)), now)
                for name in wanted
            }
            population = {pool: n for pool, n in reconciler.population.items() if n}
            notices = self.positions.untold(self.metrics)
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
        self._mark_ahead(observations, now)
        self.replacements.take(done.plan, now)
        if self.replacements.awaiting:
            with self._lock:
                registered = list(self._observed.values())
            self.replacements.name(reconciler.history, registered, now)
        self.deadline = min(done.deadline, next_silence)
        if not self.position_faults.publish(reconciler.episodes.values(), now):
            self.deadline = min(self.deadline, now + self.retry_s)
        if self.applier.evictions_blocked:  # a budget frees up with no event we watch
            self.applier.evictions_blocked = False
            self.deadline = min(self.deadline, now + EVICTION_RETRY_S)
        self._observe_metrics(done, observations, now)
        if now - self._collected_at >= COLLECT_EVERY_S:
            self.collect_closed(now)
        return done.plan

    def _read(self, observed: NodeObservation, silent_since: float | None) -> NodeObservation:
        """The node as a pass sees it: with our quarantine's taint, silenced if quiet."""
        episode = observed.name in self.reconciler.episodes
        observed = self.quarantine.as_pass_sees(observed, episode=episode)
        return observed if silent_since is None else silenced(observed, silent_since)

    def _tell_silent(self, silent: Mapping[str, float], now: float) -> None:
        self.metrics.silent_agents.set(len(silent))
        for name in sorted(self.silence.newly(silent)):
            observed = self._observed.get(name)
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

    def _with_pods(self, observed: NodeObservation, now: float) -> NodeObservation:
        """What the pod watch says of the node's drain, or, before a rung starts, of the
        work a deferred repair waits for and of a pod that asks not to be disrupted
        (counted for a node about to open its episode too, so that no rung starts under
        them)."""
        episode = self.reconciler.episodes.get(observed.name)
        if episode is not None and episode.phase is Phase.DRAINING:
            moving = self.pods.to_move(observed.name, episode.gpus)
            blocked = observed.name in self.applier.drains_blocked
            return dataclasses.replace(observed, pods_to_move=moving, drain_blocked=blocked)
        if episode is not None and episode.phase is not Phase.QUARANTINED:
            return observed
        protected_by = self.pods.protected_by(observed.name, now)
        if deferred_repair(observed):
            running = self.pods.on_gpus(observed.name, named_gpus(observed))
            return dataclasses.replace(observed, pods_on_gpus=running, protected_by=protected_by)
        return (
            dataclasses.replace(observed, protected_by=protected_by) if protected_by else observed
        )

    def collect_closed(self, now: float) -> int:
        """Delete NodeRemediations of episodes closed more than ``keep_closed_s`` ago, so
        the objects (and the controller's start-up list) do not grow without bound."""
        self._collected_at = now
        deleted = delete_closed_before(self.writer, now - self.keep_closed_s)
        if deleted:
            log.info("deleted %d NodeRemediations closed before the retention window", deleted)
        return deleted

    def _observe_metrics(
        self, done: Pass, observations: Mapping[str, NodeObservation], now: float
    ) -> None:
        plan = done.plan
        self.metrics.observe_plan(plan, {n: o.pool for n, o in observations.items()})
        for decision in plan.decisions:
            observed = observations.get(decision.node)
            if decision.kind is DecisionKind.TAINT and observed is not None:
                bad = [lay.since for lay in observed.layers.values() if lay.status != TRUE]
                if bad:
                    self.metrics.to_quarantine.observe(max(0.0, self.clock.now() - min(bad)))
            if decision.kind is DecisionKind.RECORD:
                episode = plan.episodes.get(decision.node)
                if episode is not None and episode.phase is Phase.CLOSED:
                    self.metrics.to_close.labels(str(episode.resolution)).observe(
                        max(0.0, now - episode.opened_at)
                    )
        self.metrics.reconcile.observe(self.clock.now() - now)
