"""JobMonitor in one process: its verdict file's life, and the loopback exchange."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuguard.training import (
    BackgroundExchange,
    ExchangeError,
    JobMonitor,
    LoopbackExchange,
    VerdictKind,
    WindowRecord,
    open_exchange,
)
from gpuguard.training.verdicts import read_verdicts
from tests.support.controlplane import free_port

WORLD = 8


class ScriptedPeers:
    """The exchange of rank 0 in an 8-rank job whose peers compute ``1 / slowdown`` as
    long as rank 0 does, and hold the same parameters unless ``odd_prints`` says so."""

    def __init__(self) -> None:
        self.slowdown = 1.0
        self.odd_prints = False
        self.fail = False

    def all_gather(self, item):
        if self.fail:
            raise ExchangeError("rank 3 closed the connection")
        if len(item) == 3:  # a fingerprint round: [step, group, fingerprint]
            step, group, prints = item
            other = [p + 1 for p in prints] if self.odd_prints else prints
            return [item] + [[step, group, other]] * (WORLD - 1)
        mine = WindowRecord.from_wire(item)
        peer_compute = mine.compute_s / self.slowdown
        rows = [item]
        for rank in range(1, WORLD):
            wait = max(mine.compute_s - peer_compute, 0.0)
            rows.append(
                [rank, mine.first_step, mine.last_step, mine.steps, peer_compute, wait + 1e-4]
            )
        return rows

    def close(self) -> None:
        pass


class Clock:
    """Wall time that moves a second at each reading."""

    def __init__(self) -> None:
        self.at = 1_000_000.0

    def now(self) -> float:
        self.at += 1.0
        return self.at

    def monotonic(self) -> float:
        return self.now()


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    monkeypatch.setenv("GPUGUARD_GPU_PCI_BUS_ID", "00000000:3B:00.0")
    monkeypatch.setenv("GPUGUARD_JOB", "ml/pretrain")
    for name in ("RANK", "WORLD_SIZE", "GPUGUARD_IN_JOB_DIR"):
        monkeypatch.delenv(name, raising=False)


def run_steps(monitor: JobMonitor, steps: range) -> None:
    for step in steps:
        with monitor.step(step):
            time.sleep(0.0005)
            with monitor.communicating():
                pass


def test_the_verdict_file_is_written_refreshed_checkpointed_and_withdrawn(tmp_path, env):
    peers, clock = ScriptedPeers(), Clock()
    monitor = JobMonitor(
        rank=0, world_size=WORLD, exchange=peers, verdict_dir=tmp_path, clock=clock
    )
    w = monitor.window_steps  # 6; named and released after 4 windows
    run_steps(monitor, range(0, 5 * w))
    assert monitor.verdict is None and read_verdicts(tmp_path) == ([], [])
    monitor.checkpoint_saved(5 * w - 1)  # no verdict held: nothing to record

    peers.slowdown = 1.3
    run_steps(monitor, range(5 * w, 9 * w))  # four slow windows
    [verdict], errors = read_verdicts(tmp_path)
    assert not errors
    assert (verdict.kind, verdict.job, verdict.rank, verdict.world_size) == (
        VerdictKind.FAIL_SLOW,
        "ml/pretrain",
        0,
        WORLD,
    )
    assert (verdict.node, verdict.gpu) == ("gpu-node-7", "00000000:3B:00.0")
    assert verdict.steps == (5 * w, 9 * w - 1)
    assert verdict.ratio == pytest.approx(1.3) and verdict.checkpointed_at is None

    monitor.checkpoint_saved(6 * w)  # a checkpoint of a step before the verdict: no
    assert read_verdicts(tmp_path)[0][0].checkpointed_at is None
    monitor.checkpoint_saved(9 * w)
    checkpointed = read_verdicts(tmp_path)[0][0]
    assert checkpointed.since == verdict.since < checkpointed.checkpointed_at

    run_steps(monitor, range(9 * w, 10 * w))
    refreshed = read_verdicts(tmp_path)[0][0]
    assert refreshed.written_at > checkpointed.written_at
    assert refreshed.steps == (5 * w, 10 * w - 1)
    assert refreshed.checkpointed_at == checkpointed.checkpointed_at

    peers.slowdown = 1.0
    run_steps(monitor, range(10 * w, 13 * w))
    assert read_verdicts(tmp_path)[0] != [], "released only after four windows back"
    run_steps(monitor, range(13 * w, 14 * w))
    assert read_verdicts(tmp_path) == ([], []) and monitor.verdict is None


def test_a_replica_mismatch_outranks_slowness_and_stays(tmp_path, env):
    peers = ScriptedPeers()
    monitor = JobMonitor(
        rank=0, world_size=WORLD, exchange=peers, verdict_dir=tmp_path, replica_interval=16
    )
    params = {"w": [0.5, 0.25]}
    peers.slowdown = 1.3
    for step in range(40):
        run_steps(monitor, range(step, step + 1))
        peers.odd_prints = step >= 30
        monitor.check_replicas(step, params)
    assert monitor.verdict is not None and monitor.verdict.kind is VerdictKind.FAIL_SLOW
    for step in range(40, 60):  # rounds at 32 (a suspect) and 42 (the re-check names it)
        run_steps(monitor, range(step, step + 1))
        monitor.check_replicas(step, params)
    [verdict], _ = read_verdicts(tmp_path)
    assert verdict.kind is VerdictKind.REPLICA_MISMATCH and verdict.ratio == 0.0
    assert verdict.steps == (32, 59) and "at step 32 and again at step 42" in verdict.evidence


def test_the_probe_runs_when_due_and_names_wrong_gradients_below_a_replica_mismatch(tmp_path, env):
    peers = ScriptedPeers()
    monitor = JobMonitor(
        rank=0,
        world_size=WORLD,
        exchange=peers,
        verdict_dir=tmp_path,
        replica_interval=16,
        compute_interval=20,
    )
    params = {"w": [0.5, 0.25]}
    probed: list[int] = []

    def probe() -> list[float]:
        probed.append(step)
        return [0.125, 0.0625]

    for step in range(80):
        run_steps(monitor, range(step, step + 1))
        peers.odd_prints = step >= 60  # its parameters differ from step 60 on
        monitor.check_replicas(step, params)
        peers.odd_prints = step >= 30  # its probe gradients differ from step 30 on
        monitor.check_compute(step, probe)
        if step == 59:
            [verdict], _ = read_verdicts(tmp_path)
            assert verdict.kind is VerdictKind.COMPUTE_MISMATCH and verdict.ratio == 0.0
            assert verdict.steps == (40, 59)
            assert "gradients of the probe batch differ" in verdict.evidence
            assert "at step 40 and again at step 50" in verdict.evidence
    # Every 20 steps, and the re-check 10 steps after the round that first found it odd
    # (a named rank stays named: no more re-checks).
    assert probed == [0, 20, 40, 50, 60]
    [verdict], _ = read_verdicts(tmp_path)
    assert verdict.kind is VerdictKind.REPLICA_MISMATCH, "wrong parameters outrank"
    assert verdict.steps == (64, 77) and "at step 64 and again at step 74" in verdict.evidence


def test_an_exchange_that_fails_turns_the_monitor_off_not_the_job(tmp_path, env, caplog):
    peers = ScriptedPeers()
    monitor = JobMonitor(rank=0, world_size=WORLD, exchange=peers, verdict_dir=tmp_path)
    peers.fail = True
    run_steps(monitor, range(0, 2 * monitor.window_steps))
    assert monitor.disabled and "rank 3 closed" in monitor.disabled
    assert monitor.check_replicas(50, [[1.0]]) == []
    assert "in-job monitor of rank 0 off" in caplog.text


class Garbling(ScriptedPeers):
    """Rank 5 sends a row that is not the record every rank sends."""

    def all_gather(self, item):
        table = super().all_gather(item)
        table[5] = [1, "two"] if len(item) != 3 else [item[0], item[1], "prints"]
        return table


@pytest.mark.parametrize("round_kind", ["window", "fingerprint"])
def test_a_peer_row_that_is_not_a_record_turns_the_monitor_off(tmp_path, env, round_kind):
    monitor = JobMonitor(rank=0, world_size=WORLD, exchange=Garbling(), verdict_dir=tmp_path)
    if round_kind == "window":
        run_steps(monitor, range(0, monitor.window_steps))
    else:
        assert monitor.check_replicas(50, [[1.0]]) == []
    assert monitor.disabled and "rank 5 sent" in monitor.disabled
    assert monitor.verdict is None


def test_rank_and_world_size_come_from_the_environment(monkeypatch, env):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monitor = JobMonitor()
    assert (monitor.identity.rank, monitor.identity.world_size) == (0, 1)
    assert monitor.identity.node == "gpu-node-7" and monitor.verdict_dir is None
    run_steps(monitor, range(16))  # a job of one rank judges no one
    monitor.close()
    assert monitor.named == {} and monitor.disabled is None


def gather_in_threads(world: int, port: int, items: list[list[object]]) -> list[list[object]]:
    results: list[list[object]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            exchange = LoopbackExchange(rank, world, port, timeout_s=10)
            try:
                for item in items[rank]:
                    results[rank].append(exchange.all_gather(item))
            finally:
                exchange.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in reversed(range(world))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not errors, errors
    return results


def test_the_loopback_exchange_gathers_every_round_in_rank_order():
    items = [[{"rank": r, "round": i} for i in range(5)] for r in range(4)]
    results = gather_in_threads(4, free_port(), items)
    for rank in range(4):
        assert results[rank] == [[items[r][i] for r in range(4)] for i in range(5)]


def test_the_loopback_exchange_listens_on_loopback_only_and_names_missing_ranks():
    exchange = LoopbackExchange(0, 3, 0, timeout_s=0.3)
    try:
        assert exchange._server is not None
        assert exchange._server.getsockname()[0] == "127.0.0.1"
        assert exchange.port != 0
        with pytest.raises(ExchangeError, match=r"ranks \[1, 2\] did not connect"):
            exchange.all_gather([1])
    finally:
        exchange.close()


def test_without_torch_or_a_port_the_exchange_says_what_to_set(monkeypatch):
    monkeypatch.delenv("GPUGUARD_EXCHANGE_PORT", raising=False)
    with pytest.raises(ExchangeError, match="GPUGUARD_EXCHANGE_PORT"):
        open_exchange(1, 4)


def test_a_rank_whose_rank_0_never_listens_gives_up_with_an_error(tmp_path: Path):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ExchangeError, match="cannot reach rank 0"):
        LoopbackExchange(1, 2, port, timeout_s=0.3)
    assert time.monotonic() - started < 5


class SlowEcho:
    def __init__(self) -> None:
        self.seen: list[object] = []
        self.closed = False

    def all_gather(self, item):
        time.sleep(0.01)  # a round that waits for the slowest rank
        self.seen.append(item)
        return [item]

    def close(self) -> None:
        self.closed = True


def test_the_background_exchange_gathers_in_order_off_the_caller_and_finishes_on_close():
    inner = SlowEcho()
    exchange = BackgroundExchange(inner)
    started = time.perf_counter()
    futures = [exchange.submit(i) for i in range(5)]
    assert time.perf_counter() - started < 0.01 * 5  # the caller did not wait for them
    assert exchange.all_gather("last") == ["last"]
    assert [f.result(timeout=5) for f in futures] == [[i] for i in range(5)]
    pending = exchange.submit("at close")
    exchange.close()
    assert pending.result(timeout=0) == ["at close"] and inner.closed
    assert inner.seen == [0, 1, 2, 3, 4, "last", "at close"]
