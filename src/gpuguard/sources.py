"""Where checks get their raw text: the live node, or a captured bundle directory.

This is the seam that keeps checks pure: a check asks for an :class:`Artifact` and parses
what comes back, without knowing whether a tool ran or a file was read. Tests point it at a
bundle of real captured outputs, or put fake tools first on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from gpuguard.clock import SYSTEM_CLOCK
from gpuguard.config import Config
from gpuguard.errors import CheckFailed, CheckTimedOut, ParseError, ToolMissing

# Re-exported: checks and tests know them as gpuguard.sources' own.
from gpuguard.tool_process import MAX_OUTPUT_BYTES as MAX_OUTPUT_BYTES
from gpuguard.tool_process import ToolOutput as ToolOutput
from gpuguard.tool_process import run_tool as run_tool


class Artifact(StrEnum):
    """A raw diagnostic output; the value is its file name inside a bundle."""

    NVIDIA_SMI_XML = "nvidia-smi.xml"
    NVIDIA_SMI_TEXT = "nvidia-smi.txt"
    KERNEL_LOG = "kmsg.log"
    DCGMI_HEALTH = "dcgmi-health.json"
    DCGMI_DIAG = "dcgmi-diag.json"
    DCGM_METRICS = "dcgm-metrics.prom"
    IBSTAT = "ibstat.txt"


class Sources(Protocol):
    """Gives checks their raw inputs. ``live`` is False for an offline bundle."""

    live: bool

    def read(self, artifact: Artifact, timeout_s: float) -> ToolOutput:
        """The artifact's text; raises ToolMissing, CheckTimedOut or CheckFailed."""
        ...

    def infiniband_root(self) -> Path:
        """The directory that mirrors ``/sys/class/infiniband``."""
        ...

    def infiniband_root_later(self) -> Path | None:
        """A second counter sample taken after the first (None: none available)."""
        ...

    def boot_id(self) -> str:
        """Identifies the current boot: kernel-log findings hold until it changes."""
        ...

    def in_job_root(self) -> Path | None:
        """Where the jobs' verdicts are (None: not read)."""
        ...


class LiveSources:
    """Runs the node's own tools (found on PATH, or where the config says)."""

    live = True

    def __init__(self, config: Config) -> None:
        self._config = config

    def tool(self, name: str) -> str:
        path = self._config.tools.get(name) or shutil.which(name)
        if not path:
            raise ToolMissing(f"{name}: not found on PATH")
        return path

    def read(self, artifact: Artifact, timeout_s: float) -> ToolOutput:
        match artifact:
            case Artifact.NVIDIA_SMI_XML:
                return run_tool([self.tool("nvidia-smi"), "-q", "-x"], timeout_s)
            case Artifact.NVIDIA_SMI_TEXT:
                return run_tool([self.tool("nvidia-smi"), "-q"], timeout_s)
            case Artifact.DCGMI_HEALTH:
                dcgmi = self.tool("dcgmi")
                # Watches must be set before a health query reports anything; both calls
                # share the one time budget.
                started = SYSTEM_CLOCK.monotonic()
                run_tool([dcgmi, "health", "-s", "a"], timeout_s)
                remaining = max(0.1, timeout_s - (SYSTEM_CLOCK.monotonic() - started))
                return run_tool([dcgmi, "health", "-c", "-j"], remaining)
            case Artifact.DCGMI_DIAG:
                level = self._config.dcgm_diag_level
                if level is None:
                    raise ToolMissing("dcgmi diag: not enabled (set dcgm_diag_level)")
                return run_tool([self.tool("dcgmi"), "diag", "-r", str(level), "-j"], timeout_s)
            case Artifact.DCGM_METRICS:
                return self._fetch_metrics(timeout_s)
            case Artifact.KERNEL_LOG:
                return self._kernel_log(timeout_s)
            case Artifact.IBSTAT:
                return run_tool([self.tool("ibstat")], timeout_s)
        raise ToolMissing(f"{artifact}: no live source")  # pragma: no cover

    def infiniband_root(self) -> Path:
        return self._config.infiniband_sysfs

    def infiniband_root_later(self) -> Path | None:
        return None

    def in_job_root(self) -> Path | None:
        return self._config.in_job.directory

    def boot_id(self) -> str:
        try:
            return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return "unknown"

    def _fetch_metrics(self, timeout_s: float) -> ToolOutput:
        url = self._config.dcgm_exporter_url
        if not url:
            raise ToolMissing("dcgm-exporter: no URL configured (dcgm_exporter_url)")
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                body: bytes = response.read(MAX_OUTPUT_BYTES + 1)
        except TimeoutError:
            raise CheckTimedOut(f"{url}: no answer after {timeout_s:g}s") from None
        except (urllib.error.URLError, OSError) as exc:
            raise CheckFailed(f"{url}: {exc}") from None
        if len(body) > MAX_OUTPUT_BYTES:
            raise CheckFailed(f"{url}: answer too large (over {MAX_OUTPUT_BYTES // 2**20} MiB)")
        return ToolOutput(body.decode("utf-8", errors="replace"), 0, url)

    def _kernel_log(self, timeout_s: float) -> ToolOutput:
        methods = kernel_log_methods(self._config.kernel_log, follow=False)
        if methods is None:
            return read_file(Path(self._config.kernel_log))
        attempts: list[str] = []
        for method in methods:
            try:
                if method == "kmsg":
                    return read_kmsg_snapshot(KMSG)
                if method == "journalctl":
                    # The newest lines of a long boot, within the output cap.
                    argv = [self.tool("journalctl"), "-k", "-b", "-n", "20000", "--no-pager", "-q"]
                else:
                    argv = [self.tool("dmesg"), "--time-format=iso"]
                output = run_tool(argv, timeout_s)
                if output.exit_code != 0:
                    raise CheckFailed(f"{output.origin} exited {output.exit_code}")
                return output
            except (ToolMissing, CheckFailed) as exc:
                attempts.append(str(exc))
        raise CheckFailed("kernel log unreadable: " + "; ".join(attempts))


