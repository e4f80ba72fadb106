"""NVLink5 Xids (144-150): NVIDIA's decode of the unit and error status a line carries.

The driver prints these as ``Xid (PCI:...): 145, RLW_REMAP Nonfatal XC0 i0 Link 10
(0x00000004 0x00000040 ...)``: the unit, its Fatal/Nonfatal word, and a tuple whose first
word is the interrupt info and whose second is the error status. NVIDIA's "Xid 144-150
Decode" table (``data/nvlink5_decode.csv``) gives each (unit, interrupt-info pattern, error
status) a resolution: RESET_GPU, IGNORE, or XID_154_EVAL (the Xid 154 the driver prints
with it says what to do; without one, restart the application).

The status is a bit mask for Xids 144-148 (every set bit is one row of the table) and an
enumeration for 149 and 150 (the row whose status equals it). The interrupt-info pattern
changed at R575 and a line does not say its driver, so a row matches on either pattern; the
unit name narrows the rows first. A line that fits no row keeps only its word. Where the
decode and the printed word disagree, the graver of the two wins: a fault the driver calls
fatal never reads as nothing.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

XIDS = frozenset(range(144, 151))
# Xids whose error status is one value, not a mask of bits.
_ENUMERATED = frozenset({149, 150})

_LINE = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_/]*)\s+(?P<word>Fatal|Non-?fatal)\b"
    r"(?:.*?\((?P<info>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+))?",
    re.IGNORECASE,
)

# Resolutions from gravest to mildest; "ACTION2" is a row's second resolution (RESET_GPU
# under a condition the table gives no pattern for), so it is flagged, not acted on.
RESET_GPU = "RESET_GPU"
XID_154_EVAL = "XID_154_EVAL"
ACTION2 = "ACTION2"
IGNORE = "IGNORE"
_GRAVITY = (RESET_GPU, XID_154_EVAL, ACTION2, IGNORE)


@dataclass(frozen=True)
class DecodeRow:
    xid: int
    units: frozenset[str]
    patterns: tuple[str, str]  # interrupt info, before R575 and from R575 ('-': any bit)
    status: int
    resolution: str
    action2: str


@dataclass(frozen=True)
class Decoded:
    """What a line of Xid 144-150 says: its unit and word, and the table's resolution
    (None when the line carries no status or no row matches it)."""

    unit: str
    fatal: bool
    resolution: str | None
    status: int | None


@cache
def rows() -> tuple[DecodeRow, ...]:
    text = resources.files("gpuguard").joinpath("data/nvlink5_decode.csv").read_text()
    return tuple(
        DecodeRow(
            xid=int(row["Xid"]),
            units=frozenset(row["Unit"].split("/")),
            patterns=(row["IntrinfoPatternV1"], row["IntrinfoPatternV2"]),
            status=int(row["ErrorStatus"], 16),
            resolution=row["Resolution"],
            action2=row["Action2"],
        )
        for row in csv.DictReader(text.splitlines())
    )


def decode(xid: int, text: str) -> Decoded | None:
    """The decode of an Xid 144-150 line's text (after the code); None when the text does
    not have the driver's shape (no unit and Fatal/Nonfatal word)."""
    m = _LINE.search(text)
    if m is None:
        return None
    unit, fatal = m["unit"], m["word"].lower() == "fatal"
    if m["status"] is None:
        return Decoded(unit, fatal, None, None)
    info, status = int(m["info"], 16), int(m["status"], 16)
    units = frozenset(unit.split("/"))
    candidates = [r for r in _by_unit(xid, units) if _matches(info, r.patterns)]
    hits = [r for r in candidates if r.status == status]
    if not hits and xid not in _ENUMERATED:
        hits = [r for r in candidates if r.status and r.status & status == r.status]
    found = {r.resolution for r in hits} | {ACTION2 for r in hits if r.action2 == RESET_GPU}
    resolution = next((g for g in _GRAVITY if g in found), None)
    return Decoded(unit, fatal, resolution, status)


def _by_unit(xid: int, units: frozenset[str]) -> list[DecodeRow]:
    of_xid = [r for r in rows() if r.xid == xid]
    return [r for r in of_xid if r.units & units] or of_xid


def _matches(info: int, patterns: tuple[str, str]) -> bool:
    if info >> 32:
        return False  # the driver prints a 32-bit word: this line is not one of its shapes
    bits = f"{info:032b}"
    return any(
        len(p) == 32 and all(want in ("-", got) for want, got in zip(p, bits, strict=True))
        for p in patterns
    )
