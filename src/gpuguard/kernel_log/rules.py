"""What each kernel message means: the rules that give an incident its code, severity
and repair (EFA, the kernel's own faults, machine checks, the NVIDIA driver's messages that
are not Xids). The Xids' own rules are ``checks.xid_catalog``'s."""

from __future__ import annotations

import re

from gpuguard.kernel_log.messages import KernelEvent
from gpuguard.model import Action, Layer, Severity

# EFA driver messages (as matched text prefix) -> (code, severity, action).
# The admin-queue failures mean the device no longer answers its driver: only a new
# machine fixes that on EC2. A failed single command is worth a warning.
EFA_RULES: tuple[tuple[str, str, Severity, Action], ...] = (
    (
        "Wait for completion (polling) timeout",
        "EFA_ADMIN_TIMEOUT",
        Severity.CRITICAL,
        Action.REPLACE,
    ),
    (
        "The device didn't send any completion",
        "EFA_ADMIN_TIMEOUT",
        Severity.CRITICAL,
        Action.REPLACE,
    ),
    ("Admin queue is closed", "EFA_ADMIN_QUEUE_CLOSED", Severity.CRITICAL, Action.REPLACE),
    ("Reset indication didn't turn", "EFA_RESET_FAILED", Severity.CRITICAL, Action.REPLACE),
    ("Device isn't ready", "EFA_DEVICE_NOT_READY", Severity.CRITICAL, Action.REPLACE),
    ("Failed to process command", "EFA_COMMAND_FAILED", Severity.WARNING, Action.NONE),
    ("Failed to submit command", "EFA_COMMAND_FAILED", Severity.WARNING, Action.NONE),
)

