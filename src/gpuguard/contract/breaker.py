"""The fleet circuit breaker's state: the JSON document in the ``breaker`` key of the
controller's ConfigMap (``keys.BREAKER_CONFIGMAP``), so a new leader carries it on.

Its times are float seconds since the epoch, as they always were (only the controller
reads them). The document is written with sorted keys, so the same state is the same
bytes and a save that changes nothing changes nothing in the ConfigMap either.
"""

from __future__ import annotations

import json

from gpuguard.contract.errors import ContractError
from gpuguard.contract.wire import Wire, read

DATA_KEY = "breaker"


class Breaker(Wire):
    """Open (no new repairs) or closed; why and since when; the last operator reset."""

    open: bool = False
    opened_at: float | None = None
    reason: str = ""
    reset_at: float | None = None


def encode_breaker(state: Breaker) -> str:
    return json.dumps(state.model_dump(mode="json", by_alias=True), sort_keys=True)


def decode_breaker(text: str, *, configmap: str) -> Breaker:
    """The state in ``text``, or a ``ContractError`` naming ``configmap`` (``<ns>/<name>``)."""
    obj, field = f"ConfigMap/{configmap}", f"data.{DATA_KEY}"
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ContractError(obj, field, f"not JSON: {exc}") from exc
    return read(Breaker, document, obj=obj, at=field)
