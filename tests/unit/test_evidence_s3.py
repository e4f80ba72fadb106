"""RMA evidence in an S3-compatible bucket: the settings (one store, a one-line error
otherwise), the credentials (env or a credentials file, never the config), and uploads to
a real server on loopback (moto, its signature checking on): the object is there and
reads back; a wrong key, an unreachable or a silent endpoint fail with a clear line."""

from __future__ import annotations

import io
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuguard.agent.evidence import capture
from gpuguard.cli import main
from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.config import Config, build_config
from gpuguard.errors import ConfigError
from gpuguard.s3_settings import S3Settings
from gpuguard.s3_store import StoreError, credentials, get_file, put_file
from gpuguard.sources import BundleSources
from tests.support.s3_server import BUCKET, S3Server, s3_server
from tests.unit.test_evidence import EXAMPLES, EXPECT


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def settings(endpoint: str, **more: object) -> S3Settings:
    return S3Settings(endpoint=endpoint, bucket=BUCKET, prefix="rma/", **more)


@pytest.mark.parametrize(
    ("evidence", "why"),
    [
        ({}, "evidence: set exactly one of evidence.directory and evidence.s3"),
        (
            {"directory": "/e", "s3": {"endpoint": "http://h", "bucket": "bkt"}},
            "evidence: set exactly one of evidence.directory and evidence.s3",
        ),
        ({"s3": {"endpoint": "h:9000", "bucket": "bkt"}}, "evidence.s3.endpoint: must be http"),
        ({"s3": {"endpoint": "https://k:s@h", "bucket": "bkt"}}, "evidence.s3.endpoint: must be"),
        ({"s3": {"endpoint": "https://h/bkt", "bucket": "bkt"}}, "evidence.s3.endpoint: must be"),
        ({"s3": {"endpoint": "http://h", "bucket": "No_Such"}}, "evidence.s3.bucket: not a bucket"),
        ({"s3": {"bucket": "bkt"}}, "evidence.s3.endpoint: Field required"),
        (
            {"s3": {"endpoint": "http://h", "bucket": "bkt", "secret_key": "x"}},
            "evidence.s3.secret_key: unknown key",
        ),
    ],
)
def test_a_wrong_store_is_one_line_naming_the_key(evidence, why):
    with pytest.raises(ConfigError) as raised:
        build_config({"evidence": evidence}, origin="agent.yaml")
    assert why in str(raised.value) and "\n" not in str(raised.value)


def test_credentials_come_from_the_named_env_vars_or_a_credentials_file(tmp_path):
    named = settings("http://h", access_key_env="EV_KEY", secret_key_env="EV_SECRET")
    found = credentials(named, {"EV_KEY": "k", "EV_SECRET": "s", "AWS_SESSION_TOKEN": "t"})
    assert (found.access_key, found.secret_key, found.session_token) == ("k", "s", "t")
    with pytest.raises(StoreError, match="no credentials: set EV_KEY and EV_SECRET"):
        credentials(named, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    path = tmp_path / "credentials"
    path.write_text("[rma]\naws_access_key_id = fk\naws_secret_access_key = fs\n")
    found = credentials(settings("http://h", credentials_file=path, profile="rma"), {})
    assert (found.access_key, found.secret_key) == ("fk", "fs")
    with pytest.raises(
        StoreError, match=r"no aws_access_key_id and aws_secret_access_key in \[default\]"
    ):
        credentials(settings("http://h", credentials_file=path), {})


def archive(tmp_path: Path) -> Path:
    path = tmp_path / "gpu-7-2027-01-15T080000Z.tar.gz"
    with tarfile.open(path, "w:gz") as packed:
        member = tarfile.TarInfo("gpu-7-2027-01-15T080000Z/kmsg.log")
        member.size = 3
        packed.addfile(member, io.BytesIO(b"ok\n"))
    return path


def test_an_upload_is_in_the_bucket_and_reads_back(s3, tmp_path, monkeypatch):
    for name, value in s3.environ().items():
        monkeypatch.setenv(name, value)
    store, path = settings(s3.endpoint), archive(tmp_path)
    key = store.key_for(path.name)
    assert put_file(store, key, path, SYSTEM_CLOCK) == f"s3://{BUCKET}/rma/{path.name}"
    stored = s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert stored == path.read_bytes()
    back = get_file(store, key, tmp_path / "back.tar.gz", SYSTEM_CLOCK)
    assert back.read_bytes() == path.read_bytes()


@pytest.mark.parametrize(
    ("key_id", "secret", "why"),
    [
        (None, "wrong", "403 SignatureDoesNotMatch"),
        ("AKIAEXAMPLEWRONG0000", None, "403 InvalidAccessKeyId"),
    ],
)
def test_a_wrong_key_is_refused_in_one_line(s3, tmp_path, monkeypatch, key_id, secret, why):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id or s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret or s3.secret_key)
    with pytest.raises(StoreError) as raised:
        put_file(settings(s3.endpoint), "rma/x.tar.gz", archive(tmp_path), SYSTEM_CLOCK)
    assert str(raised.value) == f"{why} for s3://{BUCKET}/rma/x.tar.gz at {s3.endpoint}"


def test_a_missing_object_leaves_no_file_behind(s3, tmp_path, monkeypatch):
    for name, value in s3.environ().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StoreError, match="404 NoSuchKey"):
        get_file(settings(s3.endpoint), "rma/none.tar.gz", tmp_path / "none", SYSTEM_CLOCK)
    assert not (tmp_path / "none").exists()


@pytest.fixture
def silent_port() -> Iterator[tuple[int, int]]:
    """A port that takes connections and never answers, and one nothing listens on."""
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
        yield silent.getsockname()[1], closed.getsockname()[1]


def test_an_unreachable_or_silent_endpoint_fails_in_time(tmp_path, monkeypatch, silent_port):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    silent, closed = silent_port
    path = archive(tmp_path)
    with pytest.raises(StoreError, match="Connection refused"):
        put_file(settings(f"http://127.0.0.1:{closed}"), "rma/x", path, SYSTEM_CLOCK)
    started = SYSTEM_CLOCK.monotonic()
    with pytest.raises(StoreError, match=r"no answer in 0.5s"):
        put_file(settings(f"http://127.0.0.1:{silent}", timeout_s=0.5), "rma/x", path, SYSTEM_CLOCK)
    assert SYSTEM_CLOCK.monotonic() - started < 5


def test_check_reads_an_archive_back_from_the_bucket(s3, tmp_path, monkeypatch, capsys):
    for name, value in s3.environ().items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "agent.yaml"
    config.write_text(f"evidence:\n  s3: {{endpoint: '{s3.endpoint}', bucket: {BUCKET}}}\n")
    key = "rma/gpu-7-2027-01-15T080000Z.tar.gz"
    captured = capture(
        Config(evidence={"directory": tmp_path / "local"}),
        BundleSources(EXAMPLES / "xid79-fallen-off-bus"),
        "gpu-7",
        1_800_000_000.0,
        {},
    )
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=captured.read_bytes())
    url = f"s3://{BUCKET}/{key}"
    assert main(["check", "--config", str(config), "--bundle", url, *EXPECT]) == 2  # its Xid 79
    capsys.readouterr()
    assert (
        main(["check", "--config", str(config), "--bundle", f"s3://{BUCKET}/rma/gone.tar.gz"]) != 0
    )
    assert f"--bundle s3://{BUCKET}/rma/gone.tar.gz: 404 NoSuchKey" in capsys.readouterr().err
    assert main(["check", "--bundle", url]) != 0
    assert "come from the evidence.s3 of a --config FILE; none given" in capsys.readouterr().err
