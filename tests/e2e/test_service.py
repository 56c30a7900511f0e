"""The service edge with real worker processes: an upload through the HTTP API, an S3 put announced over
SQS to the listener, and a signed MinIO-style webhook each end as a finished job with its transcripts in
S3; a redelivered notification creates no second job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import create_key
from api.routes.hooks import SIGNATURE_HEADER, sign
from api.s3_events import SqsListener
from tests.e2e.conftest import LECTURE_BUCKET, UPLOAD_BUCKET, Cluster, lecture, write_wav
from tests.e2e.test_distributed import assert_ordered_cues, parse_cues
from tests.integration.edge_fixtures import free_port
from workers.asr.bench import word_error_rate
from workers.celery_app import make_celery
from workers.db_models import Job
from workers.local_cluster import wait_until
from workers.object_store import s3_client
from workers.settings import Settings
from workers.tasks import CeleryDispatcher

pytestmark = pytest.mark.e2e

WEBHOOK_SECRET = "e2e-hook-secret"
JOB_TIMEOUT = 600.0


@dataclass
class Service:
    """The API in process over the e2e cluster (Celery to the real workers) and its S3 and SQS clients."""

    settings: Settings
    client: TestClient
    app: Any
    key: str
    s3: Any
    sqs: Any

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def wait_done(self, job_id: str) -> dict:
        """Poll ``GET /v1/jobs/{id}`` (as a client would) until the job ends; returns its last detail."""
        deadline = time.monotonic() + JOB_TIMEOUT
        seen_progress: set[float] = set()
        while time.monotonic() < deadline:
            detail = self.client.get(f"/v1/jobs/{job_id}", headers=self.headers()).json()
            seen_progress.add(detail["progress_percent"])
            if detail["status"] in ("done", "failed", "cancelled"):
                assert detail["status"] == "done", detail
                assert all(0.0 <= p <= 100.0 for p in seen_progress)
                return detail
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not finished within {JOB_TIMEOUT} s")

    def text(self, uri: str) -> str:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        return self.s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()


@pytest.fixture(scope="module")
def flower(cluster: Cluster) -> Iterator[str]:
    """``specscribe flower`` on the cluster's broker (API open for the test); yields its URL."""
    port = free_port()
    env = {**os.environ, **cluster.env, "FLOWER_UNAUTHENTICATED_API": "true"}
    command = [
        str(Path(sys.executable).with_name("specscribe")),
        "flower",
        "--port",
        str(port),
        "--address",
        "127.0.0.1",
    ]
    log = (cluster.logs / "flower.log").open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 60, 0.5, what="flower up")
    yield url
    process.terminate()
    process.wait(20)
    log.close()


@pytest.fixture(scope="module")
def service(cluster: Cluster, moto_endpoint: str, flower: str) -> Iterator[Service]:
    s3 = s3_client(cluster.settings)
    for bucket in (UPLOAD_BUCKET, LECTURE_BUCKET):
        s3.create_bucket(Bucket=bucket)
    key_id, key = create_key(cluster.pipe.sessions, "e2e-tenant")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName="e2e-bucket-events")["QueueUrl"]
    settings = cluster.settings.model_copy(
        update={
            "webhook_secret": WEBHOOK_SECRET,
            "s3_events_key_id": key_id,
            "sqs_queue_url": queue_url,
            "s3_listen_prefix": "incoming/",
        }
    )
    app = create_app(settings, CeleryDispatcher(make_celery(settings)))
    yield Service(settings, TestClient(app), app, key, s3, sqs)


def _assert_transcripts(service: Service, outputs: dict[str, str], spoken: list[str]) -> None:
    """The outputs exist in S3: SRT cues ordered, the text within 10 % WER of what was said."""
    assert_ordered_cues(parse_cues(service.text(outputs["srt"]), vtt=False))
    if "vtt" in outputs:
        assert_ordered_cues(parse_cues(service.text(outputs["vtt"]), vtt=True))
    assert word_error_rate([" ".join(spoken)], [service.text(outputs["txt"])]) < 0.10


def test_upload_to_transcripts_in_s3(service: Service, tmp_path: Path) -> None:
    spoken = lecture(4, 5)
    wav = write_wav(tmp_path / "week 3.wav", spoken)
    fields = {"formats": "txt,srt,json", "output_prefix": f"s3://{LECTURE_BUCKET}/out/", "language": "en"}
    with wav.open("rb") as f:
        answer = service.client.post("/v1/jobs", files={"file": (wav.name, f)}, data=fields, headers=service.headers())
    assert answer.status_code == 202, answer.text
    detail = service.wait_done(answer.json()["job_id"])
    assert detail["progress_percent"] == 100.0 and detail["chunks_done"] == detail["chunks_total"] >= 1
    assert detail["acceptance_rate"] is not None and detail["real_time_factor"] is not None
    outputs = detail["recordings"][0]["outputs"]
    base = f"s3://{LECTURE_BUCKET}/out/week 3"
    assert outputs == {"txt": f"{base}.txt", "srt": f"{base}.srt", "json": f"{base}.json"}
    _assert_transcripts(service, outputs, spoken.sentences)
    assert json.loads(service.text(outputs["json"]))["segments"]
    rid = detail["recordings"][0]["id"]
    served = service.client.get(
        f"/v1/jobs/{detail['id']}/recordings/{rid}/transcript?format=srt", headers=service.headers()
    )
    assert served.text == service.text(outputs["srt"])


