"""An S3-compatible bucket as the store of RMA evidence: the credentials (from the
environment or a credentials file, never from the config), and one object's PUT or GET,
signed with :mod:`gpuguard.sigv4` and bounded by a time limit.

Requests are path-style (``<endpoint>/<bucket>/<key>``), which AWS S3 and the
S3-compatible servers (MinIO, Ceph RGW, moto) all accept.
"""

from __future__ import annotations

import configparser
import hashlib
import http.client
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

from gpuguard.clock import Clock
from gpuguard.errors import GpuguardError
from gpuguard.s3_settings import S3Settings
from gpuguard.sigv4 import EMPTY_SHA256, Credentials, canonical_uri, sign

CHUNK = 1024 * 1024


class StoreError(GpuguardError):
    """The object store could not be reached, refused the request, or it ran out of time."""


def credentials(settings: S3Settings, environ: Mapping[str, str] = os.environ) -> Credentials:
    """The key pair from ``credentials_file`` where set, else from the env vars."""
    if settings.credentials_file is not None:
        return _from_file(settings.credentials_file, settings.profile)
    access = environ.get(settings.access_key_env, "")
    secret = environ.get(settings.secret_key_env, "")
    if not access or not secret:
        raise StoreError(
            f"evidence.s3: no credentials: set {settings.access_key_env} and "
            f"{settings.secret_key_env} in the agent's environment"
        )
    return Credentials(access, secret, environ.get(settings.session_token_env) or None)


def _from_file(path: Path, profile: str) -> Credentials:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text())
    except (OSError, configparser.Error) as exc:
        raise StoreError(f"evidence.s3.credentials_file {path}: unreadable: {exc}") from None
    section = parser[profile] if parser.has_section(profile) else None
    access = section.get("aws_access_key_id", "") if section is not None else ""
    secret = section.get("aws_secret_access_key", "") if section is not None else ""
    if not access or not secret:
        raise StoreError(
            f"evidence.s3.credentials_file {path}: no aws_access_key_id and "
            f"aws_secret_access_key in [{profile}]"
        )
    token = section.get("aws_session_token") if section is not None else None
    return Credentials(access, secret, token or None)


def put_file(settings: S3Settings, key: str, source: Path, clock: Clock) -> str:
    """Upload ``source`` as ``key``; returns its ``s3://bucket/key``."""
    digest = hashlib.sha256()
    with source.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    with source.open("rb") as body:
        size = source.stat().st_size
        _request(settings, "PUT", key, clock, body=(body, size, digest.hexdigest()))
    return settings.url_for(key)


def get_file(settings: S3Settings, key: str, target: Path, clock: Clock) -> Path:
    """Download ``key`` into ``target``; returns ``target``."""
    try:
        with target.open("wb") as sink:
            _request(settings, "GET", key, clock, sink=sink)
    except StoreError:
        target.unlink(missing_ok=True)
        raise
    return target


def _request(
    settings: S3Settings,
    method: str,
    key: str,
    clock: Clock,
    body: tuple[BinaryIO, int, str] | None = None,
    sink: BinaryIO | None = None,
) -> None:
    where = f"{settings.url_for(key)} at {settings.endpoint}"
    deadline = clock.monotonic() + settings.timeout_s
    parts = urlsplit(settings.endpoint)
    path = canonical_uri(f"/{settings.bucket}/{key}")
    host = parts.netloc
    extra = {"content-length": str(body[1])} if body is not None else {}
    payload = body[2] if body is not None else EMPTY_SHA256
    headers = sign(
        method, host, path, extra, payload, credentials(settings), settings.region, clock.now()
    )
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(host, timeout=settings.timeout_s)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        if body is not None:
            _send(connection, body[0], deadline, clock)
        _within(connection, deadline, clock)
        response = connection.getresponse()
        _receive(connection, response, sink, (deadline, clock), where)
    except TimeoutError:
        raise StoreError(f"{method} {where}: no answer in {settings.timeout_s:g}s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise StoreError(f"{method} {where}: {exc or type(exc).__name__}") from None
    finally:
        connection.close()


def _send(
    connection: http.client.HTTPConnection, body: BinaryIO, deadline: float, clock: Clock
) -> None:
    for chunk in iter(lambda: body.read(CHUNK), b""):
        _within(connection, deadline, clock)
        connection.send(chunk)


def _receive(
    connection: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
    sink: BinaryIO | None,
    deadline: tuple[float, Clock],
    where: str,
) -> None:
    if response.status // 100 != 2:
        detail = response.read(4096).decode(errors="replace")
        code = re.search(r"<Code>([^<]+)</Code>", detail)
        reason = code.group(1) if code else response.reason
        raise StoreError(f"{response.status} {reason} for {where}")
    while True:
        _within(connection, *deadline)
        chunk = response.read(CHUNK)
        if not chunk:
            return
        if sink is not None:
            sink.write(chunk)


def _within(connection: http.client.HTTPConnection, deadline: float, clock: Clock) -> None:
    """What is left of the time limit becomes the socket's timeout: a whole transfer, not
    only each read or write, ends by the deadline."""
    left = deadline - clock.monotonic()
    if left <= 0:
        raise TimeoutError
    if connection.sock is not None:
        connection.sock.settimeout(left)
