"""Preemption handling, the heartbeat, and the exit codes a job reports to the launcher."""

from __future__ import annotations

import os
import signal

import pytest

from gpuguard.training import (
    EXIT_GPU_LOST,
    EXIT_PREEMPTED,
    EXIT_REASON_FILE_ENV,
    HEARTBEAT_FILE_ENV,
    Heartbeat,
    Preemption,
    exit_gpu_lost,
)
from gpuguard.training.heartbeat import read_heartbeat


def test_sigterm_is_noted_not_acted_on_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with Preemption() as preemption:
        assert not preemption.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a second signal changes nothing
        assert preemption.should_stop()
        assert preemption.received is signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_exit_says_preempted_and_records_it_for_the_launcher(tmp_path, monkeypatch):
    reason = tmp_path / "reason"
    monkeypatch.setenv(EXIT_REASON_FILE_ENV, str(reason))
    with Preemption() as preemption, pytest.raises(SystemExit) as exited:
        preemption.exit()
    assert exited.value.code == EXIT_PREEMPTED == 75
    assert reason.read_text() == "75\n"


def test_gpu_lost_exit(tmp_path, monkeypatch):
    monkeypatch.delenv(EXIT_REASON_FILE_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        exit_gpu_lost()
    assert exited.value.code == EXIT_GPU_LOST == 69


def test_heartbeat_overwrites_the_step_in_place(tmp_path, monkeypatch):
    path = tmp_path / "heartbeat"
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(path))
    heartbeat = Heartbeat(min_interval_s=0)
    assert read_heartbeat(path) is None  # created, not yet written
    heartbeat.beat(999)
    heartbeat.beat(1000)
    heartbeat.beat(7)
    assert read_heartbeat(path) == 7
    assert path.stat().st_size == 21
    heartbeat.close()


def test_heartbeat_writes_at_most_every_min_interval(tmp_path):
    path = tmp_path / "heartbeat"
    heartbeat = Heartbeat(path, min_interval_s=3600)
    heartbeat.beat(1)
    heartbeat.beat(2)
    assert read_heartbeat(path) == 1


def test_heartbeat_without_a_file_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(HEARTBEAT_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    Heartbeat().beat(5)
    assert list(tmp_path.iterdir()) == []


def test_read_heartbeat_of_missing_or_garbled_files(tmp_path):
    assert read_heartbeat(tmp_path / "missing") is None
    (tmp_path / "garbled").write_bytes(b"\x00\x01")
    assert read_heartbeat(tmp_path / "garbled") is None
