"""The service-level indicators, defined once for the simulator and the controller.

- GPU-node availability: the time-weighted share of GPU nodes in service (present, Ready,
  schedulable, no fault: :func:`in_service`). Over *slots* the denominator is the fleet's
  size; over *physical nodes* it is the machines in the fleet, those away for repair
  included.
- Job success rate: jobs that succeeded (after any automatic restarts) over jobs that
  ended, succeeded or failed; jobs still running are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TimeShare:
    """Integrates "how many are up, out of how many" over time."""

    since: float
    up: int = 0
    total: int = 0
    up_seconds: float = 0.0
    total_seconds: float = 0.0
    # Kept on its own rather than as total - up: a Prometheus counter must never go back,
    # which a difference of two growing floats can by a rounding error.
    down_seconds: float = 0.0

    def advance(self, now: float) -> None:
        elapsed = now - self.since
        if elapsed > 0:
            self.up_seconds += self.up * elapsed
            self.total_seconds += self.total * elapsed
            self.down_seconds += (self.total - self.up) * elapsed
            self.since = now

    def set(self, now: float, *, up: int, total: int) -> None:
        self.advance(now)
        self.up, self.total = up, total

    @property
    def share(self) -> float:
        return ratio(self.up_seconds, self.total_seconds)


def in_service(*, ready: bool, cordoned: bool, quarantined: bool, faulty: bool) -> bool:
    """Whether a present GPU node counts as up: Ready, not cordoned, not under a quarantine
    taint (nor in repair, which keeps the taint), and no fault that makes it unusable."""
    return ready and not cordoned and not quarantined and not faulty


def ratio(part: float, whole: float) -> float:
    """``part / whole``; an empty whole reads as 1 (nothing was out of service)."""
    return part / whole if whole > 0 else 1.0


def job_success_rate(succeeded: int, failed: int) -> float:
    return ratio(succeeded, succeeded + failed)
