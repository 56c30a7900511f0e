"""``specscribe bench pipeline``: what the distributed pipeline costs over the engine itself.

One synthetic lecture is transcribed twice with the same pair: in local mode (in process; we count the
engine's encoder + decoder seconds and the wall time), then through real workers started on this host
(an ingest worker and an ASR worker with the pair preloaded, Redis broker, the configured job store),
timed from submission until the job is done. The ratio distributed / engine is the pipeline overhead
(queueing, PCM through Redis, job-store writes, stitching); a warm-up job first makes sure the workers
are up and the model is loaded, so loading is not counted.
"""

from __future__ import annotations

import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path

import redis

from workers.celery_app import make_celery
from workers.chunk_store import ChunkStore
from workers.db_models import Job
from workers.jobstore import session_factory, upgrade_database
from workers.lecture_text import LECTURE_SENTENCES, lecture_recording
from workers.local import local_pipeline, run_job
from workers.local_cluster import start_worker, wait_for_job
from workers.pairs import pair_decoder
from workers.pipeline import Pipeline, submit_job
from workers.settings import Settings, get_settings
from workers.tasks import CeleryDispatcher
from workers.types import SAMPLE_RATE


def _write_lecture(path: Path, sentences: int) -> float:
    recording = lecture_recording(LECTURE_SENTENCES[:sentences], 0.6)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(recording.pcm.tobytes())
    return recording.seconds


def run_pipeline_bench(
    sentences: int,
    pair: str | None,
    database_url: str | None,
    timeout: float,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Run both modes on one lecture of ``sentences`` sentences; returns the measurements (seconds)."""
    base = get_settings()
    pair = pair or base.default_pair
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    lecture = work / "lecture.wav"
    audio_seconds = _write_lecture(lecture, sentences)
    warmup = work / "warmup.wav"
    _write_lecture(warmup, 1)

    log(f"local mode: {audio_seconds:.1f} s lecture, pair {pair}")
    local = local_pipeline(base.model_copy(update={"database_url": f"sqlite:///{work / 'local.db'}"}))
    pair_decoder(pair, "cpu")
    started = time.perf_counter()
    job_id = run_job(local, [str(lecture)], pair=pair, language="en")
    local_wall = time.perf_counter() - started
    with local.sessions() as session:
        stats = session.get(Job, job_id).recordings[0].stats
    engine = stats["encoder_seconds"] + stats["decoder_seconds"]

    settings = base.model_copy(update={"database_url": database_url or base.database_url})
    upgrade_database(settings.database_url)
    env = {
        "SPECSCRIBE_DATABASE_URL": settings.database_url,
        "SPECSCRIBE_REDIS_URL": settings.redis_url,
        "SPECSCRIBE_BROKER_URL": settings.broker_url,
        "SPECSCRIBE_CACHE_DIR": str(settings.cache_dir),
    }
    log(f"distributed: workers on {settings.broker_url}, job store {settings.database_url}")
    ingest = start_worker(["ingest", "--concurrency", "1", "--loglevel", "warning"], env, work / "ingest.log")
    asr = start_worker(["asr", "--pair", pair, "--device", "cpu", "--loglevel", "warning"], env, work / "asr.log")
    try:
        pipe = _service_pipeline(settings)
        wait_for_job(pipe.sessions, submit_job(pipe, [str(warmup)], pair=pair, language="en"), timeout)
        log("workers warm; timing the lecture")
        started = time.perf_counter()
        job = wait_for_job(pipe.sessions, submit_job(pipe, [str(lecture)], pair=pair, language="en"), timeout, 0.05)
        distributed = time.perf_counter() - started
    finally:
        asr.stop()
        ingest.stop()
    if job.status != "done":
        raise RuntimeError(f"distributed job {job.id} ended {job.status}: {job.error}")
    return {
        "audio_seconds": audio_seconds,
        "chunks": stats["chunks"],
        "local_engine_seconds": engine,
        "local_wall_seconds": local_wall,
        "distributed_seconds": distributed,
        "overhead_ratio": distributed / engine,
        "distributed_over_local_wall": distributed / local_wall,
    }


def _service_pipeline(settings: Settings) -> Pipeline:
    client = redis.Redis.from_url(settings.redis_url)
    dispatch = CeleryDispatcher(make_celery(settings))
    return Pipeline(session_factory(settings.database_url), ChunkStore(client), dispatch, settings)


def format_report(report: dict[str, float]) -> str:
    """The measurements as aligned lines, the ratio last."""
    return "\n".join(
        f"{key:>28}: {value:.3f}" if isinstance(value, float) else f"{key:>28}: {value}"
        for key, value in report.items()
    )
