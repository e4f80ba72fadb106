"""The one configuration model: YAML file and command-line flags, validated by pydantic.

Errors name the bad key and the file, so a typo in a fleet-wide config is found at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeGuard, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuguard.errors import ConfigError
from gpuguard.evidence import EvidenceSettings

# Named here too: the policy, figure-table and scenario loaders import both from here.
from gpuguard.files import read_yaml_mapping as read_yaml_mapping
from gpuguard.invalid import describe_invalid as describe_invalid
from gpuguard.maintenance_config import MaintenanceConfig
from gpuguard.plugins_config import PLUGIN_PREFIX, PluginConfig, unique_names

DEFAULT_TIMEOUT_S = 10.0
DEEP_CHECK_PREFIX = "deep-"
# The checks settings may name (checks/registry.py lists the same; a test holds them equal),
# besides the deep checks, which all start with DEEP_CHECK_PREFIX.
CHECK_NAMES = (
    "kernel-log",
    "dcgm",
    "nvml",
    "nvidia-smi",
    "dcgm-exporter",
    "network",
    "in-job",
    "load-clocks",
    "maintenance",
)
# The external programs the agent runs, by the name ``tools`` may give a path for.
TOOL_NAMES = ("nvidia-smi", "dcgmi", "ibstat", "journalctl", "dmesg", "ib_write_bw", "fi_pingpong")
# A deep check's timeout beyond its budget: importing PyTorch and starting CUDA on every GPU.
DEEP_TIMEOUT_MARGIN_S = 30.0

PositiveSeconds = Annotated[float, Field(gt=0, le=3600)]


class Expectations(BaseModel):
    """What the node should have; ``None`` means "do not check"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int | None = Field(default=None, ge=0)
    nics: int | None = Field(default=None, ge=0)
    link_gbps: float | None = Field(default=None, gt=0)


Dtype = Literal["bf16", "fp16", "tf32", "fp32"]


class GpuFigures(BaseModel):
    """What one GPU model should reach: a row of ``data/gpu_expected.yaml`` or an override.

    Peaks are the vendor's dense (no sparsity) figures; ``healthy`` is the share of each
    peak a healthy GPU reaches in our measurement. ``None`` means "not known": that figure
    is then judged against the node's sibling GPUs only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tflops: dict[Dtype, float] = Field(default_factory=dict, description="dense TFLOP/s")
    memory_gb_s: float | None = Field(default=None, gt=0, description="memory bandwidth, GB/s")
    pcie_gen: int | None = Field(default=None, ge=1, le=6)
    pcie_width: int | None = Field(default=None, ge=1, le=32)
    nvlink_gb_s: float | None = Field(
        default=None, gt=0, description="NVLink bandwidth per GPU, both directions, GB/s"
    )
    healthy: dict[Literal["matmul", "memory", "host_link", "nvlink"], float] = Field(
        default_factory=dict, description="share of peak a healthy GPU reaches, by metric"
    )
    source: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        return next((v for k, v in self.tflops.items() if k == dtype), None)

    def healthy_share(self, metric: str) -> float:
        return next((v for k, v in self.healthy.items() if k == metric), 1.0)


class DeepChecks(BaseModel):
    """The active load checks (``gpuguard check --deep``, the agent's idle-time schedule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_s: PositiveSeconds = Field(default=60.0, description="Time the deep suite may take")
    interval_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 86400,
        description="Agent: run the deep suite this often while the GPUs are idle (null: never)",
    )
    # A job that fails restarts or is requeued within minutes, on the nodes it ran on: a run
    # that started the moment they emptied would meet it there, delay it, and a false
    # positive would drain a node it needs. Fifteen minutes lets that restart land first.
    min_idle_s: float = Field(
        default=900.0,
        ge=0,
        le=86400,
        description="Agent: a scheduled run waits for the GPUs to have been idle this long",
    )
    idle_utilization_percent: float = Field(
        default=5.0, ge=0, le=100, description="GPUs busier than this are not idle"
    )
    matmul_size: int = Field(default=8192, ge=16, le=65536)
    dtypes: list[Dtype] = Field(default_factory=lambda: ["bf16", "tf32"], min_length=1)  # type: ignore[arg-type]
    memory_test_fraction: float = Field(
        default=0.5, gt=0, le=0.95, description="Share of free GPU memory the pattern test uses"
    )
    slow_fraction: float = Field(
        default=0.8, gt=0, le=1, description="Fail-slow below this share of the expected figure"
    )
    sibling_tolerance: float = Field(
        default=0.15, gt=0, lt=1, description="Fail-slow this far below the node's median GPU"
    )
    expected: dict[str, GpuFigures] = Field(
        default_factory=dict,
        description="Per GPU model (its name as the driver reports it): figures that replace"
        " those of the built-in table",
    )


