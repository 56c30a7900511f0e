"""Local mode: ``specscribe transcribe`` runs ingest -> transcribe -> stitch in this process.

The very stage functions the workers run (:mod:`workers.pipeline`) are composed here with an in-process
work queue instead of Celery, a SQLite job store under the cache directory (or any ``database_url``),
and chunk PCM kept in memory instead of Redis: the PCM never leaves the process, so neither Redis nor
a broker is needed, and :class:`MemoryChunkStore` keeps the :class:`~workers.chunk_store.ChunkStore`
interface (and its missing-chunk error) so the stages cannot tell the difference.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.chunk_store import ChunkMissingError
from workers.db_models import DONE, Job
from workers.jobstore import session_factory, upgrade_database
from workers.pairs import pair_decoder
from workers.pipeline import Pipeline, ingest_job, stitch_recording, submit_job, transcribe_chunks
from workers.render import FORMATS
from workers.settings import Settings, get_settings


class MemoryChunkStore:
    """Chunk PCM in a dict, with :class:`~workers.chunk_store.ChunkStore`'s interface."""

    def __init__(self) -> None:
        self._chunks: dict[tuple[str, str, int], np.ndarray] = {}

    def put_many(self, job: str, chunks: Iterable[tuple[str, int, np.ndarray | bytes]]) -> list[str]:
        keys = []
        for recording, index, pcm in chunks:
            samples = np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, bytes) else pcm
            self._chunks[(job, recording, index)] = np.array(samples, dtype=np.int16)
            keys.append(f"{job}:{recording}:{index}")
        return keys

    def get_many(self, job: str, items: Sequence[tuple[str, int]]) -> list[np.ndarray]:
        out = []
        for recording, index in items:
            pcm = self._chunks.get((job, recording, index))
            if pcm is None:
                raise ChunkMissingError(f"{job}:{recording}:{index}", "chunk missing (never stored or deleted)")
            out.append(pcm)
        return out

    def delete(self, job: str, recording: str, index: int) -> bool:
        return self._chunks.pop((job, recording, index), None) is not None

    def delete_job(self, job: str) -> int:
        keys = [key for key in self._chunks if key[0] == job]
        for key in keys:
            del self._chunks[key]
        return len(keys)


class LocalDispatcher:
    """Queues the next stage's work in this process (first in, first out)."""

    def __init__(self) -> None:
        self.queue: deque[tuple[str, object]] = deque()

    def ingest(self, job_id: str) -> None:
        self.queue.append(("ingest", job_id))

    def transcribe(self, pair: str, chunk_ids: list[int]) -> None:
        self.queue.append(("transcribe", chunk_ids))

    def stitch(self, recording_id: int) -> None:
        self.queue.append(("stitch", recording_id))


@dataclass
class LocalRecording:
    """One recording's outcome: where its files went, or why it failed."""

    name: str
    status: str
    files: list[Path]
    error: str | None = None


Progress = Callable[[int, int], None]
"""Called with (chunks done, chunks known so far)."""


def local_pipeline(settings: Settings | None = None) -> Pipeline:
    """Stages over the configured database (SQLite under the cache directory by default), in-memory PCM."""
    settings = settings or get_settings()
    upgrade_database(settings.database_url)
    return Pipeline(session_factory(settings.database_url), MemoryChunkStore(), LocalDispatcher(), settings)


def run_job(
    pipe: Pipeline,
    inputs: Sequence[str],
    *,
    pair: str | None = None,
    language: str | None = None,
    device: str = "cpu",
    progress: Progress | None = None,
) -> str:
    """Submit a job and drain the local work queue until it is finished; returns the job id."""
    dispatcher = pipe.dispatch
    if not isinstance(dispatcher, LocalDispatcher):
        raise TypeError("run_job needs a pipeline built by local_pipeline()")
    job_id = submit_job(pipe, [str(Path(p).resolve()) for p in inputs], pair=pair, language=language)
    done = total = 0
    while dispatcher.queue:
        stage, arg = dispatcher.queue.popleft()
        if stage == "ingest":
            ingest_job(pipe, arg)
            total = sum(len(a) for s, a in dispatcher.queue if s == "transcribe")
        elif stage == "transcribe":
            transcribe_chunks(pipe, arg, lambda p: pair_decoder(p, device, pipe.settings.asr_batch_size))
            done += len(arg)
        else:
            stitch_recording(pipe, arg)
        if progress:
            progress(done, total)
    return job_id


def write_outputs(pipe: Pipeline, job_id: str, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[LocalRecording]:
    """Write each finished recording's outputs as ``out_dir/<name>.<format>``."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown format(s) {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[LocalRecording] = []
    used: set[str] = set()
    with pipe.sessions() as session:
        job = session.get(Job, job_id)
        for recording in job.recordings:
            stem = Path(recording.source_key).stem or f"recording-{recording.position}"
            if stem in used:
                stem = f"{stem}-{recording.position}"
            used.add(stem)
            files = []
            if recording.status == DONE:
                for name in formats:
                    path = out_dir / f"{stem}.{name}"
                    path.write_text(recording.outputs[name], encoding="utf-8")
                    files.append(path)
            results.append(LocalRecording(recording.source_key, recording.status, files, recording.error))
    return results
