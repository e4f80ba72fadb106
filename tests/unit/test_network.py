"""RDMA network layer: real ibstat captures, a real H100 sysfs tree with injected faults,
a hand-made EFA tree, and the check end to end in bundle and live mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuguard.checks.base import CheckContext
from gpuguard.checks.network.check import (
    NetworkCheck,
    counter_deltas,
    evaluate_ports,
    read_infiniband_sysfs,
)
from gpuguard.checks.network.ibstat import parse_ibstat
from gpuguard.config import Config
from gpuguard.errors import CheckFailed, ParseError, ToolMissing
from gpuguard.model import NODE, Action, Finding, Severity, nic
from gpuguard.sources import BundleSources, LiveSources
from tests.conftest import DATA, read_data
from tests.unit.ib_tree import EFA_DEVICE, efa_tree, h100_tree, write

ALL_ACTIVE = "ibstat_h100_all_active.txt"
SOME_DOWN = "ibstat_h100_some_ports_down.txt"
IBPANIC = "ibstat_a100_ibpanic_exit255.txt"
IBSTATUS = "ibstatus_a100_all_active.txt"


def codes(findings: list[Finding]) -> dict[str, set[str]]:
    """Finding codes mapped to the components they name."""
    by_code: dict[str, set[str]] = {}
    for finding in findings:
        by_code.setdefault(finding.code, set()).add(finding.component.id)
    return by_code


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity >= Severity.WARNING]


def run_check(sources: BundleSources | LiveSources, config: Config | None = None) -> list[Finding]:
    return NetworkCheck().run(CheckContext(sources, config or Config(), timeout_s=5.0))


# --- ibstat ---------------------------------------------------------------------------------


def test_ibstat_all_active_is_healthy() -> None:
    ports = parse_ibstat(read_data(ALL_ACTIVE))
    assert len(ports) == 12 and ports.panic is None
    assert all(port.link_up for port in ports)
    # 400G ConnectX-7 and 100G ConnectX-6 Dx on one node: different models, not a degradation.
    assert problems(evaluate_ports(ports, 12, None, "ibstat")) == []


def test_ibstat_disabled_front_end_ethernet_beside_infiniband_is_not_judged() -> None:
    # mlx5_2, mlx5_7 and mlx5_8 are ConnectX-6 Dx Ethernet ports, Down and Disabled, next to
    # eight active NDR InfiniBand ports: the front end, administratively off, not a fault.
    ports = parse_ibstat(read_data(SOME_DOWN))
    assert {p.name for p in ports if not p.link_up} == {"mlx5_2/1", "mlx5_7/1", "mlx5_8/1"}
    assert evaluate_ports(ports, 12, None, "ibstat") == []


def test_expected_rate_applies_to_infiniband_ports_not_the_ethernet_front_end() -> None:
    # The 100G Ethernet ports next to 400G InfiniBand ones are the front-end network.
    assert evaluate_ports(parse_ibstat(read_data(SOME_DOWN)), 12, 400, "ibstat") == []


def test_ibpanic_keeps_the_printed_ports_and_names_the_failed_device() -> None:
    ports = parse_ibstat(read_data(IBPANIC))
    assert [port.name for port in ports] == [f"mlx5_{n}/1" for n in range(8)]
    assert ports.panic is not None and ports.panic.device == "mlx5_8"


def test_ibpanic_through_the_check_gives_a_finding_for_the_lost_adapter(tmp_path: Path) -> None:
    shutil.copy(DATA / IBPANIC, tmp_path / "ibstat.txt")
    findings = run_check(BundleSources(tmp_path), Config(expected_nics=9))
    assert codes(findings) == {"IBSTAT_PANIC": {"mlx5_8"}, "NIC_COUNT_MISMATCH": {"node"}}
    assert all(f.severity is Severity.CRITICAL for f in findings)
    assert {f.source for f in findings} == {"ibstat"}


def test_ibstatus_output_is_read_in_its_own_format() -> None:
    # The A100 node: eight 200G HDR InfiniBand ports and a 40G Ethernet front end.
    ports = parse_ibstat(read_data(IBSTATUS))
    assert len(ports) == len({p.device for p in ports}) == 9
    assert {(p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports} == {
        ("ACTIVE", "LinkUp", 200.0, "InfiniBand"),
        ("ACTIVE", "LinkUp", 40.0, "Ethernet"),
    }
    assert evaluate_ports(ports, 9, 200, "ibstat") == []


def test_ibstatus_with_a_port_down_or_cut_short() -> None:
    text = (
        read_data(IBSTATUS).replace("4: ACTIVE", "1: DOWN", 1).replace("5: LinkUp", "2: Polling", 1)
    )
    findings = evaluate_ports(parse_ibstat(text), None, None, "ibstat")
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_0/1"}}
    full = read_data(IBSTATUS)
    with pytest.raises(ParseError, match="missing"):
        parse_ibstat(full[: full.rindex("link_layer")])


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no CA blocks"),
        ("CA 'mlx5_0'\n\tNumber of ports: 1\n", "announced 1 ports, printed 0"),
        ("CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n", "missing"),
        (
            "CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n"
            "\t\tRate: fast\n\t\tLink layer: InfiniBand\n",
            "not a number",
        ),
        ("hello\n", "unexpected"),
        ("CA 'a'\n\tNumber of ports: " + "9" * 5000 + "\n", "bad port count"),
    ],
)
def test_ibstat_garbage_is_a_parse_error(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_ibstat(text)


def test_ibstat_truncated_before_the_last_port_is_a_parse_error() -> None:
    text = read_data(ALL_ACTIVE)
    with pytest.raises(ParseError):
        parse_ibstat(text[: text.rindex("Rate:")])


# --- sysfs ----------------------------------------------------------------------------------


def test_sysfs_h100_tree_reads_and_is_healthy(tmp_path: Path) -> None:
    ports = read_infiniband_sysfs(h100_tree(tmp_path))
    assert [port.name for port in ports] == ["mlx5_0/1", "mlx5_7/1", "mlx5_bond_0/1"]
    first = ports[0]
    assert (first.state, first.phys_state, first.rate_gbps) == ("ACTIVE", "LinkUp", 400.0)
    assert first.link_layer == "InfiniBand" and first.ca_type == "MT4129"
    assert first.counters["port_rcv_errors"] == 14
    assert first.hw_counters["out_of_buffer"] == 0
    assert ports[2].rate_gbps == 200.0 and ports[2].link_layer == "Ethernet"
    # Non-zero absolute error counters (port_rcv_errors 14) are history, not a fault.
    assert evaluate_ports(ports, 3, None, "sysfs") == []
    assert evaluate_ports(ports, 3, 400, "sysfs") == []


def test_sysfs_fabric_port_disabled_is_a_warning_without_action(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_7/ports/1/state", "1: DOWN")
    write(root, "mlx5_7/ports/1/phys_state", "3: Disabled")
    findings = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert codes(findings) == {"PORT_DISABLED": {"mlx5_7/1"}}
    disabled = findings[0]
    assert (disabled.severity, disabled.action) == (Severity.WARNING, Action.NONE)
    assert "Disabled" in disabled.message and disabled.component == nic("mlx5_7", 1)


def test_sysfs_port_down_polling(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_7/ports/1/state", "1: DOWN")
    write(root, "mlx5_7/ports/1/phys_state", "2: Polling")
    findings = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_7/1"}}
    assert "DOWN" in findings[0].message and findings[0].component == nic("mlx5_7", 1)
    assert (findings[0].severity, findings[0].action) == (Severity.CRITICAL, Action.REBOOT)


def test_sysfs_active_but_polling_is_down(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_0/ports/1/phys_state", "2: Polling")
    findings = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert codes(findings) == {"IB_LINK_DOWN": {"mlx5_0/1"}}


def test_reduced_rate_against_expectation_is_critical(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_7/ports/1/rate", "200 Gb/sec (4X HDR)")
    findings = evaluate_ports(read_infiniband_sysfs(root), 3, 400, "sysfs")
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_7/1"}}
    assert findings[0].severity is Severity.CRITICAL and findings[0].action is Action.REBOOT


def test_reduced_rate_against_peers_is_a_warning(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_7/ports/1/rate", "200 Gb/sec (4X HDR)")
    findings = evaluate_ports(read_infiniband_sysfs(root), None, None, "sysfs")
    assert codes(findings) == {"LINK_RATE_DEGRADED": {"mlx5_7/1"}}
    assert findings[0].severity is Severity.WARNING


def test_missing_adapter_is_a_nic_count_mismatch(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    shutil.rmtree(root / "mlx5_7")
    findings = evaluate_ports(read_infiniband_sysfs(root), 3, None, "sysfs")
    assert codes(findings) == {"NIC_COUNT_MISMATCH": {"node"}}
    mismatch = findings[0]
    assert (mismatch.severity, mismatch.action, mismatch.component) == (
        Severity.CRITICAL,
        Action.REPLACE,
        NODE,
    )
    assert "mlx5_0" in mismatch.evidence and "mlx5_7" not in mismatch.evidence


def test_unreadable_state_is_never_healthy(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    state = root / "mlx5_0/ports/1/state"
    state.unlink()
    state.mkdir()  # reading a directory fails like a driver query error would
    ports = read_infiniband_sysfs(root)
    assert ports[0].state is None and any("state" in note for note in ports[0].notes)
    findings = evaluate_ports(ports, None, None, "sysfs")
    assert codes(findings) == {"PORT_STATE_UNREADABLE": {"mlx5_0/1"}}
    assert findings[0].severity is Severity.CRITICAL


def test_unreadable_rate_and_counter_become_none_with_a_note(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    (root / "mlx5_0/ports/1/rate").unlink()
    write(root, "mlx5_0/ports/1/counters/symbol_error", "lots")
    port = read_infiniband_sysfs(root)[0]
    assert port.rate_gbps is None and port.counters["symbol_error"] is None
    assert len(port.notes) == 2
    assert codes(evaluate_ports([port], None, None, "sysfs")) == {
        "LINK_RATE_UNREADABLE": {"mlx5_0/1"}
    }


@pytest.mark.parametrize("content", ["-1", "0x10", "9" * 5000, "²"])
def test_counter_that_is_not_a_64_bit_count_is_none(tmp_path: Path, content: str) -> None:
    root = h100_tree(tmp_path)
    write(root, "mlx5_0/ports/1/counters/link_downed", content)
    port = read_infiniband_sysfs(root)[0]
    assert port.counters["link_downed"] is None and port.notes


@pytest.mark.parametrize(
    ("relative", "content"),
    [("mlx5_0/ports/1/state", "ACTIVE"), ("mlx5_0/ports/1/rate", "400 Gbit")],
)
def test_malformed_mandatory_field_is_a_parse_error(
    tmp_path: Path, relative: str, content: str
) -> None:
    root = h100_tree(tmp_path)
    write(root, relative, content)
    with pytest.raises(ParseError):
        read_infiniband_sysfs(root)


def test_device_without_ports_is_a_parse_error(tmp_path: Path) -> None:
    root = h100_tree(tmp_path)
    shutil.rmtree(root / "mlx5_7/ports")
    with pytest.raises(ParseError, match="mlx5_7"):
        read_infiniband_sysfs(root)


# --- counter deltas -------------------------------------------------------------------------


def test_rising_ib_error_counters_and_link_flap(tmp_path: Path) -> None:
    before = read_infiniband_sysfs(h100_tree(tmp_path / "before"))
    later = h100_tree(tmp_path / "after")
    write(later, "mlx5_0/ports/1/counters/symbol_error", "7")
    write(later, "mlx5_0/ports/1/counters/port_rcv_errors", "20")
    write(later, "mlx5_7/ports/1/counters/link_downed", "1")
    findings = counter_deltas(before, read_infiniband_sysfs(later))
    assert codes(findings) == {
        "IB_ERROR_COUNTER_RISING": {"mlx5_0/1"},
        "LINK_FLAPPED": {"mlx5_7/1"},
    }
    rising = next(f for f in findings if f.code == "IB_ERROR_COUNTER_RISING")
    assert rising.evidence == "symbol_error 0 -> 7; port_rcv_errors 14 -> 20"
    assert {f.severity for f in findings} == {Severity.WARNING}


def test_reset_or_unchanged_counters_are_not_errors(tmp_path: Path) -> None:
    before = read_infiniband_sysfs(h100_tree(tmp_path / "before"))
    later = h100_tree(tmp_path / "after")
    write(later, "mlx5_0/ports/1/counters/port_rcv_errors", "0")  # 14 -> 0: reset
    write(later, "mlx5_0/ports/1/counters/port_xmit_wait", "9999999999")  # not an error count
    assert counter_deltas(before, read_infiniband_sysfs(later)) == []


def test_efa_tree_reads_and_is_healthy(tmp_path: Path) -> None:
    ports = read_infiniband_sysfs(efa_tree(tmp_path))
    assert [port.name for port in ports] == [f"{EFA_DEVICE}/1"]
    port = ports[0]
    assert port.link_up and port.rate_gbps == 100.0 and port.counters == {}
    assert port.hw_counters["lifespan"] == 12 and port.device_hw_counters["cmds_err"] == 0
    assert evaluate_ports(ports, 1, 100, "sysfs") == []


def test_rising_efa_counters(tmp_path: Path) -> None:
    before = read_infiniband_sysfs(efa_tree(tmp_path / "before", rx_drops=5))
    after = read_infiniband_sysfs(
        efa_tree(tmp_path / "after", rx_drops=9, retrans_timeout_events=2, rx_pkts=1000)
    )
    findings = counter_deltas(before, after)
    assert codes(findings) == {"EFA_ERROR_COUNTER_RISING": {f"{EFA_DEVICE}/1"}}
    assert findings[0].evidence == "rx_drops 5 -> 9; retrans_timeout_events 0 -> 2"


def test_efa_counter_reset_is_not_an_error(tmp_path: Path) -> None:
    before = read_infiniband_sysfs(efa_tree(tmp_path / "before", rx_drops=5))
    after = read_infiniband_sysfs(efa_tree(tmp_path / "after", rx_drops=0))
    assert counter_deltas(before, after) == []


# --- the check ------------------------------------------------------------------------------


def test_bundle_with_later_sample_reports_rising_counters(tmp_path: Path) -> None:
    h100_tree(tmp_path / "sysfs")
    later = h100_tree(tmp_path / "sysfs-later")
    write(later, "mlx5_0/ports/1/counters/symbol_error", "3")
    findings = run_check(BundleSources(tmp_path), Config(expected_nics=3))
    assert codes(findings) == {"IB_ERROR_COUNTER_RISING": {"mlx5_0/1"}}
    assert findings[0].source == "sysfs"


def test_the_check_reads_only_the_counters_it_judges(tmp_path: Path) -> None:
    # A port has dozens of counter files; reading them all every round was most of the
    # check's CPU. One the check does not judge is not read (nor noted when unreadable).
    root = h100_tree(tmp_path / "sysfs")
    (root / "mlx5_0/ports/1/rate").unlink()
    write(root, "mlx5_0/ports/1/counters/port_xmit_data", "lots")  # traffic, not judged
    write(root, "mlx5_0/ports/1/hw_counters/out_of_buffer", "lots")
    write(root, "mlx5_0/ports/1/counters/symbol_error", "lots")  # judged: noted
    (finding,) = run_check(BundleSources(tmp_path))
    assert finding.code == "LINK_RATE_UNREADABLE"
    assert "symbol_error" in finding.evidence and "rate" in finding.evidence
    assert "port_xmit_data" not in finding.evidence and "out_of_buffer" not in finding.evidence


def test_sysfs_wins_over_ibstat(tmp_path: Path) -> None:
    h100_tree(tmp_path / "sysfs")
    shutil.copy(DATA / SOME_DOWN, tmp_path / "ibstat.txt")
    assert run_check(BundleSources(tmp_path)) == []


def test_ibstat_fallback_when_sysfs_is_absent(tmp_path: Path) -> None:
    shutil.copy(DATA / SOME_DOWN, tmp_path / "ibstat.txt")
    assert run_check(BundleSources(tmp_path), Config(expected_nics=12)) == []
    findings = run_check(BundleSources(tmp_path), Config(expected_nics=13))
    assert codes(findings) == {"NIC_COUNT_MISMATCH": {"node"}}
    assert findings[0].source == "ibstat" and "mlx5_11" in findings[0].evidence


def test_no_adapters_but_some_expected_is_critical(tmp_path: Path) -> None:
    findings = run_check(BundleSources(tmp_path), Config(expected_nics=8))
    assert codes(findings) == {"NIC_COUNT_MISMATCH": {"node"}}
    assert findings[0].severity is Severity.CRITICAL


@pytest.mark.parametrize("make_empty_root", [False, True])
def test_no_adapters_and_none_expected_is_tool_missing(
    tmp_path: Path, make_empty_root: bool
) -> None:
    if make_empty_root:
        (tmp_path / "sysfs").mkdir()
    with pytest.raises(ToolMissing):
        run_check(BundleSources(tmp_path), Config(expected_nics=0))


def test_live_mode_samples_twice_within_the_time_budget(tmp_path: Path) -> None:
    root = h100_tree(tmp_path / "sys")
    slept: list[float] = []

    def errors_while_sleeping(seconds: float) -> None:
        slept.append(seconds)
        write(root, "mlx5_7/ports/1/counters/link_downed", "2")

    config = Config(infiniband_sysfs=root, counter_sample_interval_s=30)
    check = NetworkCheck(wait=errors_while_sleeping)
    findings = check.run(CheckContext(LiveSources(config), config, timeout_s=4.0))
    assert codes(findings) == {"LINK_FLAPPED": {"mlx5_7/1"}}
    assert slept == [2.0]


def fake_ibstat(tmp_path: Path, fixture: str, exit_code: int) -> Config:
    script = tmp_path / "ibstat"
    script.write_text(f"#!/bin/sh\ncat '{DATA / fixture}'\nexit {exit_code}\n")
    script.chmod(0o755)
    return Config(infiniband_sysfs=tmp_path / "absent", tools={"ibstat": str(script)})


def test_live_ibstat_exit_255_with_ibpanic_is_judged_and_reported(tmp_path: Path) -> None:
    config = fake_ibstat(tmp_path, IBPANIC, 255)
    findings = run_check(LiveSources(config), config)
    assert codes(findings) == {"IBSTAT_PANIC": {"mlx5_8"}}


def test_live_ibstat_failing_without_ibpanic_is_check_failed(tmp_path: Path) -> None:
    config = fake_ibstat(tmp_path, ALL_ACTIVE, 1)
    with pytest.raises(CheckFailed):
        run_check(LiveSources(config), config)


# --- bundle sysfs layouts -------------------------------------------------------------------


def test_bundle_sysfs_may_be_a_copy_of_all_of_sys(tmp_path: Path) -> None:
    h100_tree(tmp_path / "sysfs" / "class" / "infiniband")
    later = h100_tree(tmp_path / "sysfs-later" / "class" / "infiniband")
    (tmp_path / "sysfs" / "class" / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "sysfs" / "devices" / "system").mkdir(parents=True)
    write(tmp_path / "sysfs", "kernel/mm/transparent_hugepage/enabled", "never")
    write(later, "mlx5_0/ports/1/counters/symbol_error", "3")
    sources = BundleSources(tmp_path)
    assert sources.infiniband_root() == tmp_path / "sysfs" / "class" / "infiniband"
    findings = run_check(sources, Config(expected_nics=3))
    assert codes(findings) == {"IB_ERROR_COUNTER_RISING": {"mlx5_0/1"}}


def test_bundle_sysfs_of_neither_layout_is_a_parse_error_naming_it(tmp_path: Path) -> None:
    write(tmp_path / "sysfs", "block/sda/size", "1000")
    (tmp_path / "sysfs" / "bus" / "pci").mkdir(parents=True)
    with pytest.raises(ParseError) as error:
        run_check(BundleSources(tmp_path))
    message = str(error.value)
    assert str(tmp_path / "sysfs") in message and "/sys/class/infiniband" in message
    assert "block, bus" in message


def test_bundle_copy_of_sys_without_rdma_devices_falls_back_to_ibstat(tmp_path: Path) -> None:
    (tmp_path / "sysfs" / "class" / "net").mkdir(parents=True)
    with pytest.raises(ToolMissing, match="sysfs/class/infiniband does not exist"):
        run_check(BundleSources(tmp_path))
    shutil.copy(DATA / SOME_DOWN, tmp_path / "ibstat.txt")
    findings = run_check(BundleSources(tmp_path), Config(expected_nics=13))
    assert findings[0].source == "ibstat"
