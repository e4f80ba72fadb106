"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go does it.

Only one controller replica may taint, evict and reboot. Replicas race to write the Lease
with the resourceVersion they read (a conflict means someone else won). Two rules keep two
leaders from ever acting at once, whatever the clocks of the machines say:

- a candidate judges expiry by its *own* monotonic clock: the holder's record must stay
  unchanged for ``leaseDurationSeconds`` since this candidate first saw it, never by
  comparing the holder's ``renewTime`` with local time;
- the holder counts itself leader only until ``renew_deadline_s`` (shorter than the lease)
  after its last successful renewal, so it stops before any candidate may take over.

Failover after a holder dies takes the lease duration plus up to two retry periods
(about 15-19 s with the defaults); a holder that shuts down cleanly releases the lease and
a candidate takes it on its next try.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable

from gpuguard import threads
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.contract.times import format_micro_time
from gpuguard.errors import ConfigError
from gpuguard.kube.errors import KubeError, KubeUnavailable
from gpuguard.kube.rest import LEASES, Json, KubeApi, KubeConflict, KubeNotFound

log = logging.getLogger(__name__)


class LeaderElector:
    """One replica's view of one Lease; call :meth:`try_acquire_or_renew` periodically."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_s: float = 5.0,
        retry_s: float = 2.0,
        renew_deadline_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.api = api
        self.clock = clock  # monotonic: expiry and deadlines; now(): the Lease's stamps
        self.identity = identity
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.retry_s = retry_s
        self.renew_deadline_s = renew_deadline_s if renew_deadline_s else lease_s * 2 / 3
        if not 0 < renew_s < self.renew_deadline_s < lease_s:
            raise ConfigError("leader election needs renew_s < renew_deadline_s < lease_s")
        self.path = LEASES.path(name, namespace=namespace)
        self._namespace, self._name = namespace, name
        self._seen: tuple[object, ...] | None = None  # the holder's record as last read
        self._seen_at = 0.0  # when (our monotonic clock) that record was first seen
        self._renewed_at: float | None = None  # our last successful write as holder
        self._renewed_last_try = False

    @property
    def renewed_at(self) -> float | None:
        """When (its clock's ``monotonic()``) this replica last wrote the Lease as its
        holder; None while not holding it."""
        return self._renewed_at

    @property
    def next_try_s(self) -> float:
        """How long to wait before the next try: a failed renewal is retried soon, well
        inside the renew deadline."""
        return self.renew_s if self._renewed_last_try else self.retry_s

    def is_leader(self) -> bool:
        """Leader until ``renew_deadline_s`` after the last successful renewal."""
        return self._leads_at(self.clock.monotonic())

    def _leads_at(self, now: float) -> bool:
        return self._renewed_at is not None and now - self._renewed_at < self.renew_deadline_s

    def try_acquire_or_renew(self) -> bool:
        """Take the Lease if it is free or expired, renew it if ours; True while leading.

        API outages do not end leadership by themselves: the answer is :meth:`is_leader`,
        which turns False once the renew deadline passes without a renewal.
        """
        self._renewed_last_try = False
        now = self.clock.monotonic()
        try:
            lease = self.api.get(self.path)
        except KubeNotFound:
            return self._create(now)
        except KubeUnavailable:
            return self._leads_at(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = _record(spec)
        if record != self._seen:
            self._seen, self._seen_at = record, now
        if holder and holder != self.identity:
            self._renewed_at = None
            duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
            if now - self._seen_at < duration:
                return False
        stamp = format_micro_time(self.clock.now())
        ours = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours or not holder else 1)
        lease["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.lease_s),
            "renewTime": stamp,
            "acquireTime": spec.get("acquireTime") if ours else stamp,
            "leaseTransitions": transitions,
        }
        return self._write(lease, now)

    def release(self) -> None:
        """Give the Lease up (if still ours) so a candidate need not wait for it to expire.
        Stop acting as leader before calling this."""
        self._renewed_at = None
        try:
            lease = self.api.get(self.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1}
            self.api.replace(self.path, lease)
        except (KubeUnavailable, KubeConflict, KubeNotFound):
            pass  # it expires on its own

    def _create(self, now: float) -> bool:
        stamp = format_micro_time(self.clock.now())
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": math.ceil(self.lease_s),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        try:
            self.api.create(LEASES.path(namespace=self._namespace), lease)
        except KubeConflict:
            return False  # another replica created it first
        except KubeUnavailable:
            return self._leads_at(now)
        self._renewed_at, self._renewed_last_try = now, True
        return True

    def _write(self, lease: Json, now: float) -> bool:
        try:
            written = self.api.replace(self.path, lease)
        except KubeConflict:
            self._renewed_at = None  # someone else wrote first: they may hold it now
            return False
        except KubeUnavailable:
            return self._leads_at(now)
        self._seen, self._seen_at = _record(written.get("spec") or {}), now
        self._renewed_at, self._renewed_last_try = now, True
        return True


def _record(spec: Json) -> tuple[object, ...]:
    """What must change for a holder to count as alive."""
    return (spec.get("holderIdentity") or "", spec.get("renewTime"), spec.get("leaseTransitions"))


def run_leader_election(
    elector: LeaderElector,
    stop: threading.Event,
    *,
    on_started_leading: Callable[[], None],
    on_stopped_leading: Callable[[], None],
) -> None:
    """Campaign and renew until ``stop`` is set, then release. The callbacks run on this
    thread and should only flip a flag: leadership may end while they run."""
    leading = False
    try:
        while not stop.is_set():
            try:
                renewed = elector.try_acquire_or_renew()
            except KubeError as exc:  # forbidden, invalid: keep trying, say why
                log.warning("leader election on %s: %s", elector.path, exc)
                renewed = elector.is_leader()
            if renewed != leading:
                leading = not leading
                (on_started_leading if leading else on_stopped_leading)()
            stop.wait(elector.next_try_s)
    finally:
        if leading:
            on_stopped_leading()
        elector.release()


def start_leader_election(
    elector: LeaderElector,
    stop: threading.Event,
    *,
    on_started_leading: Callable[[], None],
    on_stopped_leading: Callable[[], None],
) -> threading.Thread:
    """:func:`run_leader_election` on a daemon thread."""
    run = functools.partial(
        run_leader_election,
        elector,
        on_started_leading=on_started_leading,
        on_stopped_leading=on_stopped_leading,
    )
    return threads.start(f"leader-election-{elector.identity}", run, stop)
