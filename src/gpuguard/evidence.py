"""RMA evidence archives: their settings, packing a bundle directory into a tar.gz and
unpacking one safely for ``gpuguard check --bundle`` (docs/remediation.md, "RMA evidence").
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuguard.errors import ConfigError
from gpuguard.s3_settings import S3Settings

SUFFIX = ".tar.gz"
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # a bundle is text: far below this


class EvidenceSettings(BaseModel):
    """Where the agent stores a node's evidence when asked (a directory or an S3-compatible
    bucket, one of the two); absent: nothing is captured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    directory: Path | None = Field(
        default=None, description="Where each <node>-<time>.tar.gz is written"
    )
    s3: S3Settings | None = Field(default=None, description="The bucket each one is put in")

    @model_validator(mode="after")
    def _one_store(self) -> EvidenceSettings:
        if (self.directory is None) == (self.s3 is None):
            raise ValueError("set exactly one of evidence.directory and evidence.s3")
        return self


def pack(source: Path, target: Path) -> None:
    """Write ``source``'s files as ``target`` (a tar.gz with one top folder, its stem),
    through a temporary name so a reader never sees half an archive."""
    partial = target.with_name(f".{target.name}.partial")
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(source, arcname=target.name.removesuffix(SUFFIX))
    partial.rename(target)


def unpack(archive_path: Path, target: Path) -> Path:
    """Extract a bundle archive into ``target``; returns the bundle directory inside.
    Links, devices, absolute or escaping paths and oversized content are refused."""
    try:
        with tarfile.open(archive_path, "r:gz") as archive:
            members = archive.getmembers()
            _vet(archive_path, members)
            archive.extractall(target, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ConfigError(f"--bundle {archive_path}: not a readable tar.gz: {exc}") from None
    entries = list(target.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else target


def _vet(archive_path: Path, members: list[tarfile.TarInfo]) -> None:
    total = 0
    for member in members:
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            raise ConfigError(f"--bundle {archive_path}: unsafe path {member.name!r} in it")
        if not (member.isfile() or member.isdir()):
            raise ConfigError(f"--bundle {archive_path}: {member.name!r} is not a plain file")
        total += member.size
        if total > MAX_UNPACKED_BYTES:
            raise ConfigError(f"--bundle {archive_path}: over {MAX_UNPACKED_BYTES} bytes unpacked")
