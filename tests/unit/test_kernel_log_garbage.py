"""A kernel log that is no kernel log (random bytes, prose) fails closed, however it is
read: ``gpuguard check`` on a bundle, the whole-log check, and the agent following a file.
One with real lines among the garbage still reads them."""

from __future__ import annotations

import json
import random

import pytest

from gpuguard.cli import main
from gpuguard.errors import ParseError
from gpuguard.kernel_log.check import classify_log
from gpuguard.model import Layer, Status
from tests.support.cluster import wait_for
from tests.unit.test_agent_kernel import monitoring

XID79 = (
    "[ 8811.120034] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>,"
    " GPU has fallen off the bus."
)
PROSE = "\n".join(
    f"Line {n}: the quick brown fox jumps over the lazy dog; nothing here is a kernel record."
    for n in range(400)
)


def _random_bytes(size: int = 64 * 1024) -> bytes:
    return random.Random(7).randbytes(size)


@pytest.mark.parametrize(
    "log",
    [_random_bytes(), _random_bytes().decode("utf-8", errors="replace"), PROSE, "", "\n\n"],
    ids=["random bytes", "random bytes as text", "400 lines of prose", "empty", "blank lines"],
)
def test_no_kernel_record_is_a_parse_error_not_healthy(log):
    with pytest.raises(ParseError, match="no kernel log record"):
        classify_log(log)


@pytest.mark.parametrize(
    "healthy",
    [
        "[    5.121045] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  590.48.01",
        "[Fri Dec  4 05:46:09 2026] nvidia-nvlink: Nvlink Core is being initialized",
        "kern  :info  : [    5.102331] nvidia: loading out-of-tree module taints kernel.",
        "6,1234,5102331,-;nvidia: loading out-of-tree module taints kernel.",
        "2026-12-04T05:46:09,123456+00:00 nvidia: loading out-of-tree module taints kernel.",
        "Dec 04 05:46:09 gpu-node-7 kernel: nvidia: loading out-of-tree module taints kernel.",
    ],
    ids=["dmesg", "dmesg -T", "dmesg --decode", "/dev/kmsg", "dmesg iso", "journalctl -k"],
)
def test_every_collector_s_healthy_log_reads_healthy_even_among_garbage(healthy):
    assert classify_log(healthy) == []
    assert classify_log(PROSE + "\n" + healthy + "\n" + PROSE) == []


def test_a_real_line_among_garbage_is_read():
    garbage = _random_bytes().replace(b"\n", b" ")
    (finding,) = classify_log(garbage + b"\n" + XID79.encode() + b"\n" + garbage)
    assert finding.code == "XID_79"


def test_gpuguard_check_on_a_bundle_of_garbage_is_not_healthy(tmp_path, capsys):
    (tmp_path / "kmsg.log").write_bytes(_random_bytes())
    main(["check", "--json", "--bundle", str(tmp_path)])
    kernel = json.loads(capsys.readouterr().out)["layers"]["kernel"]
    assert kernel["status"] != "Healthy"
    (finding,) = kernel["findings"]
    assert finding["code"] == "OUTPUT_UNPARSEABLE"
    assert "kmsg.log" in finding["message"] and "no kernel log record" in finding["message"]


def test_the_agent_following_a_file_of_garbage_reports_it_until_a_record_comes(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(PROSE + "\n")
    with monitoring(log) as report:

        def kernel():
            now = report()
            if now is None:
                return None
            layer = now.layers[Layer.KERNEL]
            return layer.status, {f.code for f in layer.findings}

        wait_for(lambda: kernel() == (Status.UNHEALTHY, {"OUTPUT_UNPARSEABLE"}))
        with log.open("a") as handle:
            handle.write(XID79 + "\n")
        wait_for(lambda: kernel() is not None and kernel()[0] is Status.HEALTHY)
