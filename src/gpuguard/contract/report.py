"""The node report: what the agent publishes about each layer, and how it is read back.

The agent writes two things per layer: a condition (``contract.conditions``) and an entry
of the report annotation (``gpuguard.io/report``) that says what the condition cannot:
the recommended action, the finding codes, the GPUs they name, and whether the repair
waits for running work. ``layer_reports`` is the one translation from an assessed
``NodeReport`` to what the controller reads off the Node, so the simulator needs no Node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

import msgspec

from gpuguard.contract.conditions import LAYER_OF_TYPE, UNKNOWN, desired_conditions
from gpuguard.contract.errors import ContractError
from gpuguard.contract.keys import REPORT_ANNOTATION
from gpuguard.contract.remediation import MAX_GPUS, MAX_ID
from gpuguard.contract.times import parse_time
from gpuguard.contract.verify import VerifyAnswer, read_answer
from gpuguard.model import Action, NodeReport, Status

_AT_MOST_GPUS = msgspec.Meta(max_length=MAX_GPUS)


class LayerEntry(msgspec.Struct, frozen=True):
    """One layer of the report annotation."""

    status: str  # the agent's verdict (model.Status): Healthy, Degraded, Unknown, Unhealthy
    action: str  # the highest rung its findings recommend (model.Action name)
    codes: list[str] = []
    # PCI bus ids of the GPUs the findings name; bounded as the episode that copies them is.
    gpus: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_ID)]], _AT_MOST_GPUS] = []
    # The repair waits for running work (drain and reset); written only when it does.
    deferred: bool | msgspec.UnsetType = msgspec.UNSET
    # The network ports (``mlx5_0/1``) the findings name: what "the same fault" means at
    # a position (remediation/positions.py). Bounded as ``gpus``.
    ports: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_ID)]], _AT_MOST_GPUS] = []


class DeepEntry(msgspec.Struct, frozen=True):
    """The latest run of the deep suite."""

    at: str
    trigger: str
    verdict: str
    codes: list[str]


class VerifyEntry(msgspec.Struct, frozen=True, rename="camel"):
    """The answer to the latest verify request (``contract.verify``)."""

    requested_at: str  # the id of the request it answers, echoed as written (it is a time)
    at: str
    passed: bool
    codes: list[str]


class ReportDocument(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """The ``gpuguard.io/report`` annotation."""

    # Microseconds: a report written just after a repair is told from one just before.
    reported_at: str | None = None
    layers: dict[str, LayerEntry] = {}
    deep: DeepEntry | None = None
    verify: VerifyEntry | None = None


@dataclass(frozen=True)
class LayerReport:
    """One layer as the controller reads it: its condition plus its report entry."""

    status: str  # the condition's status: "True", "False", "Unknown"
    reason: str
    since: float  # lastTransitionTime
    action: Action = Action.NONE  # the highest rung the layer's findings recommend
    codes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # PCI bus ids of the GPUs the findings name
    ports: tuple[str, ...] = ()  # the network ports the findings name (``mlx5_0/1``)
    # The repair waits for running work (drain and reset): the controller admits no new
    # work, lets the running pods finish (policy ``drain_and_reset``), then repairs.
    deferred: bool = False
    degraded: bool = False  # the agent's verdict is Degraded (usable, flagged)


def layer_entries(report: NodeReport) -> dict[str, LayerEntry]:
    """Each layer's entry of the report annotation."""
    entries = {}
    for layer, health in report.layers.items():
        problems = health.problems
        entries[str(layer)] = LayerEntry(
            status=str(health.status),
            action=str(health.action),
            codes=sorted({f.code for f in problems}),
            gpus=sorted({f.component.id for f in problems if f.component.kind == "gpu"}),
            deferred=True if health.deferred else msgspec.UNSET,
            ports=sorted({f.component.id for f in problems if f.component.kind == "nic"}),
        )
    return entries


def layer_reports(report: NodeReport, profile: str, since: float = 0.0) -> dict[str, LayerReport]:
    """What the controller reads off a Node whose agent published ``report``."""
    entries = layer_entries(report)
    conditions = desired_conditions(report.layers, profile)
    return {
        layer: _layer_report(desired.status, desired.reason, since, entries[layer])
        for layer, desired in zip(entries, conditions, strict=True)
    }


def read_layers(
    conditions: Iterable[Mapping[str, object]], document: ReportDocument | None
) -> dict[str, LayerReport]:
    """The layers of a Node from its conditions and its report annotation."""
    entries = document.layers if document is not None else {}
    layers = {}
    for condition in conditions:
        layer = LAYER_OF_TYPE.get(str(condition.get("type", "")))
        if layer is None:
            continue
        layers[layer] = _layer_report(
            str(condition.get("status", UNKNOWN)),
            str(condition.get("reason", "")),
            _lenient_time(condition.get("lastTransitionTime")) or 0.0,
            entries.get(layer),
        )
    return layers


def _layer_report(status: str, reason: str, since: float, entry: LayerEntry | None) -> LayerReport:
    if entry is None:
        return LayerReport(status=status, reason=reason, since=since)
    action = _action(entry.action)
    return LayerReport(
        status=status,
        reason=reason,
        since=since,
        action=action,
        codes=tuple(entry.codes),
        gpus=tuple(entry.gpus),
        ports=tuple(entry.ports),
        deferred=entry.deferred is True and action > Action.NONE,
        degraded=entry.status == Status.DEGRADED,
    )


def _action(name: str) -> Action:
    # An unknown rung recommends nothing: not knowing never triggers a repair.
    return Action[name] if name in Action.__members__ else Action.NONE


def encode_report(document: ReportDocument) -> str:
    return msgspec.json.encode(document, order="sorted").decode()


def decode_report(text: str, obj: str) -> tuple[ReportDocument, VerifyAnswer | None]:
    """The report annotation of ``obj`` (``Node/<name>``) and the verify answer in it.

    A malformed document raises ``ContractError``; a garbled verify entry alone is no
    answer (which times out as a failure, never passes), the rest still counts.
    """
    where = f"metadata.annotations[{REPORT_ANNOTATION}]"
    try:
        read = _READER.decode(text)
    except msgspec.ValidationError as exc:
        raise ContractError(obj, where + _path(exc), str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise ContractError(obj, where, f"not JSON: {exc}") from exc
    document = ReportDocument(read.reported_at, read.layers, read.deep)
    if not read.verify:
        return document, None
    try:
        answer = read_answer(msgspec.json.decode(read.verify))
    except msgspec.DecodeError:
        answer = None
    return document, answer


class _Read(msgspec.Struct, frozen=True, rename="camel"):
    """The document as read: the verify entry is judged on its own (``read_answer``)."""

    reported_at: str | None = None
    layers: dict[str, LayerEntry] = {}
    deep: DeepEntry | None = None
    verify: msgspec.Raw = msgspec.Raw()


_READER = msgspec.json.Decoder(_Read)


def reported_at(document: ReportDocument | None) -> float | None:
    """The report's time (the agent's heartbeat); None when absent or unreadable."""
    return _lenient_time(document.reported_at) if document is not None else None


def _path(exc: msgspec.ValidationError) -> str:
    """msgspec ends its message with "- at `$.layers.gpu`": that path, or nothing."""
    _, found, path = str(exc).rpartition("at `$")
    return path.rstrip("`") if found else ""


def _lenient_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None
