"""The agent's side of remediation: carry out the controller's orders for this node.

The controller writes a request (``RESET_GPU`` with the GPUs, or ``REBOOT``) into the
episode's NodeRemediation; the agent on that node performs it once per attempt and writes
the result back into the same object. After a GPU reset the kernel-log faults of those GPUs
are considered handled and every check runs again at once, so the controller's verify step
sees a fresh report within seconds.

A repair is never done twice for one attempt, even across a restart of the agent: before
it begins, the agent marks the attempt on the object (``status.started``, with the boot
id). A restarted agent that finds its mark and no answer answers rather than repeating:
a REBOOT whose boot id has changed happened; anything else was interrupted (failed, and
not repeated: the controller's ladder decides the next attempt).

The agent watches its node's NodeRemediations (field selector ``spec.nodeName``) and reads
them when one changes, plus once a minute in case an event was missed: a fleet of 5,000
agents polling every 2 s would be 2,500 lists a second on the API server. Where RBAC
refuses the watch (an older chart) it says so once and polls every ``poll_s`` instead,
trying the watch again with backoff.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Protocol

from gpuguard import logs, threads
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.remediation import MAX_ID, Started
from gpuguard.contract.times import format_time
from gpuguard.kube.api_errors import KubeNotFound
from gpuguard.kube.errors import KubeError
from gpuguard.kube.remediations import (
    NODE_REMEDIATIONS,
    ActionRequest,
    pending_request_for,
    report_result,
    report_started,
)
from gpuguard.kube.rest import NODES, Json, KubeApi, WatchEvent
from gpuguard.kube.watch import (
    REFUSED_RETRY_MAX_S,
    WATCH_JOIN_S,
    Snapshot,
    keep_watching,
    list_then_watch,
)
from gpuguard.model import Action
from gpuguard.remediation.model import ActionResult
from gpuguard.retry import Backoff

log = logging.getLogger("gpuguard.agent")


class RequestsNotServed(KubeError):
    """The API server does not serve NodeRemediations: the CRD is not installed."""


POLL_S = 2.0  # without the watch; also while a result waits to be written again
RESYNC_S = 60.0  # with the watch: a read now and then, in case an event was missed
RESET_TIMEOUT_S = 120.0
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(path: Path = BOOT_ID) -> str:
    """This boot's id (new at every boot), or "" where it cannot be read."""
    try:
        return path.read_text().strip()[:MAX_ID]
    except OSError:
        return ""


class RepairBackend(Protocol):
    """Performs repairs on this node; returns (succeeded, message)."""

    def reset_gpus(self, gpus: tuple[str, ...]) -> tuple[bool, str]: ...

    def reboot(self) -> tuple[bool, str]: ...


class NvidiaSmiRepair:
    """``nvidia-smi -r -i <bus id>`` per GPU; reboot through a configured command."""

    def __init__(self, nvidia_smi: str, reboot_command: list[str] | None) -> None:
        self.nvidia_smi = nvidia_smi
        self.reboot_command = reboot_command

    def reset_gpus(self, gpus: tuple[str, ...]) -> tuple[bool, str]:
        if not gpus:
            return False, "no GPU named: refusing to reset every GPU of the node"
        for gpu in gpus:
            ok, message = _run([self.nvidia_smi, "-r", "-i", gpu], RESET_TIMEOUT_S)
            if not ok:
                return False, f"reset of {gpu} failed: {message}"
        return True, f"reset {', '.join(gpus)}"

    def reboot(self) -> tuple[bool, str]:
        if not self.reboot_command:
            return False, "no reboot_command configured on this node"
        return _run(self.reboot_command, 60.0)


