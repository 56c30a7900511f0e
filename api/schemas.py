"""Request and response models of the HTTP API (apart from the database models in ``workers.db_models``)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

from workers.pairs import split_pair

Format = Literal["txt", "srt", "vtt", "json"]
JobStatus = Literal["queued", "ingesting", "transcribing", "stitching", "done", "failed", "cancelled"]
ALL_FORMATS: list[Format] = ["txt", "srt", "vtt", "json"]


class JobOptions(BaseModel):
    """How to transcribe and where results go (shared by uploads, ``s3://`` sources and the CLI)."""

    model_config = ConfigDict(extra="forbid")

    pair: str | None = Field(
        None, max_length=300, description="VERIFIER+DRAFTER; default: the service's default pair.",
        examples=["bundled:whisper-base+distilled:whisper-base"],
    )  # fmt: skip
    language: str | None = Field(
        None, min_length=2, max_length=16, pattern=r"^[a-z]{2,3}(-[A-Za-z]+)?$", description="Language code; "
        "detected per chunk when omitted.", examples=["en"],
    )  # fmt: skip
    formats: list[Format] = Field(
        default_factory=lambda: list(ALL_FORMATS), min_length=1, max_length=4, description="Output formats."
    )
    output_prefix: str | None = Field(
        None, max_length=1024, pattern=r"^s3://", description="Also write <prefix>/<recording>.<format> here "
        "(an allowed bucket).", examples=["s3://lectures/transcripts/"],
    )  # fmt: skip
    callback_url: HttpUrl | None = Field(
        None, description="Receives one POST with the job's outcome when it ends.",
        examples=["https://example.org/hooks/specscribe"],
    )  # fmt: skip

    @field_validator("pair")
    @classmethod
    def _pair_names_a_verifier(cls, value: str | None) -> str | None:
        if value is not None:
            split_pair(value)
        return value


class JobSourceRequest(JobOptions):
    """Transcribe an object, or every object under a prefix, in an allowed S3 bucket."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"source": "s3://lectures/2026/", "language": "en", "formats": ["srt"]}]},
    )

    source: str = Field(
        ..., min_length=6, max_length=1024, pattern=r"^s3://[^/]+(/.*)?$", examples=["s3://lectures/week1.mp3"]
    )


class JobCreated(BaseModel):
    """Answer to a submission: the job is queued."""

    job_id: str = Field(..., examples=["3f2a9c0e6d4b4f7e9a1c2b3d4e5f6a7b"])
    status: JobStatus = Field("queued")
    inputs: list[str] = Field(default_factory=list, examples=[["s3://specscribe/uploads/3f2a.../week1.mp3"]])


class RecordingInfo(BaseModel):
    """One recording of a job."""

    id: int
    name: str = Field(..., description="File name, or archive member path.")
    status: JobStatus
    duration: float | None = Field(None, description="Seconds of audio.")
    chunks_done: int
    chunks_total: int
    error: str | None = None
    outputs: dict[str, str] = Field(default_factory=dict, description="Output object URIs by format.")


class JobSummary(BaseModel):
    """A job as listed."""

    id: str
    status: JobStatus
    source: str
    pair: str
    created_at: datetime
    updated_at: datetime
    recordings_total: int
    recordings_done: int
    recordings_failed: int


class JobDetail(JobSummary):
    """A job with its recordings, progress and decoding statistics."""

    options: dict
    chunks_done: int
    chunks_total: int
    progress_percent: float = Field(..., ge=0, le=100, examples=[42.5])
    eta_seconds: float | None = Field(None, description="Estimated seconds left (from the rate so far).")
    acceptance_rate: float | None = Field(None, description="Accepted / drafted tokens of decoded chunks.")
    real_time_factor: float | None = Field(None, description="Decoding seconds per second of audio.")
    audio_seconds_done: float = 0.0
    errors: list[str] = Field(default_factory=list)
    recordings: list[RecordingInfo] = Field(default_factory=list)


class JobPage(BaseModel):
    """One page of jobs, newest first."""

    items: list[JobSummary]
    total: int
    limit: int
    offset: int


class HookResult(BaseModel):
    """What an S3 event delivery created."""

    created: list[str] = Field(default_factory=list, description="New job ids.")
    duplicates: int = 0
    ignored: int = 0


class Health(BaseModel):
    """Dependency checks: ``ok`` or an error text each."""

    status: Literal["ok", "degraded"]
    checks: dict[str, str] = Field(..., examples=[{"database": "ok", "redis": "ok", "s3": "ok"}])


class ErrorBody(BaseModel):
    """An error answer."""

    detail: str
