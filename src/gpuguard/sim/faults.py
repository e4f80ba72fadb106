"""What a fault is: its class, when, what would clear it, what it does to a job on it,
where it lives, and the raw signal the node shows for it.

The signal is a kernel log line, a GPU fact (a remap flag, a lost GPU, a temperature) or an
RDMA port record. The policies never see the class: the agent's real parsers and rules
classify the signal (see ``agent_view``). ``fault_stream`` draws a run's faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

DAY = 86_400.0
HOUR = 3_600.0

GPUS_PER_NODE = 8  # an HGX node's
# PCI bus ids of the eight GPUs of an HGX H100 node, as the driver prints them.
GPU_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def gpu_bus_id(gpu: int) -> str:
    return f"0000:{GPU_BUS[gpu]}:00.0"


class Fix(IntEnum):
    """The least that clears a fault; ordered like the remediation ladder."""

    RESTART = 0
    RESET = 1
    REBOOT = 2
    REPLACE = 3
    SELF = 4  # nothing on the node clears it; it ends by itself

    def __str__(self) -> str:
        return self.name.lower()


class Locus(StrEnum):
    """Where a fault lives: what it leaves with, and what a replacement leaves behind.

    ``MACHINE``: the server (a GPU, the board, the host, an adapter); it leaves with the
    machine when the machine is replaced. ``POSITION``: the rack slot (a cable, a remote
    optic, a switch port, a PDU outlet); it stays across replacements, and whatever machine
    fills the slot shows it. ``DOMAIN``: something above many positions (a switch, a rack,
    a power feed); it stays with every position under it. ``JOB``: the job's own fault (an
    application error, a hang); it ends with the job.
    """

    MACHINE = "machine"
    POSITION = "position"
    DOMAIN = "domain"
    JOB = "job"


class Effect(StrEnum):
    """What the fault does to the job running on the node."""

    CRASH = "crash"  # the job's processes die at once
    HANG = "hang"  # the job stalls until its watchdog (or the platform) kills it
    DOWN = "down"  # the node is gone (NotReady); the job dies with it
    SLOW = "slow"  # the job runs at the slowest node's pace
    SILENT = "silent"  # data corruption, noticed by the job hours later
    NONE = "none"  # nothing happens to the job


# The signals (what the agent reads), one recipe per fault kind.
class Signal(StrEnum):
    XID_79 = "xid79"  # kernel line + NVML: GPU lost
    XID_74 = "xid74"  # NVLink error + NVML: a link down
    FALLEN_OFF = "fallen_off"  # "fallen off the bus" without an Xid
    XID_48_REMAP = "xid48_remap"  # DBE + NVML: ECC count, row remap pending
    XID_48_REMAP_FAILED = "xid48_remap_failed"  # DBE + NVML: row remap failure
    XID_48 = "xid48"
    XID_95 = "xid95"  # uncontained memory error (SRAM)
    XID_119 = "xid119"  # GSP RPC timeout
    XID_13 = "xid13"  # application fault
    KERNEL_BUG = "kernel_bug"
    PORT_DOWN = "port_down"
    RATE_DROP = "rate_drop"  # a port at half its rate
    OVERHEAT = "overheat"  # NVML: temperature at the shutdown threshold
    POWER_BRAKE = "power_brake"  # NVML: clocks held down (fail-slow)
    XID_63 = "xid63"  # benign: a row remapping event
    CHECK_TIMEOUT = "check_timeout"  # benign: the NVML check hung once
    NOT_READY = "not_ready"  # the node stopped answering (kubelet)
    NOTHING = "nothing"  # no signal at all (SDC, NCCL hang)


@dataclass(frozen=True)
class Kind:
    effect: Effect
    signals: tuple[tuple[float, Signal], ...]  # (weight, signal)


KINDS: dict[str, Kind] = {
    "gpu": Kind(Effect.CRASH, ((1.0, Signal.XID_79),)),
    "nvlink": Kind(Effect.CRASH, ((1.0, Signal.XID_74),)),
    "pcie": Kind(Effect.CRASH, ((1.0, Signal.FALLEN_OFF),)),
    "hbm": Kind(Effect.CRASH, ((1.0, Signal.XID_48),)),  # refined by the fix, see _signal
    "sram": Kind(Effect.CRASH, ((1.0, Signal.XID_95),)),
    "gsp": Kind(Effect.HANG, ((1.0, Signal.XID_119),)),
    "application": Kind(Effect.CRASH, ((1.0, Signal.XID_13),)),
    "kernel_driver": Kind(Effect.HANG, ((1.0, Signal.KERNEL_BUG),)),
    "nccl_hang": Kind(Effect.HANG, ((1.0, Signal.NOTHING),)),
    "host": Kind(Effect.DOWN, ((1.0, Signal.NOT_READY),)),
    "nic": Kind(Effect.CRASH, ((0.7, Signal.PORT_DOWN), (0.3, Signal.RATE_DROP))),
    "fabric": Kind(Effect.CRASH, ((1.0, Signal.PORT_DOWN),)),
    "thermal": Kind(Effect.CRASH, ((1.0, Signal.OVERHEAT),)),
    "sdc": Kind(Effect.SILENT, ((1.0, Signal.NOTHING),)),
    "fail_slow": Kind(Effect.SLOW, ((1.0, Signal.POWER_BRAKE),)),  # persistent: none
    "unattributed": Kind(Effect.HANG, ((1.0, Signal.NOTHING),)),
    "benign": Kind(Effect.NONE, ((0.5, Signal.XID_63), (0.5, Signal.CHECK_TIMEOUT))),
}
# Where each class's faults live, unless a trace's record says otherwise. A generated
# ``fabric`` fault is a rack's switch (one fault per node of the rack, one group): a
# domain. A job's own faults end with it; everything else is the machine's.
LOCI: dict[str, Locus] = {name: Locus.MACHINE for name in KINDS} | {
    "fabric": Locus.DOMAIN,
    "application": Locus.JOB,
    "nccl_hang": Locus.JOB,
    "unattributed": Locus.JOB,
}
# Classes no periodic check reads reliably: only a load test (the deep suite) finds them.
HIDDEN_CLASSES = frozenset({"sdc", "fail_slow"})
# Replayed records no device signal shows, which the trace's operators found themselves
# (a job troubleshot, their stress test) and held offline for the record's span.
OFFLINE_CLASSES = frozenset({"unattributed", "fail_slow"})
# Classes whose faults live on one GPU: the GPU lost or off its PCIe link (Xid 79), its
# memory (Xid 48, 63, 64, 94, 95, a row-remap failure), its GSP (Xid 119), its NVLinks
# (Xid 74: the GPU's own links; the others' links and the switches are fine), its
# temperature at the shutdown threshold (the agent names that GPU), its corrupting SMs.
# A per-GPU quarantine (a DRA device taint) can take that GPU alone out. The host, its
# kernel and driver, its adapters, the rack's switch and the power (a power brake holds
# every GPU) are the node's: they take the node.
GPU_LOCAL_CLASSES = frozenset({"gpu", "pcie", "hbm", "sram", "gsp", "nvlink", "thermal", "sdc"})
# Classes whose faults are counted as job interruptions in the published figures.
ATTRIBUTED = frozenset(
    name for name in KINDS if name not in ("fail_slow", "unattributed", "benign")
)


@dataclass
class Fault:
    id: int
    slot: int
    cls: str
    start: float
    fix: Fix
    effect: Effect
    signal: Signal
    gpu: int
    end: float | None  # when a self-clearing fault ends
    slowdown: float  # the node's pace while it lasts (SLOW faults)
    lemon: bool  # from a lemon's extra rate: gone once the machine is replaced
    check_phase: float  # where in the agent's check period it shows (0..1)
    group: int = -1  # faults of one switch failure share a group
    locus: Locus = Locus.MACHINE  # what a replacement takes away (MACHINE) or leaves
    # A replayed record's end: when the trace's operators had the node back, repaired.
    recorded_end: float | None = None

    @property
    def stays_with_slot(self) -> bool:
        """The position's or its domain's (a cable, a switch): no reset, reboot or new
        machine clears it, and it fails whether or not a machine runs in the slot."""
        return self.locus is Locus.POSITION or self.locus is Locus.DOMAIN

    @property
    def gpu_local(self) -> bool:
        """Confined to one GPU (``GPU_LOCAL_CLASSES``): the node's other GPUs are fine."""
        return self.cls in GPU_LOCAL_CLASSES and self.locus is Locus.MACHINE

    @property
    def of_silent_machine(self) -> bool:
        """A crash of a bad machine that shows nothing on the node (``silent_machine_share``):
        it stops once the machine is replaced."""
        return self.cls == "unattributed" and self.lemon

    @property
    def disables(self) -> bool:
        """The node is out of service while this fault lasts."""
        return self.effect not in (Effect.SLOW, Effect.NONE)
