"""Karpenter's pod-level ``karpenter.sh/do-not-disrupt``, read as Karpenter reads it.

A pod says "do not disrupt the node I run on" with ``"true"`` (for as long as it runs) or
with a Go duration such as ``"4h"`` (until it has run that long, from ``status.startTime``;
no start time yet: protected). Anything else is ignored, as Karpenter ignores it
(sigs.k8s.io/karpenter pkg/utils/pod ``IsDoNotDisruptActive``). A finished or terminating
pod protects nothing.
"""

from __future__ import annotations

import re

from gpuguard.contract.keys import DO_NOT_DISRUPT
from gpuguard.contract.times import parse_time
from gpuguard.kube.drain import is_finished, is_terminating
from gpuguard.kube.rest import Json

_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def go_duration_s(text: str) -> float | None:
    """Seconds in a Go ``time.ParseDuration`` text (``1h30m``, ``90s``, ``1.5h``); None when
    it is not one. A sign is refused: only a positive duration protects."""
    if not text or _PART.sub("", text):
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in _PART.findall(text))


def protects(pod: Json, now: float) -> bool:
    """Whether the pod's do-not-disrupt holds at ``now`` (seconds since the epoch)."""
    if is_terminating(pod) or is_finished(pod):
        return False
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(DO_NOT_DISRUPT)
    if value == "true":
        return True
    duration = go_duration_s(value) if isinstance(value, str) else None
    if not duration:
        return False
    started = (pod.get("status") or {}).get("startTime")
    if not isinstance(started, str):
        return True
    try:
        return now - parse_time(started) < duration
    except ValueError:
        return True  # an unreadable start: fail safe, as with none
