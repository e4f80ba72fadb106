"""Reading a trace from where it is: bundled by name, a StepFun-format JSON file, or a CSV
trace (``trace.py`` says the format)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gpuguard.files import read_text_file
from gpuguard.sim.trace import Trace, parse_csv
from gpuguard.sim.trace_infinitehbd import parse_infinitehbd

BUNDLED = {"infinitehbd": "data/traces/infinitehbd/fault_trace.json"}


def load_trace(source: str | Path) -> Trace:
    """A bundled trace by name, a StepFun-format JSON file, or a CSV trace."""
    if str(source) in BUNDLED:
        resource = resources.files("gpuguard").joinpath(BUNDLED[str(source)])
        return parse_infinitehbd(resource.read_text(), str(source))
    path = Path(source)
    text = read_text_file(path, "trace")
    if path.suffix == ".json":
        return parse_infinitehbd(text, str(path))
    return parse_csv(text, str(path))
