"""``gpuguard agent``: monitors feed the node state, one publisher writes it to the Node.

The parts, each in its own module, in the order a finding travels:

- monitors: the scheduled checks (``check_loops.py``), the followed kernel log
  (``kernel_log/``) and the deep check (``deep.py``), each on threads of its own;
- the node state they write (``node_state.py``), which wakes the publisher on each change;
- the publisher (``publisher.py``): conditions, the report and memory annotations, Events;
- the controller's orders (``orders.py``): verify requests and repair requests.

This module only builds and starts them; the publisher runs on the caller's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuguard import threads
from gpuguard.agent.check_loops import CheckLoops
from gpuguard.agent.deep import DeepSchedule, Idleness, nvml_idleness
from gpuguard.agent.evidence import EvidenceRequests
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.agent.orders import Orders
from gpuguard.agent.publisher import Publisher
from gpuguard.checks.base import Check, Fallback
from gpuguard.checks.in_job.verdict_check import forget_verdicts
from gpuguard.checks.load.checks import DeepGpuCheck
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.checks.registry import FALLBACKS
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.config import Config
from gpuguard.contract.conditions import PROFILES, Desired, desired_conditions
from gpuguard.kernel_log.followers import Follower
from gpuguard.kernel_log.monitor import NAME as KERNEL_LOG
from gpuguard.kernel_log.monitor import KernelLogMonitor
from gpuguard.kube.watch import WATCH_JOIN_S
from gpuguard.model import Action, Layer, NodeReport
from gpuguard.sources import Sources
from gpuguard.training.verdicts import VerdictKind

log = logging.getLogger("gpuguard.agent")
SUPERVISE_S = 5.0  # how often the observer threads are looked at (the liveness probe: 120 s)

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi


class Agent:
    def __init__(
        self,
        config: Config,
        sources: Sources,
        checks: Sequence[Check],
        follower: Follower,
        node_name: str,
        api: NodeApi | None,
        metrics: AgentMetrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        deep_check: Check | None = None,
        idleness: Callable[[], Idleness] | None = None,
        fallbacks: Sequence[Fallback] = FALLBACKS,
    ) -> None:
        """``deep_check``/``idleness`` default to the PyTorch suite and NVML's activity;
        ``api`` None: observe only (``--print-conditions``)."""
        self.config = config
        self.sources = sources
        self.node_name = node_name
        self.api = api
        self.failed = ""  # why run() ended by itself ("": it did not)
        self.metrics = metrics or AgentMetrics()
        self._clock = clock
        scheduled = [c for c in checks if c.name != KERNEL_LOG]  # followed, not polled
        self.state = NodeState(c.name for c in scheduled)
        self.checks = CheckLoops(
            scheduled, config, sources, self.state, self.metrics, fallbacks=fallbacks
        )
        self.kernel_log = KernelLogMonitor(
            follower,
            config.application_fault_ttl_s,
            sources.boot_id,
            self.state,
            self.metrics.count_xids,
            clock,
        )
        self.deep = DeepSchedule(
            deep_check or DeepGpuCheck(),
            config,
            sources,
            idleness=idleness or nvml_idleness(config.deep.idle_utilization_percent),
            on_run=self.after_deep_run,
            metrics=self.metrics,
            clock=clock,
        )
        self.orders = Orders(node_name, self.state, self.checks, self.kernel_log, self.deep, clock)
        self.publisher: Publisher | None = None  # none: observe only
        if api is not None:
            self.publisher = Publisher(
                api,
                node_name,
                config,
                self.state,
                report=self.report,
                memory=self.kernel_log,
                on_node=self._node_readers(api),
                metrics=self.metrics,
                clock=clock,
            )

    def _node_readers(self, api: NodeApi) -> Callable[[Mapping[str, str]], None]:
        """What reads the Node's annotations: the orders, and evidence requests if set."""
        if self.config.evidence is None:  # RMA evidence on request: off by default
            return self.orders.take_annotations
        evidence = EvidenceRequests(
            api, self.node_name, self.config, self.sources, self.report, self._clock
        )
        return _both(self.orders.take_annotations, evidence.take_annotations)

    # --- running ------------------------------------------------------------------
    def start_observers(self, stop: threading.Event) -> list[threading.Thread]:
        """Start the monitors: check loops, kernel-log follower, deep schedule (daemon
        threads); returns them."""
        return [
            *self.checks.start(stop),
            threads.start("kernel-log", self.kernel_log.run, stop),
            threads.start("deep", self.deep.run, stop),
        ]

    def run(self, stop: threading.Event, also_supervise: Sequence[threading.Thread] = ()) -> None:
        """Observe and publish until ``stop`` is set, or until a thread it supervises (its
        own and ``also_supervise``) dies. Never raises on API errors."""
        assert self.api is not None and self.publisher is not None
        observers = self.start_observers(stop)
        # The readers of each heartbeat's Node, also on the watch of its annotations.
        requests = self.orders.watch_verify_requests(self.api, stop, self.publisher.on_node)
        threads.start("wake-on-stop", self._wake_on_stop, stop)
        watched = [*observers, requests, *also_supervise]
        threads.start(
            "supervise",
            lambda stop: threads.supervise(watched, stop, SUPERVISE_S, self._died),
            stop,
        )
        self.publisher.run(stop)
        requests.join(WATCH_JOIN_S)  # ended by _wake_on_stop: none left reading the client

    def _died(self, why: str) -> None:
        """A dead observer would leave its layer's last verdict standing (a healthy one,
        say) for good: the agent stops instead (``failed`` says why), its liveness probe
        fails and the kubelet starts a fresh one."""
        self.failed = why
        log.error("%s: stopping", why)

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        if self.api is not None:
            self.api.end_watches(stop)
        self.state.changed.set()
        self.orders.wake()

    def wait_first_round(self, timeout_s: float) -> bool:
        deadline = self._clock.monotonic() + timeout_s
        while self._clock.monotonic() < deadline:
            if self.report() is not None:
                return True
            self.state.changed.wait(0.1)
            self.state.changed.clear()
        return False

    # --- what is published --------------------------------------------------------
    def report(self) -> NodeReport | None:
        """The node's health now, or None until every source has been read once."""
        return self.state.report(self.kernel_log.findings, fail_closed=self.config.fail_closed)

    def desired(self, report: NodeReport) -> list[Desired]:
        return desired_conditions(report.layers, self.config.condition_profile)

    def desired_type(self, layer: Layer) -> str:
        return PROFILES[self.config.condition_profile][layer]

    def publish_once(self) -> bool:
        """Bring the Node up to date; True when there was something to decide."""
        assert self.publisher is not None
        return self.publisher.publish_once()

    # --- orders -------------------------------------------------------------------
    def after_repair(self, action: Action, gpus: tuple[str, ...], at: float) -> None:
        """A repair on this node finished: forget what it fixed and look again at once."""
        if action in (Action.RESET_GPU, Action.REBOOT):  # a reset answers its GPUs only
            named = gpus if action is Action.RESET_GPU else ()
            forgotten = forget_verdicts(self.sources.in_job_root(), named, at)
            if forgotten:
                log.info("%s: forgot %d in-job verdicts it answered", action, forgotten)
        self.orders.after_repair(action, gpus, at)

    def after_deep_run(self, run: DeepRun) -> None:
        """A passing deep run contradicts the fail-slow verdicts written before it began:
        they are forgotten, so an unconfirmed slowness does not hold the node for good."""
        if run.passed:
            began = run.finished_at - run.result.duration_s
            root = self.sources.in_job_root()
            forgotten = forget_verdicts(root, (), began, (VerdictKind.FAIL_SLOW,))
            if forgotten:
                log.info("deep check passed: forgot %d fail-slow verdicts", forgotten)
        self.state.put_deep_run(run)

    def request_fresh_report(self) -> None:
        """Make the next publish write a new report timestamp (after a repair, say)."""
        self.state.request_fresh_report()


def _both(
    first: Callable[[Mapping[str, str]], None], second: Callable[[Mapping[str, str]], None]
) -> Callable[[Mapping[str, str]], None]:
    def both(annotations: Mapping[str, str]) -> None:
        first(annotations)
        second(annotations)

    return both