class InJobChecks(BaseModel):
    """What running jobs report about their own GPUs (``gpuguard.training``'s verdicts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    directory: Path | None = Field(
        default=Path("/var/lib/gpuguard/in-job"),
        description="Agent: where jobs on this node write their verdicts (the chart's"
        " inJob.hostPath); null: not read",
    )


class LoadClocks(BaseModel):
    """The passive comparison of busy GPUs with their siblings (check ``load-clocks``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    busy_utilization_percent: float = Field(
        default=90.0, gt=0, le=100, description="A GPU at least this busy is under load"
    )
    tolerance: float = Field(
        default=0.10,
        gt=0,
        lt=1,
        description="A sample counts against a GPU whose SM clock is this far below the"
        " median of its busy siblings of the same model",
    )
    window_s: float = Field(
        default=600.0, gt=0, le=86400, description="The samples judged: this long back"
    )
    min_samples: int = Field(
        default=10, ge=2, description="Loaded samples the window needs before any verdict"
    )
    share: float = Field(
        default=0.8,
        gt=0.5,
        le=1,
        description="A finding when at least this share of the window's loaded samples"
        " counted against the GPU",
    )


# Link layers as the network check names them: sysfs's "InfiniBand" and "Ethernet" (RoCE),
# and "EFA" for any other (AWS EFA's sysfs link_layer reads "Unknown").
LinkLayer = Literal["InfiniBand", "Ethernet", "EFA"]


class LinkExpectation(BaseModel):
    """What the node's RDMA fabric ports of one link layer should be."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ports: int | None = Field(
        default=None, ge=0, description="Fabric ports of this link layer the node must have"
    )
    gbps: float | None = Field(
        default=None, gt=0, description="Minimum rate of each active fabric port, Gb/s"
    )


class DevicePatterns(BaseModel):
    """Which RDMA devices (by name, shell-style globs such as ``mlx5_*``) form the fabric."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        description="When set, exactly the devices matching one of these are the fabric;"
        " the others are not judged",
    )
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Devices never judged nor counted (wins over include)"
    )


