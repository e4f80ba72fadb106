"""The NodeRemediation CRD and gpuguard's time parser accept exactly the same times.

A time the API server lets in but gpuguard cannot read is an object gpuguard cannot read
(chaos_findings F3: an agent's ``…T08:00:00,5Z`` answer). Each candidate is written to a
real kube-apiserver with the chart's CRD; it must be stored iff ``parse_time`` reads it.
"""

from __future__ import annotations

import time
import uuid

import pytest

from gpuguard.contract.times import parse_time
from gpuguard.kube import remediations
from gpuguard.kube.rest import KubeApi, KubeRefused
from gpuguard.remediation.model import Episode

VALID = [
    "2026-12-01T08:00:00Z",
    "2026-12-01T08:00:00.5Z",  # one fractional digit
    "2026-12-01T08:00:00.123456789Z",  # nine
    "2026-12-01T08:00:00.1234567890123456789Z",  # more than a float keeps
    "2026-12-01T08:00:00+05:30",
    "2026-12-01T08:00:00-08:00",
    "2028-02-29T08:00:00Z",  # a leap year's day
    "2026-12-31T23:59:59.999Z",
]
ODD = [
    "2026-12-01T08:00:00,5Z",  # chaos_findings row 34: the CRD's date-time took these
    "2026-12-01T08:00:00 5Z",
    "2026-12-01t08:00:00Z",
    "2026-12-01T08:00:00z",
    "2026-12-01 08:00:00Z",
    "2026-12-01T08:00:00",  # no zone
    "2026-12-01T08:00Z",  # no seconds
    "2026-12-01T08:00:00.Z",  # a point without digits
    "2026-12-31T23:59:60Z",  # a leap second
    "2026-02-30T08:00:00Z",  # no such day: a pattern takes it, the date-time format not
    "2026-02-29T08:00:00Z",
    "2026-04-31T08:00:00Z",
    "2026-13-01T08:00:00Z",
    "2026-12-01T24:00:00Z",
    "2026-12-01T08:00:00+24:00",
    "2026-12-01T08:00:00+05:60",
    "2026-12-01T08:00:00+0530",
    "0000-01-01T00:00:00Z",
    "2026-W48-2T08:00:00Z",  # an ISO 8601 week date, 20 characters like a Time
    "2026-12-01T080000.5Z",
    " 2026-12-01T08:00:00Z",
    "2026-12-01T08:00:00Z\n",
    "2026-12-01T08:00:00Zt",
    "２０２６-12-01T08:00:00Z",  # fullwidth digits  # noqa: RUF001
    "",
]


def parses(text: str) -> bool:
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def status_path(api: KubeApi) -> str:
    ep = Episode(node=f"gpu-times-{uuid.uuid4().hex[:8]}", opened_at=time.time())
    remediations.save_episode(api, ep, new=True)
    return remediations.NODE_REMEDIATIONS.path(
        remediations.object_name(ep.node, ep.opened_at), sub="status"
    )


def stored(api: KubeApi, path: str, text: str) -> bool:
    try:
        api.patch(path, {"status": {"phaseSince": text}})
    except KubeRefused as exc:
        assert exc.code == 422, exc
        return False
    return True


@pytest.mark.parametrize("text", VALID + ODD)
def test_the_api_server_stores_a_time_iff_gpuguard_reads_it(api, status_path, text):
    assert stored(api, status_path, text) == parses(text)


def test_the_valid_ones_are_read_exactly():
    assert all(parses(text) for text in VALID)
    assert parse_time("2026-12-01T08:00:00+05:30") == parse_time("2026-12-01T02:30:00Z")
    assert parse_time("2026-12-01T08:00:00.5Z") == parse_time("2026-12-01T08:00:00Z") + 0.5
