"""The kernel log's monitor in the agent: the log followed into :class:`KernelState`, the
state's findings handed to the node state, and their memory on the Node.

The kernel log is followed, not polled like the other checks (so it has no check loop).
A log that cannot be followed (or has gone, ``followers.MISSING_GRACE_S``) is a ``FAILED``
verdict on the kernel layer (Unknown; Unhealthy when failing closed), never a quiet
healthy one, until the log is read again; a follower that raised is started again every
``retry_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from gpuguard.clock import Clock
from gpuguard.contract.memory import encode_memory
from gpuguard.kernel_log.check import KernelLogCheck
from gpuguard.kernel_log.followers import Follower
from gpuguard.kernel_log.state import KernelState, lasting, recall
from gpuguard.model import CheckResult, Finding, Layer, NodeReport, Outcome
from gpuguard.runner import inconclusive_result

log = logging.getLogger("gpuguard.agent")

NAME = KernelLogCheck.name
FOLLOW_RETRY_S = 5.0


class KernelStatusSink(Protocol):
    """Where the kernel layer's verdict goes (the agent's node state)."""

    def put_kernel_status(self, result: CheckResult) -> None: ...


# Counts ``lines`` Xid lines of ``code`` (the agent's metric).
XidCounter = Callable[[int, int], None]


class KernelLogMonitor:
    def __init__(
        self,
        follower: Follower,
        application_ttl_s: float,
        boot_id: Callable[[], str],
        state: KernelStatusSink,
        count_xids: XidCounter,
        clock: Clock,
        *,
        retry_s: float = FOLLOW_RETRY_S,
    ) -> None:
        self.follower = follower
        self._boot_id = boot_id
        self._state = state
        self._count_xids = count_xids
        self._clock = clock
        self._retry_s = retry_s
        self._kernel = KernelState(application_ttl_s, boot_id, clock)
        self._started = clock.monotonic()

    def run(self, stop: threading.Event) -> None:
        """Follow the log until ``stop``, starting the follower again after a failure."""
        while not stop.is_set():
            try:
                self.follower.follow(self, stop)
            except Exception as exc:  # an unreadable log is a verdict on the kernel layer
                self.unreadable(f"{exc}")
                log.error("retrying %s in %.0fs", self.follower.description, self._retry_s)
                stop.wait(self._retry_s)

    # --- the follower's sink --------------------------------------------------------
    def lines(self, block: bytes, reset: bool) -> None:
        """New lines of the log."""
        for code, lines in self._kernel.add_block(block, reset).items():
            self._count_xids(code, lines)
        elapsed = self._clock.monotonic() - self._started
        garbage = self._kernel.unrecognised_bytes
        if garbage:
            detail = (
                f"{NAME}: no kernel log record in the {garbage:,} bytes read from"
                f" {self.follower.description}"
            )
            result = inconclusive_result(NAME, Layer.KERNEL, Outcome.UNPARSEABLE, detail, elapsed)
            result.findings.extend(lasting(self._kernel.findings()))
            self._state.put_kernel_status(result)
            return
        self._state.put_kernel_status(CheckResult(NAME, Layer.KERNEL, Outcome.OK, [], elapsed))

    def unreadable(self, detail: str) -> None:
        """The log cannot be read: no verdict on the kernel layer. The hardware faults
        already seen still stand (and stay remembered on the Node): a log that went away
        heals no GPU."""
        detail = f"{NAME}: cannot follow {self.follower.description}: {detail}"
        log.error("%s", detail)
        failed = inconclusive_result(NAME, Layer.KERNEL, Outcome.FAILED, detail, 0.0)
        failed.findings.extend(lasting(self._kernel.findings()))
        self._state.put_kernel_status(failed)

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
