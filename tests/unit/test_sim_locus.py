"""Where a fault lives (issue 25): the machine's faults leave with it, a position's stay.

Each test runs the engine on a fault list of its own, with a driver that decides nothing
(the test itself replaces, reboots or calls a person at set times) and looks at the slot
at set times, so what it asserts is the fleet's doing alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest

from gpuguard.errors import ConfigError
from gpuguard.remediation.policy import Policy
from gpuguard.sim.agent_view import AgentView
from gpuguard.sim.engine import Engine, Slot
from gpuguard.sim.faults import DAY, HOUR, LOCI, Effect, Fault, Fix, Locus, Signal
from gpuguard.sim.gpuguard_policy import GpuguardPolicy
from gpuguard.sim.scenario import Scenario, build_scenario, load_scenario
from gpuguard.sim.summary import most_in_window, summarise
from gpuguard.sim.trace import TRACE_CLASSES, default_locus
from gpuguard.sim.trace_files import load_trace
from gpuguard.sim.trace_infinitehbd import MAPPING

CABLE_PORT = 3  # the RDMA port a position's cable fault takes down


def _scenario(**detection: Any) -> Scenario:
    data = load_scenario().model_dump(by_alias=True)
    data.update(days=10, warmup_days=0, seed=1)
    data["fleet"]["nodes"] = 4
    data["jobs"]["mix"] = [{"nodes": 1, "share": 1.0, "hours": [2, 24]}]  # no job runs here
    data["actions"]["failure_probability"] = 0.0  # a reboot that fails would prove nothing
    data["detection"].update({"manual_response_h": 1000, **detection})
    return build_scenario(data, "test")


class Watcher:
    """A driver that decides nothing and notes what the agent showed, by Node name."""

    name = "watcher"
    warm_spares = False

    def charges(self, job: object, cause: str, fault: object) -> bool:
        return True

    def attach(self, engine: Engine) -> None:
        self.engine = engine
        self.shown: list[tuple[float, str, tuple[tuple[Signal, int], ...]]] = []

    def signals_changed(self, slot: Slot) -> None:
        self.shown.append((self.engine.now, slot.name, self.engine.signals(slot).checked))

    def node_replaced(self, slot: Slot) -> None:
        """Nothing to do: the watcher only looks."""

    def action_done(self, slot: Slot, what: str, succeeded: bool) -> None:
        """Nothing to do: the watcher only looks."""


def _fault(
    fault_id: int,
    slot: int,
    *,
    cls: str = "fabric",
    start: float = 1 * HOUR,
    fix: Fix = Fix.SELF,
    signal: Signal = Signal.PORT_DOWN,
    locus: Locus = Locus.POSITION,
    effect: Effect = Effect.CRASH,
    end: float | None = 20 * HOUR,
) -> Fault:
    return Fault(
        id=fault_id,
        slot=slot,
        cls=cls,
        start=start,
        fix=fix,
        effect=effect,
        signal=signal,
        gpu=CABLE_PORT,
        end=end if fix is Fix.SELF else None,
        slowdown=1.0,
        lemon=False,
        check_phase=0.5,
        locus=locus,
    )


def _run(
    faults: list[Fault],
    steps: list[tuple[float, Callable[[Engine], None]]],
    scenario: Scenario | None = None,
) -> tuple[Engine, Watcher]:
    watcher = Watcher()
    engine = Engine(scenario or _scenario(), faults, [], watcher, AgentView(), seed=1)
    for t, step in steps:
        engine.at(t, step, engine)
    engine.run()
    return engine, watcher


class Snapshot(NamedTuple):
    """One slot as seen at a moment of a run."""

    machine: int | None
    name: str
    faults: dict[int, Fault]
    signals: Any


def _look(seen: dict[str, Snapshot], label: str, index: int) -> Callable[[Engine], None]:
    """A step that notes slot ``index`` under ``label``."""

    def step(engine: Engine) -> None:
        slot = engine.slots[index]
        seen[label] = Snapshot(slot.machine, slot.name, dict(slot.faults), engine.signals(slot))

    return step


def test_a_position_fault_survives_a_replacement_and_the_new_machine_shows_it_again():
    cable = _fault(0, slot=0)
    seen: dict[str, Snapshot] = {}
    engine, watcher = _run(
        [cable],
        [
            (2 * HOUR, _look(seen, "before", 0)),
            (3 * HOUR, lambda e: e.replace(e.slots[0])),
            (3 * HOUR + 1, _look(seen, "empty", 0)),
            (4 * HOUR, _look(seen, "refilled", 0)),
            (21 * HOUR, _look(seen, "ended", 0)),
        ],
    )
    down = ((Signal.PORT_DOWN, CABLE_PORT),)
    machine, name, faults, signals = seen["before"]
    assert signals.checked == down and 0 in faults
    machine, _, faults, signals = seen["empty"]
    assert machine is None and 0 in faults and signals.checked == ()
    machine, new_name, faults, signals = seen["refilled"]
    assert machine is not None and new_name != name
    assert 0 in faults and signals.checked == down  # the same port, on the new machine
    assert not engine.view.verdict(signals).healthy
    # The agent on the new Node reported the port down.
    assert any(n == new_name and checked == down for _, n, checked in watcher.shown)
    _, _, faults, signals = seen["ended"]
    assert faults == {} and signals.checked == ()  # gone at its recorded end, not before
    assert engine.stats.actions["replace"] == 1


def test_a_machine_fault_leaves_with_the_machine():
    dbe = _fault(
        0,
        slot=1,
        cls="hbm",
        fix=Fix.REPLACE,
        signal=Signal.XID_48_REMAP_FAILED,
        locus=Locus.MACHINE,
    )
    seen: dict[str, Snapshot] = {}
    engine, _ = _run(
        [dbe],
        [
            (2 * HOUR, _look(seen, "before", 1)),
            (3 * HOUR, lambda e: e.replace(e.slots[1])),
            (4 * HOUR, _look(seen, "refilled", 1)),
        ],
    )
    _, name, faults, signals = seen["before"]
    assert 0 in faults and signals.kernel and signals.checked
    _, new_name, faults, signals = seen["refilled"]
    assert new_name != name and faults == {}
    assert signals.kernel == () and signals.checked == ()
    assert engine.view.verdict(signals).healthy


def test_a_reboot_clears_the_machine_fault_but_not_the_position_fault():
    cable = _fault(0, slot=0)
    driver_bug = _fault(
        1,
        slot=0,
        cls="kernel_driver",
        fix=Fix.REBOOT,
        signal=Signal.KERNEL_BUG,
        locus=Locus.MACHINE,
        effect=Effect.HANG,
    )
    seen: dict[str, Snapshot] = {}
    _run(
        [cable, driver_bug],
        [(3 * HOUR, lambda e: e.repair(e.slots[0], "reboot")), (4 * HOUR, _look(seen, "after", 0))],
    )
    machine, _, faults, signals = seen["after"]
    assert set(faults) == {0} and machine == 0  # the same machine, the cable still bad
    assert signals.kernel == () and signals.checked == ((Signal.PORT_DOWN, CABLE_PORT),)


def test_a_person_repairs_a_bad_cable_in_place_and_leaves_the_server():
    cable = _fault(0, slot=2, fix=Fix.REPLACE)  # a cable that only a person's swap clears
    seen: dict[str, Snapshot] = {}
    engine, _ = _run(
        [cable],
        [
            (2 * HOUR, lambda e: e.request_human(e.slots[2])),
            (3 * HOUR + 60, _look(seen, "after", 2)),
        ],
        _scenario(manual_response_h=1),
    )
    machine, name, faults, signals = seen["after"]
    assert faults == {} and signals.checked == ()
    assert machine == 2 and name == "gpu-node-00002"  # the server stayed
    actions = engine.stats.actions
    assert actions["manual_position_repair"] == 1
    assert actions["manual_replace"] == actions["replace"] == 0


def test_a_position_fault_on_an_empty_slot_shows_once_a_machine_fills_it():
    cable = _fault(0, slot=0, start=3 * HOUR + 60)  # during the swap (5 min from a spare)
    seen: dict[str, Snapshot] = {}
    steps = [(3 * HOUR, lambda e: e.replace(e.slots[0])), (4 * HOUR, _look(seen, "after", 0))]
    engine, _ = _run([cable], steps)
    machine, _, _, signals = seen["after"]
    assert machine is not None and signals.checked == ((Signal.PORT_DOWN, CABLE_PORT),)
    assert engine.stats.dropped_faults == 0


def test_the_counts_name_machine_faults_and_the_most_replacements_of_one_position():
    faults = [
        _fault(0, slot=0, end=9 * DAY),  # a cable: not the machine's
        _fault(1, slot=1, cls="hbm", fix=Fix.REPLACE, signal=Signal.XID_48, locus=Locus.MACHINE),
        _fault(
            2, slot=3, cls="gsp", fix=Fix.RESET, signal=Signal.XID_119, locus=Locus.MACHINE,
            effect=Effect.HANG,
        ),
        _fault(
            3, slot=2, cls="benign", signal=Signal.XID_63, locus=Locus.MACHINE,
            effect=Effect.NONE, end=2 * HOUR,
        ),
    ]  # fmt: skip

    def replace(index: int, manual: bool = False) -> Callable[[Engine], None]:
        return lambda e: e.replace(e.slots[index], manual=manual)

    steps = [(d * DAY, replace(0)) for d in (1, 3, 5, 8.5)] + [(2 * DAY, replace(0, True))]
    engine, _ = _run(faults, steps)
    figures = summarise(engine).locus
    assert figures is not None
    assert (figures.machine_faults, figures.machine_faults_replace) == (2, 1)
    # Four automatic replacements of slot 0: three within 7 days (1, 3, 5); the person's
    # is not counted.
    assert (figures.replacements, figures.max_per_position_7d) == (4, 3)
    assert figures.ratio == 2.0


def test_most_in_window_counts_a_span_shorter_than_the_window():
    assert most_in_window([], 7.0) == 0
    assert most_in_window([0.0, 7.0, 14.0], 7.0) == 1
    assert most_in_window([0.0, 6.9, 7.0, 13.8], 7.0) == 3


def test_the_policy_is_told_the_same_position_for_every_machine_in_a_slot():
    driver = GpuguardPolicy(Policy())
    engine = Engine(_scenario(), [], [], driver, AgentView(), seed=1)
    slot = engine.slots[2]
    before = driver._observation(slot, 0.0)
    slot.refill(99)
    after = driver._observation(slot, 0.0)
    assert before.name != after.name
    assert before.position == after.position == "rack-0/slot-2"
    assert driver._observation(engine.slots[3], 0.0).position == "rack-0/slot-3"


def test_every_stepfun_class_and_description_has_a_locus():
    assert all(isinstance(locus, Locus) for _, _, locus in MAPPING.values())
    positions = {key for key, (_, _, locus) in MAPPING.items() if locus is Locus.POSITION}
    assert positions == {
        ("Parameter Plane Cable", "Link Down"),
        ("Change", "Y-cables Taken offline"),
        ("Change", "Remote Optical Module Failure"),
    }
    for (cls, _), (trace_class, _, locus) in MAPPING.items():
        if cls in ("GPU", "NIC", "Power Supply", "Fan", "Motherboard", "CPU", "Riser Card"):
            assert locus is Locus.MACHINE, cls
        if trace_class == "unattributed":
            assert locus is Locus.JOB
    # The records carry it: the trace's 44 cable and optic faults stay with their slots.
    trace = load_trace("infinitehbd")
    assert sum(r.locus is Locus.POSITION for r in trace.records) == 44
    assert all(r.locus is not None for r in trace.records)


def test_a_csv_trace_gives_a_locus_or_takes_the_class_default(tmp_path):
    path = tmp_path / "loci.csv"
    path.write_text(
        "node,start_days,end_days,class,description,fix,locus\n"
        "a,1,2,host,PDU outlet,replace,position\n"
        "b,1,2,fabric,cable,self\n"
        "c,1,2,gpu,lost,,\n"
    )
    trace = load_trace(path)
    assert [r.locus for r in trace.records] == [Locus.POSITION, None, None]
    assert default_locus("fabric") is Locus.POSITION  # one node's link in a trace
    assert default_locus("gpu") is Locus.MACHINE
    assert all(default_locus(name) in Locus for name in TRACE_CLASSES)
    assert LOCI["fabric"] is Locus.DOMAIN  # the generator's: a rack's switch
    faults = trace.faults(load_scenario(), np.random.default_rng(1))
    assert [f.locus for f in faults] == [Locus.POSITION, Locus.POSITION, Locus.MACHINE]


def test_a_csv_trace_with_a_bad_locus_is_one_line_naming_the_record_and_field(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "node,start_days,end_days,class,description,fix,locus\n"
        "a,1,2,gpu,lost,,machine\n"
        "b,1,2,fabric,cable,self,rack-7\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: record 2: field locus: 'rack-7' is not one of")
    assert "machine, position, domain, job" in message


def test_a_ticket_for_a_replaced_machine_does_not_hold_back_the_new_machines():
    # A ticket for the first machine is pending when the policy replaces it; the new
    # machine then fails for good and is ticketed too: a person comes for it.
    dbe = _fault(
        0,
        slot=0,
        cls="hbm",
        start=2 * HOUR,
        fix=Fix.REPLACE,
        signal=Signal.XID_48_REMAP_FAILED,
        locus=Locus.MACHINE,
    )
    engine, _ = _run(
        [dbe],
        [
            (1 * HOUR, lambda e: e.request_human(e.slots[0])),
            (1.5 * HOUR, lambda e: e.replace(e.slots[0])),
            (2 * HOUR + 60, lambda e: e.request_human(e.slots[0])),
        ],
        _scenario(manual_response_h=2),
    )
    assert engine.stats.actions["manual_replace"] == 1
    assert engine.slots[0].generation == 2 and engine.slots[0].faults == {}
