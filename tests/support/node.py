"""A real node for the chart tests: containerd, runc and the kubelet on loopback, and the
gpuguard image built from the Dockerfile.

``hack/node-env`` installs the Debian packages and builds the base and pause images once;
``hack/testenv`` builds the kubelet. Pods must use ``hostNetwork``: the test machines carry
test traffic on loopback only, so there is no pod network. The kubelet will not take a
loopback node IP, so the Node's address is patched to 127.0.0.1 once it registers (the
API server then reaches the kubelet there for logs and exec).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.controlplane import REPO, Component, ControlPlane, free_port, terminate

BASE_IMAGE = "localhost/debian-python:3.11-bookworm"  # hack/node-env's python:3.11-slim
IMAGE_REPOSITORY = "localhost/gpuguard"
READY_TIMEOUT_S = 90
CNI_BIN = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"
LOOPBACK_CNI = '{"cniVersion": "1.0.0", "name": "loopback", "plugins": [{"type": "loopback"}]}'


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
    buildah("rmi", "--prune")  # the last run's image, untagged now: ~110 MB a run otherwise
    return Image(reference, time.monotonic() - started)


def chart_app_version() -> str:
    chart = yaml.safe_load((REPO / "deploy/helm/gpuguard/Chart.yaml").read_text())
    return str(chart["appVersion"])


class RealNode(Component):
    """containerd and the kubelet under ``workdir`` (logs there too), registered with
    ``plane`` as ``name``; ``stop`` ends both and every container they started."""

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        bin_dir: Path,
        name: str = "gpu-node",
        labels: dict[str, str] | None = None,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.bin = bin_dir
        self.name = name
        self.labels = labels or {}
        self.socket = workdir / "containerd" / "containerd.sock"
        self.kubelet_port = free_port()
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        env = node_env()
        self._start_containerd()
        self.import_image(env / "pause.tar")
        self._start_kubelet()
        self._wait_registered()
        # The only address: a Hostname entry would make the API server resolve the name.
        self.plane.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
            "application/merge-patch+json",
        )
        self._wait_ready()

    def stop(self) -> None:
        terminate(self._kubelet)
        self._kubelet = None
        if self._containerd is not None and self._containerd.poll() is None:
            self._remove_containers()
        terminate(self._containerd)
        self._containerd = None
        self._unmount_all()
        _remove_cgroups()

    def check_running(self) -> None:
        """Raise, naming its log, if containerd or the kubelet has exited."""
        for name, proc in (("containerd", self._containerd), ("kubelet", self._kubelet)):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.log(name)}")

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def ctr(self, *args: str) -> str:
        proc = subprocess.run(
            ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed:\n{proc.stderr}")
        return proc.stdout

    def import_image(self, archive: Path) -> None:
        """Make an image available to the kubelet without a registry (pull policy Never or
        IfNotPresent)."""
        self.ctr("images", "import", str(archive))

    # --- containerd ------------------------------------------------------------------
    @property
    def registry_hosts(self) -> Path:
        """containerd's registry host configuration (its CRI ``config_path``)."""
        return self.workdir / "containerd" / "certs.d"

    def _start_containerd(self) -> None:
        root = self.workdir / "containerd"
        (root / "cni").mkdir(parents=True, exist_ok=True)
        # containerd reports the node's network ready only with some CNI config; the
        # pods use the host's network, so the loopback plugin is all it needs.
        (root / "cni" / "10-loopback.conflist").write_text(LOOPBACK_CNI)
        config = root / "config.toml"
        config.write_text(_containerd_config(root))
        self._containerd = _spawn(["containerd", f"--config={config}"], self.log("containerd"))
        self._wait(lambda: self.socket.exists() and self._answers(), "containerd's socket")

    def _answers(self) -> bool:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.ctr("version")
            return True
        return False

    def _remove_containers(self) -> None:
        """Kill what the kubelet left running: the shims outlive containerd otherwise."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            for task in self.ctr("tasks", "list", "--quiet").split():
                with contextlib.suppress(RuntimeError):
                    self.ctr("tasks", "kill", "--signal=SIGKILL", task)
            deadline = time.monotonic() + 20
            for task in self.ctr("tasks", "list", "--quiet").split():
                while time.monotonic() < deadline:
                    try:
                        self.ctr("tasks", "delete", task)
                        break
                    except RuntimeError:
                        time.sleep(0.2)  # still exiting

    def _unmount_all(self) -> None:
        """The kubelet's token volumes and containerd's snapshots, innermost first."""
        prefix = f"{self.workdir}/"
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)

    # --- kubelet ---------------------------------------------------------------------
    def _start_kubelet(self) -> None:
        root = self.workdir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.client_kubeconfig(f"system:node:{self.name}")
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(root)))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        self._kubelet = _spawn(
            [
                str(self.bin / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={root / 'root'}",
                f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.name}",
                "--node-ip=127.0.0.1",
                *([f"--node-labels={labels}"] if labels else []),
                "--v=2",
            ],
            self.log("kubelet"),
        )

    def _kubelet_config(self, root: Path) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "readOnlyPort": 0,
            "failSwapOn": False,
            "podLogsDir": str(root / "pod-logs"),
            # Loopback only, and nothing but the test's API server talks to it.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # A shared test machine's disk and memory are not this node's to defend: no
            # eviction and no image garbage collection of the imported images.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "registerNode": True,
        }

    def _wait_registered(self) -> None:
        self._wait(lambda: self._node() is not None, f"Node {self.name} to register")

    def _wait_ready(self) -> None:
        def ready() -> bool:
            node = self._node() or {}
            status = node.get("status", {})
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            addresses = [a["address"] for a in status.get("addresses", [])]
            return conditions.get("Ready") == "True" and addresses == ["127.0.0.1"]

        self._wait(ready, f"Node {self.name} Ready at 127.0.0.1")

    def _node(self) -> dict[str, object] | None:
        try:
            return dict(self.plane.request("GET", f"/api/v1/nodes/{self.name}"))
        except OSError:  # urllib's HTTPError (404 until it registers) is an OSError
            return None

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_running()
            if done():
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"timed out after {READY_TIMEOUT_S}s waiting for {what}; see "
            f"{self.log('kubelet')} and {self.log('containerd')}"
        )


def _remove_cgroups() -> None:
    """The kubelet's kubepods cgroups (v1: one tree per controller), once empty."""
    for tree in Path("/sys/fs/cgroup").glob("*/kubepods"):
        for directory in sorted(tree.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ
        )


def _containerd_config(root: Path) -> str:
    # restrict_oom_score_adj: negative OOM scores need CAP_SYS_RESOURCE, which the test
    # machines withhold (runc fails every sandbox otherwise). runc, not crun: crun refuses
    # their hybrid cgroup layout. The pause image is hack/node-env's.
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"

[grpc]
  address = "{root / "containerd.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:test"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{root / "cni"}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{root / "certs.d"}"
"""
