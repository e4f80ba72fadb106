"""Busy GPUs compared with their siblings, without the job's help (check ``load-clocks``).

Identical GPUs working for the same job at the same load run at about the same SM clock;
one that runs measurably slower (a power brake, a thermal or hardware slowdown, a clock
stuck low with no reason given) holds back every synchronous step. Each run takes one
sample; a GPU is named once most of a window of loaded samples put it ``tolerance`` below
the median of its busy siblings. An idle or lightly loaded node gives no verdict: the
deep suite judges it then.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gpuguard.checks.base import CheckContext
from gpuguard.checks.in_job.load_samples import GpuSample, sample_gpus
from gpuguard.checks.in_job.rules import LOAD_CLOCK_BELOW_SIBLINGS, RULES
from gpuguard.checks.nvml import import_pynvml
from gpuguard.checks.nvml_binding import Nvml
from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.config import LoadClocks
from gpuguard.errors import ToolMissing
from gpuguard.model import Finding, Layer, gpu

SOURCE = "load-clocks"


@dataclass(frozen=True)
class Judged:
    """One loaded sample of one GPU, against the median of its busy siblings."""

    at: float
    below: bool
    sample: GpuSample
    siblings_mhz: float
    siblings: int


class LoadClockCheck:
    name: ClassVar[str] = "load-clocks"
    layer: ClassVar[Layer] = Layer.GPU

    def __init__(
        self,
        nvml: Nvml | None = None,
        clock: Clock = SYSTEM_CLOCK,
        proc: Path = Path("/proc"),
    ) -> None:
        """``proc``: where the GPU processes' cgroups are read (the host's, with hostPID)."""
        self._nvml = nvml
        self._clock = clock
        self._proc = proc
        self._history: dict[str, deque[Judged]] = defaultdict(deque)

    def run(self, ctx: CheckContext) -> list[Finding]:
        if not ctx.sources.live:
            raise ToolMissing("load clocks are sampled on the live node only")
        nvml = self._nvml if self._nvml is not None else import_pynvml()
        settings = ctx.config.load_clocks
        now = self._clock.monotonic()
        for judged in judge_sample(sample_gpus(nvml, self._proc), settings, now):
            self._history[judged.sample.pci_bus_id].append(judged)
        findings = []
        for history in self._history.values():
            while history and history[0].at < now - settings.window_s:
                history.popleft()
            found = verdict(list(history), settings)
            if found is not None:
                findings.append(found)
        return findings


def judge_sample(samples: list[GpuSample], settings: LoadClocks, now: float) -> list[Judged]:
    """Each busy GPU against the busy GPUs of its model working for the same job."""
    groups: dict[tuple[str, str], list[GpuSample]] = defaultdict(list)
    for s in samples:
        if s.utilization_percent >= settings.busy_utilization_percent:
            groups[(s.model, s.job)].append(s)
    judged = []
    for members in groups.values():
        for s in members:
            others = [o.sm_mhz for o in members if o is not s]
            if not others:
                continue
            median = statistics.median(others)
            below = s.sm_mhz < median * (1 - settings.tolerance)
            judged.append(Judged(now, below, s, median, len(others)))
    return judged


def verdict(history: list[Judged], settings: LoadClocks) -> Finding | None:
    """A finding when enough of the window's loaded samples put the GPU below."""
    below = [j for j in history if j.below]
    if len(history) < settings.min_samples or len(below) < settings.share * len(history):
        return None
    last = below[-1].sample
    mhz = statistics.median(j.sample.sm_mhz for j in below)
    siblings = statistics.median(j.siblings_mhz for j in below)
    reasons = sorted({r for j in below for r in j.sample.reasons}) or ["none reported"]
    power = [j.sample.power_w for j in below if j.sample.power_w is not None]
    heat = [j.sample.temperature_c for j in below if j.sample.temperature_c is not None]
    evidence = (
        f"{len(below)} of {len(history)} loaded samples over {history[-1].at - history[0].at:.0f}s"
        f" below {1 - settings.tolerance:.0%} of the siblings' median; {last.model}, busy"
        f" {last.utilization_percent:.0f}%; clock event reasons: {', '.join(reasons)}"
        + (f"; power {statistics.median(power):.0f} W" if power else "")
        + (f"; {statistics.median(heat):.0f} C" if heat else "")
        + (f"; job {last.job}" if last.job else "")
    )
    message = (
        f"{gpu(last.pci_bus_id).id}: SM clock {mhz:.0f} MHz under load,"
        f" {mhz / siblings:.0%} of its {below[-1].siblings} busy siblings' {siblings:.0f} MHz"
    )
    component = gpu(last.pci_bus_id)
    return RULES[LOAD_CLOCK_BELOW_SIBLINGS].finding(Layer.GPU, component, SOURCE, message, evidence)
