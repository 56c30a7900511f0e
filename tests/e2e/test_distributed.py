"""The distributed pipeline with real worker processes: an archive of lectures, and an ASR worker that
is SIGKILLed mid-chunk three times during one job."""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster, lecture, lecture_zip, write_wav
from workers.asr.bench import normalize_text, word_error_rate
from workers.db_models import ChunkRow, Job
from workers.local_cluster import wait_for_job, wait_until
from workers.pipeline import submit_job

pytestmark = pytest.mark.e2e

_CUE_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)$")


def parse_cues(text: str, vtt: bool) -> list[tuple[float, float, str]]:
    """(start, end, text) of every cue of an SRT or VTT file; fails on anything malformed."""
    blocks = text.strip().split("\n\n")
    if vtt:
        assert blocks.pop(0) == "WEBVTT"
    cues = []
    for number, block in enumerate(blocks, 1):
        lines = block.split("\n")
        if not vtt:
            assert lines.pop(0) == str(number)
        match = _CUE_TIME.match(lines[0])
        assert match, lines[0]
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, match.groups())
        cue_text = " ".join(lines[1:]).strip()
        assert cue_text
        cues.append((h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000, cue_text))
    return cues


def assert_ordered_cues(cues: list[tuple[float, float, str]]) -> None:
    assert cues
    for (start, end, _), (next_start, _, _) in itertools.pairwise(cues):
        assert start < end <= next_start
    assert cues[-1][0] < cues[-1][1]


def test_an_archive_of_lectures(cluster: Cluster, tmp_path: Path) -> None:
    lectures = {"physics.wav": lecture(0, 14), "history.wav": lecture(16, 14), "biology.wav": lecture(32, 14)}
    archive = lecture_zip(tmp_path / "semester.zip", lectures)
    job_id = submit_job(cluster.pipe, [str(archive)], source="semester.zip", language="en")
    job = wait_for_job(cluster.pipe.sessions, job_id, timeout=900)
    assert job.status == "done", (job.error, [(r.source_key, r.error) for r in job.recordings])
    assert [r.source_key for r in job.recordings] == [f"semester/{name}" for name in lectures]
    for recording, (name, spoken) in zip(job.recordings, lectures.items()):
        assert recording.status == "done"
        wer = word_error_rate([" ".join(spoken.sentences)], [recording.transcript])
        assert wer < 0.10, f"{name}: WER {wer:.3f}: {recording.transcript}"
        assert_ordered_cues(parse_cues(recording.outputs["srt"], vtt=False))
        assert_ordered_cues(parse_cues(recording.outputs["vtt"], vtt=True))
        assert recording.stats["drafted"] > 0 and recording.language == "en"
        assert recording.chunks_done == recording.chunks_total == len(recording.chunks)
    assert (job.recordings_total, job.recordings_done) == (3, 3)
    assert [h[0] for h in job.history] == ["ingesting", "transcribing", "stitching", "done"]
    assert not cluster.pipe.store.client.keys(f"specscribe:chunk:{job_id}:*")


def _new_attempt(cluster: Cluster, job_id: str, seen: set[tuple[int, int]]) -> tuple[int, int] | None:
    """(chunk id, attempt) of a chunk a worker is decoding now, if it is an attempt not seen before."""
    with cluster.pipe.sessions() as session:
        for recording in session.get(Job, job_id).recordings:
            for chunk in recording.chunks:
                if chunk.status == "running" and (chunk.id, chunk.attempts) not in seen:
                    return chunk.id, chunk.attempts
    return None


def _chunk_state(cluster: Cluster, chunk_id: int) -> tuple[str, int]:
    with cluster.pipe.sessions() as session:
        chunk = session.get(ChunkRow, chunk_id)
        return chunk.status, chunk.attempts


def test_asr_worker_killed_mid_chunk_three_times(cluster: Cluster, tmp_path: Path) -> None:
    spoken = lecture(48, 12)
    path = write_wav(tmp_path / "crash.wav", spoken)
    job_id = submit_job(cluster.pipe, [str(path)], language="en")
    killed: list[int] = []
    seen: set[tuple[int, int]] = set()
    while len(killed) < 3:
        attempt = wait_until(lambda: _new_attempt(cluster, job_id, seen), timeout=600, what="a chunk being decoded")
        seen.add(attempt)
        time.sleep(1.0)  # well inside the decode (seconds per chunk)
        cluster.asr_worker.kill()
        if _chunk_state(cluster, attempt[0]) == ("running", attempt[1]):  # died mid-chunk: nothing stored
            killed.append(attempt[0])
        cluster.start_asr()

    job = wait_for_job(cluster.pipe.sessions, job_id, timeout=900)
    assert job.status == "done", (job.error, [r.error for r in job.recordings])
    recording = job.recordings[0]
    chunks = recording.chunks
    assert [c.index for c in chunks] == list(range(recording.chunks_total))  # one row, one result per chunk
    assert all(c.status == "done" and c.text for c in chunks)
    assert recording.chunks_done == recording.chunks_total  # each result counted once
    attempts = {c.id: c.attempts for c in chunks}
    for chunk_id, kills in Counter(killed).items():
        assert attempts[chunk_id] >= kills + 1  # redelivered after every kill

    words = normalize_text(recording.transcript).split()
    assert word_error_rate([" ".join(spoken.sentences)], [recording.transcript]) < 0.10
    truth = Counter(_ngrams(normalize_text(" ".join(spoken.sentences)).split(), 4))
    doubled = [g for g, n in Counter(_ngrams(words, 4)).items() if n > max(truth[g], 1)]
    assert not doubled, doubled


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
