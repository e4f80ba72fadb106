"""The kernel memory (``gpuguard.io/kernel-findings``): critical kernel-log findings kept
on the Node, so that an agent restarted in the same boot still reports them after the
ring buffer has lost the lines."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gpuguard.contract.errors import ContractError
from gpuguard.contract.keys import MEMORY_ANNOTATION
from gpuguard.model import Action, Component, Finding, Layer, Severity


class RememberedFinding(msgspec.Struct, frozen=True, rename="camel"):
    layer: Layer
    code: str
    severity: str  # model.Severity, lower case
    action: str  # model.Action name
    component: str  # the component as text (for people reading the annotation)
    component_kind: str
    component_id: str
    source: str
    message: str
    evidence: str
    component_uuid: str | None = None  # written as null when unknown
    deferred: bool | msgspec.UnsetType = msgspec.UNSET  # written only when it is


class KernelMemory(msgspec.Struct, frozen=True, rename="camel"):
    boot_id: str
    findings: list[RememberedFinding] = []


def encode_memory(boot_id: str, findings: Iterable[Finding]) -> str:
    remembered = [
        RememberedFinding(
            layer=f.layer,
            code=f.code,
            severity=str(f.severity),
            action=str(f.action),
            component=str(f.component),
            component_kind=f.component.kind,
            component_id=f.component.id,
            component_uuid=f.component.uuid,
            source=f.source,
            message=f.message,
            evidence=f.evidence,
            deferred=True if f.deferred else msgspec.UNSET,
        )
        for f in findings
    ]
    return msgspec.json.encode(KernelMemory(boot_id, remembered), order="sorted").decode()


def decode_memory(text: str, obj: str, source: str) -> tuple[str, list[Finding]]:
    """The boot id and findings stored on ``obj``, each found again as from ``source``;
    ``ContractError`` if the annotation is malformed."""
    where = f"metadata.annotations[{MEMORY_ANNOTATION}]"
    try:
        memory = msgspec.json.decode(text, type=KernelMemory)
        return memory.boot_id, [_finding(item, source) for item in memory.findings]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ContractError(obj, where, str(exc)) from exc
    except (KeyError, ValueError) as exc:
        raise ContractError(obj, where + ".findings", f"unknown value {exc}") from exc


def _finding(item: RememberedFinding, source: str) -> Finding:
    return Finding(
        layer=item.layer,
        code=item.code,
        severity=Severity[item.severity.upper()],
        action=Action[item.action],
        component=Component(item.component_kind, item.component_id, item.component_uuid),
        source=source,
        message=item.message,
        evidence=item.evidence,
        deferred=item.deferred is True,
    )
