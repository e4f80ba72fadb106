"""A plugin as a check: its program run under the check's time limit and a small output cap.

The program runs through :func:`gpuguard.tool_process.run_tool` like nvidia-smi does: in its
own process group, killed at the time limit or as soon as its output passes
:data:`MAX_OUTPUT_BYTES`, and never started again while a run that outlived its kill holds
on. What it said is read by :mod:`.document`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gpuguard.checks.base import Check, CheckContext
from gpuguard.checks.plugins.document import read_exit_code, read_json
from gpuguard.errors import CheckFailed, ToolMissing
from gpuguard.model import Finding, Layer
from gpuguard.plugins_config import PluginConfig
from gpuguard.tool_process import run_tool

# A verdict is a few lines; a plugin printing more is broken, and the agent's memory is small.
MAX_OUTPUT_BYTES = 64 * 1024


class PluginCheck:
    """Runs one configured program; its settings say how to read the answer."""

    name: ClassVar[str] = "plugin"
    layer: ClassVar[Layer] = Layer.KERNEL

    def __init__(self, settings: PluginConfig) -> None:
        self.settings = settings

    def run(self, ctx: CheckContext) -> list[Finding]:
        settings = self.settings
        try:
            # A hung run holds back this plugin only, not another that runs the same program.
            output = run_tool(
                list(settings.command), ctx.timeout_s, MAX_OUTPUT_BYTES, settings.check_name
            )
        except ToolMissing as exc:  # the operator asked for it: its absence is no verdict
            raise CheckFailed(str(exc)) from None
        read = read_json if settings.output == "json" else read_exit_code
        return read(settings, output.exit_code, output.text)


def plugin_checks(plugins: Sequence[PluginConfig]) -> list[Check]:
    """One check per configured plugin, named ``plugin-<name>``, on the plugin's layer."""
    return [_check_for(settings) for settings in plugins]


def _check_for(settings: PluginConfig) -> Check:
    class Configured(PluginCheck):
        name: ClassVar[str] = settings.check_name
        layer: ClassVar[Layer] = settings.layer

    return Configured(settings)
