"""Which RDMA ports form the fabric a node's jobs use, and which are left alone.

Not every RDMA port under ``/sys/class/infiniband`` is part of the fabric: a node's
front-end Ethernet NICs appear too, often administratively down. Each port gets a role
here before the network check judges it; only fabric ports are judged, and a port outside
the fabric never gets a finding that asks for an action.

Roles, in order: ``network.devices.exclude`` takes a device out; ``network.devices.include``,
when set, makes exactly its devices the fabric. Otherwise they are inferred:

- InfiniBand and EFA ports are fabric.
- Ethernet ports beside InfiniBand or EFA ports are the front end, unless
  ``network.expected.Ethernet`` is set (then they are judged as on an all-Ethernet node).
- On an all-Ethernet node (RoCE) the fabric's adapter model is the one most ports that
  want a link have (LinkUp or Polling; a Disabled port is an administrator's choice and
  never fabric by default); ports of other models are front-end NICs. With
  ``network.expected.Ethernet.ports`` = N, the N fastest ports of that model are the
  fabric (a port without a link fills a missing place). Without N, a port of that model
  is fabric when it runs at half the fabric rate or more (the expected rate, else the
  model's fastest port): a link that lost one step still shows half its rate. One that
  runs slower, or wants a link and has none, is a *candidate*: a same-model front end or
  unused port, or a fabric link that lost most of its lanes or its cable; it is warned
  about and never repaired until N or ``network.devices`` says which. When no port of
  the fabric's model has a link at all and the configuration expects a fabric (an
  adapter count, a rate or a port count), unused spares cannot explain it: those ports
  are fabric and judged.
- A port whose link layer cannot be read is judged (fail closed) and changes no other
  port's role.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpuguard.checks.network.sysfs import DISABLED, LINK_UP, PortRecord, natural_key
from gpuguard.config import LinkLayer, NetworkConfig

INFINIBAND: LinkLayer = "InfiniBand"
ETHERNET: LinkLayer = "Ethernet"
EFA: LinkLayer = "EFA"


class Role(StrEnum):
    """What a port is to this check: judged (fabric), or left alone."""

    FABRIC = "fabric"
    # On a RoCE node without a configured port count: a port of the fabric's adapter model
    # that wants a link and has none (Polling: no cable, or a dead one). A lost fabric link,
    # or a port left unused (the second port of a dual-port card): warned about, never
    # repaired, until network.expected.Ethernet.ports or network.devices says which. A
    # Disabled port is an administrator's choice, not a candidate.
    CANDIDATE = "fabric candidate"
    FRONT_END = "front-end"
    EXCLUDED = "excluded"


@dataclass(frozen=True)
class PortRole:
    role: Role
    why: str

    @property
    def fabric(self) -> bool:
        return self.role is Role.FABRIC


def link_layer_of(port: PortRecord) -> LinkLayer:
    """InfiniBand, Ethernet (RoCE), or EFA for anything else (EFA's sysfs says "Unknown")."""
    if port.link_layer == INFINIBAND:
        return INFINIBAND
    if port.link_layer == ETHERNET:
        return ETHERNET
    return EFA


def in_scope(device: str, network: NetworkConfig) -> bool:
    """False for a device ``network.devices`` leaves out: neither judged nor counted."""
    patterns = network.devices
    if any(fnmatch.fnmatchcase(device, pattern) for pattern in patterns.exclude):
        return False
    return patterns.include is None or any(
        fnmatch.fnmatchcase(device, pattern) for pattern in patterns.include
    )


def assign_roles(
    ports: Sequence[PortRecord],
    network: NetworkConfig,
    link_gbps: float | None,
    *,
    fabric_expected: bool = False,
) -> dict[str, PortRole]:
    """Each port's role, by port name (see the module docstring for the rules).

    ``fabric_expected``: the configuration says the node has an RDMA fabric (an expected
    adapter count, rate or port count), so a node none of whose ports has a link is broken
    rather than simply not cabled.
    """
    roles: dict[str, PortRole] = {}
    inferred: list[PortRecord] = []
    for port in ports:
        if not in_scope(port.device, network):
            roles[port.name] = PortRole(Role.EXCLUDED, "left out by network.devices")
        elif network.devices.include is not None:
            roles[port.name] = PortRole(Role.FABRIC, "in network.devices.include")
        else:
            inferred.append(port)
    ethernet = [port for port in inferred if link_layer_of(port) == ETHERNET]
    for port in inferred:
        if port.link_layer is None:  # unreadable: judged (fail closed), and it decides nothing
            roles[port.name] = PortRole(Role.FABRIC, "link layer unreadable")
        elif link_layer_of(port) != ETHERNET:
            roles[port.name] = PortRole(Role.FABRIC, f"{link_layer_of(port)} port")
    beside = [p for p in inferred if p.link_layer is not None and link_layer_of(p) != ETHERNET]
    if beside and ETHERNET not in network.expected:
        front_end = PortRole(Role.FRONT_END, "Ethernet beside InfiniBand/EFA: the front end")
        roles.update((port.name, front_end) for port in ethernet)
    else:
        expected = network.expected.get(ETHERNET)
        gbps = expected.gbps if expected and expected.gbps is not None else link_gbps
        count = expected.ports if expected else None
        roles.update(_roce_roles(ethernet, gbps, count, fabric_expected or link_gbps is not None))
    return roles


def _roce_roles(
    ports: Sequence[PortRecord], gbps: float | None, count: int | None, fabric_expected: bool
) -> dict[str, PortRole]:
    roles: dict[str, PortRole] = {}
    in_use = [p for p in ports if p.phys_state in (LINK_UP, None) or p.state is None]
    idle = [p for p in ports if p not in in_use]
    unplugged = [p for p in idle if p.phys_state != DISABLED]
    if not in_use and not unplugged:
        return {p.name: PortRole(Role.FRONT_END, "administratively Disabled") for p in ports}
    # The fabric's model: the one most ports that want a link have (a Disabled port does not).
    model = _majority_model([*in_use, *unplugged])
    linked = any(p.ca_type == model for p in in_use)
    for port in idle:
        if port.phys_state == DISABLED:
            roles[port.name] = PortRole(Role.FRONT_END, "administratively Disabled")
        elif port.ca_type == model and not linked and fabric_expected:
            # A fabric is expected and no port of its model has a link: unused spares
            # cannot explain that (a node without RDMA cabling, and no expectation, can).
            why = f"no {model} port of the node has a link"
            roles[port.name] = PortRole(Role.FABRIC, why)
        elif port.ca_type == model and count is None:
            why = f"{port.phys_state} port of the RoCE fabric's model {model}"
            roles[port.name] = PortRole(Role.CANDIDATE, why)
        else:
            roles[port.name] = PortRole(Role.FRONT_END, "no link, not of the fabric's model")
    if not in_use:
        return roles
    same = [p for p in in_use if p.ca_type == model]
    for port in in_use:
        if port.ca_type != model:
            why = f"adapter model {port.ca_type}, the RoCE fabric's is {model}"
            roles[port.name] = PortRole(Role.FRONT_END, why)
    if count is not None:
        ranked = sorted(same, key=lambda p: (-_rate_or_inf(p), natural_key(p.name)))
        # Short of N in use: a same-model port without a link is likely a missing one.
        spare = [p for p in idle if p.ca_type == model and p.phys_state != DISABLED]
        for index, port in enumerate([*ranked, *spare]):
            if index < count:
                why = f"one of the {count} fastest {model} ports (the expected RoCE fabric)"
                roles[port.name] = PortRole(Role.FABRIC, why)
            elif port in ranked:
                why = f"slower than the {count} expected RoCE fabric ports"
                roles[port.name] = PortRole(Role.FRONT_END, why)
        return roles
    reference = gbps if gbps is not None else max((_rate_or_zero(p) for p in same), default=0.0)
    for port in same:
        if port.rate_gbps is None or port.rate_gbps >= reference / 2:
            roles[port.name] = PortRole(Role.FABRIC, f"RoCE port of the fabric's model {model}")
        else:
            why = (
                f"{port.rate_gbps:g} Gb/s, under half the fabric's {reference:g}: a front-end"
                " port of the same model or a fabric link that lost most of its lanes"
            )
            roles[port.name] = PortRole(Role.CANDIDATE, why)
    return roles


def _majority_model(ports: Sequence[PortRecord]) -> str | None:
    """The adapter model most ports have; a tie goes to the faster, then the first named."""
    counts = Counter(port.ca_type for port in ports)
    peak: dict[str | None, float] = {}
    for port in ports:
        peak[port.ca_type] = max(peak.get(port.ca_type, 0.0), _rate_or_zero(port))
    return min(counts, key=lambda model: (-counts[model], -peak[model], str(model)))


def _rate_or_zero(port: PortRecord) -> float:
    return 0.0 if port.rate_gbps is None else port.rate_gbps


def _rate_or_inf(port: PortRecord) -> float:
    return float("inf") if port.rate_gbps is None else port.rate_gbps
