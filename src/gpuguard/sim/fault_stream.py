"""The failure stream: every fault of a run, drawn once from the seed before any policy runs.

Each class's faults arrive as a Poisson process at the scenario's rate (lemons at a
multiple of it, a switch for a whole rack at once); what clears each one, its signal and
how long it lasts are drawn with it. A replayed trace's records become faults here too.
"""

from __future__ import annotations

import math

import numpy as np

from gpuguard.sim.faults import DAY, HOUR, KINDS, LOCI, Effect, Fault, Fix, Locus, Signal
from gpuguard.sim.scenario import Failures, FaultClass, FaultClasses, Scenario
from gpuguard.sim.scenario import Fix as FixShares

# (start, slot or rack, class, lemon): one onset, before it becomes a fault per node.
Onset = tuple[float, int, str, bool]


def _signal(cls: str, fix: Fix, rng: np.random.Generator) -> Signal:
    if cls == "fail_slow" and fix is not Fix.SELF:
        return Signal.NOTHING  # a gray failure: slow, with no throttle reason to read
    if cls == "hbm":
        if fix is Fix.RESET:
            return Signal.XID_48_REMAP
        return Signal.XID_48_REMAP_FAILED if fix is Fix.REPLACE else Signal.XID_48
    weights = KINDS[cls].signals
    if len(weights) == 1:
        return weights[0][1]
    total = sum(w for w, _ in weights)
    draw = rng.random() * total
    for weight, signal in weights:
        draw -= weight
        if draw <= 0:
            return signal
    return weights[-1][1]


def _effect(cls: str, signal: Signal) -> Effect:
    if signal is Signal.RATE_DROP:
        return Effect.SLOW  # the link is up at half speed: the collective slows down
    return KINDS[cls].effect


def generate_faults(scenario: Scenario, rng: np.random.Generator) -> list[Fault]:
    """Every fault of the run, in time order (ties broken by slot)."""
    racks = _racks(scenario.fleet.nodes, scenario.fleet.nodes_per_rack)
    onsets = _onsets(scenario, rng, len(racks))
    onsets.sort()
    faults: list[Fault] = []
    for group, (start, where, cls, lemon) in enumerate(onsets):
        config = getattr(scenario.failures.classes, cls, None)
        members = racks[where] if cls == "fabric" else [where]
        fix = _fix(cls, scenario.failures, rng)
        signal = _signal(cls, fix, rng)
        gpu = int(rng.integers(0, 8))
        phase = float(rng.random())
        end, slowdown = _duration(cls, fix, config, scenario, start, rng)
        for slot in members:
            faults.append(
                Fault(
                    id=len(faults),
                    slot=slot,
                    cls=cls,
                    start=start,
                    fix=fix,
                    effect=_effect(cls, signal),
                    signal=signal,
                    gpu=gpu,
                    end=end,
                    slowdown=slowdown,
                    lemon=lemon,
                    check_phase=phase,
                    group=group if cls == "fabric" else -1,
                    locus=Locus.MACHINE if cls == "unattributed" and lemon else LOCI[cls],
                )
            )
    faults.extend(_present_at_start(scenario, rng, first_id=len(faults)))
    return faults


def _onsets(scenario: Scenario, rng: np.random.Generator, racks: int) -> list[Onset]:
    """Every class's onsets over the run, unsorted; a ``fabric`` onset names a rack."""
    fleet, failures = scenario.fleet, scenario.failures
    horizon = scenario.span_days * DAY
    slots = fleet.nodes
    lemons = rng.permutation(slots)[: round(failures.lemon_share * slots)]
    # Published rates are fleet averages with the lemons in them: the others run a bit lower.
    weight = 1.0 + failures.lemon_share * (failures.lemon_multiplier - 1.0)
    scale = failures.rate_multiplier / weight
    raw: list[Onset] = []

    def draw(cls: str, per_node_day: float, on: np.ndarray, lemon: bool) -> None:
        count = int(rng.poisson(per_node_day * len(on) * scenario.span_days)) if len(on) else 0
        if count:
            starts = rng.random(count) * horizon
            where = on[rng.integers(0, len(on), count)]
            raw.extend((float(t), int(s), cls, lemon) for t, s in zip(starts, where, strict=True))

    everyone = np.arange(slots)
    for cls in FaultClasses.model_fields:
        if cls == "fabric":
            continue  # whole racks, below
        rate = getattr(failures.classes, cls).rate / 1000.0 * scale
        draw(cls, rate, everyone, lemon=False)
        draw(cls, rate * (failures.lemon_multiplier - 1.0), lemons, lemon=True)
    draw("fail_slow", failures.fail_slow_per_1000_node_days / 1000.0, everyone, False)
    # A share of the interruptions no node signal explains comes from a few bad machines
    # (a lemon no check sees), at the rest of the rate spread over the fleet. Drawn only
    # when there are such interruptions, so the other scenarios' streams stay as they were.
    unattributed = failures.unattributed_per_1000_node_days / 1000.0
    silent = np.arange(0)
    if unattributed > 0:
        silent = rng.permutation(slots)[: round(failures.silent_machine_share * slots)]
    if len(silent) == 0:
        draw("unattributed", unattributed, everyone, False)
    else:
        on_silent = unattributed * failures.unattributed_machine_share
        draw("unattributed", unattributed - on_silent, everyone, False)
        draw("unattributed", on_silent * slots / len(silent), silent, lemon=True)
    draw("benign", failures.benign_signals_per_node_day, everyone, False)
    # The published rate counts job interruptions per node-day, and one switch takes its
    # whole rack: a rack fails at the rate of its nodes together.
    rack_rate = failures.classes.fabric.rate / 1000.0 * failures.rate_multiplier
    draw("fabric", rack_rate * fleet.nodes_per_rack, np.arange(racks), False)
    return raw


