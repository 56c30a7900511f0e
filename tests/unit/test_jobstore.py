"""Job store on SQLite: migrations, status transitions, idempotent chunk results, job completion."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from workers.db_models import ChunkRow, IllegalTransition, Job, Recording
from workers.jobstore import (
    advance_job,
    claim_chunks,
    make_engine,
    session_factory,
    store_chunk_failure,
    store_chunk_result,
    transaction,
    upgrade_database,
)
from workers.types import ChunkResult, DecodeStats, Segment


@pytest.fixture
def sessions(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade_database(url)
    return session_factory(url)


def _job_with_chunks(sessions, chunks: int, status: str = "transcribing") -> tuple[str, int, list[int]]:
    with transaction(sessions) as session:
        job = Job(source="test", inputs=[], pair="p+d", options={}, status="queued", history=[])
        job.move_to("ingesting")
        job.move_to("transcribing")
        session.add(job)
        session.flush()
        recording = Recording(job_id=job.id, position=0, source_key="a.wav", chunks_total=chunks, status=status)
        session.add(recording)
        session.flush()
        rows = [ChunkRow(recording_id=recording.id, index=i, start_sample=0, end_sample=1, start_seconds=0.0,
                         end_seconds=1.0) for i in range(chunks)]  # fmt: skip
        session.add_all(rows)
        session.flush()
        return job.id, recording.id, [r.id for r in rows]


def test_upgrade_creates_every_table_and_is_repeatable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x' / 'jobs.db'}"
    upgrade_database(url)
    upgrade_database(url)
    tables = set(inspect(make_engine(url)).get_table_names())
    assert {"jobs", "recordings", "chunks", "api_keys", "alembic_version"} <= tables


def test_transitions_are_checked_and_recorded() -> None:
    job = Job(id="j", status="queued", history=[])
    for status in ("ingesting", "transcribing", "stitching"):
        job.move_to(status)
    job.move_to("failed", "disk full")
    assert job.status == "failed" and job.error == "disk full"
    assert [h[0] for h in job.history] == ["ingesting", "transcribing", "stitching", "failed"]
    with pytest.raises(IllegalTransition):
        job.move_to("done")
    with pytest.raises(IllegalTransition):
        Job(id="k", status="queued", history=[]).move_to("transcribing")


def test_a_chunk_result_is_stored_and_counted_once(sessions) -> None:
    _, recording_id, chunk_ids = _job_with_chunks(sessions, 2)
    result = ChunkResult(0, 0.0, 1.0, 0.0, "hello", [Segment(0.0, 1.0, "hello")], "en", [1, 2], DecodeStats(drafted=3))
    with transaction(sessions) as session:
        assert [c.id for c in claim_chunks(session, chunk_ids)] == chunk_ids
        assert store_chunk_result(session, chunk_ids[0], result) == (recording_id, 1, 2)
    with transaction(sessions) as session:  # a redelivered task: nothing stored, nothing counted
        assert store_chunk_result(session, chunk_ids[0], result) is None
        assert claim_chunks(session, chunk_ids)[0].id == chunk_ids[1]
    with transaction(sessions) as session:
        assert store_chunk_failure(session, chunk_ids[1], "gone") == (recording_id, 2, 2)
        rows = sorted(session.get(Recording, recording_id).chunks, key=lambda c: c.index)
        assert [(r.status, r.attempts, r.text, r.drafted) for r in rows] == [
            ("done", 1, "hello", 3),
            ("failed", 2, None, 0),
        ]


def test_chunks_of_a_cancelled_recording_are_not_claimed(sessions) -> None:
    _, _, chunk_ids = _job_with_chunks(sessions, 1, status="cancelled")
    with transaction(sessions) as session:
        assert claim_chunks(session, chunk_ids) == []


def test_job_advances_with_its_recordings(sessions) -> None:
    job_id, recording_id, _ = _job_with_chunks(sessions, 1)
    with transaction(sessions) as session:
        assert advance_job(session, job_id).status == "transcribing"
        session.get(Recording, recording_id).move_to("stitching")
        assert advance_job(session, job_id).status == "stitching"
        session.get(Recording, recording_id).move_to("done")
        job = advance_job(session, job_id)
        assert (job.status, job.recordings_total, job.recordings_done) == ("done", 1, 1)
        assert [h[0] for h in job.history] == ["ingesting", "transcribing", "stitching", "done"]


def test_a_job_whose_recordings_all_failed_fails(sessions) -> None:
    job_id, recording_id, _ = _job_with_chunks(sessions, 1)
    with transaction(sessions) as session:
        session.get(Recording, recording_id).move_to("failed", "bad file")
        job = advance_job(session, job_id)
        assert job.status == "failed" and job.recordings_failed == 1
