"""Cost of one ``decide`` call against the length of the closed-episode history.

The lemon count and the breaker read the history of closed episodes; on a plain list each
call walks all of it (and again for every node that tries a rung), with a ``History``
kept by the caller it answers from an index. Same fleet, same episodes, same decisions
(checked here), both forms side by side in one run.

    .venv/bin/python bench/decide_history.py
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from gpuguard.contract.report import LayerReport
from gpuguard.model import Action
from gpuguard.remediation.decide import decide
from gpuguard.remediation.history import History
from gpuguard.remediation.model import BreakerState, Episode, NodeObservation, Phase, Resolution
from gpuguard.remediation.policy import Policy

NOW = 1_000_000_000.0
FLEET = 10_000
SICK = 20  # nodes a call decides on: each is past its tolerance and tries a rung
WEEK = 7 * 24 * 3600.0


def fleet() -> tuple[dict[str, NodeObservation], dict[str, Episode]]:
    ok = LayerReport("True", "Healthy", NOW - WEEK)
    bad = LayerReport("False", "Xid79", NOW - 600, Action.REBOOT, ("XID_79",), ("0000:91:00.0",))
    nodes, episodes = {}, {}
    for i in range(SICK):
        name = f"node-{i:05d}"
        nodes[name] = NodeObservation(
            name, "pool", {"gpu": bad, "network": ok, "kernel": ok}, NOW - 10, tainted=True
        )
        episodes[name] = Episode(name, opened_at=NOW - 600, phase_since=NOW - 600)
    return nodes, episodes


def history(length: int, rng: random.Random) -> list[Episode]:
    closed = []
    for _ in range(length):
        opened = NOW - rng.uniform(0, WEEK)
        closed.append(
            Episode(
                f"node-{rng.randrange(FLEET):05d}",
                opened_at=opened,
                phase=Phase.CLOSED,
                closed_at=opened + rng.uniform(60, 7200),
                resolution=Resolution.TRANSIENT,
            )
        )
    return closed


def per_call(past: Sequence[Episode], calls: int = 200) -> float:
    nodes, episodes = fleet()
    policy = Policy()
    population = {"pool": FLEET}
    started = time.perf_counter()
    for _ in range(calls):
        decide(nodes, episodes, past, BreakerState(), policy, NOW, population=population)
    return (time.perf_counter() - started) / calls


def main() -> None:
    rng = random.Random(1)
    nodes, episodes = fleet()
    print(f"decide over {SICK} sick nodes of a {FLEET:,}-node fleet, each trying a rung")
    print("| closed episodes in history | plain list | History | ratio |")
    print("|---:|---:|---:|---:|")
    for length in (0, 1_000, 5_000, 20_000):
        plain = history(length, rng)
        index = History(plain)
        args = (nodes, episodes)
        same = [
            decide(*args, h, BreakerState(), Policy(), NOW, population={"pool": FLEET})
            for h in (plain, index)
        ]
        assert same[0] == same[1], "the indexed history decided differently"
        list_s, index_s = per_call(plain), per_call(index)
        print(
            f"| {length:,} | {list_s * 1e3:.3f} ms | {index_s * 1e3:.3f} ms"
            f" | {list_s / index_s:.1f}x |"
        )


if __name__ == "__main__":
    main()