class NetworkConfig(BaseModel):
    """The RDMA fabric: which ports belong to it, and what it should have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: DevicePatterns = Field(default_factory=DevicePatterns)
    expected: dict[LinkLayer, LinkExpectation] = Field(
        default_factory=dict,
        description="Per link layer: fabric port count and minimum rate. An Ethernet entry"
        " on a node with InfiniBand or EFA makes its Ethernet ports candidates for the fabric",
    )


class Config(BaseModel):
    """Everything ``gpuguard check`` can be told; every key is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expected_gpus: int | None = Field(default=None, ge=0, description="GPUs the node must have")
    expected_nics: int | None = Field(
        default=None, ge=0, description="RDMA adapters (EFA or InfiniBand) the node must have"
    )
    expected_link_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Minimum rate of every active RDMA fabric port (see network) whose link"
        " layer has no network.expected.<layer>.gbps, Gb/s",
    )
    network: NetworkConfig = Field(
        default_factory=NetworkConfig, description="RDMA fabric roles and expectations"
    )
    fail_closed: bool = Field(
        default=True, description="Report a layer whose checks gave no verdict as Unhealthy"
    )
    default_timeout_s: PositiveSeconds = DEFAULT_TIMEOUT_S
    timeouts: dict[str, PositiveSeconds] = Field(
        default_factory=dict, description="Per-check timeout in seconds, by check name"
    )
    tools: dict[str, str] = Field(
        default_factory=dict, description="Path of an external tool, by its name on PATH"
    )
    kernel_log: str = Field(
        default="auto", description="auto, kmsg, journalctl, dmesg, or the path of a log file"
    )
    dcgm_diag_level: int | None = Field(
        default=None, ge=1, le=4, description="Run `dcgmi diag -r N` live (slow: level 2+)"
    )
    dcgm_exporter_url: str | None = Field(
        default=None,
        description="dcgm-exporter metrics URL to read, e.g. http://localhost:9400/metrics",
    )
    infiniband_sysfs: Path = Path("/sys/class/infiniband")
    counter_sample_interval_s: float = Field(
        default=1.0, ge=0, le=60, description="Gap between the two error-counter samples"
    )
    cross_check: bool = Field(default=False, description="Also read nvidia-smi when NVML answered")
    deep: DeepChecks = Field(default_factory=DeepChecks, description="Active load checks")
    in_job: InJobChecks = Field(
        default_factory=InJobChecks, description="Verdicts of the jobs running on the node"
    )
    load_clocks: LoadClocks = Field(
        default_factory=LoadClocks, description="Busy GPUs compared with their siblings"
    )
    maintenance: MaintenanceConfig = Field(
        default_factory=MaintenanceConfig, description="Cloud maintenance events (off by default)"
    )

    # The agent (gpuguard agent).
    condition_profile: Literal["gpuguard", "eks"] = Field(
        default="gpuguard", description="Condition names: gpuguard's own, or the EKS names"
    )
    check_interval_s: PositiveSeconds = Field(default=30.0, description="Default check period")
    check_intervals: dict[str, PositiveSeconds] = Field(
        default_factory=lambda: {"dcgm": 300.0},
        description="Per-check period in seconds, by check name (expensive checks rarely)",
    )
    heartbeat_interval_s: PositiveSeconds = Field(
        default=180.0, description="Rewrite conditions at least this often, even unchanged"
    )
    application_fault_ttl_s: PositiveSeconds = Field(
        default=600.0, description="How long an application-class Xid stays in the verdict"
    )
    metrics_port: int = Field(default=9465, ge=0, le=65535, description="0 disables /metrics")
    reboot_command: list[str] | None = Field(
        default=None, description="How the agent reboots its node when the controller asks"
    )
    evidence: EvidenceSettings | None = Field(
        default=None, description="Where RMA evidence is stored when asked (none: off)"
    )
    plugins: list[PluginConfig] = Field(
        default_factory=list, description="Custom check programs (docs/checks.md)"
    )

    @field_validator("timeouts", "check_intervals", mode="after")
    @classmethod
    def _known_checks(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(
            name
            for name in value
            if name not in CHECK_NAMES and not name.startswith(DEEP_CHECK_PREFIX)
        )
        if unknown:
            known = ", ".join(CHECK_NAMES)
            raise ValueError(f"unknown check {', '.join(unknown)} (checks: {known}, deep-*)")
        return value

    @field_validator("plugins", mode="after")
    @classmethod
    def _unique_plugins(cls, value: list[PluginConfig]) -> list[PluginConfig]:
        return unique_names(value)

    @field_validator("tools", mode="after")
    @classmethod
    def _known_tools(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(TOOL_NAMES))
        if unknown:
            raise ValueError(f"unknown tool {', '.join(unknown)} (tools: {', '.join(TOOL_NAMES)})")
        return value

    @property
    def expectations(self) -> Expectations:
        return Expectations(
            gpus=self.expected_gpus, nics=self.expected_nics, link_gbps=self.expected_link_gbps
        )

    def plugin(self, check: str) -> PluginConfig | None:
        """The settings of the plugin whose check this is, if it is one."""
        if not check.startswith(PLUGIN_PREFIX):
            return None
        return next((p for p in self.plugins if p.check_name == check), None)

    def timeout_for(self, check: str) -> float:
        if check in self.timeouts:
            return self.timeouts[check]
        if (plugin := self.plugin(check)) is not None:
            return plugin.timeout_s
        if check.startswith(DEEP_CHECK_PREFIX):  # the budget, plus start-up and a margin
            return self.deep.budget_s + DEEP_TIMEOUT_MARGIN_S
        return self.default_timeout_s

    def interval_for(self, check: str) -> float:
        if check == "maintenance" and check not in self.check_intervals:
            return self.maintenance.interval_s
        if (plugin := self.plugin(check)) is not None:
            return plugin.interval_s
        return self.check_intervals.get(check, self.check_interval_s)

    def with_overrides(self, **overrides: object) -> Config:
        """A copy with the non-``None`` overrides applied and validated (CLI flags win)."""
        merged = self.model_dump()
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return build_config(merged, origin="command line")


def build_config(data: Mapping[str, object], origin: str) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        message = describe_invalid(exc, origin, "configuration", _section_of)
        raise ConfigError(message) from None


def _section_of(loc: list[str]) -> type[BaseModel]:
    """The model that owns the last key of ``loc`` (``network.devices.x`` -> DevicePatterns,
    ``plugins.0.x`` -> PluginConfig: list items and optional sections are looked into)."""
    model: type[BaseModel] = Config
    for key in loc[:-1]:
        field = model.model_fields.get(key)
        if field is None:
            if key.isdigit():  # an item of the list just entered
                continue
            break
        inner = [a for a in (field.annotation, *get_args(field.annotation)) if _is_model(a)]
        if not inner:
            break
        model = inner[0]
    return model


def _is_model(annotation: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def load_config(path: Path | None) -> Config:
    """Read and validate a YAML config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    return build_config(read_yaml_mapping(path, "config"), origin=str(path))
