"""Cleanup, on its own thread: the NodeRemediations of episodes closed longer ago than the
retention window are deleted while this replica leads, once at the start of its leadership
and every ``COLLECT_EVERY_S`` after, so the objects (and a new leader's first list) do not
grow without bound. Closed episodes are the audit trail: a month by default. ``sweeps``
run in the same rounds (per-GPU quarantine's leftover DeviceTaintRules)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuguard.clock import Clock
from gpuguard.kube.errors import KubeError
from gpuguard.kube.remediations import delete_closed_before
from gpuguard.kube.rest import KubeApi

log = logging.getLogger("gpuguard.controller")
KEEP_CLOSED_S = 30 * 86400.0
COLLECT_EVERY_S = 3600.0


class ClosedEpisodes:
    def __init__(
        self, writer: KubeApi, keep_s: float, clock: Clock, *, every_s: float = COLLECT_EVERY_S
    ) -> None:
        self.writer = writer  # fenced: nothing is deleted by a replica that lost the Lease
        self.keep_s = keep_s
        self.clock = clock
        self.every_s = every_s
        self.sweeps: list[Callable[[], object]] = []

    def collect(self) -> int:
        deleted = delete_closed_before(self.writer, self.clock.now() - self.keep_s)
        if deleted:
            log.info("deleted %d NodeRemediations closed before the retention window", deleted)
        return deleted

    def run(self, stop: threading.Event, *, leading: threading.Event) -> None:
        while not stop.is_set():
            if not leading.wait(1.0):
                continue
            try:
                self.collect()
            except KubeError as exc:  # tried again at the next round
                log.warning("collecting closed NodeRemediations failed: %s", exc)
            except Exception:  # a bug: the next round tries again, the controller goes on
                log.exception("collecting closed NodeRemediations failed")
            for sweep in self.sweeps:
                _sweep(sweep)
            stop.wait(self.every_s)


def _sweep(sweep: Callable[[], object]) -> None:
    try:
        sweep()
    except KubeError as exc:  # tried again at the next round
        log.warning("sweeping failed: %s", exc)
    except Exception:  # a bug: the next round tries again, the controller goes on
        log.exception("sweeping failed")
