"""Reading a file a user named: one place that turns every way it can fail into a
:class:`ConfigError` naming the file (a configuration, policy, scenario, trace or
kubeconfig), a YAML syntax error with its line and column."""

from __future__ import annotations

from pathlib import Path

import yaml

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


def read_yaml_mapping(path: Path, what: str) -> dict[str, object]:
    """A YAML file that must hold a mapping (an empty file is an empty one)."""
    text = read_text_file(path, what)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{_yaml_where(path, exc)}: not valid YAML: {_yaml_problem(exc)}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys to values, got {type(data).__name__}"
        )
    return data


def _yaml_where(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The YAML error's own words without its position in ``<unicode string>``."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem is None:
        return str(exc).splitlines()[0]
    return f"{context}, {problem}" if context else str(problem)
