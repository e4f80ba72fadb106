"""What every scenario section is built of: a strict, frozen model, and the number types
its fields take."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]


class Strict(BaseModel):
    """Unknown keys are errors, and a scenario does not change once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
