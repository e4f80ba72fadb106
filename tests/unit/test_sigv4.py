"""The SigV4 signer against AWS's published S3 examples ("Signature Calculations for the
Authorization Header", examples GET Object and PUT Object: access key AKIAIOSFODNN7EXAMPLE,
bucket examplebucket, 20130524T000000Z, region us-east-1)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from gpuguard.sigv4 import EMPTY_SHA256, Credentials, canonical_uri, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
AT = datetime(2013, 5, 24, tzinfo=UTC).timestamp()
HOST = "examplebucket.s3.amazonaws.com"
SCOPE = "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"


def test_the_get_object_example():
    headers = sign(
        "GET", HOST, "/test.txt", {"Range": "bytes=0-9"}, EMPTY_SHA256, EXAMPLE, "us-east-1", AT
    )
    assert headers["authorization"] == (
        f"AWS4-HMAC-SHA256 {SCOPE},SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z" and headers["host"] == HOST


def test_the_put_object_example_with_an_escaped_key():
    body = b"Welcome to Amazon S3."
    digest = hashlib.sha256(body).hexdigest()
    assert digest == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
    path = canonical_uri("/test$file.text")
    assert path == "/test%24file.text"
    extra = {"Date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"}
    headers = sign("PUT", HOST, path, extra, digest, EXAMPLE, "us-east-1", AT)
    assert headers["authorization"] == (
        f"AWS4-HMAC-SHA256 {SCOPE},"
        "SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class,"
        "Signature=98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"
    )


def test_a_session_token_is_sent_and_signed():
    temporary = Credentials(EXAMPLE.access_key, EXAMPLE.secret_key, "token-1")
    headers = sign("GET", HOST, "/test.txt", {}, EMPTY_SHA256, temporary, "us-east-1", AT)
    assert headers["x-amz-security-token"] == "token-1"
    assert "x-amz-security-token" in headers["authorization"]
    assert "token-1" not in repr(temporary) and EXAMPLE.secret_key not in repr(EXAMPLE)
