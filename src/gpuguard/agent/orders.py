"""The controller's orders for this node: verify requests and repair requests.

A verify request (the Node's ``gpuguard.io/verify-requested`` annotation, seen by its watch
in ``verify_requests.py`` or at the publisher's read of the Node) goes to the deep
schedule, which answers each request once. A repair request (in a NodeRemediation) is
carried out by ``repair.RepairExecutor``; once it succeeded the agent looks again: a GPU
reset forgets those GPUs' kernel-log faults, every check and the deep schedule wake at
once, and the next report is freshly stamped, so the controller's verify step sees a
fresh report within seconds.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpuguard import threads
from gpuguard.agent.check_loops import CheckLoops
from gpuguard.agent.deep import DeepSchedule
from gpuguard.agent.node_state import NodeState
from gpuguard.agent.repair import RepairBackend, RepairExecutor
from gpuguard.agent.verify_requests import follow_verify_requests
from gpuguard.clock import Clock
from gpuguard.contract.keys import VERIFY_REQUEST_ANNOTATION
from gpuguard.kernel_log.monitor import KernelLogMonitor
from gpuguard.model import Action

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi
    from gpuguard.kube.rest import KubeApi


class Orders:
    def __init__(
        self,
        node_name: str,
        state: NodeState,
        checks: CheckLoops,
        kernel_log: KernelLogMonitor,
        deep: DeepSchedule,
        clock: Clock,
    ) -> None:
        self._node_name = node_name
        self._state = state
        self._checks = checks
        self._kernel_log = kernel_log
        self._deep = deep
        self._clock = clock

    def take_annotations(self, annotations: Mapping[str, str]) -> None:
        """The Node's annotations, as the publisher read them: a verify request, if any."""
        stamp = annotations.get(VERIFY_REQUEST_ANNOTATION)
        if stamp:
            self._deep.request_verify(stamp)

    def watch_verify_requests(
        self, api: NodeApi, stop: threading.Event, take: Callable[[Mapping[str, str]], None]
    ) -> threading.Thread:
        """A daemon thread handing the Node's annotations to ``take`` (this class's
        ``take_annotations``, and the evidence requests' reader where set) at each change
        until ``stop`` (and ``api.end_watches(stop)``)."""
        follow = functools.partial(follow_verify_requests, api, self._node_name, take)
        return threads.start("verify-requests", follow, stop)

    def repairs(self, api: KubeApi, backend: RepairBackend) -> RepairExecutor:
        """The executor of this node's repair requests, wired to :meth:`after_repair`."""
        return RepairExecutor(api, self._node_name, backend, self.after_repair, self._clock)

    def after_repair(self, action: Action, gpus: tuple[str, ...], at: float) -> None:
        """A repair on this node finished: forget what it fixed and look again at once."""
        if action is Action.RESET_GPU:
            self._kernel_log.forget_gpus(gpus)
        self._state.look_again()
        self.wake()
        self._state.request_fresh_report()

    def wake(self) -> None:
        """Every check and the deep schedule look now (after a repair, at stop)."""
        self._deep.wake.set()
        self._checks.kick()
