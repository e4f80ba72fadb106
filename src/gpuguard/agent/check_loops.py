"""The scheduled checks: one thread per check, each run every ``interval_for(check)``
seconds or at once when kicked (after a repair, at stop).

A fallback (``checks.registry.FALLBACKS``: nvidia-smi for NVML) runs only while its
primary gives no verdict, unless ``cross_check`` is set, as in ``gpuguard check``; while
the primary answers, the fallback's last result is withdrawn. A check stuck past its
timeout is not started again while its previous run is still blocked
(``runner.RepeatingCheck``), nor is a tool that outlived its kill (``tool_process``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

from gpuguard import threads
from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.checks.base import Check, CheckContext, Fallback
from gpuguard.checks.registry import FALLBACKS
from gpuguard.config import Config
from gpuguard.runner import RepeatingCheck
from gpuguard.sources import Sources


class CheckLoops:
    def __init__(
        self,
        checks: Sequence[Check],
        config: Config,
        sources: Sources,
        state: NodeState,
        metrics: AgentMetrics,
        fallbacks: Sequence[Fallback] = FALLBACKS,
    ) -> None:
        self.checks = list(checks)
        self._config = config
        self._sources = sources
        self._state = state
        self._metrics = metrics
        self._primary_of = {f.check: f.primary for f in fallbacks}
        self._kicks: list[threading.Event] = []

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        """One daemon thread per check; returns them."""
        started = []
        for check in self.checks:
            ctx = CheckContext(self._sources, self._config, self._config.timeout_for(check.name))
            kick = threading.Event()
            self._kicks.append(kick)
            loop = functools.partial(self._loop, RepeatingCheck(check, ctx), kick=kick)
            started.append(threads.start(f"loop-{check.name}", loop, stop))
        return started

    def kick(self) -> None:
        """Run every check again now."""
        for kick in self._kicks:
            kick.set()

    def _loop(
        self, runner: RepeatingCheck, stop: threading.Event, *, kick: threading.Event
    ) -> None:
        name = runner.check.name
        while not stop.is_set():
            if self._stands_down(name):
                self._state.put_result(name, None)
            else:
                result = runner.run_once()
                self._metrics.observe_check(result)
                self._state.put_result(name, result)
            kick.wait(self._config.interval_for(name))
            kick.clear()
        runner.close()

    def _stands_down(self, name: str) -> bool:
        primary = self._primary_of.get(name)
        if primary is None or self._config.cross_check:
            return False
        answer = self._state.result(primary)
        return answer is not None and answer.answered
