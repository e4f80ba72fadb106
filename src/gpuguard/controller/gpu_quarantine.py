"""Per-GPU quarantine: a finding confined to some GPUs taints just those devices (DRA
DeviceTaintRules, ``kube/dra.py``) instead of the node, which keeps serving claims on its
other GPUs. Off unless ``gpuguard controller --gpu-quarantine``.

It stands in for the node's taint and nothing else: the episode runs as it would (the
drain of the named GPUs' pods, the GPU reset, verify, close), every node write other than
the taint goes through unchanged, and the node taint comes back (escalation) when:
a layer is bad without naming GPUs (or Unknown), the rung climbs past RESET_GPU or runs
out, the GPUs are not all found in the driver's ResourceSlices of the node, the API server
serves no DeviceTaintRule, or the fault outlives the time a reset episode gets
(``window_s``). The rules go when the node's taint would (the episode closes).

Effect: a GPU the agent calls Degraded, or whose repair waits for running work
(deferred), or whose action is below RESET_GPU, keeps its running pods (NoSchedule); an
unhealthy GPU the policy resets (e.g. a fatal Xid) has its pods evicted (NoExecute).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from gpuguard import logs
from gpuguard.clock import Clock
from gpuguard.contract.conditions import FALSE, TRUE
from gpuguard.kube import dra, fleet
from gpuguard.kube.errors import KubeError, KubeFenced
from gpuguard.kube.remediations import read_episodes
from gpuguard.kube.rest import Json, KubeApi
from gpuguard.model import Action
from gpuguard.remediation.model import DecisionKind, Episode, NodeObservation
from gpuguard.remediation.policy import Policy

if TYPE_CHECKING:
    from gpuguard.controller.loop import Controller

log = logging.getLogger("gpuguard.controller")
REDISCOVER_S = 600.0  # a server that served no DeviceTaintRule is asked again this often
REPORT_WAIT_S = 2.0


@dataclass(frozen=True)
class Confined:
    """What a node's finding asks of its GPUs: which, with which effect, and why."""

    gpus: frozenset[str]
    effect: str
    value: str


def confined(node: NodeObservation) -> Confined | None:
    """The GPUs the node's bad layers name, if every bad layer names GPUs and asks for at
    most a GPU reset; None when the fault is the node's (or unknown)."""
    gpus: set[str] = set()
    effect, codes = dra.NO_SCHEDULE, list[str]()
    for name in sorted(node.layers):
        layer = node.layers[name]
        if layer.status == TRUE:
            continue
        if layer.status != FALSE or not layer.gpus or layer.action > Action.RESET_GPU:
            return None
        gpus.update(layer.gpus)
        codes += layer.codes
        fatal = layer.action == Action.RESET_GPU and not (layer.degraded or layer.deferred)
        effect = dra.NO_EXECUTE if fatal else effect
    if not gpus:
        return None
    return Confined(frozenset(gpus), effect, codes[0] if codes else "")


def window_s(policy: Policy) -> float:
    """How long a GPU reset episode may take before its device taint is judged not to
    help: the tolerance, the drain, the action, the verify and the clearing."""
    return (
        policy.tolerance_s
        + policy.drain_timeout_s
        + policy.action_timeout_s
        + policy.verify_timeout_s
        + policy.clear_after_s
    )


