"""The gpuguard image built from the Dockerfile, for the tests that run it.

``hack/node-env`` installs the Debian packages and builds the base image once.
"""

from __future__ import annotations

import functools
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.controlplane import REPO

BASE_IMAGE = "localhost/debian-python:3.11-bookworm"  # hack/node-env's python:3.11-slim
IMAGE_REPOSITORY = "localhost/gpuguard"


@functools.cache
def node_env() -> Path:
    """Install (when missing) and locate what hack/node-env provides."""
    proc = subprocess.run(
        [str(REPO / "hack" / "node-env")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/node-env failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def buildah(*args: str) -> str:
    """buildah on hack/node-env's storage; its output, or an error naming the command."""
    proc = subprocess.run([*buildah_command(), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def buildah_command() -> list[str]:
    storage = node_env() / "containers"
    return [
        "buildah",
        f"--root={storage / 'storage'}",
        f"--runroot={storage / 'run'}",
        "--storage-driver=overlay",
    ]


@dataclass(frozen=True)
class Image:
    reference: str  # repository:tag, as the chart's values name it
    build_s: float

    @property
    def tag(self) -> str:
        return self.reference.rsplit(":", 1)[1]

    def run(self, *command: str, volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """``command`` in a fresh container of the image (buildah run), as its default user."""
        container = buildah("from", "--pull=never", self.reference).strip()
        try:
            mounts = [f"--volume={volume}" for volume in volumes]
            return subprocess.run(
                [
                    *buildah_command(),
                    "run",
                    "--isolation=chroot",
                    *mounts,
                    container,
                    "--",
                    *command,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            buildah("rm", container)

    def export(self, path: Path) -> Path:
        """A docker-archive of the image, as ``ctr images import`` reads it."""
        path.unlink(missing_ok=True)
        buildah("push", "--quiet", self.reference, f"docker-archive:{path}:{self.reference}")
        return path


@functools.cache
def gpuguard_image() -> Image:
    """The Dockerfile built with ``make image`` on the Debian base, once per test run."""
    reference = f"{IMAGE_REPOSITORY}:{chart_app_version()}"
    started = time.monotonic()
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "image",
            f"IMAGE={reference}",
            f"IMAGE_BASE={BASE_IMAGE}",
            f"BUILDAH={' '.join(buildah_command())}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"make image failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return Image(reference, time.monotonic() - started)


def chart_app_version() -> str:
    chart = yaml.safe_load((REPO / "deploy/helm/gpuguard/Chart.yaml").read_text())
    return str(chart["appVersion"])
