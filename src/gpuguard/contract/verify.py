"""The verify request (controller -> agent) and its answer (agent -> controller).

After a repair the controller asks the node's agent to run the deep suite by writing a
request id on the Node (``gpuguard.io/verify-requested``); the agent answers in its report
with the id echoed as written. The id is the request's time in RFC 3339, so it also orders
requests, but an answer is matched to a request by the id string, never by comparing
times parsed back into floats.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuguard.contract.times import format_time, parse_time


def request_id(requested_at: float) -> str:
    """The id of a request made at ``requested_at`` (the same float gives the same id)."""
    return format_time(requested_at)


def requested_time(request: str) -> float | None:
    """When the request with this id was made; None for an id that is not a time."""
    try:
        return parse_time(request)
    except ValueError:
        return None


@dataclass(frozen=True)
class VerifyAnswer:
    """The agent's answer to a verify request: the deep suite's verdict after a repair."""

    request: str  # the id of the request it answers
    passed: bool
    codes: tuple[str, ...] = ()

    @property
    def requested_at(self) -> float:
        at = requested_time(self.request)
        assert at is not None  # read_answer admits only ids that are times
        return at


def read_request(value: object) -> str | None:
    """The request id on a Node; anything that is not one is no request."""
    return value if isinstance(value, str) and requested_time(value) is not None else None


def read_answer(entry: object) -> VerifyAnswer | None:
    """The report's verify entry; anything garbled is no answer (which times out as a
    failure, never passes), and only ``"passed": true`` is a pass."""
    if not isinstance(entry, dict):
        return None
    request = read_request(entry.get("requestedAt"))
    codes = entry.get("codes")
    if request is None or not isinstance(codes, list):
        return None
    return VerifyAnswer(request, entry.get("passed") is True, tuple(map(str, codes)))
