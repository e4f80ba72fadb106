"""RFC 3339 times <-> float seconds since the epoch, without losing a bit.

The remediation policy counts time in float seconds (the simulator's clock may start at
zero); the cluster stores RFC 3339 strings. A fixed number of fractional digits would
either lose bits (microseconds: ``time.time()`` values drift between a save and a load)
or print noise, so the fraction is the float's shortest round-trip decimal (``repr``):
``12.5`` prints as ``...:12.5Z`` and any float comes back exactly. The API server accepts
any number of fractional digits in a ``date-time`` field.

What :func:`parse_time` reads is exactly what the NodeRemediation CRD lets in, so no time
the API server stores is one gpuguard cannot read: RFC 3339 with an upper-case ``T``, an
optional ``.`` fraction, and ``Z`` or a ``±hh:mm`` offset (:data:`TIME_PATTERN`, the CRD's
``pattern``), on a day that exists (the CRD's ``format: date-time``, which a pattern
cannot say: ``2026-02-30`` is refused by both). The API server's ``date-time`` alone also
takes ``,5Z``, `` 5Z``, lower-case letters and offsets such as ``+99:99``.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
from decimal import Decimal

# ASCII digits only (Python's \d takes any script's, RE2's does not); a year from 0001, as
# Python's datetime has it. The same text is the CRD's pattern (contract.wire.Time).
TIME_PATTERN = (
    r"^([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
    r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])(?:\.([0-9]+))?"
    r"(Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)
_TIME = re.compile(TIME_PATTERN)


def format_time(seconds: float) -> str:
    """An RFC 3339 UTC string that :func:`parse_time` turns back into exactly ``seconds``."""
    exact = Decimal(repr(float(seconds)))
    whole = int(exact // 1)
    fraction = format(exact - whole, "f")  # "0", "0.5", "0.000001"...
    digits = fraction.partition(".")[2].rstrip("0")
    return _utc(whole) + (f".{digits}" if digits else "") + "Z"


def format_whole_time(seconds: float) -> str:
    """A Kubernetes ``Time`` (whole seconds, the fraction dropped), as conditions carry."""
    return _utc(math.floor(seconds)) + "Z"


def format_micro_time(seconds: float) -> str:
    """A Kubernetes ``MicroTime`` (exactly six fractional digits, as the API requires)."""
    micros = int((Decimal(seconds) * 1_000_000).to_integral_value())
    whole, fraction = divmod(micros, 1_000_000)
    return f"{_utc(whole)}.{fraction:06d}Z"


def parse_time(text: str) -> float:
    """Seconds since the epoch from an RFC 3339 string (any number of fractional digits);
    ``ValueError`` for anything the CRD would refuse."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    if len(text) == 20:  # whole seconds in UTC, the API's Time (every condition): the C
        # parser is exact, and a controller parses four of these per Node event
        try:
            return datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise ValueError(f"not an RFC 3339 time: {text!r} (no such day)") from None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    # The pattern takes 2026-02-30; the CRD's date-time format (and so this) does not.
    if int(day) > calendar.monthrange(int(year), int(month))[1]:
        raise ValueError(f"not an RFC 3339 time: {text!r} (no such day)")
    whole = calendar.timegm(tuple(map(int, (year, month, day, hour, minute, second))))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        whole -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    if fraction is None:
        return float(whole)
    # Decimal keeps the written digits exactly; float() of it is correctly rounded.
    return float(whole + Decimal(f"0.{fraction}"))


def _utc(whole_seconds: int) -> str:
    moment = datetime.datetime.fromtimestamp(whole_seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")
