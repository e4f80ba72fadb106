"""RMA evidence: captured from a bundle into a directory as a tar.gz, read back by
``gpuguard check --bundle``, and a hostile archive refused with a one-line error."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from gpuguard.agent.evidence import capture
from gpuguard.cli import main
from gpuguard.config import Config
from gpuguard.sources import BundleSources
from tests.conftest import EXAMPLES

EXPECT = ["--expected-gpus", "1", "--expected-nics", "3", "--expected-link-gbps", "400"]
AT = 1_800_000_000.0


def captured(example: str, tmp_path: Path) -> Path:
    config = Config(evidence={"directory": tmp_path / "evidence"})
    history = {"node-report.json": '{"status": "Unhealthy"}'}
    return capture(config, BundleSources(EXAMPLES / example), "gpu-7", AT, history)


def test_capture_stores_one_named_archive_with_the_bundle_history_and_manifest(tmp_path):
    path = captured("healthy-h100", tmp_path)
    assert path.parent == tmp_path / "evidence"
    assert path.name == "gpu-7-2027-01-15T080000Z.tar.gz"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no scratch left
    with tarfile.open(path) as archive:
        names = set(archive.getnames())
        manifest = json.load(archive.extractfile("gpu-7-2027-01-15T080000Z/manifest.json"))
    top = "gpu-7-2027-01-15T080000Z"
    assert {f"{top}/nvidia-smi.txt", f"{top}/kmsg.log", f"{top}/node-report.json"} <= names
    assert manifest["node"] == "gpu-7" and manifest["capturedAt"] == "2027-01-15T08:00:00Z"


@pytest.mark.parametrize(("example", "code"), [("healthy-h100", 0), ("xid79-fallen-off-bus", 2)])
def test_check_reads_the_archive_back_as_it_reads_the_source_bundle(
    tmp_path, capsys, example, code
):
    path = captured(example, tmp_path)
    assert main(["check", "--bundle", str(EXAMPLES / example), *EXPECT]) == code
    capsys.readouterr()
    assert main(["check", "--json", "--bundle", str(path), *EXPECT]) == code
    assert json.loads(capsys.readouterr().out)["status"] in ("Healthy", "Unhealthy")


def hostile(path: Path, name: str, kind: bytes = tarfile.REGTYPE) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        member = tarfile.TarInfo(name)
        member.type = kind
        member.size = 2 if kind == tarfile.REGTYPE else 0
        member.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
        archive.addfile(member, io.BytesIO(b"x\n") if kind == tarfile.REGTYPE else None)
    return path


@pytest.mark.parametrize(
    ("name", "kind", "why"),
    [
        ("../escape", tarfile.REGTYPE, "unsafe path"),
        ("/abs", tarfile.REGTYPE, "unsafe path"),
        ("b/link", tarfile.SYMTYPE, "not a plain file"),
    ],
)
def test_a_hostile_archive_is_refused_in_one_line(tmp_path, capsys, name, kind, why):
    path = hostile(tmp_path / "bad.tar.gz", name, kind)
    assert main(["check", "--bundle", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert why in err and "\n" not in err and not (tmp_path / "escape").exists()


def test_a_garbled_archive_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "garbled.tar.gz"
    path.write_bytes(b"not gzip")
    assert main(["check", "--bundle", str(path)]) != 0
    assert "not a readable tar.gz" in capsys.readouterr().err
