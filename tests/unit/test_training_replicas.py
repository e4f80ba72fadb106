"""Parameter fingerprints, the replica vote and its re-check."""

from __future__ import annotations

import numpy as np
import pytest

from gpuguard.training import ReplicaCheck, fingerprint
from gpuguard.training.replicas import agree, vote


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int8])
def test_one_flipped_bit_anywhere_changes_the_fingerprint(dtype):
    noise = np.random.default_rng(11)
    params = {
        "w": noise.standard_normal((64, 33)).astype(dtype),
        "b": noise.standard_normal(7).astype(dtype),
    }
    clean = fingerprint(params)
    assert fingerprint({"b": params["b"].copy(), "w": params["w"].copy()}) == clean
    for _ in range(50):
        name = "w" if noise.random() < 0.8 else "b"
        flat = params[name].reshape(-1).view(np.uint8)
        index, bit = int(noise.integers(flat.size)), int(noise.integers(8))
        flat[index] ^= 1 << bit
        assert fingerprint(params) != clean, (name, index, bit)
        flat[index] ^= 1 << bit
    assert fingerprint(params) == clean


def test_a_list_of_arrays_and_non_contiguous_views_fingerprint_by_value():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert fingerprint([base[:, ::2]]) == fingerprint([np.ascontiguousarray(base[:, ::2])])
    assert fingerprint([base, base]) != fingerprint([base])


def test_the_tolerant_fingerprint_forgives_rounding_but_not_a_corruption():
    params = np.random.default_rng(12).standard_normal(10_000)
    rounded = params * (1 + 1e-12)
    corrupted = params.copy()
    corrupted[17] *= 2.0
    a, b, c = (fingerprint([p], rtol=1e-9) for p in (params, rounded, corrupted))
    assert agree(a, b, 1e-9) and not agree(a, c, 1e-9)
    assert fingerprint([params]) != fingerprint([rounded])  # the exact one does not forgive


def test_the_vote_names_the_odd_one_of_each_group_and_not_a_tie():
    good, bad, other = (1.0, 2.0, 3.0), (1.0, 2.0, 4.0), (9.0, 9.0, 9.0)
    groups = {0: ("a", good), 1: ("a", good), 2: ("a", bad), 3: ("b", other), 4: ("b", other)}
    assert vote(groups).odd == (2,) and vote(groups).inconclusive == ()
    two = {0: (0, good), 1: (0, bad)}
    assert vote(two).odd == () and vote(two).inconclusive == (0, 1)
    split = {0: (0, good), 1: (0, good), 2: (0, bad), 3: (0, bad)}
    assert vote(split).odd == () and vote(split).inconclusive == (0, 1, 2, 3)
    shards = {0: ([0, 1], good), 1: ([0, 1], good), 2: ([0, 1], bad)}  # group ids via JSON
    assert vote(shards).odd == (2,)


def test_a_rank_is_named_only_when_the_recheck_finds_it_odd_again():
    check = ReplicaCheck(interval=50, recheck_after=10)
    good, bad = (1.0, 1.0, 1.0), (1.0, 1.0, 2.0)
    assert [s for s in range(120) if check.due(s)] == [0, 50, 100]

    first = check.judge(50, {0: (0, good), 1: (0, bad), 2: (0, good)})
    assert first.vote.odd == (1,) and first.named == {}
    assert check.due(60) and not check.due(59)
    healed = check.judge(60, {0: (0, good), 1: (0, good), 2: (0, good)})
    assert healed.named == {} and not check.due(70)

    check.judge(100, {0: (0, good), 1: (0, good), 2: (0, bad)})
    again = check.judge(110, {0: (0, good), 1: (0, good), 2: (0, bad)})
    assert list(again.named) == [2]
    assert (again.named[2].first_step, again.named[2].last_step) == (100, 110)
    later = check.judge(150, {0: (0, good), 1: (0, good), 2: (0, good)})
    assert list(later.named) == [2], "a named rank stays named: its results were wrong"


def test_a_suspect_with_rechecks_left_is_named_by_any_of_them_then_forgotten():
    check = ReplicaCheck(interval=50, recheck_after=5, rechecks=3)
    good, bad = (1.0,), (2.0,)
    agree = {0: (0, good), 1: (0, good), 2: (0, good)}
    odd = {0: (0, good), 1: (0, bad), 2: (0, good)}
    check.judge(50, odd)
    assert check.due(55)
    assert check.judge(55, agree).named == {} and check.due(60), "agreed: re-checked again"
    named = check.judge(60, odd).named
    assert list(named) == [1] and (named[1].first_step, named[1].last_step) == (50, 60)
    assert not check.due(65), "named: no more re-checks"
    check.judge(100, {0: (0, bad), 1: (0, good), 2: (0, good)})
    for step in (105, 110, 115):
        assert check.due(step)
        check.judge(step, agree)
    assert not check.due(120), "three re-checks agreed: forgotten"
    result = check.judge(150, {0: (0, bad), 1: (0, good), 2: (0, good)})
    assert result.named.keys() == {1} and check.due(155), "a new suspect, not named yet"


def test_an_inconclusive_round_clears_suspects_and_names_no_one():
    check = ReplicaCheck(interval=10, recheck_after=5)
    a, b = (1.0,), (2.0,)
    check.judge(10, {0: (0, a), 1: (0, a), 2: (0, b)})
    result = check.judge(15, {0: (0, a), 1: (0, b)} | {2: (1, b)})
    assert result.named == {} and result.vote.inconclusive == (0, 1)
