"""What the ``dcgmi`` parsers share: reading its JSON strictly, and naming DCGM entities.

``dcgmi`` names parts only by DCGM's own entity ids (``GPU 0``), never by PCI bus id, so a
DCGM component id reads ``dcgm-gpu-0``; mapping it to a bus id would need
``dcgmi discovery -l``, which gpuguard does not read.
"""

from __future__ import annotations

import json
import re

from gpuguard.errors import ParseError
from gpuguard.model import NODE, Component

JsonObject = dict[str, object]

# DCGM's "no value" sentinels (dcgm_structs.h): INT64 blank 0x7ffffffffffffff0 and its
# NOT_FOUND/NOT_SUPPORTED/NOT_PERMISSIONED neighbours (9223372036854775794 in the GB10
# capture), INT32 blank 0x7ffffff0.., FP64 blank 2^47... They mean "not measured".
_INT64_BLANK_FLOOR = 0x7FFFFFFFFFFFFFF0
_INT32_BLANKS = range(0x7FFFFFF0, 0x80000000)
_FP64_BLANK = 140737488355328.0

_ENTITY_KINDS = {"gpu": "gpu", "switch": "nvswitch", "nvswitch": "nvswitch", "connectx": "nic"}
_UNSAFE = re.compile(r"[^a-z0-9]+")


def load_dcgmi_json(text: str, command: str) -> JsonObject:
    """The one JSON object ``dcgmi ... -j`` printed; text before the first ``{`` is dropped.

    Some dcgmi versions print "Successfully ran diagnostic for group." first. Anything but
    whitespace after the object is refused: a second or cut-off document is not one we read.
    """
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{command}: no JSON document in the output ({_preview(text)})")
    try:
        document, end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, huge ints, deep nesting
        raise ParseError(f"{command}: not valid JSON: {_reason(exc)}") from None
    if text[end:].strip():
        raise ParseError(f"{command}: unexpected text after the JSON document")
    return expect_object(document, command)


def expect_object(value: object, where: str) -> JsonObject:
    if not isinstance(value, dict):
        raise ParseError(f"{where}: expected an object, got {_kind(value)}")
    return value


def expect_list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise ParseError(f"{where}: expected an array, got {_kind(value)}")
    return value


def expect_str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ParseError(f"{where}: expected a string, got {_kind(value)}")
    return value


def small_int(value: object) -> int | None:
    """An id or code as an int; ``None`` for sentinels, negatives, floats and booleans."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < _INT32_BLANKS.start else None


def int_text(text: str) -> int | None:
    """A small non-negative decimal such as ``"13"``; ``None`` for anything else."""
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) < 10:
        return small_int(int(text))
    return None


def is_blank(value: float) -> bool:
    """True when a number is one of DCGM's "not measured" sentinels (or not finite)."""
    if value != value or value in (float("inf"), float("-inf")):
        return True
    return (
        value >= _INT64_BLANK_FLOOR
        or _INT32_BLANKS.start <= value < _INT32_BLANKS.stop
        or _FP64_BLANK <= value <= _FP64_BLANK + 3
    )


def dcgm_entity(group: str, entity_id: int | str | None) -> Component:
    """The component for a DCGM entity (group name as dcgmi prints it, id in that group)."""
    if entity_id is None:
        return NODE
    slug = _UNSAFE.sub("-", group.lower()).strip("-")[:24] or "entity"
    ident = _UNSAFE.sub("-", str(entity_id).lower()).strip("-")[:24] or "unknown"
    kind = _ENTITY_KINDS.get(slug, "node")
    return Component(kind, f"dcgm-{slug}-{ident}")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]


def _preview(text: str) -> str:
    first = text.strip().splitlines()[0][:80] if text.strip() else ""
    return repr(first) if first else "empty"


# dcgmi exits with a negative DCGM status as an unsigned byte (226 is -30).
# -30 DCGM_ST_NVVS_ERROR: "the diagnostic ran and reported an error" (dcgm_structs.h).
_DCGM_STATUS_NAMES = {-30: "DCGM_ST_NVVS_ERROR"}


def describe_exit(code: int) -> str:
    """An exit status for messages, decoded when it is a DCGM status (226 -> -30)."""
    if 128 <= code <= 255:
        status = code - 256
        name = _DCGM_STATUS_NAMES.get(status)
        return f"{code} (DCGM status {status}{', ' + name if name else ''})"
    return str(code)
