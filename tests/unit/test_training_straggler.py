"""The straggler judge on synthetic window tables: who is named, who is not, and when."""

from __future__ import annotations

import numpy as np
import pytest

from gpuguard.training import StragglerJudge, StragglerPolicy, VerdictKind, WindowRecord

WINDOW = 6  # the monitor's default window


def sync_table(window: int, compute: list[float], comm: float = 0.002) -> list[WindowRecord]:
    """One window of a synchronous job: every rank leaves the collective when the slowest
    arrives, so a rank waits there for as long as it was faster than the slowest."""
    slowest = max(compute)
    return [
        WindowRecord(
            rank, window * WINDOW, window * WINDOW + WINDOW - 1, WINDOW, c, comm + slowest - c
        )
        for rank, c in enumerate(compute)
    ]


def computes(world: int, noise: np.random.Generator, slow: dict[int, float]) -> list[float]:
    base = 0.100 * noise.lognormal(0.0, 0.01, world)
    return [float(b * slow.get(rank, 1.0)) for rank, b in enumerate(base)]


def test_a_slow_rank_is_named_after_persistence_windows_and_its_waiters_never():
    judge, noise = StragglerJudge(16), np.random.default_rng(1)
    for window in range(10):
        assert judge.judge(sync_table(window, computes(16, noise, {}))) == {}
    named_after = []
    for window in range(10, 20):
        named = judge.judge(sync_table(window, computes(16, noise, {7: 1.15})))
        assert set(named) <= {7}, "a rank that only waited for rank 7 was named"
        named_after.append(bool(named))
    assert named_after[:4] == [False, False, False, True]  # persistence 4
    slowness = judge.judge(sync_table(20, computes(16, noise, {7: 1.15})))[7]
    assert slowness.kind is VerdictKind.FAIL_SLOW
    assert slowness.first_step == 10 * WINDOW and slowness.last_step == 21 * WINDOW - 1
    assert 1.12 < slowness.ratio < 1.18
    assert "own compute baseline" in slowness.evidence


def test_a_rank_below_the_ratio_is_not_named():
    judge, noise = StragglerJudge(16), np.random.default_rng(2)
    for window in range(500):
        assert judge.judge(sync_table(window, computes(16, noise, {3: 1.07}))) == {}


def test_a_rank_that_becomes_7_percent_slower_than_its_past_and_its_peers_is_named():
    judge, noise = StragglerJudge(16), np.random.default_rng(21)
    for window in range(20):  # its own baseline: 20 windows at its peers' pace
        assert (
            judge.judge(
                sync_table(window, computes(16, noise, {})),
            )
            == {}
        )
    named_after = []
    for window in range(20, 32):
        named = judge.judge(sync_table(window, computes(16, noise, {3: 1.07})))
        assert set(named) <= {3}
        named_after.append(bool(named))
    assert named_after.index(True) == 7, "named after change_persistence (8) windows"
    slowness = judge.judge(sync_table(32, computes(16, noise, {3: 1.07})))[3]
    assert slowness.kind is VerdictKind.FAIL_SLOW and slowness.first_step == 20 * WINDOW
    assert 1.05 < slowness.ratio < 1.09 and "its own past" in slowness.evidence
    for window in range(33, 37):  # back at pace: released after persistence windows
        named = judge.judge(sync_table(window, computes(16, noise, {})))
    assert named == {}
    off = StragglerJudge(16, StragglerPolicy(change_ratio=None))
    for window in range(40):
        slow = {3: 1.07} if window >= 20 else {}
        assert off.judge(sync_table(window, computes(16, noise, slow))) == {}


def test_a_job_wide_slowdown_and_a_rank_slower_from_its_start_are_no_change():
    judge, noise = StragglerJudge(16), np.random.default_rng(22)
    for window in range(200):
        everyone = 1.07 if window >= 20 else 1.0  # a new phase of the job: all ranks
        compute = [c * everyone for c in computes(16, noise, {5: 1.07})]  # rank 5 always
        assert judge.judge(sync_table(window, compute)) == {}


def test_a_higher_ratio_setting_spares_a_15_percent_rank_and_a_lower_one_names_it():
    strict = StragglerJudge(8, StragglerPolicy(ratio=1.20, change_ratio=None))
    loose = StragglerJudge(8, StragglerPolicy(ratio=1.05, persistence=2, change_ratio=1.05))
    noise = np.random.default_rng(3)
    for window in range(40):
        table = sync_table(window, computes(8, noise, {2: 1.15}))
        assert strict.judge(table) == {}
        named = loose.judge(table)
    assert set(named) == {2}


def test_slowness_that_does_not_persist_is_not_named():
    judge, noise = StragglerJudge(8), np.random.default_rng(4)
    for window in range(300):
        slow = {5: 1.3} if window % 4 else {}  # three slow windows, then one that keeps pace
        assert judge.judge(sync_table(window, computes(8, noise, slow))) == {}


