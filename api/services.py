"""What the routes do with the job store: create jobs, read them with their progress, cancel them."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import func, select

from api.schemas import JobDetail, JobOptions, JobSummary, RecordingInfo
from workers.db_models import CANCELLED, CHUNK_DONE, FINAL, TRANSCRIBING, ChunkRow, Job, Recording
from workers.jobstore import SessionFactory, locked, transaction
from workers.pipeline import Dispatcher
from workers.settings import Settings


def job_options(options: JobOptions) -> dict:
    """The ``jobs.options`` JSON of a submission."""
    data = options.model_dump(mode="json", include={"language", "formats", "output_prefix", "callback_url"})
    return {k: v for k, v in data.items() if v is not None}


def create_job(
    sessions: SessionFactory,
    dispatch: Dispatcher,
    settings: Settings,
    *,
    inputs: list[str],
    source: str,
    options: JobOptions,
    api_key_id: int | None,
    job_id: str | None = None,
) -> str:
    """Insert a queued job and, after the commit, dispatch its ingest; returns the job id."""
    with transaction(sessions) as session:
        job = Job(
            source=source,
            inputs=inputs,
            pair=options.pair or settings.default_pair,
            options=job_options(options),
            api_key_id=api_key_id,
        )
        if job_id:
            job.id = job_id
        session.add(job)
        session.flush()
        job_id = job.id
    dispatch.ingest(job_id)
    return job_id


def owned_job(session, job_id: str, api_key_id: int, *, lock: bool = False) -> Job | None:
    """The job if the key owns it (another key's job reads as missing)."""
    job = locked(session, Job, job_id) if lock else session.get(Job, job_id)
    return job if job is not None and job.api_key_id == api_key_id else None


def summary(job: Job) -> JobSummary:
    return JobSummary.model_validate(job, from_attributes=True)


def detail(session, job: Job) -> JobDetail:
    """A job with chunk progress, ETA, acceptance rate and real-time factor rolled up from its chunks."""
    done_chunks = (
        select(
            func.coalesce(func.sum(ChunkRow.drafted), 0),
            func.coalesce(func.sum(ChunkRow.accepted), 0),
            func.coalesce(func.sum(ChunkRow.encoder_seconds + ChunkRow.decoder_seconds), 0.0),
            func.coalesce(func.sum(ChunkRow.end_seconds - ChunkRow.start_seconds), 0.0),
        )
        .join(Recording, ChunkRow.recording_id == Recording.id)
        .where(Recording.job_id == job.id, ChunkRow.status == CHUNK_DONE)
    )
    drafted, accepted, compute, audio = session.execute(done_chunks).one()
    recordings = [
        RecordingInfo(
            id=r.id, name=r.source_key, status=r.status, duration=r.duration, chunks_done=r.chunks_done,
            chunks_total=r.chunks_total, error=r.error, outputs=r.output_locations or {},
        )
        for r in job.recordings
    ]  # fmt: skip
    done = sum(r.chunks_done for r in recordings)
    total = sum(r.chunks_total for r in recordings)
    percent = 100.0 if job.status in FINAL else (round(100.0 * done / total, 1) if total else 0.0)
    errors = [e for e in [job.error, *(f"{r.name}: {r.error}" for r in recordings if r.error)] if e]
    return JobDetail(
        **summary(job).model_dump(),
        options=job.options or {},
        chunks_done=done,
        chunks_total=total,
        progress_percent=percent,
        eta_seconds=_eta(job, done, total),
        acceptance_rate=round(accepted / drafted, 4) if drafted else None,
        real_time_factor=round(compute / audio, 4) if audio else None,
        audio_seconds_done=round(float(audio), 3),
        errors=errors,
        recordings=recordings,
    )


def _eta(job: Job, done: int, total: int) -> float | None:
    """Seconds left at the chunk rate since transcription began (none before a chunk is done)."""
    if job.status in FINAL or not done or not total:
        return None
    started = next((at for status, at in job.history or [] if status == TRANSCRIBING), None)
    begin = datetime.fromisoformat(started) if started else job.created_at
    if begin.tzinfo is None:
        begin = begin.replace(tzinfo=timezone.utc)
    elapsed = (datetime.now(timezone.utc) - begin).total_seconds()
    return round(max(elapsed, 0.0) * (total - done) / done, 1)


def cancel(sessions: SessionFactory, job_id: str, api_key_id: int) -> Job | None:
    """Cancel a live job and its live recordings (workers skip chunks of cancelled recordings).

    Returns the job (unchanged if it had already ended), or ``None`` if the key owns no such job.
    """
    with transaction(sessions) as session:
        job = owned_job(session, job_id, api_key_id, lock=True)
        if job is None or job.status in FINAL:
            return job
        for recording in job.recordings:
            if recording.status not in FINAL:
                recording.move_to(CANCELLED, "cancelled by request")
        job.move_to(CANCELLED, "cancelled by request")
        return job
