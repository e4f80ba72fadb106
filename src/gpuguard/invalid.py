"""One-line messages for a settings file pydantic refused: every bad key, named."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from pydantic import BaseModel, ValidationError


def _nearest(key: str, model: type[BaseModel]) -> str:
    """ "did you mean ...?" for a misspelt key, else the keys the model knows."""
    known = list(model.model_fields)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_invalid(
    exc: ValidationError,
    origin: str,
    what: str,
    model_at: Callable[[list[str]], type[BaseModel]],
) -> str:
    """One line naming every bad key; ``model_at(loc)`` is the model that owns a key, so an
    unknown key is answered with the keys that model does know."""
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key ({_nearest(loc[-1], model_at(loc))})")
        elif not loc:  # about the whole document: its input is all of it
            problems.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
        else:
            message = err["msg"].removeprefix("Value error, ")
            problems.append(f"{key}: {message} (got {_short(err.get('input'))})")
    return f"{origin}: invalid {what}: " + "; ".join(problems)
