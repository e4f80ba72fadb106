"""Build /sys/class/infiniband copies under a temporary directory for network tests.

The H100 tree comes from a real capture (tests/data/sysfs_class_infiniband_h100_flattened.txt,
one "RELATIVE_PATH: content" line per file); the EFA tree is made by hand from the counter
names in AWS's EFA monitoring guide. The InfiniBand and RoCE nodes are built from the real
mlx5_0 of that capture, one copy per port, with the values the kernel prints for each state
(``rate`` of a port without a link reads 40 Gb/sec (4X QDR), as ibstat's "Rate: 40" on the
real Disabled ports of tests/data/ibstat_h100_some_ports_down.txt). Tests then edit single
files to inject a fault.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import read_data

H100_FLATTENED = "sysfs_class_infiniband_h100_flattened.txt"

EFA_DEVICE = "rdmap0s31"
# Port counters listed in the AWS guide ("Retrieve EFA driver metrics for your instance").
EFA_PORT_COUNTERS = [
    "lifespan",
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
]
# Device-scope counters of the EFA driver (admin command queue).
EFA_DEVICE_COUNTERS = ("submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds")


def expand_flattened(text: str, root: Path) -> Path:
    """Write each "RELATIVE_PATH: content" line of ``text`` as a file under ``root``."""
    for line in text.splitlines():
        if not line.strip():
            continue
        relative, _, content = line.partition(": ")
        write(root, relative, content)
    return root


def h100_tree(root: Path) -> Path:
    """Real H100 tree: mlx5_0 and mlx5_7 (NDR 400 IB, MT4129), mlx5_bond_0 (200 GbE bond)."""
    return expand_flattened(read_data(H100_FLATTENED), root)


CX7 = "MT4129"  # ConnectX-7: 400G NDR InfiniBand, or 400GbE
CX6_DX = "MT4125"  # ConnectX-6 Dx: Ethernet only, the usual front-end NIC
# sysfs rate strings as ib_query_port reports them for these Ethernet speeds.
RATES = {
    400: "400 Gb/sec (4X NDR)",
    200: "200 Gb/sec (4X HDR)",
    100: "100 Gb/sec (4X EDR)",
    40: "40 Gb/sec (4X QDR)",
    25: "25 Gb/sec (1X EDR)",
}
STATES = {"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN", "INIT": "2: INIT", "ARMED": "3: ARMED"}
PHYS_STATES = {
    "LinkUp": "5: LinkUp",
    "Polling": "2: Polling",
    "Disabled": "3: Disabled",
    "PortConfigurationTraining": "4: PortConfigurationTraining",
}


def add_port(
    root: Path,
    device: str,
    *,
    link_layer: str,
    hca_type: str = CX7,
    state: str = "ACTIVE",
    phys_state: str = "LinkUp",
    gbps: int = 400,
) -> None:
    """One single-port mlx5 device, counters copied from the real capture's mlx5_0."""
    template = root.parent / f".{root.name}-template"
    if not template.is_dir():
        h100_tree(template)
    shutil.copytree(template / "mlx5_0", root / device, dirs_exist_ok=True)
    set_port(root, f"{device}/1", state=state, phys_state=phys_state, gbps=gbps)
    write(root, f"{device}/ports/1/link_layer", link_layer)
    write(root, f"{device}/hca_type", hca_type)


def set_port(
    root: Path,
    name: str,
    *,
    state: str | None = None,
    phys_state: str | None = None,
    gbps: int | None = None,
) -> None:
    """Change a port's state, physical state or rate (``name`` is ``mlx5_3/1``)."""
    device, port = name.split("/")
    if state is not None:
        write(root, f"{device}/ports/{port}/state", STATES[state])
    if phys_state is not None:
        write(root, f"{device}/ports/{port}/phys_state", PHYS_STATES[phys_state])
    if gbps is not None:
        write(root, f"{device}/ports/{port}/rate", RATES[gbps])


def ib_node_tree(root: Path) -> Path:
    """8 active NDR InfiniBand ports (mlx5_0-7), 2 Disabled ConnectX-6 Dx Ethernet ports."""
    for index in range(8):
        add_port(root, f"mlx5_{index}", link_layer="InfiniBand")
    for index in (8, 9):
        add_port(
            root,
            f"mlx5_{index}",
            link_layer="Ethernet",
            hca_type=CX6_DX,
            state="DOWN",
            phys_state="Disabled",
            gbps=40,
        )
    return root


def roce_tree(root: Path, *, front_end_model: str = CX6_DX, front_end_gbps: int = 100) -> Path:
    """An all-Ethernet node: 8 x 400GbE ConnectX-7 (mlx5_0-7, the RoCE fabric), two active
    front-end ports (mlx5_8, mlx5_9) and a third, Disabled (mlx5_10)."""
    for index in range(8):
        add_port(root, f"mlx5_{index}", link_layer="Ethernet")
    for index in (8, 9):
        add_port(
            root,
            f"mlx5_{index}",
            link_layer="Ethernet",
            hca_type=front_end_model,
            gbps=front_end_gbps,
        )
    add_port(
        root,
        "mlx5_10",
        link_layer="Ethernet",
        hca_type=front_end_model,
        state="DOWN",
        phys_state="Disabled",
        gbps=40,
    )
    return root


def efa_tree(root: Path, **counters: int) -> Path:
    """One EFA device with one active port; every counter 0 unless given (``lifespan`` 12)."""
    device = root / EFA_DEVICE
    write(device, "ports/1/state", "4: ACTIVE")
    write(device, "ports/1/phys_state", "5: LinkUp")
    # EFA's query_port reports 4X EDR; its link layer is unspecified, which sysfs prints as
    # "Unknown" (an assumption: no real EFA capture of these two files is at hand).
    write(device, "ports/1/rate", "100 Gb/sec (4X EDR)")
    write(device, "ports/1/link_layer", "Unknown")
    values = {"lifespan": 12, **counters}
    for name in EFA_PORT_COUNTERS:
        write(device, f"ports/1/hw_counters/{name}", str(values.get(name, 0)))
    for name in EFA_DEVICE_COUNTERS:
        write(device, f"hw_counters/{name}", str(values.get(name, 0)))
    return root


def write(root: Path, relative: str, content: str) -> None:
    """Set one sysfs file (sysfs values end with a newline)."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content + "\n")
