"""The in-job monitor: step telemetry, the straggler judge, replica agreement and the
compute probe in one object a training loop calls, and the verdict file of this rank kept
up to date.

Every rank of the job makes the same calls at the same steps (they are collectives)::

    monitor = JobMonitor()                       # rank, job, node, GPU from the environment
    for step in range(start, total_steps):
        with monitor.step(step):
            loss = forward_backward(batch)       # compute
            with monitor.communicating():        # the first collective of the step
                all_reduce(gradients)
            optimizer.step()
        monitor.check_replicas(step, model)      # a fingerprint round every 50 steps
        monitor.check_compute(step, probe)       # the probe batch's gradients, every 200
        if step % interval == 0:
            save_checkpoint(step)
            monitor.checkpoint_saved(step)
    monitor.close()

At the end of every window of ``window_steps`` steps the ranks exchange one record each
(on a worker thread, so the loop does not wait for it) and all run the judge on the table
when it is back, a step or so later. A named rank writes its verdict (one at a time: a
replica mismatch, a compute mismatch, fail-slow, link-slow) into ``verdict_dir``,
refreshes it every window, and withdraws it when it recovers. The monitor never stops the
job: an exchange that fails is logged and the monitor turns itself off.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from numbers import Real
from pathlib import Path
from typing import TypeVar

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.training.exchange import BackgroundExchange, Exchange, ExchangeError, open_exchange
from gpuguard.training.identity import RankIdentity
from gpuguard.training.replicas import Fingerprint, ReplicaCheck, ReplicaRound, fingerprint
from gpuguard.training.step_timer import StepTimer, WindowRecord
from gpuguard.training.straggler import Slowness, StragglerJudge, StragglerPolicy
from gpuguard.training.verdicts import (
    DEFAULT_TTL_S,
    IN_JOB_DIR_ENV,
    Verdict,
    VerdictKind,
    withdraw_verdict,
    write_verdict,
)

log = logging.getLogger("gpuguard.training")

DEFAULT_WINDOW_STEPS = 6
"""Steps per exchanged window: 6 x 4 windows names a rank within 28 steps of its onset."""
DEFAULT_COMPUTE_INTERVAL = 200
"""Steps between probe rounds: one probe per 200 steps costs 0.5 % of compute when the
probe is a whole step's work, less where a step accumulates several micro-batches."""
DEFAULT_COMPUTE_RECHECKS = 8
"""A probe suspect is re-checked up to this many times, ``replica_recheck_after`` apart."""
_PARAMETERS = "parameters"
_PROBE_GRADIENTS = "gradients of the probe batch"
_Parsed = TypeVar("_Parsed")


