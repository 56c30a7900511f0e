"""Fixtures of the service-edge tests: a moto S3/SQS server over HTTP, the API app over PostgreSQL with an
in-process dispatcher, two API keys, and a counter of S3 calls."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import create_key
from workers.jobstore import session_factory, upgrade_database
from workers.local import LocalDispatcher
from workers.object_store import s3_client
from workers.settings import Settings

REDIS_URL = os.environ.get("SPECSCRIBE_TEST_EDGE_REDIS", "redis://127.0.0.1:6379/11")
UPLOAD_BUCKET, ALLOWED_BUCKET = "specscribe-uploads", "lectures"
UPLOAD_LIMIT = 1_000_000
WEBHOOK_SECRET = "hook-secret"


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto server (S3 + SQS) on a free loopback port, with fake credentials in the environment."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
            patch.setenv(name, value)
        yield f"http://127.0.0.1:{port}"
    server.stop()


class RecordingDispatcher(LocalDispatcher):
    """The local mode's in-process queue, also recording finished-job announcements."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: list[str] = []

    def job_finished(self, job_id: str) -> None:
        self.finished.append(job_id)


@dataclass
class Edge:
    settings: Settings
    client: TestClient
    app: Any
    dispatcher: RecordingDispatcher
    key: str
    other_key: str
    s3: Any
    s3_calls: list[str] = field(default_factory=list)

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}


@pytest.fixture(scope="session")
def edge(postgres_url: str, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    upgrade_database(postgres_url)
    settings = Settings(
        cache_dir=tmp_path_factory.mktemp("edge-cache"), database_url=postgres_url, redis_url=REDIS_URL,
        s3_endpoint_url=moto_endpoint, s3_allowed_buckets=ALLOWED_BUCKET, upload_bucket=UPLOAD_BUCKET,
        upload_max_bytes=UPLOAD_LIMIT, webhook_secret=WEBHOOK_SECRET, chunk_max_seconds=8.0,
    )  # fmt: skip
    s3 = s3_client(settings)
    for bucket in (UPLOAD_BUCKET, ALLOWED_BUCKET, "bucket-not-allowed"):
        s3.create_bucket(Bucket=bucket)
    sessions = session_factory(postgres_url)
    key = create_key(sessions, "tenant-a")[1]
    other = create_key(sessions, "tenant-b")[1]
    dispatcher = RecordingDispatcher()
    app = create_app(settings, dispatcher)
    edge = Edge(settings, TestClient(app), app, dispatcher, key, other, s3)
    s3.meta.events.register("before-call.s3", lambda model, **_: edge.s3_calls.append(model.name))
    yield edge


def write_tones(path: Path, bursts: int = 2) -> Path:
    from tests.unit.test_pipeline_local import _tones

    _tones(path, bursts)
    return path
