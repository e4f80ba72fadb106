"""From the conditions a Node should show to the write that keeps them.

Pure: no clock, no I/O. What each condition says is ``contract.conditions``; here only how
it is kept: ``lastTransitionTime`` moves only when ``status`` does, and a heartbeat
rewrites unchanged conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuguard.contract.conditions import OWNED_TYPES, Desired


@dataclass(frozen=True)
class ConditionWrite:
    """The conditions to write now, the types to remove, and the status transitions."""

    conditions: list[dict[str, object]]
    remove: list[str]
    transitions: list[tuple[Desired, str | None]]  # (new, old status or None)

    @property
    def empty(self) -> bool:
        return not self.conditions and not self.remove


def plan_write(
    desired: list[Desired],
    current: Mapping[str, Mapping[str, object]],
    now: str,
    *,
    heartbeat_due: bool,
) -> ConditionWrite:
    """What to write so the Node says ``desired``; ``current`` is what it says now.

    A condition is written when its status, reason or message changed, or when the
    heartbeat is due. ``lastTransitionTime`` is kept unless the status changed.
    """
    conditions: list[dict[str, object]] = []
    transitions: list[tuple[Desired, str | None]] = []
    for want in desired:
        have = current.get(want.type)
        status = have.get("status") if have else None
        old_status = status if isinstance(status, str) else None
        changed = have is None or (old_status, have.get("reason"), have.get("message")) != (
            want.status,
            want.reason,
            want.message,
        )
        if not changed and not heartbeat_due:
            continue
        transitioned = old_status != want.status
        if transitioned:
            transitions.append((want, old_status))
        last_transition = now if transitioned or not have else have.get("lastTransitionTime")
        conditions.append(
            {
                "type": want.type,
                "status": want.status,
                "reason": want.reason,
                "message": want.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": last_transition or now,
            }
        )
    wanted = {d.type for d in desired}
    remove = sorted(t for t in current if t in OWNED_TYPES and t not in wanted)
    return ConditionWrite(conditions, remove, transitions)
