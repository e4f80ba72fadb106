"""AWS Signature Version 4 for S3 requests, standard library only: the canonical request,
the string to sign, the signing key and the ``Authorization`` header
(https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html).

No SDK: the agent's image keeps its hashed requirements lock, and one PUT and one GET
need a page of code, checked against AWS's published examples (tests/unit/test_sigv4.py).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def canonical_uri(path: str) -> str:
    """A key's path as S3 signs it: every byte but unreserved ones and ``/`` escaped."""
    return quote(path, safe="/-_.~")


def amz_date(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y%m%dT%H%M%SZ")


def sign(
    method: str,
    host: str,
    path: str,
    headers: Mapping[str, str],
    payload_sha256: str,
    credentials: Credentials,
    region: str,
    at: float,
    service: str = "s3",
) -> dict[str, str]:
    """The headers to send for a request without a query string: ``headers`` plus host,
    x-amz-date, x-amz-content-sha256 (the security token where set) and Authorization.
    ``path`` is as sent on the request line (already escaped with :func:`canonical_uri`)."""
    stamp = amz_date(at)
    sent = {name.lower(): " ".join(value.split()) for name, value in headers.items()}
    sent.update({"host": host, "x-amz-date": stamp, "x-amz-content-sha256": payload_sha256})
    if credentials.session_token:
        sent["x-amz-security-token"] = credentials.session_token
    names = sorted(sent)
    signed_headers = ";".join(names)
    request = "\n".join(
        [
            method,
            path,
            "",  # no query string
            *(f"{name}:{sent[name]}" for name in names),
            "",
            signed_headers,
            payload_sha256,
        ]
    )
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, _sha256(request.encode())])
    signature = hmac.new(
        signing_key(credentials.secret_key, stamp[:8], region, service),
        to_sign.encode(),
        hashlib.sha256,
    ).hexdigest()
    sent["authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope},"
        f"SignedHeaders={signed_headers},Signature={signature}"
    )
    return sent


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
