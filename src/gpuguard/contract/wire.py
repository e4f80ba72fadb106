"""What every wire model shares: camelCase names, RFC 3339 times, and one way to read one.

Code builds a model with its Python names (``node_name``) and writes it with
``model_dump(mode="json", by_alias=True)`` (``nodeName``). :func:`read` turns a document
from the cluster into a model, or into the one :class:`ContractError` naming the object
and the field, so no caller has to know pydantic's errors.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from gpuguard.contract.errors import ContractError
from gpuguard.contract.times import TIME_PATTERN, format_time, parse_time


class Wire(BaseModel):
    """A document gpuguard keeps in a Kubernetes object. Unknown fields are ignored, so an
    older reader keeps working beside a newer writer."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


def _seconds(value: object) -> object:
    # A string is the wire's RFC 3339; a number is code building the model from seconds.
    return parse_time(value) if isinstance(value, str) else value


# Float seconds since the epoch in code, an RFC 3339 string on the wire, exactly the same
# float after a round trip (contract.times). The schema's pattern and format together let
# in exactly what parse_time reads.
Time = Annotated[
    float,
    BeforeValidator(_seconds),
    PlainSerializer(format_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": TIME_PATTERN}),
]

Model = TypeVar("Model", bound=BaseModel)


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def cut_to(limit: int) -> BeforeValidator:
    """For a free-text field of at most ``limit`` characters (``Field(max_length=limit)``,
    the schema's ``maxLength``): a longer string, from code or from an object written
    before the limit, is cut rather than refused."""
    return BeforeValidator(lambda value: cut(value, limit) if isinstance(value, str) else value)


def read(model: type[Model], data: object, *, obj: str, at: str) -> Model:
    """``data`` (found at ``at`` in ``obj``) as a ``model``, or a ``ContractError``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = exc.error_count() - 1
        detail = first["msg"] + (f" (and {more} more)" if more else "")
        raise ContractError(obj, dotted(at, first["loc"]), detail) from exc


def dotted(at: str, loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a path: ``status.steps[2].at``."""
    path = at
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":  # pydantic's marker for a bad mapping key: the key is named
            path += f".{part}" if path else part
    return path