class BundleRepair:
    """For a bundle (offline or test) node: writes each repair to ``repairs.log`` there."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def reset_gpus(self, gpus: tuple[str, ...]) -> tuple[bool, str]:
        return self._log(f"reset {' '.join(gpus)}")

    def reboot(self) -> tuple[bool, str]:
        return self._log("reboot")

    def _log(self, line: str) -> tuple[bool, str]:
        with self.log_path.open("a") as handle:
            handle.write(line + "\n")
        return True, f"{line} (recorded in {self.log_path})"


def _run(argv: list[str], timeout_s: float) -> tuple[bool, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    output = (proc.stdout + proc.stderr).strip()[-300:]
    return proc.returncode == 0, output or f"exit {proc.returncode}"


class RepairExecutor:
    """Reads this node's requests every ``poll_s`` (``resync_s`` while the watch is up and
    nothing waits to be written again) and at once when the watch sees a change."""

    def __init__(
        self,
        api: KubeApi,
        node_name: str,
        backend: RepairBackend,
        after_repair: Callable[[Action, tuple[str, ...], float], None],
        clock: Clock = SYSTEM_CLOCK,
        *,
        poll_s: float = POLL_S,
        resync_s: float = RESYNC_S,
        boot_id: str | None = None,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.backend = backend
        self.after_repair = after_repair
        self.clock = clock  # stamps the results
        self.poll_s = poll_s
        self.resync_s = resync_s
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.watching = threading.Event()  # the watch is up: reads can be rare
        # Marked as begun by this process, not begun yet (a REBOOT whose answer failed).
        self._marked: set[tuple[str, str, int]] = set()
        self._unsent: dict[tuple[str, str, int], ActionResult] = {}

    def run(self, stop: threading.Event) -> None:
        wake = threading.Event()  # a change to this node's NodeRemediations, or the stop
        follower = threads.start("repair-requests", partial(self._follow, wake=wake), stop)
        threads.start("repair-wake-on-stop", partial(self._wake_on_stop, wake=wake), stop)
        unserved = Backoff(self.poll_s, REFUSED_RETRY_MAX_S)
        while not stop.is_set():
            wake.clear()
            try:
                self.poll_once()
                failed = False
                unserved.reset()
            except RequestsNotServed as exc:  # no CRD: asking every poll_s will not add one
                if not unserved.failures:
                    log.warning("%s; asking again less and less often", exc)
                wake.wait(unserved.next())
                continue
            except KubeError as exc:
                log.warning("reading repair requests failed: %s", exc)
                failed = True
            except Exception:  # a bug, or input nothing foresaw: the next request still counts
                log.exception("handling repair requests failed; trying again")
                failed = True
            rare = self.watching.is_set() and not failed and not self._unsent
            wake.wait(self.resync_s if rare else self.poll_s)
        follower.join(WATCH_JOIN_S)

    def _wake_on_stop(self, stop: threading.Event, *, wake: threading.Event) -> None:
        stop.wait()
        self.api.end_watches(stop)
        wake.set()

    def _follow(self, stop: threading.Event, *, wake: threading.Event) -> None:
        """Wake the executor on every change to this node's NodeRemediations."""
        version = ""

        def changes() -> Iterator[Snapshot | WatchEvent]:
            try:
                yield from list_then_watch(
                    self.api,
                    NODE_REMEDIATIONS.path(),
                    field_selector=f"spec.nodeName={self.node_name}",
                    project=_version_only,
                    resource_version=version,
                    stop=stop,
                )
            finally:
                self.watching.clear()

        def take(item: Snapshot | WatchEvent) -> None:
            nonlocal version
            version = item.resource_version or version
            self.watching.set()
            wake.set()

        keep_watching(
            changes,
            take,
            stop,
            log=log,
            what="repair requests",
            when_refused="reading them now and then instead",
        )

    def _pending(self) -> tuple[str, ActionRequest] | None:
        try:
            return pending_request_for(self.api, self.node_name)
        except KubeNotFound as exc:  # a list is not found only when its kind is not served
            raise RequestsNotServed(
                f"NodeRemediations are not served (is gpuguard's CRD installed?): {exc}"
            ) from None

    def poll_once(self) -> ActionResult | None:
        """Perform the pending request, if any; each (object, action, attempt) only once."""
        pending = self._pending()
        if pending is None:
            self._unsent.clear()  # nothing waits for an answer any more
            self._marked.clear()
            return None
        name, request = pending
        if request.node_uid and request.node_uid != self._own_uid():
            log.warning(
                "not performing %s on %s: its episode %s is about the machine that had this "
                "name before (uid %s)",
                request.action.name,
                self.node_name,
                name,
                request.node_uid,
            )
            return None
        key = (name, request.action.name, request.attempt)
        for stale in [k for k in self._unsent if k != key]:  # the controller moved on
            del self._unsent[stale]
        unsent = self._unsent.get(key)
        if unsent is not None:  # performed; its answer did not reach the API server
            self._answer(key, name, unsent)
            return None
        if request.started is not None and key not in self._marked:
            result = self._begun_before(request, request.started)  # by an agent now gone
            self._answer(key, name, result)
            return result
        if key not in self._marked:  # no mark, no action: a failed write is tried again
            report_started(self.api, name, request, self.clock.now(), self.boot_id)
            self._marked.add(key)
        log.info(
            "performing %s (attempt %d) on %s %s",
            request.action.name,
            request.attempt,
            self.node_name,
            ", ".join(request.gpus),
            extra=logs.about(self.node_name, name),
        )
        if request.action is Action.REBOOT:
            # Answer first: once the reboot starts, this process may not get to write.
            # No answer, no reboot: the next read tries both again.
            report_result(self.api, name, self._result(request, True, "reboot started"))
            self._marked.discard(key)
            ok, message = self.backend.reboot()
            if ok:
                return None
            result = self._result(request, False, message)
        elif request.action is Action.RESET_GPU:
            self._marked.discard(key)
            result = self._result(request, *self.backend.reset_gpus(request.gpus))
        else:
            self._marked.discard(key)
            result = self._result(request, False, f"{request.action.name} is not an agent action")
        self._unsent[key] = result  # answered at the next read if what follows fails
        if result.succeeded:
            self.after_repair(request.action, request.gpus, result.at)
        self._answer(key, name, result)
        return result

    def _begun_before(self, request: ActionRequest, began: Started) -> ActionResult:
        """The answer to a request an earlier agent process began and never answered."""
        what = f"{request.action.name} attempt {request.attempt}"
        rebooted = began.boot_id and self.boot_id and began.boot_id != self.boot_id
        if request.action is Action.REBOOT and rebooted:
            return self._result(request, True, f"{what}: rebooted (boot id changed)")
        log.warning("%s on %s was begun before a restart: not repeated", what, self.node_name)
        message = (
            f"{what} was interrupted (begun {format_time(began.at)} by an agent that then "
            "stopped); not repeated"
        )
        return self._result(request, False, message)

    def _own_uid(self) -> str:
        """This Node's uid, read when a request names one: a machine registered again under
        the same name never carries out the repair ordered for the one before it."""
        return str((self.api.get(NODES.path(self.node_name)).get("metadata") or {}).get("uid", ""))

    def _answer(self, key: tuple[str, str, int], name: str, result: ActionResult) -> None:
        """Write the result; kept for the next read if the write fails (the action is
        never repeated, and the controller would otherwise time it out and escalate)."""
        self._unsent[key] = result
        report_result(self.api, name, result)
        self._unsent.pop(key, None)

    def _result(self, request: ActionRequest, ok: bool, message: str) -> ActionResult:
        return ActionResult(request.attempt, request.action, ok, self.clock.now(), message)


def _version_only(obj: Json) -> Json:
    return {"metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}}
