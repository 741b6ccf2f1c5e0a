"""`data`: the trajectory store - local or S3, compression, redaction. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class S3Config(Section):
    bucket: str = Field("agentrl", min_length=3, description="Bucket for trajectories")
    prefix: str = Field("trajectories", description="Key prefix inside the bucket")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (None = AWS)")
    region: str = Field("us-east-1", description="Bucket region")


class DataConfig(Section):
    store: Literal["local", "s3"] = Field("local", description="Trajectory store: a local directory or S3")
    root: str = Field("data/trajectories", description="Local store directory (and spool and temp files for S3)")
    s3: S3Config = Field(default_factory=S3Config, description="S3 settings when store is s3")
    compression: Literal["zstd", "snappy", "gzip", "none"] = Field("zstd", description="Parquet compression codec")
    rows_per_file: int = Field(1024, ge=1, description="Trajectories buffered before a Parquet file is published")
    write_timeout_s: float = Field(300.0, gt=0, le=86_400, description="Deadline for publishing the buffered trajectories to the store (a flush; with S3 its retries included, after which a file is spooled locally); past it the write fails with StoreTimeout instead of hanging")
    retention_days: int = Field(30, ge=1, description="Trajectories older than this are removed by `agentrl data gc`")
    redact_fields: list[str] = Field(default_factory=lambda: ["api_key", "token", "password", "secret"], description="Field names whose values are always redacted")
    max_tool_output_bytes: int = Field(16384, ge=0, le=16 * 1024 * 1024, description="Each tool call's output is stored (in its trajectory step and in the run's call log, `agentrl data calls`) clipped to this many bytes of UTF-8, with the whole output's size and sha256; the output is what the harness reported for the call (the sandboxed harnesses clip it to what the agent was shown)")
