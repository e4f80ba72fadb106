"""The API server's error answers, as exceptions split by what the caller does next.

:class:`KubeUnavailable` (5xx, 429: retry later) and :class:`KubeRejected` (other 4xx: do
not retry as is) come from :mod:`gpuguard.kube.errors`; the subclasses here carry the HTTP
``code`` and the Status ``reason`` and name the answers a caller must tell apart: an object
that is not there, a stale resourceVersion, a version too old to watch from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpuguard.kube.errors import KubeError, KubeRejected, KubeUnavailable


class KubeStatusError(KubeError):
    """The API server answered with an error status; ``code`` and ``reason`` say which."""

    def __init__(
        self, message: str, *, code: int, reason: str = "", retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.retry_after_s = retry_after_s


class KubeRefused(KubeStatusError, KubeRejected):
    """A 4xx other than the ones below (forbidden, invalid, ...)."""


class KubeNotFound(KubeStatusError, KubeRejected):
    """404: the object (or its namespace) does not exist."""


class KubeConflict(KubeStatusError, KubeRejected):
    """409: stale resourceVersion, failed precondition, or the object already exists."""


class KubeExpired(KubeStatusError, KubeRejected):
    """410: the resourceVersion or continue token is too old; list again."""


class KubeThrottled(KubeStatusError, KubeUnavailable):
    """429: rate limited, or an eviction a PodDisruptionBudget does not allow yet."""


class KubeServerError(KubeStatusError, KubeUnavailable):
    """5xx: the server failed; retry later."""


def error_for(code: int, status: Mapping[str, object]) -> KubeStatusError:
    """The error for an HTTP status and the ``Status`` object the server sent with it."""
    reason = str(status.get("reason") or "")
    detail = f"{code} {reason or 'Error'}: {status.get('message') or ''}".rstrip(": ")
    retry = _retry_after_s(status.get("details"))
    kind: type[KubeStatusError]
    if code == 404:
        kind = KubeNotFound
    elif code == 409:
        kind = KubeConflict
    elif code == 410:
        kind = KubeExpired
    elif code == 429:
        kind = KubeThrottled
    elif code >= 500:
        kind = KubeServerError
    else:
        kind = KubeRefused
    return kind(detail, code=code, reason=reason, retry_after_s=retry)


def _retry_after_s(details: object) -> float | None:
    """``details.retryAfterSeconds`` (an integer on the wire), when the server sent one."""
    if not isinstance(details, Mapping):
        return None
    seconds = details.get("retryAfterSeconds")
    return seconds if isinstance(seconds, int | float) else None


def status_error(code: int, content: bytes) -> KubeStatusError:
    try:
        status = json.loads(content)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        status = {"message": content[:200].decode(errors="replace")}
    return error_for(code, status)
