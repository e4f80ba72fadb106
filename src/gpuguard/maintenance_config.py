"""The ``maintenance:`` settings: which cloud's metadata service to poll for scheduled events."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Provider = Literal["aws", "gcp", "azure"]
DEFAULT_ENDPOINTS: dict[str, str] = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}


class MaintenanceConfig(BaseModel):
    """Cloud maintenance events (check ``maintenance``); off while ``provider`` is null."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider | None = Field(
        default=None, description="aws, gcp or azure: whose metadata service to poll (null: off)"
    )
    endpoint: str | None = Field(
        default=None,
        description="Base URL of the metadata service (null: the provider's own address)",
    )
    window_s: float = Field(
        default=3600.0,
        gt=0,
        le=30 * 86400,
        description="Drain when a scheduled event starts within this many seconds",
    )
    interval_s: float = Field(default=30.0, gt=0, le=3600, description="Poll period")
    timeout_s: float = Field(
        default=2.0, gt=0, le=30, description="Time limit of one poll (a slow answer never drains)"
    )

    @property
    def base_url(self) -> str:
        if self.endpoint:
            return self.endpoint.rstrip("/")
        return DEFAULT_ENDPOINTS[self.provider or "aws"]
