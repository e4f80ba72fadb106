"""The sections of the remediation policy: one validated model per safeguard.

The fleet's limits (the pools' disruption budget, the circuit breaker, shared causes in a
topology domain), the gates a repair passes (the deep verify, drain and reset), and the
evidence weighed before a machine is blamed (its position, a confirming measurement,
crashes across jobs, failed pods' attribution). ``policy.Policy`` gathers them.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuguard.model import Action

Seconds = Annotated[float, Field(ge=0)]
Percent = Annotated[float, Field(ge=0, le=100)]

# Every finding code is upper-case words joined by "_" (XID_79, DCGM_FR_XID_ERROR).
CODE_SHAPE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


class StrictModel(BaseModel):
    """A policy model: unknown keys are refused, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(StrictModel):
    """How many nodes of one pool may be in repair (Draining, Acting, Verifying) at once.

    Only rungs that take GPUs or the node away (RESET_GPU and up) count and wait for it;
    taints and job kills are never limited.
    """

    max_unavailable: int = Field(default=2, ge=1, description="Absolute cap per pool")
    max_unavailable_percent: Percent = Field(
        default=10, description="Percent of the pool (Karpenter RFC #3192's default budget)"
    )

    def allowed(self, pool_size: int) -> int:
        """``min(absolute, max(1, floor(percent of the pool)))``: a small pool still repairs."""
        by_percent = int(self.max_unavailable_percent * pool_size // 100)
        return min(self.max_unavailable, max(1, by_percent))


class Breaker(StrictModel):
    """The fleet circuit breaker: a wave of new episodes is a bad rollout, not bad machines.

    It opens when the episodes opened within ``window_s`` reach ``threshold_percent`` of the
    fleet (and at least ``min_nodes``), and closes by itself once that rate falls below
    ``close_percent`` (unlike Karpenter's latching 20 % breaker), or when an operator
    resets it. While open no disruptive decision is made; taints continue.
    """

    threshold_percent: Percent = Field(default=10, gt=0)
    window_s: Seconds = Field(default=600, gt=0)
    min_nodes: int = Field(default=3, ge=1, description="Never open for fewer new episodes")
    close_percent: Percent = Field(default=5)

    @model_validator(mode="after")
    def _close_below_open(self) -> Breaker:
        if self.close_percent > self.threshold_percent:
            raise ValueError("close_percent must not exceed threshold_percent")
        return self


class Verify(StrictModel):
    """The deep suite (``gpuguard check --deep``) as the last gate before a repaired node
    returns to service: the controller asks the node's agent for it and waits for a pass.

    Off by default: the suite needs PyTorch in the agent's image, and a node without it can
    never pass (its agent answers ``TOOL_MISSING``), so such a node would stay quarantined.
    The suite loads every GPU of the node, so by default only the rung that drains the whole
    node (REBOOT) is verified; after a GPU reset other GPUs may still be running jobs.
    """

    enabled: bool = Field(default=False, description="Require a deep-suite pass after a repair")
    timeout_s: Seconds = Field(
        default=900, gt=0, description="No answer within this long fails the verify"
    )
    rungs: list[Literal["RESET_GPU", "REBOOT"]] = Field(
        default_factory=lambda: ["REBOOT"],  # type: ignore[arg-type]
        description="The rungs whose repair is verified (RESET_GPU loads busy GPUs too)",
    )

    def applies_to(self, rung: Action | None) -> bool:
        return self.enabled and rung is not None and rung.name in self.rungs


class Correlation(StrictModel):
    """Faults with a shared cause: several nodes of one topology domain (a rack, a leaf
    switch) turning bad in the same layer at about the same time are one incident.

    Rebooting or replacing the nodes cannot fix a dead switch, so such nodes are held:
    quarantined (NoSchedule), no disruptive rung, no budget slot, until the domain recovers
    or a person acts. A fault of another layer on the same node is still handled.
    Nodes without the label are never grouped.
    """

    enabled: bool = Field(default=True, description="Hold shared-cause faults")
    domain_label: str = Field(
        default="topology.k8s.aws/network-node-layer-3",
        description="Node label naming the topology domain (EKS: the network node nearest"
        " the instance; NVIDIA Topograph: network.topology.nvidia.com/leaf; or a rack label)",
    )
    min_nodes: int = Field(
        default=3, ge=2, description="This many nodes of one domain make a shared cause"
    )
    window_s: Seconds = Field(
        default=600, description="Their layer turned False within this long of each other"
    )
    layers: list[Literal["gpu", "network", "kernel"]] = Field(
        default_factory=lambda: ["network"],  # type: ignore[arg-type]
        description="The layers whose faults can have a shared cause in the domain",
    )


class DrainAndReset(StrictModel):
    """Deferred repairs, NVIDIA's "drain and reset": a row remap or page retirement that
    takes effect at the next reset, Xid 154's "Drain and Reset", a GPU the deep suite found
    slow. The GPU still computes correctly, so the node admits no new work (tainted at
    once) while the pods on those GPUs finish; the repair starts when none runs, or
    ``max_wait_s`` after the layer turned False, whichever comes first.

    4 h by default: most jobs end, or reach a checkpoint they can resume from, well within
    it (training jobs commonly checkpoint every 30-60 min), and a GPU waiting on a pending
    remap is not left for days with a spare row unused: a second uncorrectable error in
    that row before the reset is an Xid 48 that kills the job anyway. A week-long job is
    drained at the bound, through the Eviction API, and resumes from its checkpoint.
    """

    max_wait_s: Seconds = Field(
        default=4 * 3600,
        description="Drain and repair at the latest this long after the layer turned False",
    )


# Findings of slowness, not of errors: a load test or a job's step times measured a GPU
# slower than its siblings or its expected figure. One slow measurement is also what a
# noisy neighbour, a throttled job or a misjudged expectation gives, so none of these
# alone starts a destructive rung (``Confirm``).
DEFAULT_SLOW_CODES = (
    "DEEP_MATMUL_SLOW",
    "DEEP_MEMORY_BANDWIDTH_LOW",
    "DEEP_PEER_BANDWIDTH_LOW",
    "IN_JOB_FAIL_SLOW",
    "LOAD_CLOCK_BELOW_SIBLINGS",
)
# Node labels that name a machine's physical position, tried in order; the first set whose
# labels are all present names it. On-premises racks carry a plain rack/position pair; GKE
# names the physical host a VM runs on by block, sub-block and host. (EKS's
# topology.k8s.aws/network-node-layer-* name switches, several instances under each: a
# domain for ``correlation``, not a position.)
DEFAULT_POSITION_LABELS: tuple[tuple[str, ...], ...] = (
    ("rack", "position"),
    (
        "cloud.google.com/gce-topology-block",
        "cloud.google.com/gce-topology-subblock",
        "cloud.google.com/gce-topology-host",
    ),
)
WEEK_S = 7 * 24 * 3600.0


class Positions(StrictModel):
    """Where a machine sits, and what happened there before (docs/remediation.md, "Where
    a fault lives"). A cable, an optic or a switch port stays with the position when the
    machine is replaced: the successor shows the same fault, and replacing it again would
    repair nothing. So the policy remembers positions across Node names.
    """

    labels: list[list[str]] = Field(
        default_factory=lambda: [list(names) for names in DEFAULT_POSITION_LABELS],
        description="Label sets naming a node's physical position, tried in order; the"
        " first whose labels are all present names it (none: the node's name, reported)",
    )
    window_s: Seconds = Field(
        default=WEEK_S,
        gt=0,
        description="How long a replacement at a position is remembered: the same fault on"
        " its successor within this long is the position's, and the replacement cap's window",
    )
    max_replacements: int = Field(
        default=1,
        ge=0,
        description="Automatic replacements per position within window_s; beyond, a person"
        " decides (0: never replace automatically)",
    )

    @field_validator("labels", mode="after")
    @classmethod
    def _label_sets(cls, value: list[list[str]]) -> list[list[str]]:
        if any(not names or any(not name for name in names) for names in value):
            raise ValueError("each label set names at least one label, none empty")
        return value


class Confirm(StrictModel):
    """A slow finding is confirmed by an independent second measurement (the deep suite,
    asked for through the verify request) before a rung that resets, reboots or replaces
    starts. Unconfirmed, the node stays quarantined and is measured again: never destroyed.
    """

    enabled: bool = Field(default=True, description="Confirm slow findings before acting")
    codes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SLOW_CODES),
        description="The finding codes that are slowness, not errors",
    )
    remeasure_s: Seconds = Field(
        default=3600,
        gt=0,
        description="After a measurement that did not confirm, measure again this long later",
    )

    @field_validator("codes", mode="after")
    @classmethod
    def _codes(cls, value: list[str]) -> list[str]:
        value = [code.upper() for code in value]
        bad = sorted(code for code in value if not CODE_SHAPE.fullmatch(code))
        if bad:
            raise ValueError(f"not a finding code: {', '.join(bad)}")
        return value