# The kernel log's sources, in the order ``auto`` tries them. dmesg prints the ring buffer
# and exits: it gives a snapshot (``gpuguard check``) but cannot be followed (the agent).
KERNEL_LOG_METHODS = ("kmsg", "journalctl", "dmesg")
FOLLOWABLE_METHODS = ("kmsg", "journalctl")
KMSG = Path("/dev/kmsg")
KMSG_RECORD_BYTES = 8192  # more than the kernel's longest record


def kernel_log_methods(choice: str, *, follow: bool) -> tuple[str, ...] | None:
    """The methods a ``kernel_log`` setting means, in the order to try them; None when it
    names a file. A method that cannot be followed is a ValueError when ``follow``."""
    if choice == "auto":
        return FOLLOWABLE_METHODS if follow else KERNEL_LOG_METHODS
    if choice not in KERNEL_LOG_METHODS:
        return None
    if follow and choice not in FOLLOWABLE_METHODS:
        others = " or ".join(FOLLOWABLE_METHODS)
        raise ValueError(f"kernel_log: {choice} cannot be followed; use auto, {others}")
    return (choice,)


def drain_kmsg(fd: int) -> list[bytes]:
    """Every record a non-blocking ``/dev/kmsg`` descriptor holds now, oldest first."""
    records: list[bytes] = []
    while True:
        try:
            record = os.read(fd, KMSG_RECORD_BYTES)
        except BlockingIOError:
            return records
        except BrokenPipeError:
            continue  # the ring buffer overwrote records we had not read yet
        if not record:
            return records
        records.append(record)


def kmsg_message(record: bytes) -> str:
    """A record's message line: "prio,seq,usec,flags;message" (the " KEY=value" lines
    after it are dropped)."""
    return record.decode("utf-8", errors="replace").split("\n", 1)[0]


def read_kmsg_snapshot(path: Path) -> ToolOutput:
    """Everything currently in the kernel ring buffer, read without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ToolMissing(f"{path}: not present") from None
    except OSError as exc:
        raise CheckFailed(f"{path}: cannot open: {exc.strerror}") from None
    try:
        records = drain_kmsg(fd)
    finally:
        os.close(fd)
    text = b"".join(records).decode("utf-8", errors="replace")
    return ToolOutput(text, 0, str(path))


def read_file(path: Path) -> ToolOutput:
    try:
        return ToolOutput(path.read_text(errors="replace"), 0, str(path))
    except FileNotFoundError:
        raise ToolMissing(f"{path}: no such file") from None
    except OSError as exc:
        raise CheckFailed(f"{path}: cannot read: {exc.strerror}") from None


class BundleSources:
    """Reads a captured bundle directory (see docs/bundles.md for the layout)."""

    live = False

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, artifact: Artifact, timeout_s: float) -> ToolOutput:
        if artifact is Artifact.KERNEL_LOG and not (self.root / artifact.value).exists():
            artifact_path = self.root / "dmesg.log"
        else:
            artifact_path = self.root / artifact.value
        output = read_file(artifact_path)
        if artifact is Artifact.DCGMI_DIAG:
            output = ToolOutput(output.text, _recorded_exit_code(self.root), output.origin)
        return output

    def infiniband_root(self) -> Path:
        return locate_infiniband_copy(self.root / "sysfs")

    def in_job_root(self) -> Path | None:
        return self.root / "in-job"

    def infiniband_root_later(self) -> Path | None:
        later = locate_infiniband_copy(self.root / "sysfs-later")
        return later if later.is_dir() else None

    def boot_id(self) -> str:
        path = self.root / "boot_id"
        return path.read_text().strip() if path.exists() else f"bundle:{self.root.resolve()}"

    def kernel_log_path(self) -> Path:
        kmsg = self.root / Artifact.KERNEL_LOG.value
        return (
            kmsg
            if kmsg.exists() or not (self.root / "dmesg.log").exists()
            else self.root / "dmesg.log"
        )


def locate_infiniband_copy(copy: Path) -> Path:
    """Where a bundle's copy of ``/sys/class/infiniband`` is, in either layout.

    ``copy`` may mirror ``/sys/class/infiniband`` itself (``<device>/ports/<n>/``, what
    ``gpuguard bundle collect`` writes) or the whole of ``/sys`` (``class/infiniband/``
    inside). A missing ``copy``, or a copy of ``/sys`` without ``class/infiniband``, gives a
    path that does not exist: the bundle has no RDMA sysfs, and ibstat is read instead. A
    directory that is neither layout is a :class:`ParseError` naming it, never a device
    called ``class``.
    """
    if not copy.is_dir():
        return copy
    nested = copy / "class" / "infiniband"
    if nested.is_dir() or (copy / "class").is_dir():
        return nested
    entries = sorted(p.name for p in copy.iterdir())
    if not entries or any((copy / name / "ports").is_dir() for name in entries):
        return copy
    shown = ", ".join(entries[:8]) + (", ..." if len(entries) > 8 else "")
    raise ParseError(
        f"{copy}: neither a copy of /sys/class/infiniband (no <device>/ports/ in it) nor of"
        f" /sys (no class/infiniband/ in it); it holds: {shown}"
    )


def _recorded_exit_code(root: Path) -> int:
    path = root / "dcgmi-diag.exitcode"
    if not path.exists():
        return 0
    text = path.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise CheckFailed(f"{path}: not an exit code: {text[:40]!r}") from None