class GpuQuarantine:
    """Installed into a Controller (``attach``): the taint writes of its quarantine and its
    applier go through here, and a pass sees a device-quarantined node as tainted."""

    def __init__(
        self, driver: str = dra.DEFAULT_DRIVER, *, rediscover_s: float = REDISCOVER_S
    ) -> None:
        self.driver = driver
        self.rediscover_s = rediscover_s
        self._lock = threading.Lock()
        self._taints: dra.DeviceTaints | None = None
        self._discovered_at = -float("inf")
        self._held: dict[str, tuple[Confined, frozenset[str], float]] = {}  # rules, since
        self._escalated: set[str] = set()
        self._writing: set[str] = set()  # nodes whose rules are being written

    def attach(self, controller: Controller) -> None:
        self.api = controller.api
        self.writer = controller.writer  # fenced by leadership
        if not controller.applier.dry_run:  # a dry run deletes nothing, leftovers neither
            controller.closed.sweeps.append(self.sweep)
        self.policy = controller.policy
        self.clock: Clock = controller.clock
        cache = controller.nodes  # its dict is replaced on each full list: looked up each time
        self.observed: Callable[[str], NodeObservation | None] = lambda n: cache.observed.get(n)
        self.episodes: Callable[[], Mapping[str, Episode]] = lambda: controller.reconciler.episodes
        registry = controller.metrics.registry
        self.available = Gauge(
            "gpuguard_controller_gpu_quarantine_available",
            "1 while the API server serves DeviceTaintRules (per-GPU quarantine possible)",
            registry=registry,
        )
        self.devices = Gauge(
            "gpuguard_controller_gpu_quarantine_devices",
            "GPUs quarantined by a DeviceTaintRule of gpuguard's",
            registry=registry,
        )
        self.escalations = Counter(
            "gpuguard_controller_gpu_quarantine_escalations_total",
            "Nodes quarantined whole although per-GPU quarantine is on, by reason",
            ["reason"],
            registry=registry,
        )
        controller.applier.node_writes[DecisionKind.TAINT] = self.taint
        controller.applier.node_writes[DecisionKind.UNTAINT] = self.untaint
        controller.quarantine.taint_node = self.taint
        controller.quarantine.pass_view = self.pass_view

    # --- what a pass sees -------------------------------------------------------------
    def pass_view(self, node: NodeObservation) -> NodeObservation:
        """Tainted, while its device rules stand for the node's taint: its finding still
        confined to the same GPUs (or gone), the rung and the window not outgrown. Else
        as it is, so the pass sends the taint again, which re-targets or escalates."""
        with self._lock:
            held = self._held.get(node.name)
        if held is None or node.tainted or self._outgrown(node.name, held[2]):
            return node
        now = confined(node)
        healthy = all(layer.status == TRUE for layer in node.layers.values())
        if healthy or (now is not None and now == held[0]):
            return dataclasses.replace(node, tainted=True)
        return node

    def _outgrown(self, name: str, since: float) -> str:
        episode = self.episodes().get(name)
        if episode is not None:
            if episode.exhausted or (episode.rung is not None and episode.rung > Action.RESET_GPU):
                return "rung"
            since = min(since, episode.opened_at)
        return "window" if self.clock.now() - since > window_s(self.policy) else ""

    # --- the writes ---------------------------------------------------------------------
    def taint(self, api: KubeApi, node: Json) -> Json:
        """The node's quarantine: its GPUs' rules when they can stand for it, else (and from
        then on, until the node is untainted) the node's taint."""
        name = str(node["metadata"]["name"])
        why = self._why_not(api, name)
        if not why:
            return node
        with self._lock:
            first = name not in self._escalated
            self._escalated.add(name)
        if first:
            self.escalations.labels(why.split(":")[0]).inc()
            log.info("%s: the node's taint, not its GPUs': %s", name, why, extra=logs.about(name))
        return fleet.taint(api, node)

    def _read(self, name: str) -> NodeObservation | None:
        """The node as last seen; a bad layer whose report has not named its findings
        yet (the agent writes the condition first, its report just after) is waited for,
        ``REPORT_WAIT_S`` at most."""
        deadline = self.clock.monotonic() + REPORT_WAIT_S
        while True:
            observed = self.observed(name)
            lagging = observed is not None and any(
                layer.status == FALSE and not layer.codes for layer in observed.layers.values()
            )
            if not lagging or self.clock.monotonic() >= deadline:
                return observed
            threading.Event().wait(0.05)

    def _why_not(self, api: KubeApi, name: str) -> str:
        """Nothing once the rules are in place; else why the node is tainted instead."""
        observed = self._read(name)
        taints = self._discovered()
        with self._lock:
            escalated, held = name in self._escalated, self._held.get(name)
        if escalated:
            return "escalated"
        if not taints.available:
            return "unavailable: the API server serves no DeviceTaintRule"
        wanted = None if observed is None else confined(observed)
        if wanted is None:
            return "node: a fault not confined to named GPUs"
        since = held[2] if held is not None else self.clock.now()
        outgrown = self._outgrown(name, since)
        if outgrown:
            return f"{outgrown}: the device taint did not help"
        try:
            devices = dra.resolve(dra.node_devices(self.api, name, self.driver), wanted.gpus)
            if devices is None:
                gpus = ", ".join(sorted(wanted.gpus))
                return f"unresolved: not every GPU of {gpus} is in a {self.driver} slice"
            self._put(api, taints, name, wanted, list(devices.values()), since)
        except KubeFenced:
            raise
        except KubeError as exc:  # the node's taint is the safe side
            return f"error: {exc}"
        return ""

    def _put(
        self,
        api: KubeApi,
        taints: dra.DeviceTaints,
        name: str,
        wanted: Confined,
        devices: list[dra.Device],
        since: float,
    ) -> None:
        names = {dra.rule_name(name, d.name) for d in devices}
        with self._lock:
            held = self._held.get(name)
        if held is not None and held[0] == wanted and held[1] == names:
            return
        with self._lock:
            self._writing.add(name)  # before the write: a sweep must not take it for a leftover
        try:
            self._write(api, taints, name, wanted, devices, held)
        finally:
            with self._lock:
                self._writing.discard(name)
        with self._lock:
            self._held[name] = (wanted, frozenset(names), since)
            self._count()

    def _write(
        self,
        api: KubeApi,
        taints: dra.DeviceTaints,
        name: str,
        wanted: Confined,
        devices: list[dra.Device],
        held: tuple[Confined, frozenset[str], float] | None,
    ) -> None:
        names = {dra.rule_name(name, d.name) for d in devices}
        for device in devices:
            body = dra.rule(taints, name, device, wanted.effect, wanted.value)
            if dra.put_rule(api, taints, body):
                log.info(
                    "%s: device %s (%s) tainted %s",
                    name,
                    device.name,
                    ", ".join(sorted(wanted.gpus)),
                    wanted.effect,
                    extra=logs.about(name),
                )
        for stale in (held[1] if held is not None else frozenset()) - names:
            dra.delete_rule(api, taints, stale)

    def untaint(self, api: KubeApi, node: Json) -> Json:
        """The quarantine ends: the node's taint (if any) goes, then its GPU rules. If
        they cannot be deleted the hold stays, so the next pass sends the untaint again."""
        name = str(node["metadata"]["name"])
        untainted = fleet.untaint(api, node)
        taints = self._discovered()
        if taints.available:
            for found in dra.our_rules(api, taints, name):
                self._delete(api, taints, name, found)
        with self._lock:
            self._held.pop(name, None)
            self._escalated.discard(name)
            self._count()
        return untainted

    def _delete(self, api: KubeApi, taints: dra.DeviceTaints, name: str, found: Json) -> None:
        if dra.delete_rule(api, taints, found["metadata"]["name"]):
            log.info("%s: %s deleted", name, found["metadata"]["name"], extra=logs.about(name))

    def sweep(self) -> None:
        """Rules of nodes with no open episode and no hold here: a node deleted while
        quarantined, or a leader gone between an episode's close and its untaint. The
        episodes are read from the cluster, not from a pass that may not have run yet."""
        taints = self._discovered()
        if not taints.available:
            return
        found = dra.our_rules(self.writer, taints)  # first: what is kept is read after it
        keep = set(read_episodes(self.api).open)
        listed = {str(rule["metadata"]["name"]) for rule in found}
        with self._lock:
            keep |= self._held.keys() | self._writing
            # A hold whose rule is gone (deleted by hand) is dropped: the next pass sees
            # the node untainted and writes the rule again.
            for node in [n for n, held in self._held.items() if not held[1] <= listed]:
                del self._held[node]
        for rule in found:
            node = dra.node_of(rule)
            if node not in keep:
                self._delete(self.writer, taints, node, rule)

    def _count(self) -> None:
        self.devices.set(sum(len(rules) for _, rules, _ in self._held.values()))

    def _discovered(self) -> dra.DeviceTaints:
        """The served DeviceTaintRule version, asked at first use and, while none, again
        every ``rediscover_s``; said once in the log when it changes."""
        now = self.clock.monotonic()
        with self._lock:
            known, due = self._taints, now - self._discovered_at >= self.rediscover_s
        if known is not None and (known.available or not due):
            return known
        try:
            found = dra.discover(self.api)
        except KubeError as exc:
            log.warning("discovering DeviceTaintRules failed, the node taint stands in: %s", exc)
            return dra.UNAVAILABLE
        with self._lock:
            self._taints, self._discovered_at = found, now
        if known is None or found != known:
            if found.available:
                log.info("per-GPU quarantine: DeviceTaintRule served as %s", found.version)
            else:
                log.warning("per-GPU quarantine unavailable: no DeviceTaintRule served")
        self.available.set(1 if found.available else 0)
        return found


def install(driver: str) -> Callable[[Controller], None]:
    """The Controller's ``gpu_quarantine`` argument for ``--gpu-quarantine``."""
    return GpuQuarantine(driver).attach
