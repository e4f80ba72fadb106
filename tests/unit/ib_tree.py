"""Build /sys/class/infiniband copies under a temporary directory for network tests.

The H100 tree comes from a real capture (tests/data/sysfs_class_infiniband_h100_flattened.txt,
one "RELATIVE_PATH: content" line per file); the EFA tree is made by hand from the counter
names in AWS's EFA monitoring guide. Tests then edit single files to inject a fault.
"""

from __future__ import annotations

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
