"""Capture a node's raw diagnostics into a bundle directory for offline triage.

The layout is what :class:`gpuguard.sources.BundleSources` reads: one file per
:class:`~gpuguard.sources.Artifact`, ``dcgmi-diag.exitcode``, and ``sysfs/`` (plus
``sysfs-later/``, a second counter sample) mirroring ``/sys/class/infiniband``, and
``in-job/``, the jobs' verdicts (a bundle
made by hand may copy all of ``/sys`` instead: see
:func:`gpuguard.sources.locate_infiniband_copy`). Nothing
that fails to collect stops the rest; ``manifest.json`` says what was captured and why
anything was not.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpuguard.config import Config
from gpuguard.errors import CheckError, ConfigError
from gpuguard.sources import Artifact, LiveSources
from gpuguard.training.verdicts import SUFFIX as VERDICT_SUFFIX

# What is copied from each RDMA device and port: small text files only.
_DEVICE_FILES = ("hca_type", "fw_ver", "board_id", "node_guid", "node_type")
_PORT_FILES = ("state", "phys_state", "rate", "link_layer", "lid")
_COUNTER_DIRS = ("counters", "hw_counters")


def collect(
    target: Path, config: Config, progress: Callable[[str], None] = lambda _: None
) -> dict[str, str]:
    """Capture everything the live node offers into ``target``; returns the manifest."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / ".gpuguard-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write the bundle there: {exc.strerror}") from None
    sources = LiveSources(config)
    manifest: dict[str, str] = {}
    for artifact in Artifact:
        progress(f"collecting {artifact.value}")
        try:
            output = sources.read(artifact, config.timeout_for(_check_of(artifact)))
        except CheckError as exc:
            manifest[artifact.value] = f"not collected: {exc}"
            continue
        (target / artifact.value).write_text(output.text)
        if artifact is Artifact.DCGMI_DIAG:
            (target / "dcgmi-diag.exitcode").write_text(f"{output.exit_code}\n")
        manifest[artifact.value] = f"from {output.origin} (exit {output.exit_code})"
    root = config.infiniband_sysfs
    if root.is_dir():
        progress("copying RDMA sysfs (two samples)")
        copy_infiniband_sysfs(root, target / "sysfs")
        time.sleep(config.counter_sample_interval_s)
        copy_infiniband_sysfs(root, target / "sysfs-later")
        manifest["sysfs"] = (
            f"from {root}, second sample after {config.counter_sample_interval_s:g}s"
        )
    else:
        manifest["sysfs"] = f"not collected: {root} does not exist"
    manifest["in-job"] = _copy_verdicts(config.in_job.directory, target / "in-job")
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _copy_verdicts(source: Path | None, target: Path) -> str:
    """The jobs' verdict files as they are (a garbled one too: the check reports it)."""
    if source is None or not source.is_dir():
        return f"not collected: {source} is not a directory"
    names = sorted(p.name for p in source.glob(f"*{VERDICT_SUFFIX}") if not p.name.startswith("."))
    _copy_files(source, target, tuple(names))
    return f"from {source}: {len(names)} verdict files"


def copy_infiniband_sysfs(root: Path, target: Path) -> None:
    """Copy the readable state and counter files of every RDMA device and port."""
    if target.exists():
        shutil.rmtree(target)
    for device in sorted(root.iterdir()):
        _copy_files(device, target / device.name, _DEVICE_FILES)
        _copy_dir(device / "hw_counters", target / device.name / "hw_counters")
        ports = device / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir()):
            port_target = target / device.name / "ports" / port.name
            _copy_files(port, port_target, _PORT_FILES)
            for counters in _COUNTER_DIRS:
                _copy_dir(port / counters, port_target / counters)


def _copy_files(source: Path, target: Path, names: tuple[str, ...]) -> None:
    for name in names:
        _copy_one(source / name, target / name)


def _copy_dir(source: Path, target: Path) -> None:
    if source.is_dir():
        for entry in sorted(source.iterdir()):
            _copy_one(entry, target / entry.name)


def _copy_one(source: Path, target: Path) -> None:
    try:
        text = source.read_text()
    except OSError:
        return  # some counters are unreadable without privileges, or not files at all
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _check_of(artifact: Artifact) -> str:
    """The check whose timeout applies to collecting an artifact."""
    if artifact in (Artifact.NVIDIA_SMI_XML, Artifact.NVIDIA_SMI_TEXT):
        return "nvidia-smi"
    if artifact in (Artifact.DCGMI_HEALTH, Artifact.DCGMI_DIAG):
        return "dcgm"
    if artifact is Artifact.DCGM_METRICS:
        return "dcgm-exporter"
    if artifact is Artifact.IBSTAT:
        return "network"
    return "kernel-log"
