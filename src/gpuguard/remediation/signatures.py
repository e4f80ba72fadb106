"""A training process's last words, read for whose fault its end was.

The table (``data/failure_signatures.csv``) holds the messages the CUDA runtime, NCCL,
gloo, aws-ofi-nccl, NVML and PyTorch print when the hardware or the fabric fails under a
job, and those that only the job's own code causes. Each row carries the source that
defines its text.

Precedence is the conservative one: a specific application error (out of memory, a
device-side assert) wins over any transport error next to it, since a rank that dies of
its own bug takes its peers' connections down with it; a transport or device error wins
over a bare Python traceback, which every fatal error in a PyTorch job prints.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

# Read at most this much of a text, from its end: the last words are what matter, and a
# launcher's captured stderr can be long.
TAIL_CHARS = 65536
DETAIL_CHARS = 240


@dataclass(frozen=True)
class Signature:
    code: str  # the table's code, e.g. NCCL_REMOTE_ERROR
    infrastructure: bool  # True: the infrastructure's doing; False: the job's own
    detail: str  # the line it was found on, cut short


@dataclass(frozen=True)
class _Rule:
    code: str
    infrastructure: bool
    specific: bool
    pattern: re.Pattern[str]


@cache
def rules() -> tuple[_Rule, ...]:
    """The table's rows, in its order, loaded once."""
    text = resources.files("gpuguard").joinpath("data/failure_signatures.csv").read_text()
    return tuple(
        _Rule(
            code=row["code"],
            infrastructure=row["kind"] == "infrastructure",
            specific=row["strength"] == "specific",
            pattern=re.compile(row["pattern"], re.IGNORECASE),
        )
        for row in csv.DictReader(text.splitlines())
    )


def classify(text: object) -> Signature | None:
    """The signature that decides ``text``, or None when nothing in it is known.

    Never raises: anything that is not a string is unknown, however it came in."""
    if not isinstance(text, str) or not text:
        return None
    tail = text[-TAIL_CHARS:]
    found = [(rule, match) for rule in rules() if (match := rule.pattern.search(tail))]
    for wanted in (_specific_application, _infrastructure, _generic_application):
        for rule, match in found:
            if wanted(rule):
                # A traceback's header says nothing: its last line names the error.
                line = _line_of(tail, match) if rule.specific else _last_line(tail[match.end() :])
                return Signature(rule.code, rule.infrastructure, line)
    return None


def _specific_application(rule: _Rule) -> bool:
    return rule.specific and not rule.infrastructure


def _infrastructure(rule: _Rule) -> bool:
    return rule.infrastructure


def _generic_application(rule: _Rule) -> bool:
    return not rule.infrastructure


def _line_of(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start : end if end >= 0 else len(text)].strip()
    return line[:DETAIL_CHARS]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:DETAIL_CHARS] if lines else ""
