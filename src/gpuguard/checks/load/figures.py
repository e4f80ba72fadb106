"""The expected-figure table: what each GPU model should reach, and the per-pool overrides.

The table is data (``gpuguard/data/gpu_expected.yaml``, one row per model with its
source); a node pool's config replaces any figure of a row (``deep.expected``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuguard.config import DeepChecks, GpuFigures, describe_invalid, read_yaml_mapping
from gpuguard.errors import ConfigError

# PCIe transfer rate per lane (GT/s) and line-code efficiency, by generation (PCI-SIG).
_PCIE_GT_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_PCIE_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 1.0}


class ModelRow(GpuFigures):
    names: list[str] = Field(min_length=1, description="names the driver reports")


class FigureTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: GpuFigures = GpuFigures()
    models: dict[str, ModelRow]


def pcie_gb_s(gen: int, width: int) -> float:
    """One direction's raw bandwidth of a PCIe link, GB/s (Gen5 x16: 63.0)."""
    return _PCIE_GT_S[gen] * _PCIE_ENCODING[gen] * width / 8


def load_table(path: Path | None = None) -> FigureTable:
    """The built-in table, or another file in the same format."""
    if path is None:
        with resources.as_file(resources.files("gpuguard") / "data" / "gpu_expected.yaml") as p:
            data = read_yaml_mapping(p, "expected-figure table")
        origin = "gpuguard/data/gpu_expected.yaml"
    else:
        data = read_yaml_mapping(path, "expected-figure table")
        origin = str(path)
    try:
        return FigureTable.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            describe_invalid(exc, origin, "expected-figure table", _model_at)
        ) from None


@cache
def builtin_table() -> FigureTable:
    """The table shipped in the package, read once (it is frozen, so safe to share)."""
    return load_table()


def _model_at(loc: list[str]) -> type[BaseModel]:
    if not loc or loc[0] not in ("defaults", "models"):
        return FigureTable
    return ModelRow if loc[0] == "models" else GpuFigures


def expected_for(device_name: str, table: FigureTable, deep: DeepChecks) -> GpuFigures | None:
    """The figures a GPU reporting ``device_name`` should reach (``None``: unknown model).

    A config override (by model name or driver name) replaces the figures it sets; the
    table's default healthy shares fill in what neither the row nor the override gives.
    """
    label, row = _find(device_name, table)
    override = deep.expected.get(device_name) or (deep.expected.get(label) if label else None)
    if row is None and override is None:
        return None
    healthy: dict[str, float] = dict(table.defaults.healthy.items())
    tflops: dict[str, float] | None = None
    merged: dict[str, object] = {}
    for part in (row, override):
        if part is None:
            continue
        fields = part.model_dump(exclude_unset=True, exclude={"names"})
        healthy.update(fields.pop("healthy", {}))
        if (given := fields.pop("tflops", None)) is not None:
            tflops = {**(tflops or {}), **given}
        merged.update(fields)
    merged["healthy"] = healthy
    if tflops is not None:
        merged["tflops"] = tflops
    if override is not None:
        merged["source"] = f"{merged.get('source') or 'no table row'}; overridden by config"
    return GpuFigures.model_validate(merged)


def expected_figures(
    deep: DeepChecks, table: FigureTable | None = None
) -> Callable[[str], GpuFigures | None]:
    """:func:`expected_for` by device name, in one table (the built-in one unless given) with
    one pool's overrides: the expected figures the GPU-facts rules take."""
    chosen = builtin_table() if table is None else table

    def figures_for(device_name: str) -> GpuFigures | None:
        return expected_for(device_name, chosen, deep)

    return figures_for


def _find(device_name: str, table: FigureTable) -> tuple[str | None, ModelRow | None]:
    wanted = device_name.strip().lower()
    for label, row in table.models.items():
        if wanted in (n.lower() for n in row.names):
            return label, row
    return None, None
