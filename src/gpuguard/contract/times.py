"""RFC 3339 times <-> float seconds since the epoch, without losing a bit.

The remediation policy counts time in float seconds (the simulator's clock may start at
zero); the cluster stores RFC 3339 strings. A fixed number of fractional digits would
either lose bits (microseconds: ``time.time()`` values drift between a save and a load)
or print noise, so the fraction is the float's shortest round-trip decimal (``repr``):
``12.5`` prints as ``...:12.5Z`` and any float comes back exactly. The API server accepts
any number of fractional digits in a ``date-time`` field.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
from decimal import Decimal

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:\d{2})$"
)


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
    """Seconds since the epoch from an RFC 3339 string (any number of fractional digits)."""
    if len(text) == 20 and text[10] == "T" and text[19] == "Z":
        # Whole seconds, the API's Time (every condition): the C parser is exact here,
        # and a controller parses four of these per Node event.
        try:
            return datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:
            pass  # the full grammar below says what is wrong
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    whole = calendar.timegm(
        (int(year), int(month), int(day), int(hour), int(minute), int(second), 0, 0, 0)
    )
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        whole -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    # Decimal keeps the written digits exactly; float() of it is correctly rounded.
    return float(whole + Decimal(f"0.{fraction or 0}"))


def _utc(whole_seconds: int) -> str:
    moment = datetime.datetime.fromtimestamp(whole_seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")
