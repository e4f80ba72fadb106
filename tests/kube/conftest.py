"""Session fixture: one real etcd + kube-apiserver for every Kubernetes test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.controlplane import ControlPlane, testenv_bin


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(Path(tmp_path_factory.mktemp("controlplane")), testenv_bin())
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