def test_flower_shows_the_tasks_by_job_and_chunk(service: Service, flower: str) -> None:
    """Flower (started before the jobs) saw every stage's task, its arguments named as ids."""
    with service.app.state.sessions() as session:
        job = session.query(Job).filter(Job.source == "week 3.wav").one()
        chunk_ids = sorted(c.id for r in job.recordings for c in r.chunks)
        recording_ids = [r.id for r in job.recordings]
    tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json().values()
    shown = {(t["name"], t["args"]) for t in tasks if t.get("state") == "SUCCESS"}
    assert ("specscribe.ingest", f"job={job.id}") in shown
    assert ("specscribe.stitch", f"recording={recording_ids[0]}") in shown
    transcribed = {int(i) for name, args in shown if name == "specscribe.transcribe" for i in args[7:].split(",")}
    assert set(chunk_ids) <= transcribed
    workers = httpx.get(f"{flower}/api/workers", params={"refresh": "true"}, timeout=30).json()
    assert len(workers) >= 2  # the ingest and the ASR worker answer Flower's inspection


def test_s3_put_notifies_the_listener_and_the_job_finishes_once(service: Service, tmp_path: Path) -> None:
    arn = service.sqs.get_queue_attributes(QueueUrl=service.settings.sqs_queue_url, AttributeNames=["QueueArn"])
    service.s3.put_bucket_notification_configuration(
        Bucket=LECTURE_BUCKET,
        NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn["Attributes"]["QueueArn"], "Events": ["s3:ObjectCreated:*"]}]
        },
    )
    listener = SqsListener(service.app.state.sessions, service.app.state.dispatcher, service.settings, sqs=service.sqs)
    listener.poll_once(wait_seconds=0)  # the configuration's test event
    spoken = lecture(10, 4)
    service.s3.upload_file(str(write_wav(tmp_path / "talk.wav", spoken)), LECTURE_BUCKET, "incoming/talk.wav")
    captured = service.sqs.receive_message(QueueUrl=service.settings.sqs_queue_url, VisibilityTimeout=0)["Messages"]
    created = listener.poll_once(wait_seconds=1).created
    assert len(created) == 1
    detail = service.wait_done(created[0])  # the events key owns it: visible through the API
    outputs = detail["recordings"][0]["outputs"]
    assert set(outputs) == {"txt", "srt", "vtt", "json"}
    assert all(uri.startswith(f"s3://{LECTURE_BUCKET}/") for uri in outputs.values())
    _assert_transcripts(service, outputs, spoken.sentences)
    for message in captured:  # the same notification delivered again
        service.sqs.send_message(QueueUrl=service.settings.sqs_queue_url, MessageBody=message["Body"])
    again = listener.poll_once(wait_seconds=1)
    assert again.created == [] and again.duplicates == 1
    with service.app.state.sessions() as session:
        assert session.query(Job).filter(Job.source == f"s3://{LECTURE_BUCKET}/incoming/talk.wav").count() == 1


def test_signed_webhook_job_finishes_with_transcripts(service: Service, tmp_path: Path) -> None:
    spoken = lecture(20, 4)
    service.s3.upload_file(str(write_wav(tmp_path / "seminar.wav", spoken)), LECTURE_BUCKET, "hooked/seminar.wav")
    etag = service.s3.head_object(Bucket=LECTURE_BUCKET, Key="hooked/seminar.wav")["ETag"].strip('"')
    record = {
        "eventName": "s3:ObjectCreated:Put",
        "s3": {"bucket": {"name": LECTURE_BUCKET}, "object": {"key": "hooked/seminar.wav", "eTag": etag}},
    }
    body = json.dumps({"EventName": "s3:ObjectCreated:Put", "Records": [record]}).encode()
    signed = {SIGNATURE_HEADER: sign(WEBHOOK_SECRET, body)}
    settings = service.settings.model_copy(update={"s3_listen_prefix": "hooked/"})
    client = TestClient(create_app(settings, service.app.state.dispatcher))
    first = client.post("/v1/hooks/s3", content=body, headers=signed).json()
    assert len(first["created"]) == 1
    assert client.post("/v1/hooks/s3", content=body, headers=signed).json()["duplicates"] == 1
    detail = service.wait_done(first["created"][0])
    _assert_transcripts(service, detail["recordings"][0]["outputs"], spoken.sentences)
