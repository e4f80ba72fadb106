"""RDMA port records, and reading them from ``/sys/class/infiniband``.

Both InfiniBand HCAs (mlx5) and AWS EFA devices appear there, with the same layout::

    <dev>/hca_type                      adapter model, e.g. MT4129 (absent on some drivers)
    <dev>/hw_counters/*                 device-scope driver counters (EFA: cmds_err, ...)
    <dev>/ports/<n>/state               "4: ACTIVE"
    <dev>/ports/<n>/phys_state          "5: LinkUp"
    <dev>/ports/<n>/rate                "400 Gb/sec (4X NDR)"
    <dev>/ports/<n>/link_layer          "InfiniBand" | "Ethernet" | "Unknown" (EFA)
    <dev>/ports/<n>/counters/*          IB PMA error and traffic counters
    <dev>/ports/<n>/hw_counters/*       driver counters (EFA rx_drops, mlx5 out_of_buffer, ...)

A file that cannot be read becomes ``None`` plus a note (the kernel answers EINVAL for some
counters and for the rate of a port without a link); a state or rate that is present but
not in the kernel's format is a :class:`ParseError`, because then we are not reading sysfs.
The check reads only the counters it judges (:class:`CounterNames`): a port has dozens.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuguard.errors import CheckFailed, ParseError

# Port states (include/rdma/ib_verbs.h ``ib_port_state``) as sysfs prints them; ibstat's
# words are mapped onto these by the ibstat parser.
ACTIVE = "ACTIVE"
DOWN = "DOWN"
INIT = "INIT"
ARMED = "ARMED"
ACTIVE_DEFER = "ACTIVE_DEFER"
# Physical states (``ib_port_phys_state``): 1 Sleep, 2 Polling, 3 Disabled,
# 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 "Phy Test" (ibstat: PhyTest).
LINK_UP = "LinkUp"
DISABLED = "Disabled"
POLLING = "Polling"

Counters = dict[str, int | None]


@dataclass(frozen=True)
class PortRecord:
    """One port of one RDMA device, as sysfs or ibstat describes it.

    ``state`` is the upper-case IB port state (``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED``),
    ``phys_state`` the physical state word (``LinkUp``, ``Disabled``, ``Polling``); ``None``
    means the source could not tell, which is never read as good.
    """

    device: str
    port: int
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    link_layer: str | None
    counters: Counters = field(default_factory=dict)
    hw_counters: Counters = field(default_factory=dict)
    device_hw_counters: Counters = field(default_factory=dict)
    # Adapter model (sysfs hca_type, ibstat "CA type"): ports of different models may
    # legitimately run at different rates.
    ca_type: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def link_up(self) -> bool:
        return self.state == ACTIVE and self.phys_state == LINK_UP


_NUMBERED = re.compile(r"(\d+): (\S.*)", re.ASCII)
_RATE = re.compile(r"(\d+(?:\.\d+)?) Gb/sec\b.*", re.ASCII)


def parse_sysfs_state(text: str, what: str) -> str:
    """The word of a numbered sysfs state ("4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp")."""
    match = _NUMBERED.fullmatch(text.strip())
    if not match:
        raise ParseError(f"{what}: expected 'N: NAME', got {text.strip()[:60]!r}")
    return match.group(2).strip()


def parse_sysfs_rate(text: str, what: str) -> float:
    """Gb/s from a sysfs rate ("400 Gb/sec (4X NDR)" -> 400.0)."""
    match = _RATE.fullmatch(text.strip())
    if not match:
        raise ParseError(f"{what}: expected 'N Gb/sec (...)', got {text.strip()[:60]!r}")
    return float(match.group(1))


@dataclass(frozen=True)
class CounterNames:
    """Which counter files to read, by directory; ``None`` reads every file there."""

    port: frozenset[str] | None = None  # <port>/counters
    port_hw: frozenset[str] | None = None  # <port>/hw_counters
    device_hw: frozenset[str] | None = None  # <dev>/hw_counters


EVERY_COUNTER = CounterNames()


def read_infiniband_sysfs(root: Path, names: CounterNames = EVERY_COUNTER) -> list[PortRecord]:
    """Every port of every RDMA device under ``root`` (a copy of /sys/class/infiniband),
    with the counters ``names`` asks for."""
    records: list[PortRecord] = []
    for device_dir in _subdirectories(root):
        records.extend(_read_device(device_dir, names))
    return records


def _read_device(device_dir: Path, names: CounterNames) -> list[PortRecord]:
    device = device_dir.name
    ports_dir = device_dir / "ports"
    port_dirs = _subdirectories(ports_dir) if ports_dir.is_dir() else []
    if not port_dirs:
        # Every RDMA device has at least one port; a device without any is a broken tree.
        raise ParseError(f"{device}: no ports under {ports_dir}")
    notes: list[str] = []
    ca_type = _read_optional(device_dir / "hca_type", notes)
    device_hw_counters = _read_counters(device_dir / "hw_counters", notes, names.device_hw)
    return [
        _read_port(device, port_dir, ca_type, device_hw_counters, list(notes), names)
        for port_dir in port_dirs
    ]


def _read_port(
    device: str,
    port_dir: Path,
    ca_type: str | None,
    device_hw_counters: Counters,
    notes: list[str],
    names: CounterNames,
) -> PortRecord:
    if not is_decimal(port_dir.name):
        raise ParseError(f"{device}: port directory {port_dir.name!r} is not a port number")
    what = f"{device}/{port_dir.name}"
    state_text = _read_optional(port_dir / "state", notes)
    phys_text = _read_optional(port_dir / "phys_state", notes)
    rate_text = _read_optional(port_dir / "rate", notes)
    return PortRecord(
        device=device,
        port=int(port_dir.name),
        state=None if state_text is None else parse_sysfs_state(state_text, f"{what} state"),
        phys_state=None
        if phys_text is None
        else parse_sysfs_state(phys_text, f"{what} phys_state"),
        rate_gbps=None if rate_text is None else parse_sysfs_rate(rate_text, f"{what} rate"),
        link_layer=_read_optional(port_dir / "link_layer", notes),
        counters=_read_counters(port_dir / "counters", notes, names.port),
        hw_counters=_read_counters(port_dir / "hw_counters", notes, names.port_hw),
        device_hw_counters=device_hw_counters,
        ca_type=ca_type,
        notes=tuple(notes),
    )


def _read_counters(directory: Path, notes: list[str], wanted: frozenset[str] | None) -> Counters:
    """Counter files by name (those ``wanted``, or all); absent directory -> no counters
    (EFA has no PMA counters)."""
    if wanted is not None and not wanted:
        return {}
    if not directory.is_dir():
        return {}
    counters: Counters = {}
    for name in _names(directory, os.DirEntry.is_file, wanted):
        path = directory / name
        text = _read_optional(path, notes)
        if text is not None and not is_decimal(text):
            notes.append(f"{path}: not a counter value: {text[:40]!r}")
            text = None
        counters[path.name] = None if text is None else int(text)
    return counters


def _read_optional(path: Path, notes: list[str]) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace").strip()
    except OSError as exc:
        notes.append(f"{path}: unreadable: {exc.strerror or exc}")
        return None


def _subdirectories(directory: Path) -> list[Path]:
    return [directory / name for name in _names(directory, os.DirEntry.is_dir)]


def _names(
    directory: Path,
    kind: Callable[[os.DirEntry[str]], bool],
    wanted: frozenset[str] | None = None,
) -> list[str]:
    """The names of the entries of ``kind`` (and ``wanted``), in natural order. The kind
    comes with the listing: no stat per entry, but for symbolic links (/sys/class/infiniband
    holds links to the devices)."""
    try:
        with os.scandir(directory) as entries:
            names = [
                entry.name
                for entry in entries
                if (wanted is None or entry.name in wanted) and kind(entry)
            ]
    except OSError as exc:
        raise CheckFailed(f"{directory}: cannot list: {exc.strerror or exc}") from None
    return sorted(names, key=natural_key)


def is_decimal(text: str) -> bool:
    """True for a plain ASCII decimal number of at most 20 digits (a 64-bit counter).

    ``str.isdigit`` alone also accepts "²", and ``int`` refuses over 4300 digits.
    """
    return text.isascii() and text.isdigit() and len(text) <= 20


def natural_key(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that puts mlx5_2 before mlx5_10."""
    return tuple(
        (int(part), "") if is_decimal(part) else (-1, part) for part in re.split(r"(\d+)", name)
    )
