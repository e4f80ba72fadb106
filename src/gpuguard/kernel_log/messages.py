"""The grammar of the kernel log lines gpuguard acts on: one line in, one event out.

The patterns follow the format strings of NVIDIA's kernel driver (open-gpu-kernel-modules,
branches 515 to 590; each string, its file and the finding it yields are listed in
``data/kernel_messages.csv``) and of the Linux kernel's own fault reports. They are
deliberately loose about what varies between branches and collectors: a PCI address
comes with or without the domain (4 or 8 digits) and with or without the function, the
``PCI:`` tag and the ``NVRM:`` prefix may be missing, and any timestamp or host prefix may
stand in front (for Xid, SXid and fallen-off-the-bus lines; the driver's other messages
are found by their "NVRM:"). A message the driver uses for a fatal fault must never slip
through because of its spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A PCI address as the driver and the tools print it: "0000:3b:00", "00000000:3B:00.0",
# "3b:00.0". The domain and the function are optional.
PCI_ADDRESS = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_ADDRESS = re.compile(
    rf"(?<![0-9a-fA-F:])(?:PCI:)?(?P<bdf>{PCI_ADDRESS})(?![0-9a-fA-F]|:[0-9a-fA-F])"
)
# Outside an Xid's parentheses an address counts only where the driver names a GPU with
# it ("GPU 0000:3b:00.0: ...", "GPU at PCI:0000:3b:00"), never a time such as "+00:00".
_NAMED_ADDRESS = re.compile(
    rf"(?:PCI:|GPU (?:at )?(?:PCI:)?)(?P<bdf>{PCI_ADDRESS})(?![0-9a-fA-F]|:[0-9a-fA-F])"
)
_GPU_INSTANCE = re.compile(r"GPU-I:(?P<gi>\d+)")
# The driver's own number for a GPU (gpuGetInstance): in the prefix NV_PRINTF adds
# ("NVRM: GPU6 _kgspRpcRecvPoll: ..."), in "from GPU4 GSP!" and "GPU0 sanity check failed".
_GPU_NUMBER = re.compile(r"\bGPU(?P<n>\d{1,3})\b")

# parse_line tries SXid first, so this never sees an NVSwitch line.
_XID = re.compile(r"Xid\s*\((?P<where>[^)]*)\)\s*:\s*(?P<code>\d+),?\s*(?P<text>.*)")
_SXID = re.compile(r"SXid\s*\((?P<where>[^)]*)\)\s*:\s*(?P<code>\d+),?\s*(?P<text>.*)")
_SWITCH = re.compile(r"nvidia-nvswitch\d+")
_PROCESS = re.compile(r"pid='?(?P<pid><unknown>|\d+)'?, name=(?P<name>[^,]*),\s*")
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<code>\d+)")

# The first line of the driver's three-line "fallen off the bus" message names the GPU;
# the line that says so may not (nv.c: "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\n
# NVRM: (PCI ID: %04x:%04x) installed in this system has\nNVRM: fallen off the bus ...").
_GPU_NAMED = re.compile(rf"The NVIDIA GPU (?:at )?(?:PCI:)?(?P<bdf>{PCI_ADDRESS})")
# Words every kernel-level fault line holds (see _KERNEL for the forms); kernel_log's
# prefilter keeps the lines that have one.
KERNEL_PHRASES = (
    "BUG",  # "BUG: soft lockup", "kernel BUG at", "BUG: kernel NULL pointer dereference"
    "blocked for more than",
    "Oops",
    "Kernel panic",
    " [#",  # an x86 die header: "general protection fault: 0000 [#1] SMP PTI"
    "Hardware Error",
    "achine check",  # "Machine check events logged", "Machine check: Processor context ..."
    "EDAC ",
)
# Driver messages other than Xids, by the phrases that identify them (rules.DRIVER_RULES maps
# each kind to its finding; data/kernel_messages.csv lists the format strings). The first
# kind with a phrase in the line wins.
DRIVER_PHRASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # osinit.c osHandleGpuLost, osapi.c rm_is_supported_device; "GPU lost from the bus" is
    # NV_ERR_GPU_IS_LOST's text inside an assertion line.
    ("fallen_off_bus", ("fallen off the bus", "lost from the bus")),
    (
        "gpu_init_failed",
        (
            "RmInitAdapter failed",
            "rm_init_adapter failed",
            "Cannot initialize GSP firmware RM",
            "unexpected WPR2 already up",
            "No interrupts of any type are available",
        ),
    ),
    ("gpu_power_cables", ("does not have the necessary power cables connected",)),
    # kernel_nvlink_gh100.c / kernel_nvlink.c: link discovery between two GPUs failed, so
    # their NVLinks do not come up (NV_PRINTF names the function, not the GPU).
    (
        "nvlink_training_failed",
        ("postRxDetLinkMask failed", "Failed to update Rx Detect Link mask"),
    ),
    ("gsp_rpc_errors", ("Rate limiting GSP RPC error prints", "Back to back GSP RPC timeout")),
    # kernel_gsp.c: the GSP firmware stopped answering. These lines go on after the driver
    # rate-limits its Xid 119s, and name the GPU only by the driver's own number ("GPU6").
    (
        "gsp_unresponsive",
        (
            "GSP RM heartbeat timed out",
            "LibOS heartbeat timed out",
            "Heartbeat timed out, currentTimeMs",
            "sanity check failed 0x",
            "GSP-RM unresponsive",
            "GSP core unresponsive",
        ),
    ),
    ("gpu_unsupported", ("installed in this system is not supported by",)),
    ("driver_mismatch", ("API mismatch",)),
)
DRIVER_MESSAGES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile("|".join(map(re.escape, phrases)))) for kind, phrases in DRIVER_PHRASES
)
# The PCIe core's AER report of an uncorrectable fatal error on a device the NVIDIA driver
# holds (drivers/pci/pcie/aer.c, aer_print_error: "PCIe Bus Error: severity=%s, type=%s,
# (%s)", printed for the device as "nvidia <pci>: " and, since 5.1, "AER: "; the severity
# "Uncorrected (Fatal)", "Uncorrectable (Fatal)" in older kernels), and drivers/pci/pcie/
# err.c's "can't recover (no error_detected callback)" for it. A bridge's or another
# driver's device is not read here: nothing on such a line says a GPU is behind it.
_GPU_AER = re.compile(
    rf"\bnvidia (?P<bdf>{PCI_ADDRESS}): (?:AER: )?"
    r"(?:(?:PCIe|CXL) Bus Error: severity=Uncorrect\w* \(Fatal\)|can't recover)"
)
# The same fatal error as another device reports it: a bridge above a GPU (the error is
# about the link below it, and the kernel recovers every device under it), or the root
# port naming the device the error message came from ("AER: Uncorrected (Fatal) error
# received: 0000:9b:00.0"; "Uncorrectable", "error message received from" in later
# kernels). tally.IncidentTally finds the GPUs below a bridge from the boot's own lines:
_PORT_AER = re.compile(
    rf"\b(?P<driver>[\w-]+) (?P<bdf>{PCI_ADDRESS}): (?:AER: )?"
    r"(?:(?:PCIe|CXL) Bus Error: severity=Uncorrect\w* \(Fatal\)"
    rf"|(?:Multiple )?Uncorrect\w* \(Fatal\) error (?:message )?received(?: from)?:? "
    rf"(?P<source>{PCI_ADDRESS}))"
)
# the PCI core's enumeration of an NVIDIA display-class device (probe.c: "[%04x:%04x] type
# %02x class %#08x"; class 0x03xxxx: a GPU, not an NVSwitch or a NIC) ...
_PCI_GPU = re.compile(
    rf"\bpci (?P<bdf>{PCI_ADDRESS}): \[10de:[0-9a-fA-F]{{4}}\] type [0-9a-f]{{2}} class 0x03"
)
# ... and each bridge's secondary to subordinate bus numbers (setup-bus.c: "PCI bridge to
# %pR", the bus resource printed as "[bus 98-9c]", or "[bus 02]" for one bus).
_PCI_BRIDGE = re.compile(
    rf"\bpci (?P<bdf>{PCI_ADDRESS}): PCI bridge to \[bus (?P<first>[0-9a-f]{{2}})"
    r"(?:-(?P<last>[0-9a-f]{2}))?\]"
)
AER_PHRASES = (
    "Bus Error: severity=Uncorrect",
    "can't recover",
    "(Fatal) error ",
    "[10de:",
    "PCI bridge to",
)
# EFA's driver logs as "efa <pci>:" or through the RDMA core as "infiniband <ibdev>:".
_EFA = re.compile(
    rf"(?:infiniband (?P<ibdev>(?:rdmap\w+|efa_\d+))|efa (?P<pci>{PCI_ADDRESS})): (?P<text>.*)"
)
# A network link's carrier as its driver logs it: mlx5e ("mlx5_core 0000:0c:00.0 ens1f0np0:
# Link down"), Intel ice/i40e and Broadcom bnxt ("NIC Link is Down", "NIC Link is Up, ..."),
# and the bonding driver for its ports ("(slave ens1f0np0): link status definitely down").
_LINK = re.compile(
    r"(?:(?P<ifname>[\w.@-]+): (?:NIC )?Link (?:is )?(?P<state>[Uu]p|[Dd]own)\b"
    r"|\(slave (?P<slave>[\w.@-]+)\): link status definitely (?P<bond>up|down)\b)"
)
LINK_PHRASES = (": Link ", "NIC Link is", "(slave ")  # few and rare: the prefilter's speed
# Kernel-level faults; rules.KERNEL_RULES maps the matched words to findings.
# An x86 die header (arch/x86/kernel/dumpstack.c: "%s: %04lx [#%d]") names the trap
# that killed kernel code; userspace traps ("traps: python[12] general protection fault
# ip:...") carry no such header and are not kernel faults.
_KERNEL = re.compile(
    r"(?P<kind>soft lockup|blocked for more than \d+ seconds|kernel BUG at|BUG: unable to handle"
    r"|BUG: kernel NULL pointer dereference|Oops: |Kernel panic - not syncing"
    r"|(?:general protection fault|divide error|invalid opcode|stack segment|double fault)"
    r"[^:]*: [0-9a-f]{4} \[#\d+\]"
    r"|Hardware Error|[Mm]achine check|EDAC \S+: (?:\d+ )?(?:CE|UE) |EDAC \S+: Uncorrected)"
)


@dataclass(frozen=True)
class KernelEvent:
    """One relevant kernel log line, parsed.

    ``kind`` is ``xid``, ``sxid``, ``gpu_named`` (a line that names the GPU the next lines
    of the same message are about), one of :data:`DRIVER_MESSAGES`' kinds, ``efa``,
    ``kernel``, ``link`` (a network link's carrier; ``text`` is "up" or "down"),
    ``pcie_fatal`` (a fatal PCIe error another device reports, about ``device``: the
    device it names or the bridge itself), ``pci_gpu`` or ``pci_bridge`` (the boot's
    enumeration of a GPU, and of a bridge with its buses, ``text`` "98-9c");
    ``device`` is the PCI bus id (GPU, NVSwitch, EFA), RDMA device or network link name as
    printed ("" when the line names none); ``code`` the Xid/SXid number; ``gpu_number``
    the driver's own number for a GPU where the line gives one ("GPU6").
    """

    kind: str
    line: str
    device: str = ""
    code: int | None = None
    text: str = ""
    pid: str | None = None
    process: str | None = None
    caused_by: int | None = None
    gpu_instance: int | None = None
    gpu_number: int | None = None  # the driver's own number for the GPU ("GPU6")


def parse_line(line: str) -> KernelEvent | None:
    """The event a kernel log line records, or None if it records nothing we act on."""
    if (m := _SXID.search(line)) is not None:
        switch = _SWITCH.findall(line, 0, m.start())
        return KernelEvent(
            "sxid",
            line,
            _address(m["where"]),
            int(m["code"]),
            m["text"],
            process=switch[-1] if switch else None,
        )
    if (m := _XID.search(line)) is not None:
        return _xid_event(line, m)
    if (m := _GPU_AER.search(line)) is not None:
        return KernelEvent("gpu_pcie_fatal", line, m["bdf"], text=m[0])
    if (m := _PORT_AER.search(line)) is not None:
        return KernelEvent("pcie_fatal", line, m["source"] or m["bdf"], text=m[0])
    if (m := _PCI_GPU.search(line)) is not None:
        return KernelEvent("pci_gpu", line, m["bdf"])
    if (m := _PCI_BRIDGE.search(line)) is not None:
        return KernelEvent(
            "pci_bridge", line, m["bdf"], text=f"{m['first']}-{m['last'] or m['first']}"
        )
    for kind, pattern in DRIVER_MESSAGES:
        if (match := pattern.search(line)) is not None:
            device = _address(line, _NAMED_ADDRESS)
            return KernelEvent(kind, line, device, text=match[0], gpu_number=_number(line))
    if (m := _GPU_NAMED.search(line)) is not None:
        return KernelEvent("gpu_named", line, m["bdf"])
    if (m := _EFA.search(line)) is not None:
        return KernelEvent("efa", line, m["ibdev"] or m["pci"], text=m["text"])
    if (m := _KERNEL.search(line)) is not None:
        return KernelEvent("kernel", line, text=line[m.start() :])
    if (m := _LINK.search(line)) is not None:
        state = (m["state"] or m["bond"]).lower()
        return KernelEvent("link", line, m["ifname"] or m["slave"], text=state)
    return None


def _xid_event(line: str, m: re.Match[str]) -> KernelEvent:
    text = m["text"]
    pid = process = None
    if (p := _PROCESS.match(text)) is not None:
        pid = None if p["pid"] == "<unknown>" else p["pid"]
        process = None if p["name"] in ("<unknown>", "") else p["name"]
        text = text[p.end() :]
    caused = _CAUSED_BY.search(text)
    instance = _GPU_INSTANCE.search(m["where"])
    return KernelEvent(
        kind="xid",
        line=line,
        device=_address(m["where"]),
        code=int(m["code"]),
        text=text,
        pid=pid,
        process=process,
        caused_by=int(caused["code"]) if caused else None,
        gpu_instance=int(instance["gi"]) if instance else None,
        gpu_number=_number(text),
    )


def _number(text: str) -> int | None:
    m = _GPU_NUMBER.search(text)
    return int(m["n"]) if m else None


def _address(text: str, pattern: re.Pattern[str] = _ADDRESS) -> str:
    """The last PCI address in ``text`` ("" when there is none)."""
    found = pattern.findall(text)
    return found[-1] if found else ""
