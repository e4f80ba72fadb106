"""Every driver and kernel message in data/kernel_messages.csv, printed the way the driver
prints it and delivered the way each collector delivers it, yields its finding.

Each row holds a format string as it stands in NVIDIA's open kernel modules (or the Linux
kernel), the macro that prints it (which adds its own prefix) and the finding it must
yield. Hypothesis fills the conversions with random values and a random GPU address,
splits multi-line messages into records as /dev/kmsg, dmesg, journald and syslog do, and
surrounds them with other drivers' chatter.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.kernel_log.check import classify_log
from gpuguard.kernel_log.state import KernelState
from gpuguard.model import NODE, Action, Layer, Severity, Status, assess_layer, gpu
from tests.support.clock import FakeClock

ROWS = list(
    csv.DictReader(
        resources.files("gpuguard").joinpath("data/kernel_messages.csv").read_text().splitlines()
    )
)
PREFIXES = {
    "nv_printf": "",  # the format carries its own "NVRM: " on every line
    "linux": "",
    "NV_DEV_PRINTF": "NVRM: GPU %04x:%02x:%02x.%x: ",  # kernel-open/common/inc/os-interface.h
    "NV_PRINTF": "NVRM: {function}: ",  # RmMsgPrefix: NVRM plus the C function's name
    # RmMsgPrefix with the GPU-instance flag: the driver's own number for the GPU first.
    "NV_PRINTF_GPU": "NVRM: GPU%u {function}: ",
}
# The first PCI address of a message is the GPU (or NVSwitch) it is about.
PCI = re.compile(r"%04x:%02x:%02x(?:\.%x)?")
CONVERSION = re.compile(r"%%|%0?(\d*)(?:ll|l|L)?([duxXsc])")
CHATTER = [
    "ACPI: PCI Interrupt Link [LNKC] enabled at IRQ 11",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "mlx5_core 0000:3b:00.0: E-Switch: Total vports 18, per vport: max uc(128) max mc(2048)",
    "systemd[1]: Started Journal Service at 2026-12-01T08:00:00+00:00.",
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping",
    'audit: type=1400 audit(1700000000.123:42): apparmor="STATUS"',
]
SHAPES = (
    "kmsg-records",  # one /dev/kmsg record per line (older kernels, separate printk calls)
    "kmsg-record",  # one record, newlines escaped as \x0a (how /dev/kmsg shows one printk)
    "dmesg",  # syslog(2) / console: every line with its own timestamp
    "dmesg-T",
    "dmesg-iso",
    "dmesg-continuation",  # util-linux dmesg from /dev/kmsg: later lines bare
    "journal",  # journalctl short: later lines of one entry indented under the first
    "syslog",  # rsyslog's kern.log
)
ids = st.integers(0, 0xFFFF)
tokens = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@dataclass(frozen=True)
class Printed:
    lines: list[str]
    address: str | None  # canonical dddd:bb:dd.f of the GPU the message names


@st.composite
def printed(draw: st.DrawFn, row: dict[str, str]) -> Printed:
    template = PREFIXES[row["printed_by"]].format(function=row["function"]) + row["format"]
    template = template.replace("\\n", "\n").rstrip("\n")
    address = None
    match = PCI.search(template)
    if match is not None:
        domain, bus, device, function = (
            draw(ids),
            draw(st.integers(0, 255)),
            draw(st.integers(0, 31)),
            draw(st.integers(0, 7)),
        )
        with_function = match[0].endswith(".%x")
        text = f"{domain:04x}:{bus:02x}:{device:02x}" + (f".{function:x}" if with_function else "")
        template = template[: match.start()] + text + template[match.end() :]
        address = f"{domain:04x}:{bus:02x}:{device:02x}.{function if with_function else 0:x}"

    def fill(conversion: re.Match[str]) -> str:
        if conversion[0] == "%%":
            return "%"
        width, kind = int(conversion[1] or 0), conversion[2]
        if kind == "s":
            return draw(tokens)
        if kind == "c":
            return draw(st.sampled_from("* "))
        value = draw(st.integers(0, 0xFFFFFFFF))
        return f"{value:0{width}x}" if kind in "xX" else f"{value % 100_000:0{width}d}"

    return Printed(CONVERSION.sub(fill, template).split("\n"), address)


@dataclass(frozen=True)
class Delivery:
    shape: str
    uptime_s: float  # the kernel's timestamp
    when: datetime  # the wall-clock time dmesg -T, iso, journald and syslog print
    noise: list[str]


deliveries = st.builds(
    Delivery,
    st.sampled_from(SHAPES),
    st.floats(0, 1e8, allow_nan=False),
    st.datetimes(datetime(2020, 1, 1), datetime(2035, 12, 31)),
    st.lists(st.sampled_from(CHATTER), max_size=6),
)


def deliver(lines: list[str], how: Delivery) -> list[str]:
    """The log text a collector gives for one message, with chatter around it."""
    stamp = f"[{how.uptime_s:12.6f}]"
    usec = int(how.uptime_s * 1e6)
    if how.shape == "kmsg-record":
        body = [f"4,1234,{usec},-;" + "\\x0a".join(lines)]
    elif how.shape == "kmsg-records":
        body = [f"4,{1234 + i},{usec},-;{line}" for i, line in enumerate(lines)]
    elif how.shape == "dmesg":
        body = [f"{stamp} {line}" for line in lines]
    elif how.shape == "dmesg-T":
        body = [f"[{how.when:%a %b %e %H:%M:%S %Y}] {line}" for line in lines]
    elif how.shape == "dmesg-iso":
        body = [f"{how.when:%Y-%m-%dT%H:%M:%S,%f}+00:00 {line}" for line in lines]
    elif how.shape == "dmesg-continuation":
        body = [f"{stamp} {lines[0]}", *lines[1:]]
    elif how.shape == "journal":
        head = f"{how.when:%b %d %H:%M:%S} gpu-node-7 kernel: "
        body = [head + lines[0], *(" " * len(head) + line for line in lines[1:])]
    else:
        body = [f"{how.when:%b %e %H:%M:%S} gpu-node-7 kernel: {stamp} {line}" for line in lines]
    half = len(how.noise) // 2
    return how.noise[:half] + body + how.noise[half:]


def expected_component(row: dict[str, str], address: str | None):
    if row["code"].startswith("SXID_"):
        return ("nvswitch", address)
    if address is None or row["code"].startswith(("MACHINE_CHECK", "NVIDIA_DRIVER", "PCIE_FATAL")):
        return (NODE.kind, NODE.id)
    return ("gpu", gpu(address).id)


def assert_yields(row: dict[str, str], printed_message: Printed, findings) -> None:
    found = [f for f in findings if f.code == row["code"]]
    assert found, f"{row['message']}: no {row['code']} in {[f.code for f in findings]}"
    finding = found[0]
    assert (finding.component.kind, finding.component.id) == expected_component(
        row, printed_message.address
    )
    assert str(finding.severity) == row["severity"]
    assert str(finding.action) == row["action"]
    if finding.severity is Severity.CRITICAL:
        layer = assess_layer(finding.layer, findings, ["kernel-log"], [])
        assert layer.status is Status.UNHEALTHY or finding.layer is not layer.layer


@pytest.mark.parametrize("row", ROWS, ids=[row["message"] for row in ROWS])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_format_string_yields_its_finding_from_every_collector(row, data):
    message = data.draw(printed(row))
    log = "\n".join(deliver(message.lines, data.draw(deliveries))) + "\n"
    assert_yields(row, message, classify_log(log))
    assert_yields(row, message, classify_log(log.encode()))


@pytest.mark.parametrize("row", ROWS, ids=[row["message"] for row in ROWS])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_the_agent_reads_a_message_split_over_separate_reads(row, data):
    message = data.draw(printed(row))
    state = KernelState(application_ttl_s=600, boot_id=lambda: "boot-1", clock=FakeClock())
    how = Delivery("kmsg-records", 12.5, datetime(2026, 12, 1), [])
    for line in deliver(message.lines, how):
        state.add_lines([line], reset=False)
    assert_yields(row, message, state.findings())


def test_the_table_covers_every_driver_finding_kind():
    codes = {row["code"] for row in ROWS}
    assert {
        "GPU_FALLEN_OFF_BUS",
        "GPU_INIT_FAILED",
        "GPU_POWER_NOT_CONNECTED",
        "GSP_RPC_ERRORS",
        "GPU_UNSUPPORTED_BY_DRIVER",
        "NVIDIA_DRIVER_MISMATCH",
        "MACHINE_CHECK_FATAL",
        "MACHINE_CHECK_PREVIOUS_BOOT_FATAL",
        "MACHINE_CHECK",
    } <= codes
    for row in ROWS:
        assert row["printed_by"] in PREFIXES, row["message"]
        assert row["file"] and row["tags"], row["message"]


def test_fallen_off_the_bus_that_names_no_gpu_is_about_the_node_not_dropped():
    (finding,) = classify_log("NVRM: fallen off the bus and is not responding to commands.\n")
    assert (finding.code, finding.component, finding.action) == (
        "GPU_FALLEN_OFF_BUS",
        NODE,
        Action.REBOOT,
    )
    assert finding.layer is Layer.GPU


def test_two_gpus_lost_at_probe_are_two_findings():
    log = "".join(
        f"NVRM: The NVIDIA GPU 0000:{bus}:00.0\nNVRM: (PCI ID: 10de:2330) installed in this "
        "system has\nNVRM: fallen off the bus and is not responding to commands.\n"
        for bus in ("1b", "43")
    )
    found = {f.component.id for f in classify_log(log) if f.code == "GPU_FALLEN_OFF_BUS"}
    assert found == {"0000:1b:00.0", "0000:43:00.0"}


def test_a_time_in_the_prefix_is_never_read_as_a_gpu_address():
    line = "2026-12-01T10:25:43,123456+00:00 gpu-node-7 kernel: NVRM: GPU has fallen off the bus."
    (finding,) = classify_log(line)
    assert finding.component == NODE


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:b3:00.0): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
        "NVRM: Xid (PCI:b3:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (00000000:B3:00.0): 79, GPU has fallen off the bus.",
        "kernel: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",  # NVRM: dropped
    ],
)
def test_xid_79_in_every_address_spelling(line):
    (finding,) = classify_log(line)
    assert (finding.code, finding.component.id) == ("XID_79", "0000:b3:00.0")
    assert finding.action is Action.REBOOT


def test_a_userspace_trap_is_not_a_kernel_fault():
    log = (
        "[  812.1] traps: python3[1234] general protection fault ip:7f2a sp:7ffc error:0 in libc.so.6\n"
        "[  812.2] traps: a.out[99] trap divide error ip:401136 sp:7ffe error:0 in a.out[401000+1000]\n"
        "[  812.3] traps: train[7] trap invalid opcode ip:7f01 sp:7ffd error:0 in libtorch_cpu.so\n"
    )
    assert classify_log(log) == []


def test_an_sxid_whose_fatal_line_was_lost_is_fatal_by_its_severity_line():
    line = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Severity 1 Engine instance 00"
    (finding,) = classify_log(line)
    assert (finding.severity, finding.action) == (Severity.CRITICAL, Action.REBOOT)
    (finding,) = classify_log(line.replace("Severity 1", "Severity 0"))
    assert finding.severity is Severity.WARNING


# Lines a log shipper may strip of their "NVRM: " prefix must still be found; the driver's
# other messages are found by the "NVRM" it writes into every one of them.
SURVIVE_STRIPPING = ("Xid (", "fallen off the bus")


def survives_stripping(row: dict[str, str]) -> bool:
    return any(words in row["format"] for words in SURVIVE_STRIPPING)


@pytest.mark.parametrize(
    "row", [r for r in ROWS if survives_stripping(r)], ids=lambda r: r["message"]
)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_xid_sxid_and_fallen_off_the_bus_survive_a_stripped_prefix(row, data):
    message = data.draw(printed(row))
    stripped = "\n".join(line.replace("NVRM: ", "") for line in message.lines)
    assert row["code"] in {f.code for f in classify_log(stripped)}


@pytest.mark.parametrize("row", ROWS, ids=[row["message"] for row in ROWS])
def test_every_other_driver_message_carries_the_nvrm_marker(row):
    if row["printed_by"] == "linux" or survives_stripping(row):
        return
    printed_form = PREFIXES[row["printed_by"]] + row["format"]
    assert all("NVRM" in line for line in printed_form.split("\\n") if line), (
        f"{row['message']}: a line without NVRM would need a marker of its own"
    )
