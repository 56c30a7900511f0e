"""One settings object, read from ``SPECSCRIBE_*`` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specscribe"


class Settings(BaseSettings):
    """Service configuration; every field can be set as ``SPECSCRIBE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SPECSCRIBE_", extra="ignore")

    cache_dir: Path = Field(default_factory=_default_cache_dir, description="Converted models, local DB.")
    redis_url: str = "redis://127.0.0.1:6379/0"
    chunk_ttl_seconds: int = 24 * 3600

    # ingest: decoding and archives
    decode_max_seconds: float = Field(12 * 3600, description="Refuse recordings that decode longer.")
    archive_max_members: int = Field(10_000, description="Most entries one archive may hold.")
    archive_max_member_bytes: int = Field(8 << 30, description="Largest uncompressed member (counted).")
    archive_max_total_bytes: int = Field(32 << 30, description="Most uncompressed bytes per archive.")

    # ingest: voice activity and chunking (see workers/vad.py, workers/chunk.py)
    vad_threshold: float = 0.5
    vad_neg_threshold: float = 0.35
    vad_min_speech_seconds: float = 0.25
    vad_min_silence_seconds: float = 0.1
    vad_speech_pad_seconds: float = 0.1
    vad_loud_db: float = Field(-35.0, description="Non-speech frames louder than this (dBFS RMS) are kept.")
    chunk_max_seconds: float = 30.0
    chunk_overlap_seconds: float = Field(1.0, description="Overlap at a forced cut (no pause in reach).")
    chunk_min_skip_seconds: float = Field(1.0, description="Shortest silence left out between chunks.")
    chunk_split_pause_seconds: float = Field(4.0, description="Silences this long always end a chunk.")

    # pipeline: job store, broker, workers (see workers/jobstore.py, workers/celery_app.py)
    default_pair: str = Field(
        "bundled:whisper-base+distilled:whisper-base",
        description="VERIFIER+DRAFTER used when a job names no pair: base with the drafter distilled for it and "
        "shipped in the package (runs on CPU and CUDA; `int8:` is the CPU-only alternative).",
    )
    database_url: str = Field("", description="SQLAlchemy URL; empty: SQLite file under cache_dir.")
    broker_url: str = Field("", description="Celery broker; empty: redis_url.")
    visibility_timeout: int = Field(
        3600, description="Seconds before an unacknowledged task is redelivered; above the longest task."
    )
    ingest_time_limit: int = Field(3 * 3600, description="Hard limit on one ingest task (prefork pool).")
    asr_time_limit: int = Field(900, description="Hard limit on one transcribe task (prefork pool).")
    task_max_retries: int = Field(8, description="Retries of a task on transient errors (with backoff).")
    transcribe_task_chunks: int = Field(1, description="Chunks per transcribe task (one recording).")
    asr_device: str = Field("cpu", description="Device of an ASR worker started without --device.")
    asr_batch_size: int = Field(
        1,
        description="Chunks an ASR worker fetches as one group (one Redis round trip) and decodes together with "
        "batched speculative decoding (per-sequence acceptance, continuous batching).",
    )

    # service edge: object storage, uploads, bucket triggers, callbacks (see workers/object_store.py, api/)
    s3_endpoint_url: str = Field("", description="S3 endpoint (MinIO, moto); empty: AWS. Credentials: AWS_* env.")
    s3_region: str = "us-east-1"
    s3_allowed_buckets: str = Field("", description="Comma-separated buckets s3:// sources may name.")
    upload_bucket: str = Field("specscribe", description="Bucket that API uploads are streamed to.")
    upload_prefix: str = Field("uploads", description="Key prefix of uploads: <prefix>/<job id>/<file name>.")
    upload_max_bytes: int = Field(4 << 30, description="Largest upload accepted (413 above, nothing stored).")
    s3_output_prefix: str = Field("", description="s3:// prefix of bucket-triggered outputs; empty: beside it.")
    sqs_queue_url: str = Field("", description="SQS queue receiving S3 ObjectCreated notifications (s3-listen).")
    s3_listen_prefix: str = Field("", description="Only objects whose key starts with this create jobs.")
    s3_listen_suffixes: str = Field(
        ".wav,.mp3,.flac,.m4a,.ogg,.opus,.mp4,.mkv,.webm,.zip,.tar,.tgz,.tar.gz",
        description="Comma-separated key suffixes that create jobs (so written transcripts never do).",
    )
    s3_events_key_id: int | None = Field(
        None,
        description="Id of the API key (`specscribe keys create`) that owns bucket-triggered jobs and sees "
        "them through the API; unset: no key does (operators follow them in the database and Flower).",
    )
    webhook_secret: str = Field("", description="Shared secret of POST /v1/hooks/s3 (HMAC-SHA256); empty: off.")
    callback_max_attempts: int = Field(6, description="Attempts of a job's callback POST (exponential backoff).")
    api_url: str = Field("http://127.0.0.1:8000", description="Service URL used by the CLI client.")
    api_key: str = Field("", description="API key used by the CLI client.")

    @model_validator(mode="after")
    def _fill_derived_urls(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.cache_dir / 'specscribe.db'}"
        if not self.broker_url:
            self.broker_url = self.redis_url
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once)."""
    return Settings()
