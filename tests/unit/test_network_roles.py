"""Which RDMA ports form the fabric, and what a port outside it, or one that is off by
administration or waits for the subnet manager, is allowed to ask for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.network.check import NetworkCheck, Role, assign_roles, evaluate_ports
from gpuguard.checks.network.ibstat import parse_ibstat
from gpuguard.checks.network.sysfs import read_infiniband_sysfs
from gpuguard.config import Config, NetworkConfig, load_config
from gpuguard.errors import ConfigError
from gpuguard.model import Action, Finding, Severity, Status
from gpuguard.runner import assess, run_check
from gpuguard.sources import BundleSources
from tests.conftest import read_data
from tests.unit.ib_tree import CX7, h100_tree, ib_node_tree, roce_tree, set_port, write

ROCE_IBSTAT = "ibstat_h100_all_active.txt"  # all Ethernet: 8 x 400 MT4129, 4 x 100 MT4125
IB_IBSTAT = "ibstat_h100_some_ports_down.txt"  # 8 x 400 IB, Ethernet front end, 3 Disabled


def codes(findings: list[Finding]) -> dict[str, set[str]]:
    by_code: dict[str, set[str]] = {}
    for finding in findings:
        by_code.setdefault(finding.code, set()).add(finding.component.id)
    return by_code


def network(**data: object) -> NetworkConfig:
    return NetworkConfig.model_validate(data)


def network_status(bundle: Path, config: Config) -> tuple[Status, list[Finding]]:
    """The network layer's verdict for a bundle, through the runner as the CLI does it."""
    ctx = CheckContext(BundleSources(bundle), config, timeout_s=5.0)
    result = run_check(NetworkCheck(), ctx)
    layer = assess([result], fail_closed=True).layers[NetworkCheck.layer]
    return layer.status, list(result.findings)


def ibstat_with(text: str, device: str, **fields: str) -> str:
    """``text`` with fields of ``device``'s port block changed (``State="Initializing"``)."""
    head, _, rest = text.partition(f"CA '{device}'\n")
    block, sep, tail = rest.partition("CA '")
    for key, value in fields.items():
        name = key.replace("_", " ")
        lines = block.splitlines(keepends=True)
        block = "".join(
            f"\t\t{name}: {value}\n" if line.strip().startswith(f"{name}:") else line
            for line in lines
        )
    return head + f"CA '{device}'\n" + block + sep + tail


# --- InfiniBand node ------------------------------------------------------------------------


def test_ib_node_with_disabled_ethernet_is_healthy(tmp_path: Path) -> None:
    ib_node_tree(tmp_path / "sysfs")
    config = Config(expected_nics=10, expected_link_gbps=400)
    status, findings = network_status(tmp_path, config)
    assert (status, findings) == (Status.HEALTHY, [])


def test_ib_node_ibstat_with_disabled_ethernet_is_healthy(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).parents[1] / "data" / IB_IBSTAT, tmp_path / "ibstat.txt")
    status, findings = network_status(tmp_path, Config(expected_nics=12, expected_link_gbps=400))
    assert (status, findings) == (Status.HEALTHY, [])


def test_ethernet_beside_infiniband_is_front_end_unless_configured(tmp_path: Path) -> None:
    ports = read_infiniband_sysfs(ib_node_tree(tmp_path))
    roles = assign_roles(ports, NetworkConfig(), 400)
    assert {name for name, role in roles.items() if role.role is Role.FRONT_END} == {
        "mlx5_8/1",
        "mlx5_9/1",
    }
    # Listed as fabric by name: judged, and being Disabled is a warning with no action.
    configured = network(devices={"include": ["mlx5_*"]})
    findings = evaluate_ports(ports, None, 400, "sysfs", configured)
    assert codes(findings) == {"PORT_DISABLED": {"mlx5_8/1", "mlx5_9/1"}}
    assert {(f.severity, f.action) for f in findings} == {(Severity.WARNING, Action.NONE)}


def test_expected_ethernet_entry_judges_the_ethernet_beside_infiniband(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)  # mlx5_bond_0: 200GbE BlueField-3 beside two NDR IB ports
    ports = read_infiniband_sysfs(root)
    assert evaluate_ports(ports, None, None, "sysfs", network(expected={"Ethernet": {}})) == []
    set_port(root, "mlx5_bond_0/1", gbps=100)
    ports = read_infiniband_sysfs(root)
    assert evaluate_ports(ports, None, 400, "sysfs") == []
    findings = evaluate_ports(
        ports, None, 400, "sysfs", network(expected={"Ethernet": {"gbps": 200}})
    )
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_bond_0/1"}}


# --- all-Ethernet (RoCE) node ---------------------------------------------------------------


