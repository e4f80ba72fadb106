"""The breaker ConfigMap's document: the same bytes as ever, and one named error."""

from __future__ import annotations

import json

import pytest

from gpuguard.contract.breaker import Breaker, decode_breaker, encode_breaker
from gpuguard.contract.errors import ContractError

CONFIGMAP = "gpuguard/gpuguard-controller-state"


def test_the_document_round_trips_with_sorted_keys():
    state = Breaker(open=True, opened_at=1_795_978_800.123456789, reason="storm", reset_at=5.0)
    text = encode_breaker(state)
    assert text == json.dumps(
        {"open": True, "openedAt": state.opened_at, "reason": "storm", "resetAt": 5.0},
        sort_keys=True,
    )
    assert decode_breaker(text, configmap=CONFIGMAP) == state


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{", "data.breaker"),
        ("[]", "data.breaker"),
        ('{"open": true, "openedAt": "soon"}', "data.breaker.openedAt"),
    ],
)
def test_an_unreadable_document_names_the_configmap_and_the_field(text, field):
    with pytest.raises(ContractError) as error:
        decode_breaker(text, configmap=CONFIGMAP)
    assert error.value.obj == f"ConfigMap/{CONFIGMAP}"
    assert error.value.field == field
