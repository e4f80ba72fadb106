"""The settings of an S3-compatible bucket as the RMA evidence store (``evidence.s3``):
where, and the names of where the secrets live, never the secrets themselves."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class S3Settings(BaseModel):
    """Where and how evidence is uploaded; the keys are only names of where secrets live."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(description="http(s)://host[:port] of the S3-compatible server")
    bucket: str = Field(min_length=3, description="The bucket (it must exist)")
    prefix: str = Field(default="", description="Put before each archive's name, e.g. rma/")
    region: str = Field(default="us-east-1", description="Signed into each request")
    access_key_env: str = Field(default="AWS_ACCESS_KEY_ID", description="Env var: key id")
    secret_key_env: str = Field(default="AWS_SECRET_ACCESS_KEY", description="Env var: secret")
    session_token_env: str = Field(default="AWS_SESSION_TOKEN", description="Env var: token")
    credentials_file: Path | None = Field(
        default=None, description="An AWS credentials file to read instead of the env vars"
    )
    profile: str = Field(default="default", description="Its section in credentials_file")
    timeout_s: float = Field(default=300.0, gt=0, description="Time limit of one upload")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        plain = parts.hostname and not parts.username and not parts.path.strip("/")
        if parts.scheme not in ("http", "https") or not plain or parts.query:
            raise ValueError("must be http(s)://host[:port], nothing else")
        return value.rstrip("/")

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise ValueError("not a bucket name (lower-case letters, digits, dots, dashes)")
        return value

    def key_for(self, name: str) -> str:
        return f"{self.prefix.lstrip('/')}{name}"

    def url_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"
