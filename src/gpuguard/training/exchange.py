"""All-gather of one small record per rank: the only collective the in-job monitor needs.

Every rank passes its item (JSON-able: numbers, strings, lists) and gets back the list of
all ranks' items, indexed by rank; every rank calls it at the same points of the job. The
exchange does not look into the items (typed `object`): the caller checks what it gets.

- `TorchExchange`: ``torch.distributed.all_gather_object`` on a gloo group of its own,
  when the job has initialised ``torch.distributed`` (any backend, any number of nodes).
- `LoopbackExchange`: a standard-library exchange for single-node jobs without torch
  (NumPy jobs, tests): rank 0 listens on 127.0.0.1:``$GPUGUARD_EXCHANGE_PORT``, every
  rank sends its item over one TCP connection, rank 0 answers each with the whole table.
  It binds the loopback address only, and speaks JSON, never pickle.
- `BackgroundExchange`: either of them on a worker thread (what `JobMonitor` uses).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from concurrent.futures import Future
from typing import Protocol, TypeGuard

from gpuguard.clock import SYSTEM_CLOCK

EXCHANGE_PORT_ENV = "GPUGUARD_EXCHANGE_PORT"
"""The loopback port rank 0 listens on when ``torch.distributed`` is not initialised."""
_LOOPBACK = "127.0.0.1"
_HEADER = struct.Struct("!I")
_MAX_FRAME = 64 << 20


class ExchangeError(RuntimeError):
    """The ranks could not exchange their records (a peer gone, a timeout)."""


class Exchange(Protocol):
    def all_gather(self, item: object) -> list[object]: ...

    def close(self) -> None: ...


class SoloExchange:
    """A job of one rank has no one to exchange with."""

    def all_gather(self, item: object) -> list[object]:
        return [item]

    def close(self) -> None:
        pass


class TorchExchange:
    """``group`` defaults to a new gloo group of all ranks (creating it is a collective:
    every rank constructs the exchange at the same point): the monitor's gathers then run
    on the CPU, apart from the job's own NCCL collectives, and may run on another thread.
    A ``group`` given is only handed back to ``torch.distributed``: opaque here."""

    def __init__(self, group: object = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = group if group is not None else dist.new_group(backend="gloo")
        self._size = dist.get_world_size(self._group)

    def all_gather(self, item: object) -> list[object]:
        gathered: list[object] = [None] * self._size
        self._dist.all_gather_object(gathered, item, group=self._group)
        return gathered

    def close(self) -> None:
        pass


class BackgroundExchange:
    """Runs another exchange's all-gathers on one worker thread, in the order they were
    submitted, so the training loop does not wait in them: the gather's time is mostly
    waiting for the slowest rank to arrive, which the job's own next collective absorbs
    anyway. Every rank submits in the same order, so the rounds still match. Items must
    not be changed once submitted."""

    def __init__(self, inner: Exchange, *, close_timeout_s: float = 10.0) -> None:
        self._inner = inner
        self._close_timeout_s = close_timeout_s
        self._queue: queue.SimpleQueue[tuple[object, Future[list[object]]] | None] = (
            queue.SimpleQueue()
        )
        # A daemon: a peer that never answers must not keep the interpreter from exiting.
        self._worker = threading.Thread(target=self._run, name="gpuguard-exchange", daemon=True)
        self._worker.start()

    def submit(self, item: object) -> Future[list[object]]:
        future: Future[list[object]] = Future()
        self._queue.put((item, future))
        return future

    def all_gather(self, item: object) -> list[object]:
        return self.submit(item).result()

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            item, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._inner.all_gather(item))
            except BaseException as exc:  # handed to whoever waits on the round
                future.set_exception(exc)

    def close(self) -> None:
        """Finish the rounds already submitted (for at most ``close_timeout_s``), so that
        the other ranks' last round is answered, then close."""
        self._queue.put(None)
        self._worker.join(self._close_timeout_s)
        self._inner.close()  # wakes a worker still blocked on a peer
        self._worker.join(self._close_timeout_s)