def _present_at_start(scenario: Scenario, rng: np.random.Generator, first_id: int) -> list[Fault]:
    """The hidden faults a fleet in service for ``fleet.age_days`` already carries at t = 0.

    Nothing in a fleet without load tests finds a persistent fail-slow or SDC GPU, so one
    stays until its machine is replaced for some other fault: a node carries each kind at
    its onset rate times the mean time it has had to collect them, min(age, time to the
    next replacement), the latter exponential at the scenario's rate of faults that need
    new hardware. Drawn after the run's own faults, so those stay as the seed drew them.
    """
    failures = scenario.failures
    age = scenario.fleet.age_days
    replace_rate = replacement_rate(failures)
    dwell = age if replace_rate == 0 else (1.0 - math.exp(-age * replace_rate)) / replace_rate
    onsets = (
        ("fail_slow", failures.fail_slow_per_1000_node_days * failures.fail_slow_persistent_share),
        ("sdc", failures.classes.sdc.rate * failures.rate_multiplier),
    )
    faults: list[Fault] = []
    for cls, per_1000 in onsets:
        counts = rng.poisson(per_1000 / 1000.0 * dwell, scenario.fleet.nodes)
        for slot in np.repeat(np.arange(scenario.fleet.nodes), counts):
            fix = _draw_fix(
                failures.fail_slow_persistent_fix
                if cls == "fail_slow"
                else failures.classes.sdc.fix,
                rng,
            )
            faults.append(
                Fault(
                    id=first_id + len(faults),
                    slot=int(slot),
                    cls=cls,
                    start=0.0,
                    fix=fix,
                    effect=KINDS[cls].effect,
                    signal=Signal.NOTHING,
                    gpu=int(rng.integers(0, 8)),
                    end=None,
                    slowdown=float(rng.uniform(*failures.fail_slow_factor)),
                    lemon=False,
                    check_phase=float(rng.random()),
                )
            )
    return faults


def replacement_rate(failures: Failures) -> float:
    """Faults per node-day whose fix is new hardware, over every class."""
    configs: list[FaultClass] = [getattr(failures.classes, c) for c in FaultClasses.model_fields]
    per_1000 = sum(config.rate * config.fix.replace for config in configs)
    return per_1000 * failures.rate_multiplier / 1000.0


def fault_from_record(
    fault_id: int,
    slot: int,
    cls: str,
    start: float,
    recorded_end: float,
    scenario: Scenario,
    rng: np.random.Generator,
    *,
    fix: Fix | None = None,
    signal: Signal | None = None,
    locus: Locus | None = None,
) -> Fault:
    """A fault of a replayed trace: its node, start and class as recorded; what clears it
    drawn from the scenario's shares for the class unless the record says; one that ends
    by itself (a cable, a switch) ends when the record says it did, as no policy hastens
    it. Its locus is the record's, else the class's (``LOCI``). The recorded end is kept
    for the people's repairs (``Fleet.request_human``) and the operators' offline holds
    (``OFFLINE_CLASSES``), which end when the record says."""
    fix = fix if fix is not None else _fix(cls, scenario.failures, rng)
    if cls == "fail_slow" and fix is Fix.SELF:
        fix = _draw_fix(scenario.failures.fail_slow_persistent_fix, rng)
    signal = signal if signal is not None else _signal(cls, fix, rng)
    _, slowdown = _duration(cls, fix, None, scenario, start, rng)
    return Fault(
        id=fault_id,
        slot=slot,
        cls=cls,
        start=start,
        fix=fix,
        effect=_effect(cls, signal),
        signal=signal,
        gpu=int(rng.integers(0, 8)),
        end=recorded_end if fix is Fix.SELF else None,
        slowdown=slowdown,
        lemon=False,
        check_phase=float(rng.random()),
        locus=locus if locus is not None else LOCI[cls],
        recorded_end=recorded_end,
    )


def _racks(slots: int, per_rack: int) -> list[list[int]]:
    return [list(range(first, min(first + per_rack, slots))) for first in range(0, slots, per_rack)]


def _fix(cls: str, failures: Failures, rng: np.random.Generator) -> Fix:
    config: FaultClass | None = getattr(failures.classes, cls, None)
    if cls == "fail_slow":
        if rng.random() >= failures.fail_slow_persistent_share:
            return Fix.SELF  # ends by itself after a while
        return _draw_fix(failures.fail_slow_persistent_fix, rng)
    if config is None:  # unattributed and benign are not configured by fix
        return Fix.SELF if cls == "benign" else Fix.RESTART
    return _draw_fix(config.fix, rng)


def _draw_fix(fix: FixShares, rng: np.random.Generator) -> Fix:
    shares = fix.shares()
    draw = rng.random() * sum(shares)
    for what, share in zip(
        (Fix.RESTART, Fix.RESET, Fix.REBOOT, Fix.REPLACE, Fix.SELF), shares, strict=True
    ):
        draw -= share
        if draw <= 0 and share > 0:
            return what
    return Fix.REPLACE


def _duration(
    cls: str,
    fix: Fix,
    config: FaultClass | None,
    scenario: Scenario,
    start: float,
    rng: np.random.Generator,
) -> tuple[float | None, float]:
    failures = scenario.failures
    if cls == "fail_slow":
        low, high = failures.fail_slow_duration_s
        length = math.exp(rng.uniform(math.log(low), math.log(high)))
        slowdown = float(rng.uniform(*failures.fail_slow_factor))
        return (start + length if fix is Fix.SELF else None), slowdown
    if cls == "benign":
        return start + scenario.detection.check_interval_s, 1.0  # the next check round
    if fix is Fix.SELF and config is not None:
        return start + config.self_clear_h * HOUR, 1.0
    return None, 1.0
