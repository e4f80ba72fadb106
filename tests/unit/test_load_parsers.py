"""perftest and fi_pingpong parsers on real captured outputs (tests/data/SOURCES.md), and
the loopback verdicts built on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuguard.checks.load.nic_loopback import judge_loopback
from gpuguard.checks.load.perftest import Bandwidth, parse_fi_pingpong, parse_perftest_bw
from gpuguard.errors import ParseError
from gpuguard.model import Action, Severity

DATA = Path(__file__).parent.parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_ib_write_bw_in_gbits():
    rows = parse_perftest_bw(read("perftest_ib_write_bw_postlist_gbits_roce.txt"))
    assert rows == [Bandwidth(8, 0.48)]


def test_perftest_in_megabytes_is_converted_to_gbits():
    rows = parse_perftest_bw(read("perftest_ib_atomic_bw_mbsec_localhost_pib.txt"))
    assert rows == [Bandwidth(8, pytest.approx(1.67 * 8 / 1000))]


def test_fi_pingpong_sizes_and_rates():
    rows = parse_fi_pingpong(read("fabtests_fi_pingpong_efa_rdm_server.txt"))
    assert [r.size_bytes for r in rows] == [64, 256, 1024, 4096, 65536, 1 << 20]
    assert rows[-1].gbps == pytest.approx(2185.67 * 8 / 1000)


@pytest.mark.parametrize(
    ("name", "parse"),
    [
        ("perftest_ib_write_bw_postlist_gbits_roce.txt", parse_perftest_bw),
        ("perftest_ib_atomic_bw_mbsec_localhost_pib.txt", parse_perftest_bw),
        ("fabtests_fi_pingpong_efa_rdm_server.txt", parse_fi_pingpong),
    ],
)
def test_truncated_or_garbled_output_is_a_parse_error(name, parse):
    text = read(name)
    lines = text.splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if "bytes" in line and "#" in line)
    cut_in_row = "".join(lines[: header + 1]) + lines[header + 1][:12]
    with pytest.raises(ParseError):
        parse(cut_in_row)
    with pytest.raises(ParseError):
        parse("".join(lines[:header]))  # no table at all
    with pytest.raises(ParseError):
        parse(text.replace(".", ",", 3).replace("0", "O"))
    with pytest.raises(ParseError):
        parse("")


def test_perftest_table_without_its_closing_line_is_truncated():
    text = read("perftest_ib_write_bw_postlist_gbits_roce.txt")
    without_end = text[: text.rstrip().rfind("\n")]
    with pytest.raises(ParseError, match="truncated"):
        parse_perftest_bw(without_end)


def test_loopback_below_expected_rate_is_slow_and_asks_for_renegotiation():
    findings = judge_loopback({"mlx5_0/1": 390.0, "mlx5_1/1": 180.0}, 400.0, 0.8)
    slow = [f for f in findings if f.severity is Severity.WARNING]
    assert [f.component.id for f in slow] == ["mlx5_1/1"]
    assert slow[0].action is Action.REBOOT
    assert "expected 400 Gb/s" in slow[0].message


def test_loopback_without_expected_rate_is_judged_against_siblings():
    findings = judge_loopback({"mlx5_0/1": 390.0, "mlx5_1/1": 385.0, "mlx5_2/1": 100.0}, None, 0.8)
    slow = [f for f in findings if f.severity is Severity.WARNING]
    assert [f.component.id for f in slow] == ["mlx5_2/1"]
    measured = [f for f in findings if f.code == "DEEP_NIC_LOOPBACK_MEASURED"]
    assert len(measured) == 2
