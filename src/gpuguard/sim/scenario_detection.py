"""The scenario's detection sections: the agent's checks and the people's response
(``detection``), the deep suite (``deep_checks``), detection inside running jobs
(``in_job``) and how well job interruptions are attributed (``attribution``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from gpuguard.config import DeepChecks as AgentDeepChecks
from gpuguard.sim.scenario_types import NonNegative, Positive, Share, Strict
from gpuguard.training.monitor import (
    DEFAULT_COMPUTE_INTERVAL,
    DEFAULT_COMPUTE_RECHECKS,
    DEFAULT_WINDOW_STEPS,
)
from gpuguard.training.replicas import ReplicaCheck
from gpuguard.training.straggler import StragglerPolicy

_STRAGGLER = StragglerPolicy()  # the job-side judge's defaults
_REPLICAS = ReplicaCheck()


class Detection(Strict):
    kernel_log_s: NonNegative = Field(default=5.0, description="Event-driven kernel log")
    check_interval_s: Positive = Field(default=30.0, description="The agent's periodic checks")
    watchdog_min: Positive = Field(default=10.0, description="NCCL watchdog: a hung job dies")
    sdc_detection_h: Positive = Field(default=24.0, description="Until a loss spike shows SDC")
    manual_response_h: Positive = Field(default=12.0, description="Until a human acts")
    slow_noticed_h: Positive | None = Field(
        default=72.0,
        description=(
            "Until a job's owners notice a persistently slow node under their job and file a"
            " ticket, in every run (null: never)"
        ),
    )
    device_plugin_health_check: bool = Field(
        default=True,
        description=(
            "The none run has the NVIDIA device plugin's Xid health check on (its default;"
            " false is DP_DISABLE_HEALTHCHECKS=xids)"
        ),
    )


class DeepChecks(Strict):
    """The agent's deep suite (gpuguard policy only): on a schedule while idle, and on the
    controller's verify request when the policy's verify gate is on."""

    interval_h: Positive | None = Field(
        default=24.0, description="Run on a node this often, when it is idle (null: never)"
    )
    min_idle_s: NonNegative = Field(
        default=AgentDeepChecks.model_fields["min_idle_s"].default,
        description="A scheduled run waits for the node to have been free of jobs this long",
    )
    duration_s: Positive = Field(default=90.0, description="The suite's budget plus start-up")
    verify_pickup_s: NonNegative = Field(
        default=1.0, description="Until the agent sees a verify request (it watches its Node)"
    )
    sdc_detection_probability: Share = 0.5
    fail_slow_detection_probability: Share = 0.9
    false_positive_probability: Share = Field(
        default=0.002, description="A run on a healthy node reports a slow GPU"
    )


class InJob(Strict):
    """Detection inside running jobs (gpuguard run only): the training-side step telemetry
    and replica fingerprints (``gpuguard.training``, its defaults), and the agent's
    comparison of busy GPUs' clocks (``load-clocks``, the agent's defaults)."""

    enabled: bool = Field(default=True, description="The in-job path runs (false: deep suite only)")
    adoption: Share = Field(
        default=0.5, description="Share of jobs launched with the training-side telemetry"
    )
    ranks_per_node: int = Field(
        default=8, ge=1, description="A job's processes per node (one per GPU, as torchrun)"
    )
    gpus_per_replica: int = Field(
        default=8, ge=1, description="GPUs that hold one data-parallel replica (TP x PP)"
    )
    step_s: Positive = Field(default=5.0, description="A training step at full speed")
    window_steps: int = Field(
        default=DEFAULT_WINDOW_STEPS, ge=1, description="Steps between per-rank exchanges"
    )
    persistence_windows: int = Field(
        default=_STRAGGLER.persistence,
        ge=1,
        description="Windows in a row before a rank is named, and before it is released",
    )
    ratio: float = Field(
        default=_STRAGGLER.ratio, gt=1, description="Compute time over peers' median"
    )
    change_ratio: float | None = Field(
        default=_STRAGGLER.change_ratio,
        gt=1,
        description="A smaller slowdown named as a change from the rank's own past (null: off)",
    )
    change_persistence_windows: int = Field(
        default=_STRAGGLER.change_persistence,
        ge=1,
        description="Windows in a row before a changed rank is named",
    )
    change_baseline_windows: int = Field(
        default=_STRAGGLER.change_baseline,
        ge=1,
        description="Windows a rank must have run at its usual pace before a change is judged",
    )
    fingerprint_steps: int = Field(
        default=_REPLICAS.interval, ge=1, description="Steps between fingerprint rounds"
    )
    recheck_steps: int = Field(
        default=_REPLICAS.recheck_after,
        ge=1,
        description="Steps after an odd round to the re-check that names the replica",
    )
    sdc_parameter_share: Share = Field(
        default=0.5,
        description="Share of corrupting GPUs whose errors reach their replica's parameters",
    )
    probe_steps: int = Field(
        default=DEFAULT_COMPUTE_INTERVAL,
        ge=0,
        description="Steps between compute-probe rounds (0: the jobs run no probe)",
    )
    probe_rechecks: int = Field(
        default=DEFAULT_COMPUTE_RECHECKS,
        ge=1,
        description="Re-checks of a probe suspect, recheck_steps apart; one odd names it",
    )
    sdc_probe_round_share: Share = Field(
        default=0.5,
        description="Chance that one probe round shows a corrupting GPU's wrong passes",
    )
    false_verdicts_per_node_day: NonNegative = Field(
        default=0.0003,
        description=(
            "Healthy ranks named slow, per node-day of running jobs (measured:"
            " bench/in_job_false_verdicts.py)"
        ),
    )
    passive: bool = Field(default=True, description="The agent compares clocks under load")

    @model_validator(mode="after")
    def _a_judge_the_job_side_takes(self) -> InJob:
        # The job-side judge's own rules (change_ratio at most ratio, and so on).
        StragglerPolicy(
            ratio=self.ratio,
            persistence=self.persistence_windows,
            change_ratio=self.change_ratio,
            change_persistence=self.change_persistence_windows,
            change_baseline=self.change_baseline_windows,
        )
        return self


class Attribution(Strict):
    """How well the gpuguard run's attribution of job interruptions works (the real
    ``remediation.attribution`` decides the channel; these say how often it is in time)."""

    coverage: Share = Field(
        default=0.95,
        description="Share of interruptions attributed to the infrastructure that are marked"
        " before the Job controller counts them",
    )
    error_rate: Share = Field(
        default=0.02, description="Share of a job's own failures wrongly attributed"
    )
    signature_share: Share = Field(
        default=0.3,
        description="Share of interruptions with no node signal whose termination message"
        " carries a known NCCL or CUDA signature",
    )
