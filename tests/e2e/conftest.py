"""A real cluster for end-to-end tests: PostgreSQL (a fresh database), Redis (its own database number),
an ingest worker and an ASR worker started as ``specscribe worker ...`` processes."""

from __future__ import annotations

import os
import wave
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import base_model_cached, postgres_url  # noqa: F401 (shared fixtures)
from tests.integration.edge_fixtures import moto_endpoint  # noqa: F401 (shared fixture)
from workers.celery_app import make_celery
from workers.chunk_store import ChunkStore
from workers.jobstore import session_factory, upgrade_database
from workers.lecture_text import LECTURE_SENTENCES, LectureRecording, lecture_recording
from workers.local_cluster import WorkerProcess, start_worker
from workers.pipeline import Pipeline
from workers.settings import Settings, get_settings
from workers.tasks import CeleryDispatcher
from workers.types import SAMPLE_RATE

REDIS_URL = os.environ.get("SPECSCRIBE_TEST_REDIS", "redis://127.0.0.1:6379/9")
"""A Redis database of its own: flushed at the start of the session (the workers' queues and chunks)."""
VISIBILITY_TIMEOUT = 10
"""Short, so a message abandoned by a killed worker comes back within seconds."""
UPLOAD_BUCKET, LECTURE_BUCKET = "e2e-uploads", "e2e-lectures"
"""The service tests' buckets on the moto server (the workers read sources and write outputs there)."""


@dataclass
class Cluster:
    """What e2e tests use: the settings the workers run with, a pipeline to submit through, and workers."""

    settings: Settings
    env: dict[str, str]
    pipe: Pipeline
    logs: Path
    ingest_worker: WorkerProcess
    asr_worker: WorkerProcess | None = None

    def start_asr(self) -> WorkerProcess:
        """(Re)start the ASR worker for the default pair."""
        args = ["asr", "--pair", self.settings.default_pair, "--device", "cpu", "--loglevel", "info"]
        self.asr_worker = start_worker(args, self.env, self.logs / "asr.log")
        return self.asr_worker


@pytest.fixture(scope="session")
def cluster(
    postgres_url: str,  # noqa: F811
    base_model_cached: Path,  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.skip(f"Redis not reachable at {REDIS_URL}: {exc}")
    client.flushdb()
    upgrade_database(postgres_url)
    env = {
        "SPECSCRIBE_DATABASE_URL": postgres_url,
        "SPECSCRIBE_REDIS_URL": REDIS_URL,
        "SPECSCRIBE_BROKER_URL": REDIS_URL,
        "SPECSCRIBE_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT),
        "SPECSCRIBE_CACHE_DIR": str(get_settings().cache_dir),  # the converted model is there
        "SPECSCRIBE_S3_ENDPOINT_URL": moto_endpoint,
        "SPECSCRIBE_S3_ALLOWED_BUCKETS": LECTURE_BUCKET,
        "SPECSCRIBE_UPLOAD_BUCKET": UPLOAD_BUCKET,
    }
    settings = Settings(**{k.removeprefix("SPECSCRIBE_").lower(): v for k, v in env.items()})
    pipe = Pipeline(
        session_factory(postgres_url), ChunkStore(client), CeleryDispatcher(make_celery(settings)), settings
    )
    logs = tmp_path_factory.mktemp("worker-logs")
    ingest = start_worker(["ingest", "--concurrency", "1", "--loglevel", "info"], env, logs / "ingest.log")
    cluster = Cluster(settings, env, pipe, logs, ingest)
    cluster.start_asr()
    yield cluster
    for worker in (cluster.asr_worker, ingest):
        if worker is not None:
            worker.stop()
    client.flushdb()


def write_wav(path: Path, recording: LectureRecording) -> Path:
    """16 kHz mono 16-bit WAV."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(recording.pcm.tobytes())
    return path


def lecture(first: int, count: int) -> LectureRecording:
    """``count`` lecture sentences from ``first`` on, with natural pauses of 0.4-0.9 s."""
    sentences = LECTURE_SENTENCES[first : first + count]
    return lecture_recording(sentences, [0.4 + 0.1 * (i % 6) for i in range(count - 1)])


def lecture_zip(path: Path, lectures: dict[str, LectureRecording]) -> Path:
    """A zip of WAV lectures under ``semester/``."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, recording in lectures.items():
            zf.write(write_wav(path.parent / name, recording), f"semester/{name}")
    return path