DAY_S = 24 * 3600.0


class Crashes(StrictModel):
    """Crash memory (docs/remediation.md, "Crashes no check explains"): pods of different
    jobs that keep crashing on one node, with no finding and no other cause, point at the
    node. Counted across jobs, since one job's own bug crashes it wherever it runs.

    Three distinct jobs in a day: at Meta's rate of interruptions with no attributed
    cause (6.5 per 1,000 node-days, Kokolis et al., HPCA 2025), three of them on one
    healthy node within a day happen about 5e-8 times per node-day (a Poisson tail, with
    every such crash assumed to hit a different job), two about 2e-5: a thousand nodes
    would then see a false suspicion every seven weeks. Kokolis et al. name the count of
    distinct jobs that excluded a node (``excl_jobid_count``) among their best lemon
    signals.
    """

    enabled: bool = Field(default=True, description="Suspect nodes whose pods keep crashing")
    jobs: int = Field(
        default=3,
        ge=2,
        description="Distinct jobs whose pods crashed on the node, unexplained, within"
        " window_s: the node is suspect (quarantined and deep-checked)",
    )
    window_s: Seconds = Field(
        default=DAY_S, gt=0, description="How long an unexplained crash is remembered"
    )


class Preflight(StrictModel):
    """A failed preflight (docs/remediation.md, "A failed preflight"): the check the
    admission webhook adds to GPU pods failed on the node they were placed on. Its
    ``preflight`` layer stands until a repair's action or a passing deep verify comes after
    the failure, or for ``window_s`` at most: as long as crash memory's suspicion, so a
    finding nothing repairs (a slow link a gang peer named) still lapses.
    """

    window_s: Seconds = Field(
        default=DAY_S,
        gt=0,
        description="How long a failed preflight keeps its node quarantined, unrepaired",
    )


class Attribution(StrictModel):
    """Failed training pods judged for the infrastructure's part (docs/attribution.md):
    a pod gpuguard attributes gets the pod condition ``gpuguard.io/InfrastructureFailure``,
    which the Job's ``podFailurePolicy`` ignores.

    The window spans PyTorch's default collective timeout for NCCL (10 min): a rank
    whose peer's node died fails up to that long after the node's finding.

    A failure excused by nothing but the pod's own words (a signature, a lost peer) is
    bounded: an excused failure is never counted, so a job that fails the same way each
    time for a reason of its own (a bad NCCL setting, a dead dataset server) would be
    retried without end. Failures within ``window_s`` of each other are one incident.
    """

    enabled: bool = Field(default=True, description="Judge failed pods of training jobs")
    window_s: Seconds = Field(
        default=600,
        gt=0,
        description="A finding or a lost peer this long around a failure can be its cause",
    )
    self_reported: int = Field(
        default=5,
        ge=0,
        description=(
            "Incidents a job's own last words (or its peers' loss) may excuse per "
            "self_reported_window_s; past that, its failures are charged"
        ),
    )
    self_reported_window_s: Seconds = Field(
        default=86400,
        gt=0,
        description="The window of self_reported",
    )
