"""Reading a file a user named: one place that turns every way it can fail into a
:class:`ConfigError` naming the file (a configuration, policy, scenario, trace or
kubeconfig)."""

from __future__ import annotations

from pathlib import Path

from gpuguard.errors import ConfigError

MAX_INPUT_BYTES = 64 * 1024 * 1024  # a configuration, policy, scenario or trace file


def read_text_file(path: Path, what: str) -> str:
    """A user's input file as text, or a :class:`ConfigError` that names it and says why
    it cannot be one: missing, a directory, unreadable, too large, or not UTF-8 text."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > MAX_INPUT_BYTES:
        limit = MAX_INPUT_BYTES // (1024 * 1024)
        raise ConfigError(f"{path}: too large for a {what} (over {limit} MiB)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a {what}: not UTF-8 text (byte {exc.start}; a binary file?)"
        ) from None
