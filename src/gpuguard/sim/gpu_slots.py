"""GPU-slot accounting: how many of a node's GPUs serve jobs, and which jobs fit it.

A node-slot is in service when a whole-node job could run there. A GPU slot is one GPU
of a node: with per-GPU quarantine a node of G GPUs with k of them out alone still offers
G - k GPU slots, to a job that asks for at most G - k of its GPUs; a job that needs the
whole node does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuguard.sim.faults import GPUS_PER_NODE
from gpuguard.sim.slot import Slot


def gpus_in_service(slot: Slot, *, schedulable: bool, up: bool) -> int:
    """The node's GPUs in service: all when the node is, none when it is held or a fault
    beyond its GPUs out disables it, else the GPUs not out."""
    if up:
        return GPUS_PER_NODE
    if not schedulable or not slot.gpus_out:
        return 0
    out = slot.gpus_out
    for fault in slot.faults.values():
        if fault.disables and not (fault.gpu_local and fault.gpu in out):
            return 0
    return GPUS_PER_NODE - len(out)


def fits(gpus: int, slot: Slot) -> bool:
    """A job asking for ``gpus`` of a node's GPUs fits what the node offers."""
    return gpus <= GPUS_PER_NODE - len(slot.gpus_out)


def pick_partial(partial: Iterable[int], slots: list[Slot], gpus: int) -> int | None:
    """A node with GPUs out alone that a 1-node job of ``gpus`` GPUs fits (None: none)."""
    if gpus >= GPUS_PER_NODE:
        return None
    return next((i for i in partial if fits(gpus, slots[i])), None)
