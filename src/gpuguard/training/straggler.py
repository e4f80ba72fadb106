"""The straggler judge: which rank, if any, is slowing the job down, and how.

Every rank runs the same judge over the same gathered table of `WindowRecord` s, so all
of them reach the same conclusion with no further messages (the arithmetic is the same on
every rank, and the records cross the exchange as exact floats).

For each window and rank, its peers are the other ranks that timed steps in the window
(at least three ranks must have; the spread is the MAD of all of them, one value a window):

- compute-slow: its median compute is at least ``ratio`` times its peers' median, and
  above that median by more than ``spread_k`` robust deviations (1.4826 x MAD) of the
  peers, so a window where everyone is noisy names no one;
- link-slow: its compute keeps pace but its own communication exceeds its peers' median
  by at least ``ratio - 1`` of their step time (and by ``spread_k`` deviations). In a
  synchronous job a rank that arrives early waits for the last one inside the collective,
  so "own" communication is what lasts beyond the last rank's arrival; and links are
  judged only in windows without a compute-slow rank. The waiters are never named. A slow
  link inside a ring collective delays every rank alike and names no one: per-rank
  timing can single out a link only where the pattern is point to point (pipeline
  sends, uneven collectives).

A rank is named once it is slow ``persistence`` windows in a row (FAIL_SLOW or
LINK_SLOW), and released once it is back within ``ratio`` for ``persistence`` windows.
Each rank's own baseline (the median of its recent unflagged windows) marks the change
point in the evidence: how much slower it became than itself, and from which step.

A smaller slowdown is a finding only as a change: a rank whose compute is at least
``change_ratio`` times its peers' median (with the same ``spread_k`` margin) and whose
ratio to its peers is ``change_ratio`` times its usual one (the median over at least
``change_baseline`` healthy windows), for ``change_persistence`` windows in a row, is
named FAIL_SLOW too. GPUs of one model differ by a few per cent, and stay so: such a
difference is in the rank's usual ratio from its first windows. A job-wide change (a new
phase, longer sequences) moves every rank and no ratio. A GPU that becomes 5-10 % slower
than it was, while its peers do not, has changed.
The judge names minorities: if half the job slows down at once, the median moves with it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass

from gpuguard.training.step_timer import WindowRecord
from gpuguard.training.verdicts import VerdictKind

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class StragglerPolicy:
    ratio: float = 1.10  # a 10 % slower rank paces a synchronous job 10 % slower
    persistence: int = 4  # windows in a row, to be named and to be released
    spread_k: float = 3.0  # robust deviations of the peers the excess must also exceed
    baseline_windows: int = 32  # the rank's own recent healthy windows it is compared with
    # A smaller slowdown against peers and against the rank's own past (None: not judged).
    change_ratio: float | None = 1.05
    change_persistence: int = 8  # windows in a row: weaker evidence, so more of it
    change_baseline: int = 8  # own healthy windows needed before a change is judged

    def __post_init__(self) -> None:
        if self.ratio <= 1.0:
            raise ValueError(f"ratio {self.ratio} must be above 1")
        if self.change_ratio is not None and not 1.0 < self.change_ratio <= self.ratio:
            raise ValueError(f"change_ratio {self.change_ratio} must be above 1, at most ratio")
        if min(self.persistence, self.baseline_windows, self.change_persistence) < 1:
            raise ValueError(
                "persistence, baseline_windows and change_persistence must be at least 1"
            )
        if not 1 <= self.change_baseline <= self.baseline_windows:
            raise ValueError("change_baseline must be between 1 and baseline_windows")


@dataclass(frozen=True)
class Slowness:
    """A rank the judge names: what it found, over which steps, and how sure."""

    rank: int
    kind: VerdictKind  # FAIL_SLOW or LINK_SLOW
    ratio: float  # median over its last `persistence` slow windows
    first_step: int  # first step of the first slow window of the run
    last_step: int
    evidence: str


@dataclass
class _RankState:
    baseline: deque[float]  # compute of the latest healthy windows
    usual_ratio: deque[float]  # its compute over its peers' median, in the same windows
    slow_ratios: deque[float]  # of the latest compute-slow windows
    link_ratios: deque[float]
    change_ratios: deque[float]
    slow_run: int = 0  # compute-slow windows in a row
    slow_from: int = 0  # the first step of that run
    change_run: int = 0  # changed windows in a row (slower than its peers and its past)
    change_from: int = 0
    link_run: int = 0
    link_from: int = 0
    ok_run: int = 0  # windows in a row back within ratio, while named
    named: Slowness | None = None


@dataclass(frozen=True)
class _Window:
    compute_slow: bool
    link_slow: bool
    compute_clear: bool  # its compute exceeds its peers' median by spread_k deviations
    compute_ratio: float
    link_ratio: float
    peers_compute_s: float
    peers_comm_s: float


class StragglerJudge:
    def __init__(self, world_size: int, policy: StragglerPolicy | None = None) -> None:
        self.policy = policy or StragglerPolicy()
        self.world_size = world_size
        runs = self.policy.persistence
        self._ranks = [
            _RankState(
                baseline=deque(maxlen=self.policy.baseline_windows),
                usual_ratio=deque(maxlen=self.policy.baseline_windows),
                slow_ratios=deque(maxlen=runs),
                link_ratios=deque(maxlen=runs),
                change_ratios=deque(maxlen=self.policy.change_persistence),
            )
            for _ in range(world_size)
        ]

    def judge(self, table: list[WindowRecord]) -> dict[int, Slowness]:
        """Take one window's table (one record per rank); the ranks named after it."""
        if len(table) != self.world_size:
            raise ValueError(f"a table of {len(table)} records for {self.world_size} ranks")
        timed = [record for record in table if record.steps > 0]
        if len(timed) >= 3:  # of two ranks apart, neither is the odd one out
            windows = _judge_window(timed, self.policy)
            any_compute_slow = any(window.compute_slow for window in windows.values())
            for record in timed:
                self._update(record, windows[record.rank], any_compute_slow)
        return {rank: state.named for rank, state in enumerate(self._ranks) if state.named}

    def _update(self, record: WindowRecord, window: _Window, any_compute_slow: bool) -> None:
        policy, state = self.policy, self._ranks[record.rank]
        link_judged = not any_compute_slow  # otherwise every waiter's communication is long
        state.slow_run = state.slow_run + 1 if window.compute_slow else 0
        if state.slow_run == 1:
            state.slow_from = record.first_step
        if window.compute_slow:
            state.slow_ratios.append(window.compute_ratio)
        if link_judged:
            state.link_run = state.link_run + 1 if window.link_slow else 0
            if state.link_run == 1:
                state.link_from = record.first_step
            if window.link_slow:
                state.link_ratios.append(window.link_ratio)
        changed = self._changed(state, window)
        state.change_run = state.change_run + 1 if changed else 0
        if state.change_run == 1:
            state.change_from = record.first_step
        if changed:
            state.change_ratios.append(window.compute_ratio)
        if not window.compute_slow and not changed:  # the baseline keeps the rank's past
            state.baseline.append(record.compute_s)
            state.usual_ratio.append(window.compute_ratio)

        if state.slow_run >= policy.persistence:
            self._name(state, record, window, VerdictKind.FAIL_SLOW)
        elif state.change_run >= policy.change_persistence:
            self._name(state, record, window, VerdictKind.FAIL_SLOW, change=True)
        elif link_judged and state.link_run >= policy.persistence:
            self._name(state, record, window, VerdictKind.LINK_SLOW)
        elif state.named is not None:
            if state.named.kind is VerdictKind.FAIL_SLOW:
                still = window.compute_slow or changed
            elif link_judged:
                still = window.link_slow
            else:
                return  # a window that cannot say whether its link recovered
            state.ok_run = 0 if still else state.ok_run + 1
            if state.ok_run >= policy.persistence:
                state.named, state.ok_run = None, 0

    def _changed(self, state: _RankState, window: _Window) -> bool:
        """Slower than its peers by ``change_ratio``, and by as much more than it usually
        is (a compute-slow window too: a rank near ``ratio`` may cross it now and then)."""
        threshold = self.policy.change_ratio
        if threshold is None or len(state.usual_ratio) < self.policy.change_baseline:
            return False
        if window.compute_ratio < threshold or not window.compute_clear:
            return False  # most windows stop here: the median below only for candidates
        return window.compute_ratio >= threshold * statistics.median(state.usual_ratio)

    def _name(
        self,
        state: _RankState,
        record: WindowRecord,
        window: _Window,
        kind: VerdictKind,
        *,
        change: bool = False,
    ) -> None:
        policy = self.policy
        state.ok_run = 0
        if change:
            runs, first, ratios = state.change_run, state.change_from, state.change_ratios
        elif kind is VerdictKind.FAIL_SLOW:
            runs, first, ratios = state.slow_run, state.slow_from, state.slow_ratios
        else:
            runs, first, ratios = state.link_run, state.link_from, state.link_ratios
        state.named = Slowness(
            rank=record.rank,
            kind=kind,
            ratio=statistics.median(ratios),
            first_step=first,
            last_step=record.last_step,
            evidence=_evidence(kind, record, window, state, runs, first, policy, change),
        )


