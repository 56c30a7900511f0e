"""The job store: engines and sessions for PostgreSQL (service) or SQLite (local mode), schema upgrades,
and the few writes that must be atomic because tasks are delivered at least once.

One code path serves both databases: ``postgresql://`` URLs use psycopg 3, SQLite gets foreign keys and
WAL. Rows a stage reads and then updates are locked with ``SELECT ... FOR UPDATE`` (a no-op on SQLite,
where a single process owns the file); chunk results land with a conditional ``UPDATE ... RETURNING``,
so a redelivered or duplicated transcribe task stores nothing twice and counts nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from workers.db_models import (
    CHUNK_DONE,
    CHUNK_FAILED,
    CHUNK_RUNNING,
    CHUNK_SETTLED,
    DONE,
    FAILED,
    FINAL,
    STITCHING,
    TRANSCRIBING,
    ChunkRow,
    Job,
    Recording,
    utcnow,
)
from workers.types import ChunkResult

ALEMBIC_DIR = Path(__file__).resolve().parents[1] / "infra" / "alembic"

SessionFactory = Callable[[], Session]


def normalize_url(url: str) -> str:
    """Pick psycopg 3 for bare ``postgresql://`` URLs; leave others as they are."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get their folder created, foreign keys on and WAL journaling."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine


@lru_cache(maxsize=8)
def session_factory(url: str) -> sessionmaker[Session]:
    """One session factory (and connection pool) per database URL per process."""
    return sessionmaker(make_engine(url), expire_on_commit=False)


@contextmanager
def transaction(sessions: SessionFactory) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with sessions() as session, session.begin():
        yield session


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations in ``infra/alembic`` to ``url`` (creating the schema on first use)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    config.attributes["url"] = normalize_url(url)
    command.upgrade(config, revision)


# --- atomic writes ------------------------------------------------------------------------------------


def locked(session: Session, model: type, key: object) -> Any:
    """Load one row for update (row lock on PostgreSQL); ``None`` if it does not exist."""
    return session.execute(select(model).where(model.id == key).with_for_update()).scalar_one_or_none()


def claim_chunks(session: Session, chunk_ids: list[int]) -> list[ChunkRow]:
    """Mark the unsettled chunks among ``chunk_ids`` of recordings still being transcribed running (one more
    attempt each) and return them in order; chunks of cancelled or failed recordings are left alone."""
    transcribing = select(Recording.id).where(Recording.status == TRANSCRIBING)
    rows = session.execute(
        update(ChunkRow)
        .where(
            ChunkRow.id.in_(chunk_ids),
            ChunkRow.status.not_in(CHUNK_SETTLED),
            ChunkRow.recording_id.in_(transcribing),
        )
        .values(status=CHUNK_RUNNING, attempts=ChunkRow.attempts + 1, updated_at=utcnow())
        .returning(ChunkRow.id)
    ).all()
    claimed = {row.id for row in rows}
    chunks = session.scalars(select(ChunkRow).where(ChunkRow.id.in_(claimed))).all()
    return sorted(chunks, key=lambda c: (c.recording_id, c.index))


def settle_chunk(session: Session, chunk_id: int, values: dict[str, Any]) -> tuple[int, int, int] | None:
    """Store a chunk's final values unless it is already settled, and count it on its recording.

    Returns ``(recording_id, chunks_done, chunks_total)`` when this call settled the chunk, ``None`` when
    another delivery had already done so (nothing is written then).
    """
    settled = session.execute(
        update(ChunkRow)
        .where(ChunkRow.id == chunk_id, ChunkRow.status.not_in(CHUNK_SETTLED))
        .values(**values, updated_at=utcnow())
        .returning(ChunkRow.recording_id)
    ).first()
    if settled is None:
        return None
    counted = session.execute(
        update(Recording)
        .where(Recording.id == settled.recording_id)
        .values(chunks_done=Recording.chunks_done + 1, updated_at=utcnow())
        .returning(Recording.chunks_done, Recording.chunks_total)
    ).one()
    return settled.recording_id, counted.chunks_done, counted.chunks_total


def store_chunk_result(session: Session, chunk_id: int, result: ChunkResult) -> tuple[int, int, int] | None:
    """Settle a chunk as done with its decoded result (see :func:`settle_chunk`)."""
    stats = result.stats
    return settle_chunk(
        session,
        chunk_id,
        {
            "status": CHUNK_DONE,
            "error": None,
            "text": result.text,
            "tokens": list(result.tokens),
            "segments": [[s.start, s.end, s.text] for s in result.segments],
            "language": result.language,
            "verifier_passes": stats.verifier_passes,
            "drafter_steps": stats.drafter_steps,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "encoder_seconds": stats.encoder_seconds,
            "decoder_seconds": stats.decoder_seconds,
        },
    )


def store_chunk_failure(session: Session, chunk_id: int, error: str) -> tuple[int, int, int] | None:
    """Settle a chunk as failed with its error text (see :func:`settle_chunk`)."""
    return settle_chunk(session, chunk_id, {"status": CHUNK_FAILED, "error": error})


def recording_complete(recording: Recording) -> bool:
    """All chunks settled and the recording waits for (or is in) its stitch."""
    return recording.status in (TRANSCRIBING, STITCHING) and recording.chunks_done >= recording.chunks_total


def advance_job(session: Session, job_id: str) -> Job | None:
    """Move a job as far along as its recordings allow (row-locked, so concurrent stitches agree).

    A job in ``transcribing`` (ingest finished, recordings known) moves to ``stitching`` once no recording
    is still being transcribed, and to ``done`` once all are settled (``failed`` if none succeeded).
    """
    job = locked(session, Job, job_id)
    if job is None or job.status in FINAL:
        return job
    counts = dict(
        session.execute(
            select(Recording.status, func.count()).where(Recording.job_id == job_id).group_by(Recording.status)
        ).all()
    )
    job.recordings_total = sum(counts.values())
    job.recordings_done = counts.get(DONE, 0)
    job.recordings_failed = counts.get(FAILED, 0)
    settled = sum(n for status, n in counts.items() if status in FINAL)
    if job.status == TRANSCRIBING and settled + counts.get(STITCHING, 0) == job.recordings_total:
        job.move_to(STITCHING)
    if job.status == STITCHING and settled == job.recordings_total:
        if job.recordings_total and not job.recordings_done:
            job.move_to(FAILED, "no recording could be transcribed")
        else:
            job.move_to(DONE)
    return job
