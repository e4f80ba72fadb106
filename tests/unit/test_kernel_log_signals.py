"""Kernel log signals that name no GPU by address (issue 28, item 1): GSP lines that use the
driver's own GPU number, link flaps logged by the network stack, a fatal PCIe error
reported by the bridge above a GPU. Lines are in the shapes their printing code gives
(kernel_gsp.c, mlx5e/ice/bnxt, drivers/pci/pcie/aer.c and setup-bus.c)."""

from __future__ import annotations

from gpuguard.kernel_log.check import classify_log
from gpuguard.kernel_log.state import KernelState
from gpuguard.model import NODE, Action, Severity
from tests.support.clock import FakeClock

XID119 = (
    "[171000.000001] NVRM: Xid (PCI:0000:db:00): 119, pid=2024380, name=python3, Timeout "
    "after 6s of waiting for RPC response from GPU6 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "sequence 4242 (0x20802a02 0x8)."
)
RATE_LIMITED = (
    "[171000.100000] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:db:00 "
    "(printing 1 of every 30).  The GPU likely needs to be reset."
)


def heartbeat(n: int, t: float) -> str:
    return f"[{t:.6f}] NVRM: GPU{n} _kgspRpcRecvPoll: GSP RM heartbeat timed out"


def test_gsp_heartbeat_lines_alone_still_ask_for_a_reset_and_name_the_gpu_number():
    log = "\n".join(heartbeat(6, 171100.0 + i) for i in range(5))
    (found,) = classify_log(log)
    assert (found.code, found.severity, found.action) == (
        "GSP_UNRESPONSIVE",
        Severity.CRITICAL,
        Action.RESET_GPU,
    )
    assert found.component == NODE  # no line ties GPU6 to an address: every GPU is reset
    assert "GPU6" in found.message


def test_a_gpu_number_an_xid_119_tied_to_an_address_names_that_gpu():
    other = "[171200.0] NVRM: GPU2 _kgspRpcRecvPoll: LibOS heartbeat timed out"
    log = "\n".join([XID119, RATE_LIMITED, heartbeat(6, 171100.0), other])
    by_code = {(f.code, f.component.id): f for f in classify_log(log)}
    # GPU6's lines repeat its Xid 119; GPU2's are their own finding, about the node.
    assert set(by_code) == {("XID_119", "0000:db:00.0"), ("GSP_UNRESPONSIVE", "node")}
    assert "GPU2" in by_code["GSP_UNRESPONSIVE", "node"].message


def test_the_gsp_sanity_check_line_names_its_gpu_by_number():
    line = (
        "NVRM: _kgspLogRpcSanityCheckFailure: GPU0 sanity check failed 0xf waiting for RPC "
        "response from GSP. Expected function 4097 (GSP_INIT_DONE) sequence 0 (0x0 0x0)."
    )
    (found,) = classify_log(line)
    assert found.code == "GSP_UNRESPONSIVE"
    assert "GPU0" in found.message


def test_a_slow_gsp_answer_is_not_a_fault():
    slow = (
        "[5.0] NVRM: GPU1 _kgspRpcRecvPoll: Slow RPC response from GPU1 GSP (1234us). "
        "Function 76 (GSP_RM_CONTROL) sequence 7 (0x0 0x0)."
    )
    assert classify_log(slow) == []


def test_a_link_that_goes_down_after_being_up_is_a_counted_flap():
    log = "\n".join(
        [
            "[12.000001] mlx5_core 0000:0c:00.0 ens1f0np0: Link down",  # opened: no flap
            "[14.500000] mlx5_core 0000:0c:00.0 ens1f0np0: Link up",
            "[9000.10] mlx5_core 0000:0c:00.0 ens1f0np0: Link down",
            "[9000.90] mlx5_core 0000:0c:00.0 ens1f0np0: Link up",
            "[9100.10] mlx5_core 0000:0c:00.0 ens1f0np0: Link down",
            "[9100.20] mlx5_core 0000:0c:00.0 ens1f0np0: Link up",
            "[20.0] ice 0000:31:00.0 ens2f0: NIC Link is up 100 Gbps Full Duplex, FEC: RS-FEC",
            "[21.0] bnxt_en 0000:41:00.0 ens3f0np0: NIC Link is Up, 100000 Mbps full duplex",
        ]
    )
    (found,) = classify_log(log)
    assert (found.code, found.severity, found.action) == (
        "LINK_FLAPPED",
        Severity.WARNING,
        Action.NONE,
    )
    assert found.component.id.startswith("ens1f0np0")
    assert "2 time(s)" in found.message


