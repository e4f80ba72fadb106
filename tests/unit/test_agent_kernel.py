"""The agent's kernel-log side: following a file, expiring job faults, remembering faults."""

from __future__ import annotations

import threading
import time

from gpuguard.agent.kernel_log.followers import FileFollower
from gpuguard.agent.kernel_log.state import (
    REMEMBERED_SOURCE,
    KernelState,
    lasting,
    recall,
)
from gpuguard.contract.memory import encode_memory
from tests.support.clock import FakeClock
from tests.support.cluster import wait_for

XID79 = (
    "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)
XID13 = "NVRM: Xid (PCI:0000:38:00): 13, pid=42, name=python, Graphics Exception"


def follow_in_background(path, calls):
    stop = threading.Event()
    follower = FileFollower(path, poll_s=0.01)
    thread = threading.Thread(
        target=follower.follow,
        args=(lambda lines, reset: calls.append((lines, reset)), stop),
        daemon=True,
    )
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
    state = KernelState(600, lambda: boot[0], clock.monotonic)
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
