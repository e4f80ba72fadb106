"""gpuguard's exceptions, classified by what the caller should do next.

GpuguardError
 ├── ConfigError          bad configuration or expectations; fix the input
 └── CheckError           a check could not produce a verdict (fail closed)
      ├── ToolMissing     the tool, library or bundle file is absent; try the fallback
      ├── NotApplicable   nothing of this kind on the node, and none expected
      ├── CheckTimedOut   the tool did not finish within its timeout
      ├── CheckFailed     the tool ran but failed without usable output
      └── ParseError      the output is not the documented format (garbled, truncated)
"""

from __future__ import annotations


class GpuguardError(Exception):
    """Base class of every error gpuguard raises on purpose."""


class ConfigError(GpuguardError):
    """The configuration or a command-line expectation is invalid."""


class CheckError(GpuguardError):
    """A check could not give a verdict."""


class ToolMissing(CheckError):
    """The diagnostic tool, library or bundle file needed by a check is not available."""


class NotApplicable(CheckError):
    """The node has nothing this check looks at (no RDMA adapter, say) and none was expected.

    Unlike :class:`ToolMissing` this is a verdict: the check looked and confirmed absence.
    """


class CheckTimedOut(CheckError):
    """The diagnostic did not finish within its timeout (it was killed, or abandoned)."""


class CheckFailed(CheckError):
    """The diagnostic ran but failed without output we can use."""


class ParseError(CheckError):
    """The diagnostic's output is not in the format the parser documents.

    Parsers raise only this (never ``KeyError``, ``ValueError`` …) on bad input, so a caller
    can tell garbled output from a bug.
    """
