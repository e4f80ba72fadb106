"""Parse ``ibstat`` (infiniband-diags) output into port records.

The format, one block per adapter::

    CA 'mlx5_0'
    <TAB>CA type: MT4129
    <TAB>Number of ports: 1
    <TAB>Port 1:
    <TAB><TAB>State: Active
    <TAB><TAB>Physical state: LinkUp
    <TAB><TAB>Rate: 400
    <TAB><TAB>Link layer: InfiniBand

When ibstat cannot open one adapter it prints the others, then
``ibpanic: [pid] main: stat of IB device 'mlx5_8' failed: ...`` and exits 255. That line is
returned as :attr:`IbstatPorts.panic` so the caller can report the lost adapter while still
judging the ports that were printed.

Anything else (no CA block, a port without its state or rate, fewer ports than the adapter
announced) raises :class:`ParseError`: a truncated or foreign document is never read as a
healthy node.

``ibstatus`` (the same package's other tool) prints one block per port in sysfs's own
words, and is read too::

    Infiniband device 'mlx5_0' port 1 status:
    <spaces>state:           4: ACTIVE
    <spaces>phys state:      5: LinkUp
    <spaces>rate:            200 Gb/sec (4X HDR)
    <spaces>link_layer:      InfiniBand
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuguard.checks.network.sysfs import (
    PortRecord,
    is_decimal,
    parse_sysfs_rate,
    parse_sysfs_state,
)
from gpuguard.errors import ParseError

_CA_HEADER = re.compile(r"CA '([^']+)'")
_PORT_HEADER = re.compile(r"Port (\d{1,5}):", re.ASCII)
_KEY_VALUE = re.compile(r"([^:]+):\s*(.*)")
_RATE = re.compile(r"\d+(?:\.\d+)?", re.ASCII)
_PANIC_DEVICE = re.compile(r"IB device '([^']+)'")
_IBSTATUS_HEADER = re.compile(r"Infiniband device '([^']+)' port (\d{1,5}) status:", re.ASCII)
_IBSTATUS_FIELDS = ("state", "phys state", "rate", "link_layer")

# ibstat spells port states as words; sysfs uses these upper-case names.
_STATES = {"Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED", "Active": "ACTIVE"}
_REQUIRED_PORT_FIELDS = ("State", "Physical state", "Rate", "Link layer")


@dataclass(frozen=True)
class IbPanic:
    """ibstat gave up: the adapter it names (when it names one) could not be read."""

    device: str | None
    line: str


class IbstatPorts(list[PortRecord]):
    """The ports ibstat printed, plus the ``ibpanic`` it ended with, if any."""

    def __init__(self, ports: Iterable[PortRecord] = (), panic: IbPanic | None = None) -> None:
        super().__init__(ports)
        self.panic = panic


@dataclass
class _Block:
    """One ``CA '...'`` block while it is being read."""

    device: str
    fields: dict[str, str] = field(default_factory=dict)
    ports: dict[int, dict[str, str]] = field(default_factory=dict)
    current_port: int | None = None


def parse_ibstat(text: str) -> IbstatPorts:
    """Port records from ibstat (or ibstatus) output; raises only :class:`ParseError`."""
    if text.lstrip().startswith("Infiniband device '"):
        return parse_ibstatus(text)
    blocks: list[_Block] = []
    panic: IbPanic | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("ibwarn:"):
            continue
        if stripped.startswith("ibpanic:"):
            panic = panic or _panic(stripped)
        elif header := _CA_HEADER.fullmatch(line):
            blocks.append(_Block(header.group(1)))
        elif line[0].isspace() and blocks:
            _add_line(blocks[-1], stripped, number)
        else:
            raise ParseError(f"ibstat line {number}: unexpected {stripped[:60]!r}")
    if not blocks and panic is None:
        raise ParseError("ibstat: no CA blocks")
    _reject_duplicates(blocks)
    return IbstatPorts((port for block in blocks for port in _records(block)), panic)


def _panic(line: str) -> IbPanic:
    device = _PANIC_DEVICE.search(line)
    return IbPanic(device.group(1) if device else None, line)


def _add_line(block: _Block, line: str, number: int) -> None:
    if port := _PORT_HEADER.fullmatch(line):
        port_number = int(port.group(1))
        if port_number in block.ports:
            raise ParseError(f"ibstat line {number}: {block.device} port {port_number} twice")
        block.ports[port_number] = {}
        block.current_port = port_number
        return
    pair = _KEY_VALUE.fullmatch(line)
    if not pair:
        raise ParseError(f"ibstat line {number}: expected 'key: value', got {line[:60]!r}")
    key, value = pair.group(1).strip(), pair.group(2).strip()
    # Adapter fields come first; once a "Port N:" line is seen, fields belong to that port.
    target = block.fields if block.current_port is None else block.ports[block.current_port]
    target[key] = value


def _records(block: _Block) -> list[PortRecord]:
    announced = block.fields.get("Number of ports")
    if announced is not None and not is_decimal(announced):
        raise ParseError(f"ibstat: {block.device}: bad port count {announced[:20]!r}")
    if not block.ports or (announced is not None and int(announced) != len(block.ports)):
        raise ParseError(
            f"ibstat: {block.device}: announced {announced} ports, printed {len(block.ports)}"
            " (truncated?)"
        )
    return [_record(block, number, fields) for number, fields in sorted(block.ports.items())]


def _record(block: _Block, port: int, fields: dict[str, str]) -> PortRecord:
    what = f"ibstat: {block.device} port {port}"
    missing = [name for name in _REQUIRED_PORT_FIELDS if not fields.get(name)]
    if missing:
        raise ParseError(f"{what}: missing {', '.join(missing)} (truncated?)")
    rate = fields["Rate"]
    if not _RATE.fullmatch(rate):
        raise ParseError(f"{what}: rate is not a number: {rate[:20]!r}")
    state = fields["State"]
    return PortRecord(
        device=block.device,
        port=port,
        state=_STATES.get(state, state.upper()),
        phys_state=fields["Physical state"],
        rate_gbps=float(rate),
        link_layer=fields["Link layer"],
        ca_type=block.fields.get("CA type") or None,
    )


def _reject_duplicates(blocks: list[_Block]) -> None:
    seen: set[str] = set()
    for block in blocks:
        if block.device in seen:
            raise ParseError(f"ibstat: CA '{block.device}' printed twice")
        seen.add(block.device)


def parse_ibstatus(text: str) -> IbstatPorts:
    """Port records from ``ibstatus`` output; a block missing a field is a ParseError."""
    blocks: list[tuple[str, int, dict[str, str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped:
            continue
        if header := _IBSTATUS_HEADER.fullmatch(stripped):
            blocks.append((header.group(1), int(header.group(2)), {}))
        elif (pair := _KEY_VALUE.fullmatch(stripped)) and blocks and raw[0].isspace():
            blocks[-1][2][pair.group(1).strip()] = pair.group(2).strip()
        else:
            raise ParseError(f"ibstatus line {number}: unexpected {stripped[:60]!r}")
    if len({(device, port) for device, port, _ in blocks}) != len(blocks):
        raise ParseError("ibstatus: a port printed twice")
    return IbstatPorts(_ibstatus_record(*block) for block in blocks)


def _ibstatus_record(device: str, port: int, fields: dict[str, str]) -> PortRecord:
    what = f"ibstatus: {device} port {port}"
    missing = [name for name in _IBSTATUS_FIELDS if not fields.get(name)]
    if missing:
        raise ParseError(f"{what}: missing {', '.join(missing)} (truncated?)")
    return PortRecord(
        device=device,
        port=port,
        state=parse_sysfs_state(fields["state"], f"{what} state"),
        phys_state=parse_sysfs_state(fields["phys state"], f"{what} phys state"),
        rate_gbps=parse_sysfs_rate(fields["rate"], f"{what} rate"),
        link_layer=fields["link_layer"],
    )