def test_roce_node_with_front_end_and_disabled_port_is_healthy(tmp_path: Path) -> None:
    roce_tree(tmp_path / "sysfs")
    status, findings = network_status(tmp_path, Config(expected_nics=11, expected_link_gbps=400))
    assert (status, findings) == (Status.HEALTHY, [])
    roles = assign_roles(read_infiniband_sysfs(tmp_path / "sysfs"), NetworkConfig(), 400)
    fabric = {name for name, role in roles.items() if role.fabric}
    assert fabric == {f"mlx5_{n}/1" for n in range(8)}
    assert "Disabled" in roles["mlx5_10/1"].why and "MT4125" in roles["mlx5_8/1"].why


def test_roce_fabric_port_at_half_rate_is_caught_on_exactly_that_port(tmp_path: Path) -> None:
    root = roce_tree(tmp_path / "sysfs")
    set_port(root, "mlx5_3/1", gbps=200)
    status, findings = network_status(tmp_path, Config(expected_link_gbps=400))
    assert status is Status.UNHEALTHY
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_3/1"}}
    assert (findings[0].severity, findings[0].action) == (Severity.CRITICAL, Action.REBOOT)


def test_roce_ibstat_real_capture_is_healthy_and_a_half_rate_port_is_caught() -> None:
    text = read_data(ROCE_IBSTAT)
    assert evaluate_ports(parse_ibstat(text), 12, 400, "ibstat") == []
    slow = parse_ibstat(ibstat_with(text, "mlx5_5", Rate="200"))
    findings = evaluate_ports(slow, 12, 400, "ibstat")
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_5/1"}}
    # A front-end port (MT4125) going down is not the fabric's business.
    down = parse_ibstat(ibstat_with(text, "mlx5_1", State="Down", Physical_state="Disabled"))
    assert evaluate_ports(down, 12, 400, "ibstat") == []


def test_roce_without_expected_rate_compares_fabric_peers_only(tmp_path: Path) -> None:
    root = roce_tree(tmp_path)
    assert evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs") == []
    set_port(root, "mlx5_6/1", gbps=200)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_6/1"}}
    assert findings[0].action is Action.NONE


def test_roce_front_end_of_the_same_model_at_lower_rate(tmp_path: Path) -> None:
    # 8 x 400G ConnectX-7 plus a 2 x 100G ConnectX-7 front end: under half the fabric rate,
    # as a fabric link that fell from 4 lanes to 1 would be. Warned, never repaired...
    root = roce_tree(tmp_path, front_end_model=CX7, front_end_gbps=100)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs")
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_8/1", "mlx5_9/1"}}
    assert {(f.severity, f.action) for f in findings} == {(Severity.WARNING, Action.NONE)}
    # ... until the port count says which ports are the fabric.
    eight = network(expected={"Ethernet": {"ports": 8}})
    assert evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs", eight) == []
    set_port(root, "mlx5_2/1", gbps=200)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs", eight)
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_2/1"}}
    assert findings[0].action is Action.REBOOT


def test_roce_same_model_front_end_at_half_rate_needs_the_port_count(tmp_path: Path) -> None:
    root = roce_tree(tmp_path, front_end_model=CX7, front_end_gbps=200)
    ports = read_infiniband_sysfs(root)
    # Indistinguishable from two half-rate fabric ports by the data alone ...
    assert set(codes(evaluate_ports(ports, None, 400, "sysfs"))) == {"LINK_RATE_DEGRADED"}
    # ... the count settles it: the 8 fastest are the fabric.
    eight = network(expected={"Ethernet": {"ports": 8}})
    assert evaluate_ports(ports, None, 400, "sysfs", eight) == []
    set_port(root, "mlx5_4/1", gbps=100)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs", eight)
    # One of the 8 fastest is below 400: caught, though which of the tied ports it is
    # cannot be told (the finding says how it chose; a reboot is for the node anyway).
    assert set(codes(findings)) == {"LINK_RATE_DEGRADED"} and len(findings) == 1
    assert findings[0].action is Action.REBOOT and "8 fastest" in findings[0].evidence


def test_roce_disabled_port_is_never_fabric_by_default(tmp_path: Path) -> None:
    root = roce_tree(tmp_path)
    set_port(root, "mlx5_7/1", state="DOWN", phys_state="Disabled", gbps=40)
    ports = read_infiniband_sysfs(root)
    assert evaluate_ports(ports, None, 400, "sysfs") == []
    # With a port count, the shortfall is reported, but no rung enables a port.
    findings = evaluate_ports(
        ports, None, 400, "sysfs", network(expected={"Ethernet": {"ports": 8}})
    )
    assert codes(findings) == {"FABRIC_PORTS_MISSING": {"node"}}
    assert (findings[0].severity, findings[0].action) == (Severity.WARNING, Action.NONE)
    assert "mlx5_7/1" in findings[0].message


