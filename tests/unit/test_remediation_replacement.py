"""Recognising the Node that took over from a replaced one (remediation.replacement)."""

from __future__ import annotations

import dataclasses

from gpuguard.remediation.model import Episode, NodeObservation, Phase, Resolution
from gpuguard.remediation.replacement import PAIRING_WINDOW_S, pair_replacements

T0 = 1_796_083_200.0
H100 = "gpu/p5.48xlarge"


def replaced(node: str, began: float, machine: str = H100, **extra: object) -> Episode:
    return Episode(
        node=node,
        opened_at=began - 600,
        phase=Phase.CLOSED,
        last_action_at=began,
        closed_at=began + 300,
        resolution=Resolution.REPLACED,
        machine=machine,
        **extra,  # type: ignore[arg-type]
    )


def registered(name: str, at: float, machine: str = H100) -> NodeObservation:
    return NodeObservation(name, "", {}, None, machine=machine, registered_at=at)


def test_the_first_node_of_the_same_kind_registered_after_the_replace_is_named():
    episode = replaced("old", T0)
    nodes = [
        registered("before", T0 - 1),  # was there already
        registered("other-kind", T0 + 10, machine="gpu/p4d.24xlarge"),
        registered("second", T0 + 90),
        registered("first", T0 + 60),
        NodeObservation("unmanaged", "", {}, None, registered_at=T0 + 5),  # not Karpenter's
    ]
    assert pair_replacements([episode], nodes, T0 + 400) == [(episode, "first")]


def test_simultaneous_replacements_pair_in_order_and_never_share_a_node():
    early, late = replaced("a", T0), replaced("b", T0 + 30)
    nodes = [registered("n1", T0 + 40), registered("n2", T0 + 50)]
    pairs = pair_replacements([late, early], nodes, T0 + 400)
    assert pairs == [(early, "n1"), (late, "n2")]
    named = dataclasses.replace(early, replacement="n1")
    assert pair_replacements([named, late], nodes, T0 + 400) == [(late, "n2")]


def test_only_replaced_episodes_in_the_window_with_a_machine_wait():
    nodes = [registered("n1", T0 + 40)]
    gone = dataclasses.replace(replaced("a", T0), resolution=Resolution.GONE)
    unknown = replaced("b", T0, machine="")  # not a Karpenter node
    assert pair_replacements([gone, unknown], nodes, T0 + 400) == []
    stale = replaced("c", T0)
    assert pair_replacements([stale], nodes, T0 + 300 + PAIRING_WINDOW_S + 1) == []
    assert pair_replacements([replaced("d", T0)], [], T0 + 400) == []  # not registered yet