class JobMonitor:
    def __init__(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        job: str | None = None,
        node: str | None = None,
        gpu: str | None = None,
        replica_group: Hashable = 0,
        window_steps: int = DEFAULT_WINDOW_STEPS,
        policy: StragglerPolicy | None = None,
        replica_interval: int = 50,
        replica_recheck_after: int = 10,
        replica_rtol: float = 0.0,
        compute_interval: int = DEFAULT_COMPUTE_INTERVAL,
        compute_rtol: float = 0.0,
        compute_rechecks: int = DEFAULT_COMPUTE_RECHECKS,
        verdict_dir: str | os.PathLike[str] | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        exchange: Exchange | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if window_steps < 1:
            raise ValueError(f"window_steps {window_steps} must be at least 1")
        self.identity = RankIdentity.resolve(
            rank=rank, world_size=world_size, job=job, node=node, gpu=gpu
        )
        self.verdict_dir = _verdict_dir(verdict_dir)
        self.window_steps = window_steps
        self.replica_group = replica_group
        self.ttl_s = ttl_s
        self._clock = clock
        self._timer = StepTimer(self.identity.rank)
        self._judge = StragglerJudge(self.identity.world_size, policy)
        self._replicas = ReplicaCheck(
            replica_interval, replica_recheck_after, replica_rtol, _PARAMETERS
        )
        self._probes = ReplicaCheck(
            compute_interval,
            replica_recheck_after,
            compute_rtol,
            _PROBE_GRADIENTS,
            rechecks=compute_rechecks,
        )
        self._exchange = exchange if exchange is not None else _background_exchange(self.identity)
        self._windows: deque[Future[list[object]]] = deque()  # gathers not yet judged, in order
        # Fingerprint rounds of both checks, in the order every rank submitted them.
        self._rounds: deque[tuple[ReplicaCheck, int, Future[list[object]]]] = deque()
        self._slowness: Slowness | None = None
        self._mismatches: dict[VerdictKind, tuple[int, str]] = {}  # kind -> first step, why
        self.verdict: Verdict | None = None
        """The verdict this rank holds now (written to ``verdict_dir`` when there is one)."""
        self._verdict_step = 0  # the step at which the held verdict was first written
        self.named: dict[int, Slowness] = {}
        """Every rank the judge names after the latest window (the same on all ranks)."""
        self.last_replica_round: ReplicaRound | None = None
        """The latest round judged, of either check (its ``subject`` says which)."""
        self.disabled: str | None = None
        """Why the monitor turned itself off, or None while it works."""

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        self.begin_step(step)
        try:
            yield
        finally:
            self.end_step()

    @contextmanager
    def communicating(self) -> Iterator[None]:
        self.mark_communication()
        yield

    def begin_step(self, step: int) -> None:
        self._timer.begin(step)

    def mark_communication(self) -> None:
        """The rank enters the step's first collective: compute ends here."""
        self._timer.communicating()

    def end_step(self) -> None:
        step = self._timer.end()
        if self.disabled:
            return
        if step is not None and (step + 1) % self.window_steps == 0:
            self._windows.append(self._submit(self._timer.take_window(step).to_wire()))
        self._judge_gathered_windows()

    def check_replicas(self, step: int, parameters: object) -> list[ReplicaRound]:
        """Call after every optimiser step with the rank's parameters (see
        `replicas.fingerprint`). When a round is due, fingerprints them (the loop waits
        for that pass) and hands the fingerprint to the exchange; returns the rounds
        judged during this call (their tables came back), usually none or one."""
        return self._check(step, self._replicas, lambda: parameters)

    def check_compute(self, step: int, probe: Callable[[], object]) -> list[ReplicaRound]:
        """Call after every optimiser step, on every rank, after `check_replicas`. When a
        round is due (every ``compute_interval`` steps), calls ``probe()`` and compares
        what it returns within the replica group as `check_replicas` compares parameters.

        ``probe`` computes this rank's gradients (or any outputs) of one fixed batch, the
        same on every rank, with the current parameters, and returns them without any
        collective (DDP's ``no_sync()``), without applying them, and with no randomness
        that differs by rank (dropout off, or one seed on all ranks). Identical replicas
        computing the same thing get the same bits, so a rank whose GPU computes wrong
        values in the forward or backward pass is outside the majority: the corruption
        replica agreement cannot see, because the all-reduce averages it into every
        replica alike. A rank outside the majority is re-checked every
        ``replica_recheck_after`` steps, up to ``compute_rechecks`` times, and named
        COMPUTE_MISMATCH when one of them finds it odd again: a GPU that computes wrong
        only now and then is named too, one odd round alone (a transient) is not."""
        return self._check(step, self._probes, probe)

    def _check(
        self, step: int, check: ReplicaCheck, values: Callable[[], object]
    ) -> list[ReplicaRound]:
        if self.disabled:
            return []
        # A round's re-check step depends on its result, so every rank judges it by then.
        judged = self._judge_gathered_rounds(wait_until=step)
        if self.disabled or not check.due(step):
            return judged
        mine = fingerprint(values(), rtol=check.rtol)
        item = [step, self.replica_group, list(mine)]
        self._rounds.append((check, step, self._submit(item)))
        return judged + self._judge_gathered_rounds(wait_until=-1)

    def _judge_gathered_rounds(self, wait_until: int) -> list[ReplicaRound]:
        judged = []
        while self._rounds and not self.disabled:
            check, round_step, future = self._rounds[0]
            due_by = min(c.recheck_step(s) for c, s, _ in self._rounds)
            if not future.done() and due_by > wait_until:
                break
            self._rounds.popleft()
            groups = self._result(future, _fingerprints)
            if groups is None:
                break
            judged.append(self._judge_round(check, round_step, groups))
        return judged

    def _judge_round(
        self, check: ReplicaCheck, step: int, groups: dict[int, tuple[object, Fingerprint]]
    ) -> ReplicaRound:
        result = check.judge(step, groups)
        self.last_replica_round = result
        if result.vote.inconclusive:
            log.warning(
                "%s check at step %d inconclusive for ranks %s: no strict majority",
                check.subject,
                step,
                list(result.vote.inconclusive),
            )
        named = result.named.get(self.identity.rank)
        if named is not None:
            kind = (
                VerdictKind.REPLICA_MISMATCH
                if check is self._replicas
                else VerdictKind.COMPUTE_MISMATCH
            )
            self._mismatches[kind] = (named.first_step, named.evidence)
            self._publish(step)
        return result

    def checkpoint_saved(self, step: int) -> None:
        """Every rank calls it once a checkpoint of ``step`` is complete: a held verdict
        records that the job can now be moved without losing work since the verdict."""
        held = self.verdict
        if held is None or step < self._verdict_step:
            return
        self._write(replace(held, checkpointed_at=self._clock.now(), written_at=self._clock.now()))

    def close(self) -> None:
        """Stop exchanging. A held verdict stays, to lapse after its ``ttl_s``."""
        self._exchange.close()

    def _submit(self, item: object) -> Future[list[object]]:
        if isinstance(self._exchange, BackgroundExchange):
            return self._exchange.submit(item)
        future: Future[list[object]] = Future()
        try:
            future.set_result(self._exchange.all_gather(item))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _judge_gathered_windows(self) -> None:
        """Judge, in order, every window whose table has come back (on all ranks the same
        tables in the same order; a rank may see one a step before another)."""
        while self._windows and self._windows[0].done() and not self.disabled:
            records = self._result(self._windows.popleft(), _window_records)
            if records is None:
                return
            self.named = self._judge.judge(records)
            self._slowness = self.named.get(self.identity.rank)
            self._publish(max(record.last_step for record in records))

    def _result(
        self, future: Future[list[object]], parse: Callable[[list[object]], _Parsed]
    ) -> _Parsed | None:
        """The gathered table as ``parse`` reads it; None when the exchange failed or a
        peer sent what ``parse`` cannot read, and the monitor is now off."""
        try:
            return parse(future.result())
        except (ExchangeError, OSError) as exc:
            self.disabled = f"exchange failed: {exc}"
            log.error("in-job monitor of rank %d off: %s", self.identity.rank, self.disabled)
            self._windows.clear()
            self._rounds.clear()
            self._exchange.close()
            return None

    def _publish(self, step: int) -> None:
        wanted = self._wanted(step)
        if wanted is None:
            if self.verdict is not None:
                log.warning(
                    "rank %d recovered at step %d: verdict withdrawn", self.identity.rank, step
                )
                self.verdict = None
                if self.verdict_dir is not None:
                    withdraw_verdict(self.verdict_dir, self.identity.job, self.identity.rank)
            return
        kind, ratio, steps, evidence = wanted
        now = self._clock.now()
        held = self.verdict
        if held is not None and held.kind is kind:
            self._write(replace(held, written_at=now, ratio=ratio, steps=steps, evidence=evidence))
            return
        me = self.identity
        log.warning(
            "rank %d (node %s, GPU %r) named %s: %s", me.rank, me.node, me.gpu, kind, evidence
        )
        self._verdict_step = step
        self._write(
            Verdict(
                kind=kind,
                job=me.job,
                rank=me.rank,
                world_size=me.world_size,
                node=me.node,
                gpu=me.gpu,
                since=now,
                written_at=now,
                ratio=ratio,
                steps=steps,
                evidence=evidence,
                ttl_s=self.ttl_s,
            )
        )

    def _wanted(self, step: int) -> tuple[VerdictKind, float, tuple[int, int], str] | None:
        for kind in (VerdictKind.REPLICA_MISMATCH, VerdictKind.COMPUTE_MISMATCH):
            if kind in self._mismatches:  # wrong results outrank slow ones
                first, evidence = self._mismatches[kind]
                return kind, 0.0, (first, step), evidence
        slow = self._slowness
        if slow is None:
            return None
        return slow.kind, slow.ratio, (slow.first_step, slow.last_step), slow.evidence

    def _write(self, verdict: Verdict) -> None:
        self.verdict = verdict
        if self.verdict_dir is None:
            return
        try:
            self.verdict_dir.mkdir(parents=True, exist_ok=True)
            write_verdict(self.verdict_dir, verdict)
        except OSError as exc:
            log.error("cannot write the verdict of rank %d: %s", verdict.rank, exc)


def _verdict_dir(given: str | os.PathLike[str] | None) -> Path | None:
    directory = given if given is not None else os.environ.get(IN_JOB_DIR_ENV)
    return Path(directory) if directory else None


def _background_exchange(identity: RankIdentity) -> BackgroundExchange:
    return BackgroundExchange(open_exchange(identity.rank, world_size=identity.world_size))


def _window_records(table: list[object]) -> list[WindowRecord]:
    return [WindowRecord.from_wire(_numbers(row, rank)) for rank, row in enumerate(table)]


def _fingerprints(table: list[object]) -> dict[int, tuple[object, Fingerprint]]:
    """Rank -> (replica group, fingerprint), from the ranks' ``[step, group, fingerprint]``."""
    groups: dict[int, tuple[object, Fingerprint]] = {}
    for rank, row in enumerate(table):
        if not isinstance(row, list) or len(row) != 3:
            raise ExchangeError(f"rank {rank} sent {row!r}, not a fingerprint round")
        groups[rank] = (row[1], tuple(_numbers(row[2], rank)))
    return groups


def _numbers(row: object, rank: int) -> list[float]:
    if isinstance(row, list):
        numbers = [float(value) for value in row if isinstance(value, Real)]
        if len(numbers) == len(row):
            return numbers
    raise ExchangeError(f"rank {rank} sent {row!r}, not a list of numbers")