def test_roce_polling_port_is_pulled_in_by_the_port_count(tmp_path: Path) -> None:
    root = roce_tree(tmp_path)
    set_port(root, "mlx5_7/1", state="DOWN", phys_state="Polling", gbps=40)
    ports = read_infiniband_sysfs(root)
    # Not configured: a dead fabric link or an unused port of the fabric's model. Never
    # silent (a dead fabric link must show), never a repair (an unused port is fine).
    (unconfirmed,) = evaluate_ports(ports, None, 400, "sysfs")
    assert (unconfirmed.code, unconfirmed.component.id) == ("IB_LINK_DOWN", "mlx5_7/1")
    assert (unconfirmed.severity, unconfirmed.action) == (Severity.WARNING, Action.NONE)
    assert "network.expected.Ethernet.ports" in unconfirmed.message
    findings = evaluate_ports(
        ports, None, 400, "sysfs", network(expected={"Ethernet": {"ports": 8}})
    )
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_7/1"}}
    assert findings[0].action is Action.REBOOT


# --- port states ----------------------------------------------------------------------------


def test_polling_fabric_port_is_link_down_naming_cable_and_peer(tmp_path: Path) -> None:
    root = ib_node_tree(tmp_path)
    set_port(root, "mlx5_4/1", state="DOWN", phys_state="Polling")
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs")
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_4/1"}}
    assert "cable" in findings[0].message and "peer" in findings[0].message
    assert (findings[0].severity, findings[0].action) == (Severity.CRITICAL, Action.REBOOT)


@pytest.mark.parametrize(("state", "words"), [("INIT", "configured"), ("ARMED", "activate")])
def test_link_up_but_not_active_is_the_subnet_managers_part(
    tmp_path: Path, state: str, words: str
) -> None:
    root = ib_node_tree(tmp_path)
    set_port(root, "mlx5_2/1", state=state)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs")
    assert codes(findings) == {"IB_PORT_AWAITING_SM": {"mlx5_2/1"}}
    sm = findings[0]
    assert "subnet manager" in sm.message and words in sm.message and state in sm.message
    # The port carries no traffic (critical keeps new jobs off), but no rung configures it.
    assert (sm.severity, sm.action) == (Severity.CRITICAL, Action.NONE)


def test_ibstat_initializing_port_is_the_subnet_managers_part() -> None:
    text = ibstat_with(read_data(IB_IBSTAT), "mlx5_9", State="Initializing")
    findings = evaluate_ports(parse_ibstat(text), None, 400, "ibstat")
    assert codes(findings) == {"IB_PORT_AWAITING_SM": {"mlx5_9/1"}}
    assert findings[0].action is Action.NONE


# --- configuration --------------------------------------------------------------------------


def test_exclude_takes_a_device_out_of_judgement_and_count(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    set_port(root, "mlx5_bond_0/1", state="DOWN", phys_state="Polling")
    ports = read_infiniband_sysfs(root)
    config = network(devices={"include": ["mlx5_*"]})
    assert codes(evaluate_ports(ports, 3, None, "sysfs", config)) == {
        "IB_LINK_DOWN": {"mlx5_bond_0/1"}
    }
    config = network(devices={"include": ["mlx5_*"], "exclude": ["mlx5_bond_*"]})
    assert evaluate_ports(ports, 2, None, "sysfs", config) == []
    assert codes(evaluate_ports(ports, 3, None, "sysfs", config)) == {
        "NIC_COUNT_MISMATCH": {"node"}
    }


def test_include_makes_exactly_its_devices_the_fabric(tmp_path: Path) -> None:
    root = ib_node_tree(tmp_path)
    set_port(root, "mlx5_7/1", state="DOWN", phys_state="Polling")
    ports = read_infiniband_sysfs(root)
    config = network(devices={"include": ["mlx5_[0-6]"]})
    assert evaluate_ports(ports, None, 400, "sysfs", config) == []
    roles = assign_roles(ports, config, 400)
    assert roles["mlx5_7/1"].role is Role.EXCLUDED and roles["mlx5_0/1"].fabric


def test_expected_port_count_per_link_layer(tmp_path: Path) -> None:
    root = ib_node_tree(tmp_path)
    shutil.rmtree(root / "mlx5_5")
    ports = read_infiniband_sysfs(root)
    config = network(expected={"InfiniBand": {"ports": 8, "gbps": 400}})
    findings = evaluate_ports(ports, None, None, "sysfs", config)
    assert codes(findings) == {"FABRIC_PORTS_MISSING": {"node"}}
    assert (findings[0].severity, findings[0].action) == (Severity.CRITICAL, Action.REPLACE)
    assert "7 InfiniBand fabric ports, 8 expected" in findings[0].message


def test_per_layer_rate_wins_over_expected_link_gbps(tmp_path: Path) -> None:
    root = ib_node_tree(tmp_path)
    set_port(root, "mlx5_1/1", gbps=200)
    ports = read_infiniband_sysfs(root)
    config = network(expected={"InfiniBand": {"gbps": 200}})
    assert evaluate_ports(ports, None, 400, "sysfs", config) == []
    assert codes(evaluate_ports(ports, None, 400, "sysfs")) == {"LINK_RATE_DEGRADED": {"mlx5_1/1"}}


def test_network_section_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "gpuguard.yaml"
    path.write_text(
        "network:\n"
        "  devices: {include: ['mlx5_*'], exclude: ['mlx5_bond_*']}\n"
        "  expected: {InfiniBand: {ports: 8, gbps: 400}, Ethernet: {gbps: 200}}\n"
    )
    config = load_config(path).network
    assert config.devices.exclude == ["mlx5_bond_*"]
    assert config.expected["InfiniBand"].ports == 8 and config.expected["Ethernet"].gbps == 200


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("network: {devices: {includes: [x]}}", "network.devices.includes: unknown key"),
        ("network: {devices: {includes: [x]}}", "did you mean 'include'?"),
        ("network: {expected: {Infiniband: {ports: 8}}}", "network.expected.Infiniband"),
        ("network: {expected: {InfiniBand: {ports: -1}}}", "network.expected.InfiniBand.ports"),
        ("network: {expected: {Ethernet: {gbps: 0}}}", "network.expected.Ethernet.gbps"),
        ("network: {devices: {exclude: ['']}}", "network.devices.exclude.0"),
        ("network: {fabric: x}", "known keys: devices, expected"),
    ],
)
def test_bad_network_config_names_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert named in str(error.value)


