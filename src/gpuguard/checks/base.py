"""The one interface every check implements, and the context it runs in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from gpuguard.config import Config, Expectations
from gpuguard.model import Finding, Layer
from gpuguard.sources import Sources


@dataclass(frozen=True)
class CheckContext:
    """What a check may use: where raw data comes from, the settings, its time budget."""

    sources: Sources
    config: Config
    timeout_s: float

    @property
    def expectations(self) -> Expectations:
        return self.config.expectations


class Check(Protocol):
    """A source of findings for one layer.

    ``run`` returns the findings (an empty list means the source answered and saw nothing
    wrong). It signals "no verdict" only by raising :class:`gpuguard.errors.ToolMissing`,
    :class:`~gpuguard.errors.CheckTimedOut`, :class:`~gpuguard.errors.CheckFailed` or
    :class:`~gpuguard.errors.ParseError`; the runner turns those, a timeout it enforces
    itself, or any other exception into an explicit finding.
    """

    name: ClassVar[str]
    layer: ClassVar[Layer]

    def run(self, ctx: CheckContext) -> list[Finding]: ...


@dataclass(frozen=True)
class Fallback:
    """``check`` runs only when ``primary`` gave no verdict (or when cross-checking)."""

    check: str
    primary: str
