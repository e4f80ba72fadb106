"""The agent's kernel-log monitor: the log followed into :class:`KernelState`, the state's
findings, and their memory on the Node.

The kernel log is followed, not polled like the other checks (so it has no check loop).
A log that cannot be followed is a ``FAILED`` verdict on the kernel layer, never a quiet
healthy one; the follower is started again every ``retry_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from gpuguard.agent.kernel_log.followers import Follower
from gpuguard.agent.kernel_log.state import KernelState, lasting, recall
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.checks.kernel_log.check import KernelLogCheck
from gpuguard.clock import Clock
from gpuguard.contract.memory import encode_memory
from gpuguard.model import CheckResult, Finding, Layer, NodeReport, Outcome
from gpuguard.runner import inconclusive_result

log = logging.getLogger("gpuguard.agent")

NAME = KernelLogCheck.name
FOLLOW_RETRY_S = 5.0


class KernelLogMonitor:
    def __init__(
        self,
        follower: Follower,
        application_ttl_s: float,
        boot_id: Callable[[], str],
        state: NodeState,
        metrics: AgentMetrics,
        clock: Clock,
        *,
        retry_s: float = FOLLOW_RETRY_S,
    ) -> None:
        self.follower = follower
        self._boot_id = boot_id
        self._state = state
        self._metrics = metrics
        self._clock = clock
        self._retry_s = retry_s
        self._kernel = KernelState(application_ttl_s, boot_id, clock.monotonic)

    def run(self, stop: threading.Event) -> None:
        """Follow the log until ``stop``, starting the follower again after a failure."""
        started = self._clock.monotonic()

        def on_lines(lines: list[str], reset: bool) -> None:
            for event in self._kernel.add_lines(lines, reset):
                if event.kind == "xid":
                    self._metrics.xids.labels(str(event.code)).inc()
            elapsed = self._clock.monotonic() - started
            self._state.put_kernel_status(CheckResult(NAME, Layer.KERNEL, Outcome.OK, [], elapsed))

        while not stop.is_set():
            try:
                self.follower.follow(on_lines, stop)
            except Exception as exc:  # an unreadable log is a verdict on the kernel layer
                detail = f"{NAME}: cannot follow {self.follower.description}: {exc}"
                log.error("%s; retrying in %.0fs", detail, self._retry_s)
                self._state.put_kernel_status(
                    inconclusive_result(NAME, Layer.KERNEL, Outcome.FAILED, detail, 0.0)
                )
                stop.wait(self._retry_s)

    def findings(self) -> list[Finding]:
        """What the log says now (job faults past their time to live left out)."""
        return self._kernel.findings()

    def forget_gpus(self, gpus: Iterable[str]) -> None:
        """A reset handled these GPUs' faults."""
        self._kernel.forget_gpus(gpus)

    # --- the memory on the Node ---------------------------------------------------------
    def recall(self, annotation: str, node: str) -> None:
        """Take the findings an earlier agent stored on ``node`` (they count this boot)."""
        self._kernel.remember(*recall(annotation, node))

    def memory(self, report: NodeReport) -> str:
        """The memory annotation for ``report``: its lasting kernel findings ("": none)."""
        findings = lasting(f for h in report.layers.values() for f in h.findings)
        return encode_memory(self._boot_id(), findings) if findings else ""