def test_excluded_devices_are_not_sampled_for_counters(tmp_path: Path) -> None:
    h100_tree(tmp_path / "sysfs")
    later = h100_tree(tmp_path / "sysfs-later")
    write(later, "mlx5_bond_0/ports/1/counters/link_downed", "4")
    config = Config(network=network(devices={"exclude": ["mlx5_bond_*"]}))
    assert network_status(tmp_path, config) == (Status.HEALTHY, [])
    _, findings = network_status(tmp_path, Config())
    assert codes(findings) == {"LINK_FLAPPED": {"mlx5_bond_0/1"}}


def test_roce_link_layer_unreadable_decides_nothing_and_is_judged(tmp_path: Path) -> None:
    root = roce_tree(tmp_path)
    for index in range(7):
        set_port(root, f"mlx5_{index}/1", state="DOWN", phys_state="Polling", gbps=40)
    (root / "mlx5_7" / "ports" / "1" / "link_layer").unlink()
    findings = evaluate_ports(read_infiniband_sysfs(root), 10, 400, "sysfs")
    down = {f.component.id for f in findings if f.code == "IB_LINK_DOWN"}
    assert down == {f"mlx5_{i}/1" for i in range(7)}
    assert all(f.action is Action.REBOOT for f in findings if f.code == "IB_LINK_DOWN")


def test_roce_node_with_every_fabric_port_down_is_repaired(tmp_path: Path) -> None:
    root = roce_tree(tmp_path)
    for index in range(8):
        set_port(root, f"mlx5_{index}/1", state="DOWN", phys_state="Polling", gbps=40)
    for index in (8, 9):
        set_port(root, f"mlx5_{index}/1", state="DOWN", phys_state="Polling", gbps=40)
    findings = evaluate_ports(read_infiniband_sysfs(root), None, 400, "sysfs")
    assert {f.component.id for f in findings if f.action is Action.REBOOT} >= {
        f"mlx5_{i}/1" for i in range(8)
    }
    # Expecting no fabric, the same ports are a node without RDMA cabling: warned only.
    uncabled = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert uncabled and all(f.action is Action.NONE for f in uncabled)


def test_real_roce_node_with_a_polling_fabric_port_is_not_passed() -> None:
    # gpud's capture: 8 ConnectX-7 fabric ports (one Polling, one Disabled) + 4 CX-6 Dx.
    ports = parse_ibstat(read_data("ibstat_h100_roce_one_polling_one_disabled.txt"))
    (unconfirmed,) = evaluate_ports(ports, 8, 400, "ibstat")
    assert (unconfirmed.code, unconfirmed.component.id) == ("IB_LINK_DOWN", "mlx5_11/1")
    assert unconfirmed.action is Action.NONE  # could be an unused port: no repair unasked
    eight = network(expected={"Ethernet": {"ports": 8}})
    findings = evaluate_ports(ports, 8, 400, "ibstat", eight)
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_11/1"}, "FABRIC_PORTS_MISSING": {"node"}}
    down = next(f for f in findings if f.code == "IB_LINK_DOWN")
    assert (down.severity, down.action) == (Severity.CRITICAL, Action.REBOOT)
