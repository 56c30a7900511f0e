"""The stages composed in process (local mode) with a fake decoder: archives, failures, redelivery."""

from __future__ import annotations

import wave
import zipfile
from pathlib import Path

import numpy as np
import pytest

from workers.db_models import ChunkRow, Job
from workers.local import LocalDispatcher, local_pipeline, run_job, write_outputs
from workers.pipeline import Pipeline, ingest_job, stitch_recording, transcribe_chunks
from workers.settings import Settings
from workers.types import SAMPLE_RATE, DecodeResult, DecodeStats, Segment


class FakeDecoder:
    """Says how long each chunk is, with one segment per chunk; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def transcribe_many(self, pcms: list[np.ndarray], options=None) -> list[DecodeResult]:
        return [self._transcribe(pcm) for pcm in pcms]

    def _transcribe(self, pcm: np.ndarray) -> DecodeResult:
        self.calls += 1
        seconds = len(pcm) / SAMPLE_RATE
        text = f"chunk of {round(seconds)} seconds."
        return DecodeResult([1, 2, 3], text, "en", [Segment(0.0, seconds, text)], DecodeStats(drafted=4, accepted=3))


def _tones(path: Path, bursts: int, burst_seconds: float = 5.0, gap_seconds: float = 3.0) -> None:
    """Loud tone bursts separated by silence (the VAD keeps loud non-speech)."""
    t = np.arange(int(burst_seconds * SAMPLE_RATE)) / SAMPLE_RATE
    burst = (np.sin(2 * np.pi * 440 * t) * 12000).astype(np.int16)
    gap = np.zeros(int(gap_seconds * SAMPLE_RATE), dtype=np.int16)
    pcm = np.concatenate([gap] + [np.concatenate([burst, gap]) for _ in range(bursts)])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


@pytest.fixture
def pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    settings = Settings(cache_dir=tmp_path / "cache", chunk_max_seconds=8.0)
    decoder = FakeDecoder()
    monkeypatch.setattr("workers.local.pair_decoder", lambda pair, device, batch_size=1: decoder)
    pipeline = local_pipeline(settings)
    pipeline.decoder = decoder  # for assertions
    return pipeline


def test_local_run_of_an_archive(pipe: Pipeline, tmp_path: Path) -> None:
    _tones(tmp_path / "a.wav", 3)
    _tones(tmp_path / "b.wav", 1)
    (tmp_path / "broken.mp3").write_bytes(b"\x00" * 400)
    archive = tmp_path / "lectures.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("a.wav", "b.wav", "broken.mp3"):
            zf.write(tmp_path / name, f"week1/{name}")
        zf.writestr("week1/README.txt", "not audio")
    progress: list[tuple[int, int]] = []
    job_id = run_job(pipe, [str(archive)], progress=lambda done, total: progress.append((done, total)))
    assert progress[-1] == (4, 4) and pipe.decoder.calls == 4

    outputs = write_outputs(pipe, job_id, tmp_path / "out", ["txt", "srt"])
    assert [(r.name, r.status) for r in outputs] == [
        ("week1/a.wav", "done"),
        ("week1/b.wav", "done"),
        ("week1/broken.mp3", "failed"),
    ]
    assert (tmp_path / "out" / "a.txt").read_text() == "chunk of 5 seconds.\n" * 3
    cue = (tmp_path / "out" / "b.srt").read_text().splitlines()[1]  # the burst is at 3-8 s, the chunk padded
    assert cue.startswith("00:00:02,") and " --> 00:00:08," in cue
    with pipe.sessions() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.recordings_done, job.recordings_failed) == ("done", 2, 1)
        assert job.recordings[0].stats["accepted"] == 9
        assert job.recordings[2].error.startswith("not a recognised audio")
    assert pipe.store.delete_job(job_id) == 0  # every chunk's PCM is gone


def test_redelivered_tasks_do_nothing(pipe: Pipeline, tmp_path: Path) -> None:
    _tones(tmp_path / "a.wav", 2)
    job_id = run_job(pipe, [str(tmp_path / "a.wav")])
    calls = pipe.decoder.calls
    with pipe.sessions() as session:
        chunk_ids = [c.id for c in session.get(Job, job_id).recordings[0].chunks]
        recording_id = session.get(Job, job_id).recordings[0].id
    ingest_job(pipe, job_id)
    assert transcribe_chunks(pipe, chunk_ids, lambda pair: pipe.decoder) == 0
    stitch_recording(pipe, recording_id)
    assert pipe.decoder.calls == calls and not pipe.dispatch.queue


def test_a_chunk_whose_worker_died_is_decoded_by_the_redelivery(pipe: Pipeline, tmp_path: Path) -> None:
    _tones(tmp_path / "a.wav", 2)
    dispatcher: LocalDispatcher = pipe.dispatch
    from workers.pipeline import submit_job

    job_id = submit_job(pipe, [str(tmp_path / "a.wav")])
    ingest_job(pipe, dispatcher.queue.popleft()[1])
    (_, first), (_, second) = dispatcher.queue.popleft(), dispatcher.queue.popleft()

    class Crash(Exception):
        pass

    def dying(pair: str):
        raise Crash

    with pytest.raises(Crash):  # claimed (attempt 1), then the worker died before storing anything
        transcribe_chunks(pipe, first, dying)
    assert transcribe_chunks(pipe, second, lambda pair: pipe.decoder) == 1
    assert not dispatcher.queue  # the recording is not complete yet
    assert transcribe_chunks(pipe, first, lambda pair: pipe.decoder) == 1
    assert dispatcher.queue[0][0] == "stitch"
    stitch_recording(pipe, dispatcher.queue.popleft()[1])
    with pipe.sessions() as session:
        assert session.get(Job, job_id).status == "done"
        rows = session.query(ChunkRow).order_by(ChunkRow.index).all()
        assert [(r.status, r.attempts) for r in rows] == [("done", 2), ("done", 1)]


def test_transcribe_and_db_upgrade_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from api.cli import app
    from workers.settings import get_settings

    _tones(tmp_path / "talk.wav", 2)
    monkeypatch.setenv("SPECSCRIBE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECSCRIBE_CHUNK_MAX_SECONDS", "8")
    monkeypatch.setattr("workers.local.pair_decoder", lambda pair, device, batch_size=1: FakeDecoder())
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        out = tmp_path / "out"
        result = runner.invoke(
            app, ["transcribe", str(tmp_path / "talk.wav"), "--out", str(out), "--format", "txt,vtt"]
        )
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in out.iterdir()) == ["talk.txt", "talk.vtt"]
        assert (tmp_path / "cache" / "specscribe.db").exists()  # local mode's SQLite job store
        result = runner.invoke(app, ["db", "upgrade", "--url", f"sqlite:///{tmp_path / 'other.db'}"])
        assert result.exit_code == 0 and (tmp_path / "other.db").exists()
    finally:
        get_settings.cache_clear()