def test_a_named_rank_is_released_after_persistence_windows_back_within_ratio():
    judge, noise = StragglerJudge(8), np.random.default_rng(5)
    for window in range(6):
        named = judge.judge(sync_table(window, computes(8, noise, {1: 1.25})))
    assert set(named) == {1}
    for window in range(6, 9):
        assert set(judge.judge(sync_table(window, computes(8, noise, {})))) == {1}
    assert judge.judge(sync_table(9, computes(8, noise, {}))) == {}


def test_a_noisy_window_names_no_one_even_when_one_rank_is_over_the_ratio():
    judge = StragglerJudge(4)
    for window in range(10):  # peers spread 0.08-0.12: rank 3 at 0.125 is within their noise
        table = sync_table(window, [0.080, 0.100, 0.120, 0.125])
        assert judge.judge(table) == {}


def test_communication_only_slowness_names_the_link():
    judge = StragglerJudge(8)
    for window in range(5):
        table = [
            WindowRecord(
                r,
                window * WINDOW,
                window * WINDOW + WINDOW - 1,
                WINDOW,
                0.1,
                0.030 if r == 4 else 0.010,
            )
            for r in range(8)
        ]
        named = judge.judge(table)
    assert set(named) == {4} and named[4].kind is VerdictKind.LINK_SLOW
    assert named[4].ratio == pytest.approx(1 + 0.020 / 0.110)


def test_long_waits_behind_a_compute_slow_rank_do_not_count_as_a_slow_link():
    judge, noise = StragglerJudge(8), np.random.default_rng(6)
    for window in range(20):
        table = sync_table(window, computes(8, noise, {0: 1.2}))
        # rank 6's link is also a bit slow, but while rank 0 holds everyone up, the
        # waits say nothing about links
        table[6] = WindowRecord(
            6,
            table[6].first_step,
            table[6].last_step,
            WINDOW,
            table[6].compute_s,
            table[6].comm_s * 1.5,
        )
        named = judge.judge(table)
    assert set(named) == {0} and named[0].kind is VerdictKind.FAIL_SLOW


def test_ranks_that_timed_no_steps_are_left_out():
    judge = StragglerJudge(3)
    for window in range(5):
        table = sync_table(window, [0.1, 0.1, 0.1])
        table[2] = WindowRecord(2, window * WINDOW, window * WINDOW + WINDOW - 1, 0, 0.0, 0.0)
        assert judge.judge(table) == {}


def realistic_windows(
    noise: np.random.Generator, world: int, windows: int, slow_rank: int = -1, onset: int = 1 << 60
) -> np.ndarray:
    """Per-step compute seconds, shape (windows, WINDOW, world): GPUs a few per cent
    apart, 4 % per-step jitter, 1 % of steps hit by a 2-3x hiccup, and now and then a
    rank stalled for a dozen steps (an input pipeline hiccup)."""
    steps = windows * WINDOW
    speed = noise.uniform(0.98, 1.02, world)
    times = 0.25 * speed * noise.lognormal(0.0, 0.04, (steps, world))
    hiccups = noise.random((steps, world)) < 0.01
    times[hiccups] *= noise.uniform(2.0, 3.0, hiccups.sum())
    for start in noise.integers(0, steps - 12, steps // 2000):
        times[start : start + 12, noise.integers(world)] *= 1.5
    if slow_rank >= 0:
        times[onset:, slow_rank] *= 1.15
    return times.reshape(windows, WINDOW, world)


def judge_all(judge: StragglerJudge, times: np.ndarray) -> dict[int, int]:
    """Feed every window; rank -> the last step of the window that first named it."""
    first_named: dict[int, int] = {}
    medians = np.median(times, axis=1)
    for window, row in enumerate(medians):
        slowest = float(row.max())
        table = [
            WindowRecord(
                r,
                window * WINDOW,
                window * WINDOW + WINDOW - 1,
                WINDOW,
                float(c),
                0.01 + slowest - float(c),
            )
            for r, c in enumerate(row)
        ]
        for rank in judge.judge(table):
            first_named.setdefault(rank, window * WINDOW + WINDOW - 1)
    return first_named


def test_180_000_steps_of_realistic_jitter_name_no_one():
    noise = np.random.default_rng(20261201)
    for _ in range(3):  # 3 jobs of 8 ranks x 60,000 steps
        judge = StragglerJudge(8)
        assert judge_all(judge, realistic_windows(noise, 8, 10_000)) == {}


def test_in_the_same_jitter_a_15_percent_slow_rank_is_named_within_30_steps():
    noise = np.random.default_rng(7)
    for trial in range(20):
        onset = int(noise.integers(200, 1000))
        judge = StragglerJudge(16)
        named = judge_all(
            judge, realistic_windows(noise, 16, 200, slow_rank=trial % 16, onset=onset)
        )
        assert set(named) == {trial % 16}, (trial, onset, named)
        assert named[trial % 16] - onset < 30, (onset, named)