class LoopbackExchange:
    """Rank 0 serves; the others connect (retrying until ``timeout_s``, since rank 0 may
    start last). Each `all_gather` waits at most ``timeout_s`` for the slowest rank."""

    def __init__(self, rank: int, world_size: int, port: int, *, timeout_s: float = 120.0):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._round = 0
        self._peers: dict[int, socket.socket] = {}
        self._server: socket.socket | None = None
        self._upstream: socket.socket | None = None
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                server.bind((_LOOPBACK, port))
            except OSError as exc:
                server.close()
                raise ExchangeError(f"rank 0 cannot listen on {_LOOPBACK}:{port}: {exc}") from exc
            server.listen(world_size)
            self._server = server
        else:
            self._upstream = _connect(port, timeout_s)
            _send(self._upstream, rank)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.getsockname()[1])

    def all_gather(self, item: object) -> list[object]:
        self._round += 1
        try:
            if self._upstream is not None:
                _send(self._upstream, [self._round, item])
                answer = _receive(self._upstream, self.timeout_s)
                if not _is_round(answer, self._round) or not isinstance(answer[1], list):
                    raise ExchangeError(f"rank {self.rank}: out-of-order answer from rank 0")
                return list(answer[1])
            return self._serve(item)
        except OSError as exc:
            raise ExchangeError(f"rank {self.rank}, round {self._round}: {exc}") from exc

    def _serve(self, item: object) -> list[object]:
        self._accept_peers()
        table: list[object] = [item] + [None] * (self.world_size - 1)
        for rank, peer in self._peers.items():
            message = _receive(peer, self.timeout_s)
            if not _is_round(message, self._round):
                raise ExchangeError(f"rank {rank} is out of step in round {self._round}")
            table[rank] = message[1]
        frame = _frame([self._round, table])  # encoded once for all peers
        for peer in self._peers.values():
            peer.sendall(frame)
        return table

    def _accept_peers(self) -> None:
        assert self._server is not None
        deadline = SYSTEM_CLOCK.monotonic() + self.timeout_s
        while len(self._peers) < self.world_size - 1:
            self._server.settimeout(max(0.001, deadline - SYSTEM_CLOCK.monotonic()))
            try:
                peer, _ = self._server.accept()
            except TimeoutError:
                missing = sorted(set(range(1, self.world_size)) - set(self._peers))
                raise ExchangeError(f"ranks {missing} did not connect in time") from None
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rank = _receive(peer, self.timeout_s)
            if not isinstance(rank, int) or not 0 < rank < self.world_size or rank in self._peers:
                peer.close()
                raise ExchangeError(f"a peer introduced itself as rank {rank!r}")
            self._peers[rank] = peer

    def close(self) -> None:
        for sock in [*self._peers.values(), self._upstream, self._server]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
                sock.close()
        self._peers.clear()
        self._upstream = self._server = None


def open_exchange(rank: int, world_size: int, *, port: int | None = None) -> Exchange:
    """The exchange this job can use: solo, torch.distributed, or loopback (``port``, else
    ``$GPUGUARD_EXCHANGE_PORT``). Wrap it in `BackgroundExchange` to gather off the loop."""
    if world_size == 1:
        return SoloExchange()
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        return TorchExchange()
    if port is None:
        configured = os.environ.get(EXCHANGE_PORT_ENV)
        if not configured:
            raise ExchangeError(
                f"rank {rank} of {world_size}: no exchange: initialise torch.distributed "
                f"or set {EXCHANGE_PORT_ENV} (a free port on 127.0.0.1, the same on every rank)"
            )
        port = int(configured)
    return LoopbackExchange(rank, world_size, port)


def _connect(port: int, timeout_s: float) -> socket.socket:
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            sock = socket.create_connection((_LOOPBACK, port), timeout=timeout_s)
        except OSError as exc:
            if SYSTEM_CLOCK.monotonic() + delay > deadline:
                raise ExchangeError(f"cannot reach rank 0 on {_LOOPBACK}:{port}: {exc}") from exc
            time.sleep(delay)  # rank 0 is not listening yet
            delay = min(delay * 2, 0.5)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def _is_round(message: object, number: int) -> TypeGuard[list[object]]:
    """Whether ``message`` is ``[number, payload]``: one rank's item of that round."""
    return isinstance(message, list) and len(message) == 2 and message[0] == number


def _send(sock: socket.socket, message: object) -> None:
    sock.sendall(_frame(message))


def _frame(message: object) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def _receive(sock: socket.socket, timeout_s: float) -> object:
    sock.settimeout(timeout_s)
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    if size > _MAX_FRAME:
        raise ExchangeError(f"a frame of {size} bytes is over the {_MAX_FRAME} limit")
    try:
        return json.loads(_read_exactly(sock, size))
    except ValueError as exc:
        raise ExchangeError(f"a frame that is not JSON: {exc}") from None


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ExchangeError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
