"""Job store tables (SQLAlchemy 2): jobs, recordings, chunks and API keys, with explicit status transitions.

Jobs and recordings move ``queued -> ingesting -> transcribing -> stitching -> done``; any live state may
end in ``failed`` (with its error text) or ``cancelled``. :meth:`Tracked.move_to` is the only way to change
their status: it refuses an illegal transition, stamps ``updated_at`` and appends ``[status, time]`` to the
row's ``history``. Chunks have their own small life (``pending -> running -> done | failed``) updated by
conditional SQL in :mod:`workers.jobstore`, because redelivered tasks race on them.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

QUEUED, INGESTING, TRANSCRIBING, STITCHING = "queued", "ingesting", "transcribing", "stitching"
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
FINAL = frozenset({DONE, FAILED, CANCELLED})

TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({INGESTING, FAILED, CANCELLED}),
    INGESTING: frozenset({TRANSCRIBING, FAILED, CANCELLED}),
    TRANSCRIBING: frozenset({STITCHING, FAILED, CANCELLED}),
    STITCHING: frozenset({DONE, FAILED, CANCELLED}),
    DONE: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}
"""Legal next states of a job or recording."""

CHUNK_PENDING, CHUNK_RUNNING, CHUNK_DONE, CHUNK_FAILED = "pending", "running", "done", "failed"
CHUNK_SETTLED = frozenset({CHUNK_DONE, CHUNK_FAILED})


class IllegalTransition(ValueError):
    """A status change the state machine does not allow."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base; named constraints and indexes keep Alembic's autogenerate comparisons exact."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Tracked:
    """Status, error text and a history of transitions, shared by jobs and recordings."""

    status: Mapped[str] = mapped_column(String(16), default=QUEUED, index=True)
    error: Mapped[str | None] = mapped_column(Text)
    history: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    def move_to(self, status: str, error: str | None = None) -> None:
        """Change status (raises :class:`IllegalTransition` if not allowed), recording when and why."""
        current = self.status or QUEUED
        if status not in TRANSITIONS.get(current, frozenset()):
            raise IllegalTransition(f"{type(self).__name__} {self.id}: {current} -> {status} is not allowed")
        now = utcnow()
        self.status = status
        self.updated_at = now
        self.history = [*(self.history or []), [status, now.isoformat()]]
        if error is not None:
            self.error = error


def _job_id() -> str:
    return uuid.uuid4().hex


class Job(Tracked, Base):
    """One submission: a list of inputs (files, archives, object keys) transcribed with one model pair."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=_job_id)
    source: Mapped[str] = mapped_column(Text)
    """What was submitted, for people (a file name, an s3:// URI, an upload name)."""
    inputs: Mapped[list[Any]] = mapped_column(default=list)
    """Locations the ingest stage reads (local paths or object URIs)."""
    pair: Mapped[str] = mapped_column(String(300))
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    recordings_total: Mapped[int] = mapped_column(Integer, default=0)
    recordings_done: Mapped[int] = mapped_column(Integer, default=0)
    recordings_failed: Mapped[int] = mapped_column(Integer, default=0)
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"), index=True)
    """The API key that submitted the job (it alone sees it); none for bucket-triggered and local jobs."""

    recordings: Mapped[list[Recording]] = relationship(back_populates="job", order_by="Recording.position")


class Recording(Tracked, Base):
    """One recording of a job (a file, or an archive member) and, once stitched, its transcript."""

    __tablename__ = "recordings"
    __table_args__ = (UniqueConstraint("job_id", "position"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    """Order within the job (inputs in order, archive members in archive order)."""
    source_key: Mapped[str] = mapped_column(Text)
    archive: Mapped[str | None] = mapped_column(Text)
    duration: Mapped[float | None] = mapped_column(Float)
    chunks_total: Mapped[int] = mapped_column(Integer, default=0)
    chunks_done: Mapped[int] = mapped_column(Integer, default=0)
    """Chunks settled (done or failed); the one that makes it equal ``chunks_total`` triggers the stitch."""
    language: Mapped[str | None] = mapped_column(String(16))
    transcript: Mapped[str | None] = mapped_column(Text)
    segments: Mapped[list[Any] | None] = mapped_column()
    outputs: Mapped[dict[str, Any] | None] = mapped_column()
    """Rendered files by format (txt, srt, vtt, json)."""
    output_locations: Mapped[dict[str, Any] | None] = mapped_column()
    """Where the outputs were written (object keys by format), when written to object storage."""
    stats: Mapped[dict[str, Any] | None] = mapped_column()

    job: Mapped[Job] = relationship(back_populates="recordings")
    chunks: Mapped[list[ChunkRow]] = relationship(back_populates="recording", order_by="ChunkRow.index")


class ChunkRow(Base):
    """One chunk of a recording and, once decoded, its result and decoding statistics."""

    __tablename__ = "chunks"
    __table_args__ = (UniqueConstraint("recording_id", "index"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    recording_id: Mapped[int] = mapped_column(ForeignKey("recordings.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    start_sample: Mapped[int] = mapped_column(BigInteger)
    end_sample: Mapped[int] = mapped_column(BigInteger)
    overlap_samples: Mapped[int] = mapped_column(Integer, default=0)
    start_seconds: Mapped[float] = mapped_column(Float)
    end_seconds: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default=CHUNK_PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    text: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[list[Any] | None] = mapped_column()
    segments: Mapped[list[Any] | None] = mapped_column()
    language: Mapped[str | None] = mapped_column(String(16))
    verifier_passes: Mapped[int] = mapped_column(Integer, default=0)
    drafter_steps: Mapped[int] = mapped_column(Integer, default=0)
    drafted: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    encoder_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    decoder_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    recording: Mapped[Recording] = relationship(back_populates="chunks")


class ApiKey(Base):
    """An API key: only its SHA-256 digest is stored."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class S3Event(Base):
    """An object-created event that made a job; the unique dedup key makes redelivered events harmless."""

    __tablename__ = "s3_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dedup_key: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of bucket, key and version (version id, else ETag)."""
    bucket: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(String(1024))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