# Kernel-level faults (matched words) -> (layer, code, severity, action).
KERNEL_RULES: dict[str, tuple[Layer, str, Severity, Action]] = {
    "soft lockup": (Layer.KERNEL, "KERNEL_SOFT_LOCKUP", Severity.WARNING, Action.NONE),
    "blocked for more than": (Layer.KERNEL, "KERNEL_HUNG_TASK", Severity.WARNING, Action.NONE),
    "kernel BUG at": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "BUG: unable to handle": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "BUG: kernel NULL pointer": (Layer.KERNEL, "KERNEL_BUG", Severity.CRITICAL, Action.REBOOT),
    "Oops: ": (Layer.KERNEL, "KERNEL_OOPS", Severity.CRITICAL, Action.REBOOT),
    # The die header of a trap in kernel code (before 6.x kernels printed it without Oops:).
    **{
        trap: (Layer.KERNEL, "KERNEL_OOPS", Severity.CRITICAL, Action.REBOOT)
        for trap in (
            "general protection fault",
            "divide error",
            "invalid opcode",
            "stack segment",
            "double fault",
        )
    },
    "Kernel panic - not syncing": (Layer.KERNEL, "KERNEL_PANIC", Severity.CRITICAL, Action.REBOOT),
}
# A hardware error the firmware (CPER/GHES "event severity"), the CPU (an MCA bank status
# with its UC bit) or EDAC reports as not corrected: the machine's state is suspect and
# only a restart clears it. A corrected one is worth a warning.
MACHINE_CHECK = (Layer.KERNEL, "MACHINE_CHECK", Severity.WARNING, Action.NONE)
MACHINE_CHECK_FATAL = (Layer.KERNEL, "MACHINE_CHECK_FATAL", Severity.CRITICAL, Action.REBOOT)
# A BERT record (the firmware's, of the previous boot) of a fatal or recoverable error: that
# boot ended in it and the reboot already happened, so no repair is due, but the machine
# is not healthy on its word either: held out of service until a person decides.
MACHINE_CHECK_PREVIOUS_BOOT = (
    Layer.KERNEL,
    "MACHINE_CHECK_PREVIOUS_BOOT_FATAL",
    Severity.CRITICAL,
    Action.NONE,
)
# Driver messages that are not Xids (kernel_messages.DRIVER_MESSAGES' kinds).
DRIVER_RULES: dict[str, tuple[Layer, str, Severity, Action]] = {
    "fallen_off_bus": (Layer.GPU, "GPU_FALLEN_OFF_BUS", Severity.CRITICAL, Action.REBOOT),
    # The driver could not bring the GPU up: only a new boot (a cold GPU) retries it.
    "gpu_init_failed": (Layer.GPU, "GPU_INIT_FAILED", Severity.CRITICAL, Action.REBOOT),
    # A cable, as Xid 54 (CHECK_MECHANICALS): software cannot repair it.
    "gpu_power_cables": (Layer.GPU, "GPU_POWER_NOT_CONNECTED", Severity.CRITICAL, Action.REPLACE),
    # As Xid 136 (link training failed, NVIDIA: RESET_GPU); the ladder goes on if it stays.
    "nvlink_training_failed": (
        Layer.GPU,
        "NVLINK_TRAINING_FAILED",
        Severity.CRITICAL,
        Action.RESET_GPU,
    ),
    # The driver says so itself: "The GPU likely needs to be reset", "GPU marked for reset".
    "gsp_rpc_errors": (Layer.GPU, "GSP_RPC_ERRORS", Severity.CRITICAL, Action.RESET_GPU),
    # As Xid 119 (a GSP RPC timeout, NVIDIA: RESET_GPU): its firmware stopped answering.
    "gsp_unresponsive": (Layer.GPU, "GSP_UNRESPONSIVE", Severity.CRITICAL, Action.RESET_GPU),
    # A GPU this driver does not support is unusable, and no repair changes that.
    "gpu_unsupported": (Layer.GPU, "GPU_UNSUPPORTED_BY_DRIVER", Severity.CRITICAL, Action.NONE),
    "driver_mismatch": (Layer.KERNEL, "NVIDIA_DRIVER_MISMATCH", Severity.CRITICAL, Action.REBOOT),
    # The GPU's PCIe link failed beyond what the link corrects: it falls off the bus (Xid
    # 79, which speaks for it when present); a reset of the GPU needs a working link.
    "gpu_pcie_fatal": (Layer.GPU, "GPU_PCIE_FATAL", Severity.CRITICAL, Action.REBOOT),
}
# Driver messages that repeat what an Xid of the same GPU already said.
SAME_AS_XID = {
    "GPU_FALLEN_OFF_BUS": 79,
    "GSP_RPC_ERRORS": 119,
    "GSP_UNRESPONSIVE": 119,
    "GPU_PCIE_FATAL": 79,
}
DRIVER_MESSAGES = {
    "GPU_FALLEN_OFF_BUS": "{who} has fallen off the PCIe bus and no longer answers its driver",
    "GPU_INIT_FAILED": "the driver could not initialise {who}",
    "GPU_POWER_NOT_CONNECTED": "{who} does not have its power cables connected",
    "GSP_RPC_ERRORS": "{who} keeps timing out its GSP firmware calls; the driver asks for a reset",
    "GSP_UNRESPONSIVE": "the GSP firmware of {who} stopped answering (heartbeat or RPC timeout)",
    "NVLINK_TRAINING_FAILED": "NVLink discovery of {who} with a peer failed: its links stay down",
    "GPU_UNSUPPORTED_BY_DRIVER": "{who} is not supported by the installed driver",
    "NVIDIA_DRIVER_MISMATCH": "the NVIDIA kernel module and its user-space libraries differ",
    "GPU_PCIE_FATAL": "an uncorrectable fatal PCIe error (AER) on {who} or the link above it",
}
# Machine-check severity words: CPER/GHES, the x86 MCE handler's own, EDAC's CE/UE.
_CPER_SEVERITY = re.compile(r"(?P<seq>\{\d+\})?\[Hardware Error\]: event severity: (?P<word>\w+)")
_MCA_STATUS = re.compile(r"Bank \d+: (?P<status>[0-9a-fA-F]{16})\b")
_MCA_UNCORRECTED = 1 << 61  # IA32_MCi_STATUS.UC (Intel SDM vol. 3B, 16.3.2.2)
# "Machine Check Exception": the CPU raised #MC, which it does only for an error it could
# not correct (corrected ones are only polled or signalled by CMCI).
_FATAL_WORDS = re.compile(
    r"Machine Check Exception|Processor context corrupt"
    r"|EDAC \S+: (?:\d+ )?UE |EDAC \S+: Uncorrected"
)


def kernel_rule(event: KernelEvent) -> tuple[Layer, str, Severity, Action]:
    rule = next((r for kind, r in KERNEL_RULES.items() if event.text.startswith(kind)), None)
    if rule is None:
        if machine_check_is_fatal(event.line):
            rule = MACHINE_CHECK_FATAL
        elif previous_boot_was_fatal(event.line):
            rule = MACHINE_CHECK_PREVIOUS_BOOT
        else:
            rule = MACHINE_CHECK
    return rule


def machine_check_is_fatal(text: str) -> bool:
    """Whether a hardware error report says the error was not corrected."""
    if _FATAL_WORDS.search(text) is not None:
        return True
    if (m := _CPER_SEVERITY.search(text)) is not None:
        # A record of this boot comes through GHES, numbered "{N}[Hardware Error]: ...";
        # BERT prints the firmware's records of the previous boot without the number: the
        # reboot that followed that error already happened.
        return m["seq"] is not None and m["word"].lower() in ("fatal", "recoverable")
    status = _MCA_STATUS.search(text)
    return status is not None and bool(int(status["status"], 16) & _MCA_UNCORRECTED)


def previous_boot_was_fatal(text: str) -> bool:
    """Whether a BERT record (no ``{N}``: drivers/acpi/apei/bert.c prints the previous
    boot's records with a bare "[Hardware Error]: ") says that boot's error was fatal or
    recoverable (not corrected)."""
    m = _CPER_SEVERITY.search(text)
    return m is not None and m["seq"] is None and m["word"].lower() in ("fatal", "recoverable")
