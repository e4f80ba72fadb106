"""Which gang member the others waited on, judged from every member's all-reduce timings.

Every member times each all-reduce of the series from its own side: the time it spent on
its own part before the collective (``compute_s``) and the time inside the collective
(``collective_s``: its wait for the last member to arrive, plus the transfer). The last
member to arrive waits for no one, so the shortest time inside a collective is its
transfer alone, and a member's lateness is how long the first to arrive waited for it.
Pure: every rank runs it on the same gathered timings and reaches the same verdict.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SLOW_FRACTION = 0.8  # below this share of the reference bandwidth a member is slow
MIN_LATE_S = 0.1  # lateness below this is noise (a busy CPU, the scheduler), never a fault
GANG_STRAGGLER = "GANG_STRAGGLER"  # one member held the others up
GANG_ALLREDUCE_SLOW = "GANG_ALLREDUCE_SLOW"  # the whole gang's transfer is slow, no one late


@dataclass(frozen=True)
class MemberTimings:
    """One gang member's timings of the series, seconds per all-reduce (warm-up left out)."""

    rank: int
    node: str
    pod: str
    compute_s: tuple[float, ...]
    collective_s: tuple[float, ...]


@dataclass(frozen=True)
class MemberVerdict:
    timings: MemberTimings
    late_s: float  # median over the series of how long the first to arrive waited for it
    gbps: float  # the bus bandwidth the gang reaches when this member's lateness counts
    slow: bool


@dataclass(frozen=True)
class GangVerdict:
    members: tuple[MemberVerdict, ...]
    gang_gbps: float  # the bus bandwidth of the transfer alone (the last arrival's view)
    expected_gbps: float | None
    codes: tuple[str, ...]
    message: str

    @property
    def slow_nodes(self) -> tuple[str, ...]:
        return tuple(m.timings.node for m in self.members if m.slow)


def judge_gang(
    members: Sequence[MemberTimings],
    nbytes: int,
    expected_gbps: float | None = None,
    *,
    slow_fraction: float = SLOW_FRACTION,
    min_late_s: float = MIN_LATE_S,
) -> GangVerdict:
    """Each member's bandwidth against the gang's median (and the expected figure, when
    given); a member is named only when it was also late by ``min_late_s`` or more, so that
    noise on a busy machine never names anyone."""
    ordered = sorted(members, key=lambda m: m.rank)
    rounds = min(len(m.collective_s) for m in ordered)
    if len(ordered) < 2 or rounds < 1:
        raise ValueError("a gang verdict needs two members and one timed all-reduce")
    # An all-reduce moves 2(n-1)/n of the buffer through each member's link (nccl-tests'
    # "bus bandwidth"), so the figure compares across gang sizes.
    bus_bits = 2 * (len(ordered) - 1) / len(ordered) * nbytes * 8
    transfers: list[float] = []
    lateness: dict[int, list[float]] = {m.rank: [] for m in ordered}
    for k in range(rounds):
        inside = {m.rank: m.collective_s[k] for m in ordered}
        transfers.append(max(min(inside.values()), 1e-6))
        for rank, seconds in inside.items():
            lateness[rank].append(max(inside.values()) - seconds)
    transfer_s = statistics.median(transfers)
    late = {rank: statistics.median(values) for rank, values in lateness.items()}
    gbps = {rank: bus_bits / (transfer_s + late[rank]) / 1e9 for rank in late}
    median_gbps = statistics.median(gbps.values())
    verdicts = []
    for m in ordered:
        below = gbps[m.rank] < slow_fraction * median_gbps or (
            expected_gbps is not None and gbps[m.rank] < slow_fraction * expected_gbps
        )
        verdicts.append(
            MemberVerdict(m, late[m.rank], gbps[m.rank], below and late[m.rank] >= min_late_s)
        )
    gang_gbps = bus_bits / transfer_s / 1e9
    return _verdict(tuple(verdicts), gang_gbps, expected_gbps, slow_fraction)


def _verdict(
    members: tuple[MemberVerdict, ...],
    gang_gbps: float,
    expected_gbps: float | None,
    slow_fraction: float,
) -> GangVerdict:
    slow = [m for m in members if m.slow]
    against = f", expected {expected_gbps:g} Gb/s" if expected_gbps is not None else ""
    codes: list[str] = []
    if slow:
        codes.append(GANG_STRAGGLER)
        named = ", ".join(
            f"{m.timings.node} (rank {m.timings.rank}, {m.late_s * 1000:.0f} ms late,"
            f" {m.gbps:.2f} Gb/s)"
            for m in slow
        )
        message = f"the gang waited on {named}; transfer alone {gang_gbps:.2f} Gb/s{against}"
    else:
        message = (
            f"{len(members)} members, all-reduce {gang_gbps:.2f} Gb/s bus bandwidth{against};"
            " no member late"
        )
    if not slow and expected_gbps is not None and gang_gbps < slow_fraction * expected_gbps:
        # Everyone equally slow: a ring runs at its slowest link, so an all-reduce alone
        # cannot say which node's link it is; no node is named.
        codes.append(GANG_ALLREDUCE_SLOW)
        message += f"; below {slow_fraction:.0%} of the expected figure, no member to name"
    return GangVerdict(members, gang_gbps, expected_gbps, tuple(codes), message)
