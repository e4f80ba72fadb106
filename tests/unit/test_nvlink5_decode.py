"""NVLink5 Xids 144-150 read with NVIDIA's decode table, row by row (issue 28, item 1).

The lines have the driver's shape (``<unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<info>
<status> ...)``); every row of NVIDIA's "Xid 144-150 Decode" sheet (tests/data copy, see
SOURCES.md) becomes a line whose interrupt info satisfies the row's pattern.
"""

from __future__ import annotations

import csv

import pytest

from gpuguard.kernel_log.check import classify_log
from gpuguard.model import Action, Severity
from tests.conftest import read_data

TABLE = list(csv.DictReader(read_data("nvidia_xid_144_150_nvlink5_decode.csv").splitlines()))


def line(xid: int, unit: str, word: str, info: int, status: int) -> str:
    return (
        f"NVRM: Xid (PCI:0008:01:00): {xid}, {unit} {word} XC1 i0 Link 10 "
        f"(0x{info:08x} 0x{status:08x} 0x00000000 0x00000000 0x00000000 0x00000000)"
    )


def info_for(pattern: str) -> int:
    return int(pattern.replace("-", "0"), 2)


def finding_of(text: str):
    (found,) = classify_log(text)
    return found


@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r['Xid']}-{r['Unit']}-{r['ErrorStatus']}")
@pytest.mark.parametrize("version", ["IntrinfoPatternV1", "IntrinfoPatternV2"])
def test_every_row_of_nvidias_table_gets_its_resolution_whatever_the_word(row, version):
    xid, status = int(row["Xid"]), int(row["ErrorStatus"], 16)
    text = line(xid, row["Unit"], "Nonfatal", info_for(row[version]), status)
    found = finding_of(text)
    if row["Resolution"] == "RESET_GPU":
        assert (found.action, found.severity) == (Action.RESET_GPU, Severity.CRITICAL), text
    elif row["Resolution"] == "XID_154_EVAL":
        assert found.action is Action.KILL_JOB, text
    else:
        assert found.action is Action.NONE, text
    # The word Fatal is never read as less than a reset.
    fatal = finding_of(line(xid, row["Unit"], "Fatal", info_for(row[version]), status))
    assert fatal.action is Action.RESET_GPU


def test_a_nonfatal_remap_line_whose_status_nvidia_resolves_to_a_reset_resets():
    # The driver printed Nonfatal; RLW_REMAP's status bit 0x40 is a Fatal RESET_GPU row.
    found = finding_of(line(145, "RLW_REMAP", "Nonfatal", 0x00000004, 0x00000040))
    assert found.action is Action.RESET_GPU
    assert "decode" in found.message


def test_a_status_with_several_bits_takes_its_gravest_row():
    assert finding_of(line(145, "RLW_REMAP", "Nonfatal", 0x4, 0x41)).action is Action.RESET_GPU
    assert finding_of(line(144, "SAW_MVB", "Nonfatal", 0x1, 0x05)).action is Action.NONE


def test_xid154_eval_ends_the_job_and_the_xid_154_that_follows_says_what_the_gpu_needs():
    log = "\n".join(
        [
            line(145, "RLW_REMAP", "Nonfatal", 0x4, 0x1),
            "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x4 (Drain and Reset)",
        ]
    )
    by_code = {f.code: f for f in classify_log(log)}
    assert by_code["XID_145"].action is Action.KILL_JOB
    assert by_code["XID_154"].action is Action.RESET_GPU
    assert by_code["XID_154"].deferred


def test_the_interrupt_info_picks_the_link_down_reason():
    # NETIR_LINK_EVT reason 0b101000 (the host's doing, NVIDIA: IGNORE) against 0b100001
    # (a peer device, RESET_GPU); the real capture's 0x021425c6 is the latter.
    ignored = int("00000010100000000000000111000110", 2)
    assert finding_of(line(149, "NETIR_LINK_EVT", "Nonfatal", ignored, 0)).action is Action.NONE
    real = finding_of(line(149, "NETIR_LINK_EVT", "Nonfatal", 0x021425C6, 0))
    assert real.action is Action.RESET_GPU


def test_a_unit_the_table_does_not_name_is_found_by_its_interrupt_info():
    found = finding_of(line(145, "RLW_NEWNAME", "Nonfatal", 0b0100000010, 0x2))  # TAGSTATE
    assert found.action is Action.RESET_GPU


def test_a_line_without_the_status_tuple_follows_its_word():
    fatal = "NVRM: Xid (PCI:0008:01:00): 146, TLW_CTRL Fatal XC0 i0 Link 02"
    nonfatal = "NVRM: Xid (PCI:0008:01:00): 146, TLW_CTRL Nonfatal XC0 i0 Link 02"
    assert finding_of(fatal).action is Action.RESET_GPU
    assert finding_of(nonfatal).action is Action.NONE


def test_a_word_wider_than_the_driver_prints_is_no_row_and_no_crash():
    found = finding_of(line(145, "RLW_REMAP", "Nonfatal", 0x1_0000_0004, 0x40))
    assert found.action is Action.NONE  # no row fits: the word decides