class _Sample:
    """One quantity over the ranks of a window: sorted once, so each rank's peers'
    median (all ranks but itself) costs O(1), and the judge O(n log n) a window."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.sorted = sorted(values)
        median = statistics.median(self.sorted)
        self.spread = _MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)

    def peers_median(self, rank_index: int) -> float:
        ordered, value = self.sorted, self.values[rank_index]
        skip = bisect.bisect_left(ordered, value)
        n = len(ordered) - 1

        def at(k: int) -> float:
            return ordered[k if k < skip else k + 1]

        return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _judge_window(timed: list[WindowRecord], policy: StragglerPolicy) -> dict[int, _Window]:
    last_arrival = max(record.compute_s for record in timed)
    compute = _Sample([record.compute_s for record in timed])
    comm = _Sample([_own_comm(record, last_arrival) for record in timed])
    step = _Sample([record.compute_s + record.comm_s for record in timed])
    windows = {}
    for index, record in enumerate(timed):
        compute_median, comm_median = compute.peers_median(index), comm.peers_median(index)
        step_median = step.peers_median(index)
        compute_excess = record.compute_s - compute_median
        comm_excess = comm.values[index] - comm_median
        compute_ratio = record.compute_s / compute_median if compute_median > 0 else 1.0
        link_ratio = 1.0 + comm_excess / step_median if step_median > 0 else 1.0
        compute_clear = compute_excess > policy.spread_k * compute.spread
        compute_slow = compute_ratio >= policy.ratio and compute_clear
        link_slow = (
            not compute_slow
            and link_ratio >= policy.ratio
            and comm_excess > policy.spread_k * comm.spread
        )
        windows[record.rank] = _Window(
            compute_slow,
            link_slow,
            compute_clear,
            compute_ratio,
            link_ratio,
            compute_median,
            comm_median,
        )
    return windows


def _own_comm(record: WindowRecord, last_arrival: float) -> float:
    """Communication beyond waiting for the last rank to arrive: a fast rank waits long in
    every synchronous collective, and that says nothing about its link."""
    return max(0.0, record.compute_s + record.comm_s - last_arrival)


def _evidence(
    kind: VerdictKind,
    record: WindowRecord,
    window: _Window,
    state: _RankState,
    runs: int,
    first: int,
    policy: StragglerPolicy,
    change: bool,
) -> str:
    if kind is VerdictKind.FAIL_SLOW:
        text = (
            f"compute {record.compute_s:.4g} s/step against its peers' median "
            f"{window.peers_compute_s:.4g} s (x{window.compute_ratio:.3f})"
        )
    else:
        text = (
            f"communication {record.comm_s:.4g} s/step against its peers' median "
            f"{window.peers_comm_s:.4g} s, steps x{window.link_ratio:.3f} longer for it"
        )
    if change:
        text += (
            f", {runs} windows in a row from step {first} slower than its peers and its own"
            f" past (change_ratio {policy.change_ratio}, persistence"
            f" {policy.change_persistence})"
        )
    else:
        text += (
            f", {runs} windows in a row from step {first} (ratio {policy.ratio}, "
            f"persistence {policy.persistence})"
        )
    if state.baseline:
        own = statistics.median(state.baseline)
        if own > 0:
            text += f"; its own compute baseline {own:.4g} s, now x{record.compute_s / own:.3f}"
    else:
        text += "; slower than its peers from its first window"
    return text
