"""The list of checks the runner uses, and which ones stand in for which.

Adding a source means adding a module under ``checks/`` with a class that implements
:class:`gpuguard.checks.base.Check` and listing it in :func:`default_checks`. An operator's
own programs come from the config (:func:`configured_checks`).
"""

from __future__ import annotations

from gpuguard.checks.base import Check, Fallback
from gpuguard.checks.dcgm.check import DcgmCheck, DcgmExporterCheck
from gpuguard.checks.in_job.load_clocks import LoadClockCheck
from gpuguard.checks.in_job.verdict_check import InJobCheck
from gpuguard.checks.maintenance.check import MaintenanceCheck
from gpuguard.checks.network.check import NetworkCheck
from gpuguard.checks.nvidia_smi.check import SmiCheck
from gpuguard.checks.nvml import NvmlCheck
from gpuguard.checks.plugins.check import plugin_checks
from gpuguard.config import Config
from gpuguard.kernel_log.check import KernelLogCheck

# GPU sources in order of preference: DCGM, then NVML, then nvidia-smi. The kernel log
# comes first so that its Xid lines (the richest evidence) win when sources overlap.
FALLBACKS = (Fallback(check="nvidia-smi", primary="nvml"),)


def default_checks() -> list[Check]:
    """Every check, in the order their findings are preferred when two report the same."""
    return [
        KernelLogCheck(),
        DcgmCheck(),
        NvmlCheck(),
        SmiCheck(),
        DcgmExporterCheck(),
        NetworkCheck(),
        InJobCheck(),
        LoadClockCheck(),
        MaintenanceCheck(),
    ]


def configured_checks(config: Config) -> list[Check]:
    """The built-in checks, then the config's plugins (docs/checks.md, "Custom checks")."""
    return [*default_checks(), *plugin_checks(config.plugins)]
