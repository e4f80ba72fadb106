"""An OCI registry on loopback: Debian's docker-registry (the CNCF Distribution registry,
installed by hack/node-env), plain HTTP on 127.0.0.1, storage under the test's directory.
It serves the gpuguard image the node pulls and the chart as an OCI artifact."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tests.support.controlplane import Component, free_port, terminate

BINARY = "/usr/bin/docker-registry"
READY_TIMEOUT_S = 20.0


class Registry(Component):
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.workdir / "registry.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}},
                    "http": {"addr": self.host},
                }
            )
        )
        with (self.workdir / "registry.log").open("wb") as log:
            self._proc = subprocess.Popen(
                [BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.workdir / "registry.log").read_text(errors="replace")
                raise RuntimeError(f"the registry did not start:\n{log_text[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        terminate(self._proc)

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def containerd_hosts(self, certs_dir: Path) -> None:
        """Tell a containerd whose CRI ``config_path`` is ``certs_dir`` to pull from this
        registry over plain HTTP."""
        hosts = certs_dir / self.host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(
            f'server = "http://{self.host}"\n\n'
            f'[host."http://{self.host}"]\n  capabilities = ["pull", "resolve"]\n'
        )
