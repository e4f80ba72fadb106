"""The NodeRemediation (gpuguard.io/v1alpha1): one node's remediation episode as stored.

The controller writes ``spec`` and its part of ``status``; it orders the node's agent in
``status.request`` and the agent answers in ``status.result``. The chart's CRD schema is
generated from these models (``make crds``, contract.crd), so the API server and the code
agree on every field. The phases, resolutions and rungs are defined here because they are
part of the wire (the schema's enums); the remediation policy uses the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, WithJsonSchema

from gpuguard.contract.keys import GROUP
from gpuguard.contract.wire import Time, Wire, cut_to, read
from gpuguard.model import Action

VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeRemediation"
PLURAL = "noderemediations"

# The repair ladder, least disruptive first.
RUNGS = (Action.KILL_JOB, Action.RESET_GPU, Action.REBOOT, Action.REPLACE)


class Phase(StrEnum):
    """Where one node's episode stands."""

    QUARANTINED = "Quarantined"  # tainted NoSchedule; waiting out the finding's tolerance
    DRAINING = "Draining"  # evicting the pods the chosen rung must move
    ACTING = "Acting"  # the rung's action was requested (agent, provider) and is running
    VERIFYING = "Verifying"  # action done; waiting for a fresh healthy report (and verify)
    CLOSED = "Closed"  # healthy again (or replaced); taint and our cordon removed


class Resolution(StrEnum):
    TRANSIENT = "Transient"  # cleared within its tolerance: only tainted and untainted
    REPAIRED = "Repaired"  # healthy after an action
    REPLACED = "Replaced"  # the machine was handed back (NodeClaim or Node deleted)
    GONE = "Gone"  # the Node disappeared on its own
    GAVE_UP = "GaveUp"  # no rung left; stays tainted for a human


def _action(value: object) -> object:
    # The wire names a rung (``REBOOT``); code passes the Action itself.
    if isinstance(value, str) and value in Action.__members__:
        return Action[value]
    return value


def _is_rung(action: Action) -> Action:
    if action not in RUNGS:
        raise ValueError(f"{action.name} is not a rung")
    return action


Rung = Annotated[
    Action,
    BeforeValidator(_action),
    AfterValidator(_is_rung),
    PlainSerializer(lambda action: action.name, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "enum": [rung.name for rung in RUNGS]}),
]
Count = Annotated[int, Field(ge=0)]

# Bounds on what the API server takes, so that nothing gpuguard copies from one field into
# others can make an object too big to write (chaos_findings F11: a 1 MB answer, copied
# into a step, lastMessage and result, went over the API's request limit for good).
# 1024 characters is an Event note's limit, where the same messages go too; 200 steps of
# it keep an object near 250 KB, far below etcd's 1.5 MiB. Free text longer than its
# bound is cut, never refused: by the writer, and by the reader of an older object.
MAX_MESSAGE = 1024
MAX_STEPS = 200  # the most recent ones are kept
MAX_GPUS = 64  # a node has 8 or 16; more is not a node gpuguard knows
MAX_ID = 64  # a PCI bus id (16 characters), a GPU UUID (40), a boot id (36)
MAX_NODE_NAME = 253  # a Kubernetes object name
MAX_POSITION = 4 * 317  # label pairs: a name (253 + "/" prefix of 63) and a value (63)
MAX_SIGNATURE = 64  # network faults of one episode (8 ports, a few codes each)

Message = Annotated[str, Field(max_length=MAX_MESSAGE), cut_to(MAX_MESSAGE)]
Gpus = Annotated[tuple[Annotated[str, Field(max_length=MAX_ID)], ...], Field(max_length=MAX_GPUS)]


def _latest_steps(value: object) -> object:
    # An object from before maxItems (or code's whole history) keeps its latest steps.
    return value[-MAX_STEPS:] if isinstance(value, list | tuple) else value


class Spec(Wire):
    """What the episode is about; written once, when the controller creates it."""

    node_name: str = Field(
        description="The Node this episode is about.",
        max_length=MAX_NODE_NAME,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "nodeName is immutable"}
            ]
        },
    )
    opened_at: Time = Field(description="When the node was first seen unhealthy (RFC 3339).")
    node_uid: str | None = Field(
        default=None,
        alias="nodeUID",
        max_length=128,
        description="The Node's metadata.uid when the episode opened: a Node registered "
        "again under the same name (a new machine) does not inherit the episode.",
    )
    position: str | None = Field(
        default=None,
        max_length=MAX_POSITION,
        description="The physical position the machine sat at (from the policy's position "
        "labels; the node's name when it has none): what the episodes of the machines "
        "replaced there are remembered by.",
    )


class Step(Wire):
    """One line of the episode's history."""

    at: Time
    # The schema lets in every string, as it always did; code reads only phases.
    phase: Annotated[Phase, WithJsonSchema({"type": "string"})]
    message: Message


class Request(Wire):
    """The controller's order to the node's agent: do ``action`` (attempt ``attempt``)."""

    action: Rung
    attempt: Count
    gpus: Gpus = ()
    requested_at: Time


class Result(Wire):
    """The agent's (or provider's) answer to the request of the same action and attempt."""

    action: Rung
    attempt: Count
    succeeded: bool
    at: Time
    message: Message = ""


