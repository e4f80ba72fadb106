"""The agent's kernel-log side: following a file, expiring job faults, remembering faults."""

from __future__ import annotations

import contextlib
import threading
import time
import tracemalloc

import pytest

from gpuguard.agent.metrics import AgentMetrics
from gpuguard.agent.node_state import NodeState
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.contract.memory import encode_memory
from gpuguard.kernel_log import followers, inotify
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.kernel_log.lines import MAX_LINE_BYTES
from gpuguard.kernel_log.monitor import KernelLogMonitor
from gpuguard.kernel_log.state import (
    REMEMBERED_SOURCE,
    KernelState,
    lasting,
    recall,
)
from gpuguard.model import Layer, Status
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for

XID79 = (
    "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)
XID48 = "NVRM: Xid (PCI:0000:91:00): 48, pid=42, name=python, DBE (0x1) has been detected"
XID13 = "NVRM: Xid (PCI:0000:38:00): 13, pid=42, name=python, Graphics Exception"


class Calls:
    """A follower's sink that keeps each delivery as (lines, reset)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def lines(self, block: bytes, reset: bool) -> None:
        self.calls.append((block.decode().splitlines(), reset))

    def unreadable(self, detail: str) -> None:
        self.calls.append((detail, None))


def follow_in_background(path, calls):
    stop = threading.Event()
    follower = FileFollower(path, poll_s=0.01)
    thread = threading.Thread(target=follower.follow, args=(Calls(calls), stop), daemon=True)
    thread.start()
    return stop, thread


def test_file_follower_reads_the_log_then_each_complete_new_line(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    calls: list = []
    stop, thread = follow_in_background(log, calls)
    try:
        wait_for(lambda: calls)
        assert calls[0] == (["boot line"], True)
        with log.open("a") as handle:
            handle.write("half a li")
            handle.flush()
            # Nothing shows when a poll has seen the half line: five polls' time to see it.
            time.sleep(0.05)
            handle.write("ne\n")
        wait_for(lambda: any(lines == ["half a line"] for lines, _ in calls))
        # A replaced file (new inode: a new boot, a rotation) is read again from the start.
        fresh = tmp_path / "new.log"
        fresh.write_text("after reboot\n")
        fresh.replace(log)
        wait_for(lambda: (["after reboot"], True) in calls)
    finally:
        stop.set()
        thread.join(2)
        assert not thread.is_alive(), "the follower did not stop"


@pytest.fixture(params=[True, False], ids=["inotify", "polling"])
def notify(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_with_inotify_a_new_line_arrives_with_no_poll(tmp_path, monkeypatch):
    # Polls and the backstop an hour apart: only the directory's event can deliver it.
    monkeypatch.setattr(followers, "BACKSTOP_S", 3600.0)
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    with following(log, notify=True, poll_s=3600.0) as sink:
        with log.open("a") as handle:
            handle.write(XID79 + "\n")
        wait_for(lambda: any(b": 79," in line for line in sink.delivered()), 10)
        log.rename(tmp_path / "kern.log.1")  # rotated: the new file is read from its start
        log.write_text(XID48 + "\n")
        wait_for(lambda: sink.since_reset() == XID48.encode() + b"\n", 10)


def test_truncated_file_is_a_reset(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("one\ntwo\nthree\n")
    calls: list = []
    stop, thread = follow_in_background(log, calls)
    try:
        wait_for(lambda: calls)
        with log.open("w") as handle:
            handle.write("x\n")

        def reset_then_x() -> bool:
            # The poll may land between the truncation and the write: a reset, then "x".
            resets = [i for i, (_, reset) in enumerate(calls) if reset and i > 0]
            return bool(resets) and any("x" in lines for lines, _ in calls[resets[0] :])

        wait_for(reset_then_x)
    finally:
        stop.set()
        thread.join(2)


def test_application_faults_expire_hardware_faults_do_not():
    clock = FakeClock(1000.0)
    boot = ["boot-1"]
    state = KernelState(600, lambda: boot[0], clock)
    state.add_lines([XID13, XID79], reset=True)
    assert sorted(f.code for f in state.findings()) == ["XID_13", "XID_79"]
    clock.step(601)
    assert [f.code for f in state.findings()] == ["XID_79"]
    state.add_lines([], reset=True)  # a rotated log, same boot: the dead GPU is still dead
    assert [f.code for f in state.findings()] == ["XID_79"]
    boot[0] = "boot-2"
    state.add_lines([], reset=True)  # a new boot: the old boot's faults are gone
    assert state.findings() == []


def test_remembered_findings_count_only_for_their_boot():
    boot = ["boot-1"]
    state = KernelState(600, lambda: boot[0])
    state.add_lines([XID79], reset=True)
    stored = encode_memory("boot-1", lasting(state.findings()))

    restarted = KernelState(600, lambda: boot[0])
    restarted.add_lines(["nothing to see"], reset=True)  # the line left the ring buffer
    restarted.remember(*recall(stored, "gpu-1"))
    (finding,) = restarted.findings()
    assert (finding.code, finding.component.id) == ("XID_79", "0000:91:00.0")
    assert finding.source == REMEMBERED_SOURCE
    assert lasting([finding]) == [finding]  # kept across the next restart too
    boot[0] = "boot-2"
    assert restarted.findings() == []


def test_unreadable_memory_is_ignored():
    assert recall("not json", "gpu-1") == ("", [])
    assert recall('{"bootId": "b", "findings": [{"code": 1}]}', "gpu-1") == ("", [])


def test_a_reset_forgets_a_message_whose_gpu_was_named_on_the_line_before():
    state = KernelState(600, lambda: "boot-1")
    state.add_lines(
        [
            "NVRM: The NVIDIA GPU 0000:3b:00.0",
            "NVRM: (PCI ID: 10de:2330) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
            "NVRM: Xid (PCI:0000:5d:00): 48, pid=1, name=python, DBE",
        ],
        False,
    )
    assert {f.component.id for f in state.findings()} == {"0000:3b:00.0", "0000:5d:00.0"}
    state.forget_gpus(["0000:3b:00.0"])
    # The whole message goes, not only its first line (which would leave it about the node).
    assert [(f.code, f.component.id) for f in state.findings()] == [("XID_48", "0000:5d:00.0")]


# --- bounded memory (chaos_findings F8) and a vanished log (F13) ------------------------
class Sink:
    """What a follower delivered: blocks of complete lines, and whether it said the log
    cannot be read."""

    def __init__(self) -> None:
        self.blocks: list[tuple[bytes, bool]] = []
        self.troubles: list[str] = []

    def lines(self, block: bytes, reset: bool) -> None:
        self.blocks.append((block, reset))

    def unreadable(self, detail: str) -> None:
        self.troubles.append(detail)

    def since_reset(self) -> bytes:
        """What was delivered since the last read from the start (a new file's first read
        may find it still empty: its lines then follow)."""
        last = max(i for i, (_, reset) in enumerate(self.blocks) if reset)
        return b"".join(block for block, _ in self.blocks[last:])

    def delivered(self) -> list[bytes]:
        return [line for block, _ in self.blocks for line in block.split(b"\n") if line]


@contextlib.contextmanager
def following(path, notify, poll_s=0.01):
    """A FileFollower of ``path`` on its thread (woken by inotify, or polling), feeding
    the Sink yielded once it has delivered the log's first read; stopped on the way out."""
    with followed(FileFollower(path, poll_s=poll_s, notify=notify)) as sink:
        yield sink


def test_with_inotify_a_line_written_to_a_symlinked_log_arrives_with_no_poll(tmp_path, monkeypatch):
    # The followed path is a link into another directory: the target's is watched too.
    monkeypatch.setattr(followers, "BACKSTOP_S", 3600.0)
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "kern.log"
    target.write_text("boot line\n")
    log = tmp_path / "links" / "kern.log"
    log.symlink_to(target)
    with following(log, notify=True, poll_s=3600.0) as sink:
        with target.open("a") as handle:
            handle.write(XID79 + "\n")
        wait_for(lambda: any(b": 79," in line for line in sink.delivered()), 10)


class CountingFollower(FileFollower):
    """A FileFollower that counts its looks at the file."""

    looks = 0

    def poll(self, sink, stop=None) -> bool:
        self.looks += 1
        return super().poll(sink, stop)


@contextlib.contextmanager
def followed(follower):
    """``follower`` on its thread, feeding the Sink yielded once it delivered its first read."""
    sink, stop = Sink(), threading.Event()
    thread = threading.Thread(target=follower.follow, args=(sink, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: sink.blocks)
        yield sink
    finally:
        stop.set()
        thread.join(2)


def test_with_inotify_a_quiet_log_is_looked_at_rarely(tmp_path):
    # The backstop look is a wake-up a second of the idle agent; inotify tells of writes.
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    follower = CountingFollower(log, poll_s=3600.0)
    with followed(follower) as sink:
        time.sleep(2.5)
        assert follower.looks == 1
        with log.open("a") as handle:
            handle.write(XID79 + "\n")
        wait_for(lambda: any(b": 79," in line for line in sink.delivered()), 10)
    assert not follower.untold


def test_a_change_inotify_did_not_tell_of_makes_the_follower_poll(tmp_path, monkeypatch):
    # A file system whose writes inotify does not report (a network one): the watch here
    # hears of nothing but the directory itself going.
    monkeypatch.setattr(inotify, "MASK", inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF)
    monkeypatch.setattr(followers, "BACKSTOP_S", 0.3)
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    follower = FileFollower(log, poll_s=0.01)
    with followed(follower) as sink:
        with log.open("a") as handle:
            handle.write(XID79 + "\n")
        wait_for(lambda: any(b": 79," in line for line in sink.delivered()), 10)
        assert follower.untold  # the backstop found it: from now on the file is polled
        monkeypatch.setattr(followers, "BACKSTOP_S", 3600.0)
        time.sleep(0.5)  # past any backstop wait begun before
        with log.open("a") as handle:
            handle.write(XID48 + "\n")
        wait_for(lambda: any(b": 48," in line for line in sink.delivered()), 5)


def test_an_overlong_line_keeps_its_head_and_its_tail_and_nothing_longer(tmp_path, notify):
    log = tmp_path / "kern.log"
    log.write_text("")
    with following(log, notify) as sink:
        with log.open("ab") as handle:
            handle.write(XID48.encode() + b" trailing junk" * 100_000 + b"\n")
            for _ in range(30):  # an unterminated line growing over many polls
                handle.write(b"x" * 100_000)
                handle.flush()
            handle.write(XID79.encode() + b"\n")
        wait_for(lambda: any(b"Xid" in line and b": 79," in line for line in sink.delivered()))
        lines = sink.delivered()
        assert all(len(line) <= MAX_LINE_BYTES for line in lines)
        assert lines[0].startswith(XID48.encode())  # the head of the first long line
        assert lines[-1].endswith(XID79.encode())  # the tail of the second


def test_a_flood_of_lines_is_kept_as_counted_incidents_in_bounded_memory():
    state = KernelState(600, lambda: "boot-1")
    block = [XID13.replace("pid=42", f"pid={i % 7}") for i in range(10_000)]
    state.add_lines(block, reset=True)
    tracemalloc.start()
    try:
        for _ in range(20):
            state.add_lines(block, reset=False)
        state.add_lines([XID79], reset=False)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 256 * 1024, f"{kept} bytes kept for 210,001 lines"
    by_code = {f.code: f for f in state.findings()}
    assert set(by_code) == {"XID_13", "XID_79"}
    assert "210000 line(s) on 1 GPU(s)" in by_code["XID_13"].message


def test_a_job_fault_expires_a_time_to_live_after_its_last_line():
    clock = FakeClock(1000.0)
    state = KernelState(600, lambda: "boot-1", clock)
    state.add_lines([XID13], reset=True)
    clock.step(500)
    state.add_lines([XID13], reset=False)  # the job is still crashing
    clock.step(500)
    assert [f.code for f in state.findings()] == ["XID_13"]
    clock.step(101)
    assert state.findings() == []


def test_a_vanished_log_is_said_after_a_grace_and_read_again_when_it_is_back(tmp_path, notify):
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    with following(log, notify) as sink:
        log.unlink()
        wait_for(lambda: sink.troubles, what="the follower saying the log is gone")
        assert str(log) in sink.troubles[0] and "no such file" in sink.troubles[0]
        log.write_text("after rotation\n")
        wait_for(lambda: sink.since_reset() == b"after rotation\n")
        log.unlink()
        log.mkdir()
        wait_for(lambda: len(sink.troubles) == 2)
        assert "not a regular file" in sink.troubles[1]


def test_a_rotation_does_not_flap_the_kernel_layer(tmp_path, notify):
    log = tmp_path / "kern.log"
    log.write_text("boot line\n")
    with following(log, notify) as sink:
        for n in range(20):  # logrotate's create: renamed away, a new file in its place
            log.rename(tmp_path / f"kern.log.{n}")
            log.write_text(f"rotated {n}\n")
        wait_for(lambda: sink.since_reset() == b"rotated 19\n")
        assert sink.troubles == []


def test_an_unreadable_log_keeps_the_hardware_faults_already_seen(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(XID13 + "\n" + XID79 + "\n")
    with monitoring(log) as report:

        def kernel_and_codes():
            now = report()
            if now is None:
                return None
            codes = {f.code for h in now.layers.values() for f in h.findings}
            return now.layers[Layer.KERNEL].status, codes

        wait_for(lambda: kernel_and_codes() == (Status.HEALTHY, {"XID_13", "XID_79"}))
        log.unlink()
        # The log is gone: the kernel layer is not healthy, and the GPU that fell off the
        # bus is still reported (and still remembered on the Node).
        wait_for(lambda: kernel_and_codes() == (Status.UNHEALTHY, {"CHECK_FAILED", "XID_79"}))
        log.write_text("back\n")
        wait_for(lambda: kernel_and_codes() == (Status.HEALTHY, {"XID_13", "XID_79"}))


@contextlib.contextmanager
def monitoring(log):
    """A KernelLogMonitor following ``log`` on its own thread, as the agent runs it; yields
    a function that gives the node's report now (None before the first)."""
    state = NodeState([])
    monitor = KernelLogMonitor(
        FileFollower(log, poll_s=0.01),
        600,
        lambda: "boot-1",
        state,
        AgentMetrics().count_xids,
        SYSTEM_CLOCK,
    )
    stop = threading.Event()
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield lambda: state.report(monitor.findings, fail_closed=True)
    finally:
        stop.set()
        thread.join(2)


class _Sink:
    """A follower's sink that keeps every line delivered and counts the resets."""

    def __init__(self) -> None:
        self.lines_seen: list[bytes] = []
        self.resets = 0

    def lines(self, block: bytes, reset: bool) -> None:
        self.lines_seen.extend(block.splitlines())
        self.resets += reset

    def unreadable(self, detail: str) -> None:
        raise AssertionError(detail)


def _stamped(n: int, text: str) -> bytes:
    return f"[{n:>7}.000000] {text}\n".encode()


def test_copytruncate_refilled_past_the_old_position_loses_no_xid(tmp_path):
    # logrotate's copytruncate: the file is copied away and cut to nothing in place (same
    # inode), and the kernel's next lines land at its start. When more than was read
    # before arrives between two polls, size and inode look as if the file had grown:
    # the new head, with its Xid, must be read all the same. Every offset of the Xid in a
    # 1,000-line refill, after a short and a long old file.
    log = tmp_path / "kern.log"
    refill = [_stamped(10_000 + n, f"usb 1-{n}: new device") for n in range(1000)]
    xid = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"
    for old_lines in (1, 300):
        old = b"".join(_stamped(n, "boot chatter") for n in range(old_lines))
        for at in range(1000):
            log.write_bytes(old)
            follower, sink = FileFollower(log), _Sink()
            follower.poll(sink)
            lines = list(refill)
            lines[at] = _stamped(10_000 + at, xid)
            with log.open("r+b") as handle:  # truncated and refilled between two polls
                handle.truncate(0)
                handle.write(b"".join(lines))
            follower.poll(sink)
            assert any(b"Xid" in line for line in sink.lines_seen), (old_lines, at)
            assert sink.resets == 2
