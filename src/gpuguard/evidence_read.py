"""RMA evidence read back for ``gpuguard check --bundle``: an archive on disk, or one in
the bucket (``s3://bucket/key``, with the endpoint, region and credentials of the
``--config`` file's ``evidence.s3``), unpacked into a scratch directory removed at exit."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.config import Config
from gpuguard.errors import ConfigError
from gpuguard.evidence import SUFFIX, unpack
from gpuguard.s3_store import StoreError, get_file


def local_bundle(bundle: Path, config: Config, clock: Clock = SYSTEM_CLOCK) -> Path:
    """The bundle directory to read: ``bundle`` itself, or the archive it names unpacked."""
    remote = str(bundle).startswith("s3:/")  # a Path keeps one slash of s3://
    if not remote and not (bundle.name.endswith(SUFFIX) and bundle.is_file()):
        return bundle
    scratch = Path(tempfile.mkdtemp(prefix="gpuguard-bundle-"))
    atexit.register(shutil.rmtree, scratch, True)
    archive = _fetch(str(bundle), config, scratch, clock) if remote else bundle
    (scratch / "bundle").mkdir()
    return unpack(archive, scratch / "bundle")


def _fetch(path: str, config: Config, scratch: Path, clock: Clock) -> Path:
    url = "s3://" + path.removeprefix("s3:/")
    bucket, _, key = url.removeprefix("s3://").partition("/")
    if not bucket or not key.endswith(SUFFIX):
        raise ConfigError(f"--bundle {url}: not s3://BUCKET/KEY{SUFFIX}")
    settings = config.evidence.s3 if config.evidence is not None else None
    if settings is None:
        raise ConfigError(
            f"--bundle {url}: the endpoint and credentials come from the evidence.s3 of a"
            " --config FILE; none given"
        )
    try:
        return get_file(settings.model_copy(update={"bucket": bucket}), key, scratch / "a", clock)
    except StoreError as exc:
        raise ConfigError(f"--bundle {url}: {exc}") from None