class Started(Wire):
    """The agent's mark, written before it begins ``action`` (attempt ``attempt``): an agent
    restarted before it answered then answers instead of doing it again."""

    action: Rung
    attempt: Count
    at: Time
    boot_id: str = Field(
        default="",
        alias="bootID",
        max_length=MAX_ID,
        description="The node's boot id when the action began: a new one after a REBOOT "
        "means the reboot happened.",
    )


class Status(Wire):
    """Where the episode stands. Each writer merge-patches only its own fields: the
    controller all but ``result`` and ``started``, the node's agent those two."""

    phase: Phase = Phase.QUARANTINED
    rung: Rung | None = Field(
        default=None, description="The repair being tried (least disruptive first)."
    )
    attempt: Count = Field(
        default=0, description="Attempts of the current rung (attempts[rung]), for display."
    )
    attempts: Annotated[
        dict[Rung, Count],
        WithJsonSchema(
            {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
        ),
    ] = Field(default_factory=dict, description="Attempts made per rung in this episode.")
    phase_since: Time | None = None
    last_action_at: Time | None = None
    gpus: Gpus = Field(
        default=(),
        description="The GPUs (PCI bus ids) the current rung works on; empty is the whole node.",
    )
    cordoned_by_us: bool = Field(
        default=False, description="We cordoned the node, so closing the episode uncordons it."
    )
    exhausted: bool = Field(
        default=False, description="No rung left to try; the node stays tainted for a human."
    )
    closed_at: Time | None = None
    resolution: Resolution | None = None
    machine: str | None = Field(
        default=None,
        max_length=2 * MAX_NODE_NAME + 1,
        description="For REPLACE: the replaced node's Karpenter NodePool and instance type "
        "(<nodepool>/<instance type>), recorded when the rung started.",
    )
    replacement: str | None = Field(
        default=None,
        max_length=MAX_NODE_NAME,
        description="For an episode closed Replaced: the Node that took over (the first of "
        "the same NodePool and instance type to register after the REPLACE began).",
    )
    signature: Annotated[
        tuple[Annotated[str, Field(max_length=MAX_ID + 64)], ...], Field(max_length=MAX_SIGNATURE)
    ] = Field(
        default=(),
        description="The network faults (CODE@port) the episode's rungs acted on: a "
        "successor at the same position showing one of them shows the position's fault.",
    )
    position_fault: Message | None = Field(
        default=None,
        description="The evidence that the fault is the position's (a cable, an optic, a "
        "switch port): no reboot or replace there until a person marks it fixed.",
    )
    position_fixed_at: Time | None = Field(
        default=None,
        description="When a person's gpuguard.io/position-fixed mark was taken: the "
        "position's earlier episodes no longer count.",
    )
    slow_confirmed: bool = Field(
        default=False,
        description="A second measurement confirmed slowness before a rung started: each "
        "repair must then pass the deep suite before the node returns.",
    )
    last_message: Message | None = Field(
        default=None, description="The latest step's message, for display."
    )
    steps: Annotated[tuple[Step, ...], BeforeValidator(_latest_steps)] = Field(
        default=(),
        max_length=MAX_STEPS,
        description="Every decision of the episode (the most recent ones are kept).",
    )
    request: Request | None = Field(
        default=None, description="The controller's order for the node's agent."
    )
    result: Result | None = Field(
        default=None, description="The agent's (or provider's) answer to the request."
    )
    started: Started | None = Field(
        default=None,
        description="The agent's mark that it began the request's action (written before "
        "it does): answered, never repeated, after an agent restart.",
    )


class NodeRemediation(Wire):
    """One node's remediation episode, from detection back to service."""

    api_version: str = GROUP_VERSION
    kind: str = KIND
    metadata: Annotated[dict[str, object], WithJsonSchema({"type": "object"})] = Field(
        default_factory=dict
    )
    spec: Spec
    status: Status = Field(default_factory=Status)


def name_of(obj: Mapping[str, object]) -> str:
    """The object's name as errors and logs give it: ``NodeRemediation/<name>``."""
    return f"{KIND}/{_part(obj, 'metadata', 'name') or ''}"


def read_remediation(obj: Mapping[str, object]) -> NodeRemediation:
    """A NodeRemediation from the cluster, or a ``ContractError`` naming it and the field."""
    return read(NodeRemediation, obj, obj=name_of(obj), at="")


def request_of(obj: Mapping[str, object]) -> Request | None:
    """The object's ``status.request`` (the controller's order), if it has one."""
    wire = _part(obj, "status", "request")
    return read(Request, wire, obj=name_of(obj), at="status.request") if wire else None


def result_of(obj: Mapping[str, object]) -> Result | None:
    """The object's ``status.result`` (the agent's answer), if it has one."""
    wire = _part(obj, "status", "result")
    return read(Result, wire, obj=name_of(obj), at="status.result") if wire else None


def started_of(obj: Mapping[str, object]) -> Started | None:
    """The object's ``status.started`` (the agent's mark that it began), if it has one."""
    wire = _part(obj, "status", "started")
    return read(Started, wire, obj=name_of(obj), at="status.started") if wire else None


def _part(obj: Mapping[str, object], section: str, key: str) -> object:
    """``obj[section][key]`` as the cluster sent it; None when either is absent."""
    found = obj.get(section)
    return found.get(key) if isinstance(found, Mapping) else None