def test_each_driver_and_bonding_spelling_of_a_flap_counts():
    for up, down in [
        (
            "i40e 0000:3b:00.0 eth2: NIC Link is Up, 40 Gbps Full Duplex",
            "i40e 0000:3b:00.0 eth2: NIC Link is Down",
        ),
        (
            "ice 0000:31:00.0 ens2f0: NIC Link is up 100 Gbps Full Duplex",
            "ice 0000:31:00.0 ens2f0: NIC Link is Down",
        ),
        (
            "bond0: (slave ens1f1np1): link status definitely up, 100000 Mbps full duplex",
            "bond0: (slave ens1f1np1): link status definitely down, disabling slave",
        ),
    ]:
        (found,) = classify_log(f"[1.0] {up}\n[2.0] {down}\n")
        assert found.code == "LINK_FLAPPED", down


def test_links_that_only_come_up_are_healthy():
    log = "[12.0] mlx5_core 0000:0c:00.0 ens1f0np0: Link down\n[14.5] mlx5_core 0000:0c:00.0 ens1f0np0: Link up\n"
    assert classify_log(log) == []


def test_the_agent_forgets_a_flap_a_time_to_live_after_it():
    clock = FakeClock()
    state = KernelState(application_ttl_s=60, boot_id=lambda: "b", clock=clock)
    state.add_lines(
        [
            "[14.5] mlx5_core 0000:0c:00.0 ib0: Link up",
            "[90.0] mlx5_core 0000:0c:00.0 ib0: Link down",
        ],
        reset=True,
    )
    assert [f.code for f in state.findings()] == ["LINK_FLAPPED"]
    clock.set(3600.0)
    assert state.findings() == []


# A boot's enumeration (drivers/pci/probe.c, setup-bus.c) of a PCIe switch with two H100s
# below root port 0000:97:01.0, and an NVMe drive below another port.
BOOT = [
    "[    1.201000] pci 0000:97:01.0: [8086:352a] type 01 class 0x060400 PCIe Root Port",
    "[    1.202000] pci 0000:98:00.0: [1000:c030] type 01 class 0x060400 PCIe Switch Upstream Port",
    "[    1.210000] pci 0000:9b:00.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint",
    "[    1.211000] pci 0000:9c:00.0: [10de:2330] type 00 class 0x030200",
    "[    1.212000] pci 0000:9d:00.0: [10de:22a3] type 00 class 0x068000",  # an NVSwitch
    "[    1.300000] pci 0000:97:01.0: PCI bridge to [bus 98-9c]",
    "[    1.300100] pci 0000:00:1d.0: PCI bridge to [bus 02]",
]


def test_a_fatal_error_on_the_bridge_above_gpus_is_their_fault():
    log = [
        *BOOT,
        "[ 8812.1] pcieport 0000:97:01.0: AER: Uncorrected (Fatal) error received: 0000:97:01.0",
        "[ 8812.1] pcieport 0000:97:01.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Receiver ID)",
        "[ 8812.1] pcieport 0000:97:01.0: AER:   device [8086:352a] error status/mask=00040000/00180000",
    ]
    found = classify_log("\n".join(log))
    assert sorted((f.code, f.component.id, f.action) for f in found) == [
        ("GPU_PCIE_FATAL", "0000:9b:00.0", Action.REBOOT),
        ("GPU_PCIE_FATAL", "0000:9c:00.0", Action.REBOOT),
    ]


def test_the_root_port_naming_a_gpu_as_the_source_names_that_gpu():
    line = "[9.0] pcieport 0000:97:01.0: AER: Uncorrectable (Fatal) error message received from 0000:9c:00.0"
    (found,) = classify_log("\n".join([*BOOT, line]))
    assert (found.code, found.component.id) == ("GPU_PCIE_FATAL", "0000:9c:00.0")


def test_a_fatal_error_with_no_gpu_known_below_holds_the_node_for_a_person():
    for log in (
        [
            *BOOT,
            "[9.0] pcieport 0000:00:1d.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Data Link Layer, (Receiver ID)",
        ],
        [
            "[9.0] pcieport 0000:97:01.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)"
        ],
    ):
        (found,) = classify_log("\n".join(log))
        assert (found.code, found.component, found.severity, found.action) == (
            "PCIE_FATAL",
            NODE,
            Severity.CRITICAL,
            Action.NONE,
        )


def test_a_corrected_or_non_fatal_error_on_a_bridge_is_not_fatal():
    line = (
        "[9.0] pcieport 0000:97:01.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "(Receiver ID)"
    )
    assert classify_log("\n".join([*BOOT, line])) == []
