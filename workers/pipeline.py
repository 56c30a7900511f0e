"""The pipeline's stages as plain functions: submit -> ingest -> transcribe -> stitch.

Celery tasks (:mod:`workers.tasks`) and the in-process local mode (:mod:`workers.local`) call the same
functions; they differ only in the :class:`Dispatcher` that hands work to the next stage and in the PCM
store (Redis :class:`~workers.chunk_store.ChunkStore`, or an in-memory one). Every stage is idempotent:
it reads its state from the job store first, so a redelivered task finds its work done and does nothing
(or only re-dispatches what may have been lost when a worker died between commit and dispatch).
Work is always dispatched after the commit that makes it visible.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
from sqlalchemy import select

from workers.archive import ArchiveLimits, iter_recordings
from workers.asr.token_rules import DecodeOptions
from workers.chunk import ChunkOptions, chunk_pcm, chunk_recording
from workers.chunk_store import ChunkStoreError
from workers.db_models import (
    CHUNK_FAILED,
    CHUNK_SETTLED,
    DONE,
    FAILED,
    FINAL,
    INGESTING,
    QUEUED,
    STITCHING,
    TRANSCRIBING,
    ChunkRow,
    Job,
    Recording,
)
from workers.decode import DecodeError, decode
from workers.jobstore import (
    SessionFactory,
    advance_job,
    claim_chunks,
    locked,
    recording_complete,
    store_chunk_failure,
    store_chunk_result,
    transaction,
)
from workers.render import render_all
from workers.settings import Settings
from workers.stitch import stitch
from workers.transcribe import Transcriber, transcribe_chunks_to_end
from workers.types import SAMPLE_RATE, ChunkResult, DecodeStats, MemberFailure, RecordingFile, Segment
from workers.vad import VadOptions, get_vad

T = TypeVar("T")


class Dispatcher(Protocol):
    """Hands work to the next stage (Celery queues, or the local mode's in-process queue)."""

    def ingest(self, job_id: str) -> None: ...

    def transcribe(self, pair: str, chunk_ids: list[int]) -> None: ...

    def stitch(self, recording_id: int) -> None: ...


class PcmStore(Protocol):
    """The part of :class:`~workers.chunk_store.ChunkStore` the stages use."""

    def put_many(self, job: str, chunks: Iterable[tuple[str, int, np.ndarray | bytes]]) -> list[str]: ...

    def get_many(self, job: str, items: Sequence[tuple[str, int]]) -> list[np.ndarray]: ...

    def delete(self, job: str, recording: str, index: int) -> bool: ...

    def delete_job(self, job: str) -> int: ...


@dataclass
class Pipeline:
    """What every stage needs: the job store, the PCM store, the dispatcher and the settings."""

    sessions: SessionFactory
    store: PcmStore
    dispatch: Dispatcher
    settings: Settings


# --- submit -------------------------------------------------------------------------------------------


def submit_job(
    pipe: Pipeline,
    inputs: Sequence[str],
    *,
    source: str | None = None,
    pair: str | None = None,
    language: str | None = None,
) -> str:
    """Create a queued job for ``inputs`` (local paths) and dispatch its ingest; returns the job id."""
    with transaction(pipe.sessions) as session:
        job = Job(
            source=source or ", ".join(inputs),
            inputs=list(inputs),
            pair=pair or pipe.settings.default_pair,
            options={"language": language},
        )
        session.add(job)
        session.flush()
        job_id = job.id
    pipe.dispatch.ingest(job_id)
    return job_id


# --- ingest -------------------------------------------------------------------------------------------


def ingest_job(pipe: Pipeline, job_id: str) -> None:
    """Expand, decode and chunk every input of a job; dispatch transcription recording by recording.

    On redelivery, recordings already ingested are not decoded again (their unsettled chunks are
    re-dispatched) and a recording caught half-way is ingested afresh.
    """
    with transaction(pipe.sessions) as session:
        job = locked(session, Job, job_id)
        if job is None or job.status not in (QUEUED, INGESTING):
            return
        if job.status == QUEUED:
            job.move_to(INGESTING)
        inputs, pair = list(job.inputs), job.pair
        existing = {r.position: (r.id, r.status) for r in job.recordings}
    work_dir = Path(tempfile.mkdtemp(prefix=f"ingest-{job_id}-", dir=_work_root(pipe.settings)))
    try:
        limits = ArchiveLimits.from_settings(pipe.settings)
        for position, item in enumerate(iter_recordings(_local_inputs(pipe, inputs, work_dir), work_dir, limits)):
            if position in existing and existing[position][1] != INGESTING:
                if existing[position][1] == TRANSCRIBING:
                    _redispatch_recording(pipe, existing[position][0], pair)
                continue
            if isinstance(item, MemberFailure):
                if not item.skipped:
                    _failed_recording(pipe, job_id, position, item)
                continue
            ingest_recording(pipe, job_id, position, item, pair)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    with transaction(pipe.sessions) as session:
        job = locked(session, Job, job_id)
        if job is not None and job.status == INGESTING:
            job.move_to(TRANSCRIBING)
        finished = advance_job(session, job_id)
    _cleanup_if_final(pipe, finished)


def ingest_recording(pipe: Pipeline, job_id: str, position: int, item: RecordingFile, pair: str) -> int:
    """Decode one recording, cut it into chunks, store their PCM and rows, dispatch their transcription.

    Returns the recording id. A file that cannot be decoded fails its recording (not the job).
    """
    with transaction(pipe.sessions) as session:
        recording = session.scalars(
            select(Recording).where(Recording.job_id == job_id, Recording.position == position).with_for_update()
        ).one_or_none()
        if recording is None:  # else a previous attempt died before its chunks were stored: start over
            recording = Recording(job_id=job_id, position=position, source_key=item.name, archive=item.archive)
            recording.move_to(INGESTING)
            session.add(recording)
        session.flush()
        recording_id = recording.id
    try:
        audio = decode(item.path, max_seconds=pipe.settings.decode_max_seconds)
    except DecodeError as exc:
        with transaction(pipe.sessions) as session:
            locked(session, Recording, recording_id).move_to(FAILED, exc.reason)
        return recording_id
    plan = chunk_recording(
        str(recording_id),
        audio.pcm,
        vad=get_vad(),
        vad_options=VadOptions.from_settings(pipe.settings),
        options=ChunkOptions.from_settings(pipe.settings),
    )
    pipe.store.put_many(job_id, [(str(recording_id), c.index, chunk_pcm(audio.pcm, c)) for c in plan.chunks])
    with transaction(pipe.sessions) as session:
        recording = locked(session, Recording, recording_id)
        recording.duration = audio.duration
        recording.chunks_total = len(plan.chunks)
        recording.chunks_done = 0
        rows = [
            ChunkRow(
                recording_id=recording_id,
                index=c.index,
                start_sample=c.start_sample,
                end_sample=c.end_sample,
                overlap_samples=c.overlap_samples,
                start_seconds=c.start,
                end_seconds=c.end,
            )
            for c in plan.chunks
        ]
        session.add_all(rows)
        recording.move_to(TRANSCRIBING)
        session.flush()
        chunk_ids = [row.id for row in rows]
    _dispatch_chunks(pipe, pair, recording_id, chunk_ids)
    return recording_id


def _dispatch_chunks(pipe: Pipeline, pair: str, recording_id: int, chunk_ids: list[int]) -> None:
    if not chunk_ids:  # silence only: nothing to transcribe, stitch the empty transcript
        pipe.dispatch.stitch(recording_id)
    for group in _batched(chunk_ids, pipe.settings.transcribe_task_chunks):
        pipe.dispatch.transcribe(pair, group)


def _redispatch_recording(pipe: Pipeline, recording_id: int, pair: str) -> None:
    with pipe.sessions() as session:
        recording = session.get(Recording, recording_id)
        pending = [c.id for c in recording.chunks if c.status not in CHUNK_SETTLED]
        complete = recording_complete(recording)
    if complete:
        pipe.dispatch.stitch(recording_id)
    else:
        _dispatch_chunks(pipe, pair, recording_id, pending)


def _failed_recording(pipe: Pipeline, job_id: str, position: int, failure: MemberFailure) -> None:
    name = f"{failure.source}:{failure.member}" if failure.member else failure.source
    with transaction(pipe.sessions) as session:
        recording = Recording(
            job_id=job_id, position=position, source_key=failure.member or failure.source, archive=None
        )
        recording.move_to(FAILED, f"{name}: {failure.reason}")
        session.add(recording)


def _local_inputs(pipe: Pipeline, inputs: list[str], work_dir: Path) -> Iterable[str]:
    """Inputs as local paths: ``s3://`` sources are downloaded under ``work_dir`` as they are reached."""
    if not any(str(item).startswith("s3://") for item in inputs):
        return inputs
    from workers.object_store import fetch_inputs  # boto3 only where object storage is used

    return fetch_inputs(inputs, work_dir, pipe.settings)


def _work_root(settings: Settings) -> Path:
    root = settings.cache_dir / "work"
    root.mkdir(parents=True, exist_ok=True)
    return root


# --- transcribe ---------------------------------------------------------------------------------------


def transcribe_chunks(pipe: Pipeline, chunk_ids: list[int], decoder: Callable[[str], Transcriber]) -> int:
    """Decode the given chunks (one recording's) with ``decoder(pair)`` and store each result as it lands.

    Chunks already settled are skipped, so a redelivered task does nothing; a chunk whose PCM is gone or
    corrupt fails (no retry can fix it). When a recording's last chunk settles, its stitch is dispatched.
    Returns how many chunks this call decoded.
    """
    with transaction(pipe.sessions) as session:
        claimed = claim_chunks(session, chunk_ids)
        work = [(c.id, c.recording_id, c.index, c.start_seconds, c.end_seconds, c.overlap_samples) for c in claimed]
        jobs = {c.recording_id: (c.recording.job_id, c.recording.job.pair, c.recording.job.options) for c in claimed}
    complete: set[int] = set()
    for group in _batched(work, max(pipe.settings.asr_batch_size, 1)):
        decodable = []
        for chunk, pcm in _fetch(pipe, jobs, group):
            if isinstance(pcm, ChunkStoreError):
                settled = _settle(pipe, lambda s, cid=chunk[0], e=pcm: store_chunk_failure(s, cid, str(e)))
                if settled is not None and settled[1] >= settled[2]:
                    complete.add(chunk[1])
            else:
                decodable.append((chunk, pcm))
        for pair, language, items in _decode_groups(jobs, decodable):
            decoded = transcribe_chunks_to_end(
                decoder(pair), [pcm for _, pcm in items], DecodeOptions(language=language)
            )
            for ((chunk_id, recording_id, index, start, end, overlap), _), result in zip(items, decoded):
                chunk_result = ChunkResult(
                    index,
                    start,
                    end,
                    overlap / SAMPLE_RATE,
                    result.text,
                    result.segments,
                    result.language,
                    result.tokens,
                    result.stats,
                )
                settled = _settle(pipe, lambda s, cid=chunk_id, r=chunk_result: store_chunk_result(s, cid, r))
                pipe.store.delete(jobs[recording_id][0], str(recording_id), index)
                if settled is not None and settled[1] >= settled[2]:
                    complete.add(recording_id)
    if not work:  # redelivered after the results were stored: the stitch may never have been dispatched
        complete = _complete_recordings(pipe, chunk_ids)
    for recording_id in sorted(complete):
        pipe.dispatch.stitch(recording_id)
    return len(work)


def _decode_groups(jobs: dict, items: list[tuple[tuple, np.ndarray]]) -> list[tuple[str, str | None, list]]:
    """Group fetched chunks by (pair, language): each group is decoded as one batch."""
    groups: dict[tuple[str, str | None], list] = {}
    for chunk, pcm in items:
        _, pair, options = jobs[chunk[1]]
        groups.setdefault((pair, options.get("language")), []).append((chunk, pcm))
    return [(pair, language, group) for (pair, language), group in groups.items()]


def _fetch(pipe: Pipeline, jobs: dict, group: list[tuple]) -> Iterator[tuple[tuple, np.ndarray | ChunkStoreError]]:
    """The group's PCM in one round trip; if any chunk is missing or corrupt, fetch them one by one."""
    items = [(str(recording_id), index) for _, recording_id, index, *_ in group]
    job_id = jobs[group[0][1]][0]
    try:
        yield from zip(group, pipe.store.get_many(job_id, items))
        return
    except ChunkStoreError:
        pass
    for chunk, item in zip(group, items):
        try:
            yield chunk, pipe.store.get_many(job_id, [item])[0]
        except ChunkStoreError as exc:
            yield chunk, exc


def _settle(pipe: Pipeline, write: Callable) -> tuple[int, int, int] | None:
    with transaction(pipe.sessions) as session:
        return write(session)


def _complete_recordings(pipe: Pipeline, chunk_ids: list[int]) -> set[int]:
    with pipe.sessions() as session:
        recordings = session.scalars(
            select(Recording).where(Recording.id.in_(select(ChunkRow.recording_id).where(ChunkRow.id.in_(chunk_ids))))
        ).all()
        return {r.id for r in recordings if recording_complete(r)}


def fail_chunks(pipe: Pipeline, chunk_ids: list[int], error: str) -> None:
    """Settle chunks as failed after a task gave up on them (dispatching the stitch if that completes them)."""
    complete = set()
    for chunk_id in chunk_ids:
        settled = _settle(pipe, lambda s, cid=chunk_id: store_chunk_failure(s, cid, error))
        if settled is not None and settled[1] >= settled[2]:
            complete.add(settled[0])
    for recording_id in sorted(complete):
        pipe.dispatch.stitch(recording_id)


# --- stitch -------------------------------------------------------------------------------------------


def stitch_recording(pipe: Pipeline, recording_id: int) -> None:
    """Stitch a recording whose chunks are all settled, render its outputs, and finish it (and its job)."""
    with transaction(pipe.sessions) as session:
        recording = locked(session, Recording, recording_id)
        if recording is None or not recording_complete(recording):
            return
        if recording.status == TRANSCRIBING:
            recording.move_to(STITCHING)
        job_id = recording.job_id
        advance_job(session, job_id)
    with transaction(pipe.sessions) as session:
        recording = locked(session, Recording, recording_id)
        if recording.status != STITCHING:
            return
        failed = [c for c in recording.chunks if c.status == CHUNK_FAILED]
        if failed:
            recording.move_to(FAILED, "; ".join(f"chunk {c.index}: {c.error}" for c in failed))
        else:
            transcript = stitch([chunk_result(c) for c in recording.chunks], recording.duration or 0.0)
            recording.transcript = transcript.text
            recording.segments = [[s.start, s.end, s.text] for s in transcript.segments]
            recording.language = transcript.language
            recording.stats = transcript.stats
            recording.outputs = render_all(transcript)
            if recording.job.options.get("output_prefix"):  # written before DONE: a failed write is retried
                recording.output_locations = _publish(pipe, recording)
            recording.move_to(DONE)
        finished = advance_job(session, job_id)
    _cleanup_if_final(pipe, finished)


def chunk_result(row: ChunkRow) -> ChunkResult:
    """A stored chunk row as the stitcher's input."""
    stats = DecodeStats(
        verifier_passes=row.verifier_passes,
        drafter_steps=row.drafter_steps,
        drafted=row.drafted,
        accepted=row.accepted,
        encoder_seconds=row.encoder_seconds,
        decoder_seconds=row.decoder_seconds,
    )
    segments = [Segment(start, end, text) for start, end, text in row.segments or []]
    overlap = (row.overlap_samples or 0) / SAMPLE_RATE
    return ChunkResult(
        row.index,
        row.start_seconds,
        row.end_seconds,
        overlap,
        row.text or "",
        segments,
        row.language,
        list(row.tokens or []),
        stats,
    )


def fail_recording(pipe: Pipeline, recording_id: int, error: str) -> None:
    """Fail a recording whose stitch gave up (and settle its job if that was the last one)."""
    with transaction(pipe.sessions) as session:
        recording = locked(session, Recording, recording_id)
        if recording is None or recording.status in FINAL:
            return
        recording.move_to(FAILED, error)
        finished = advance_job(session, recording.job_id)
    _cleanup_if_final(pipe, finished)


def fail_job(pipe: Pipeline, job_id: str, error: str) -> None:
    """Fail a job whose ingest gave up."""
    with transaction(pipe.sessions) as session:
        job = locked(session, Job, job_id)
        if job is None or job.status in FINAL:
            return
        job.move_to(FAILED, error)
    _cleanup_if_final(pipe, job)


def _publish(pipe: Pipeline, recording: Recording) -> dict[str, str]:
    """Write a recording's requested outputs to its job's ``output_prefix`` (object storage)."""
    from workers.object_store import publish_outputs

    options = recording.job.options
    wanted = options.get("formats") or list(recording.outputs)
    stem = Path(recording.source_key).stem or f"recording-{recording.position}"
    if any(Path(r.source_key).stem == stem and r.position < recording.position for r in recording.job.recordings):
        stem = f"{stem}-{recording.position}"
    outputs = {name: recording.outputs[name] for name in wanted if name in recording.outputs}
    return publish_outputs(outputs, options["output_prefix"], stem, pipe.settings)


def _cleanup_if_final(pipe: Pipeline, job: Job | None) -> None:
    """Drop whatever PCM a finished job left behind (chunks of failed recordings); announce the end."""
    if job is not None and job.status in FINAL:
        pipe.store.delete_job(job.id)
        _announce(pipe, job)


def _announce(pipe: Pipeline, job: Job) -> None:
    """Hand a finished job with a callback URL to the dispatcher's (optional) ``job_finished``."""
    notify = getattr(pipe.dispatch, "job_finished", None)
    if notify is not None and (job.options or {}).get("callback_url"):
        notify(job.id)


def _batched(items: Sequence[T], size: int) -> list[list[T]]:
    size = max(size, 1)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
