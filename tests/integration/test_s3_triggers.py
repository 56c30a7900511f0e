"""Bucket triggers against moto over HTTP: S3 put -> SQS notification -> listener -> one job (redelivery
creates none); the signed webhook likewise; and the whole path to transcripts in S3, with the stage
functions driven in process (fake decoder) instead of Celery workers."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from api.routes.hooks import SIGNATURE_HEADER, sign
from api.s3_events import SqsListener
from tests.integration import edge_fixtures
from tests.integration.edge_fixtures import ALLOWED_BUCKET, WEBHOOK_SECRET, Edge, write_tones
from tests.unit.test_pipeline_local import FakeDecoder
from workers.db_models import DONE, Job, S3Event
from workers.local import MemoryChunkStore
from workers.pipeline import Pipeline, ingest_job, stitch_recording, transcribe_chunks

pytestmark = pytest.mark.integration
edge, moto_endpoint = edge_fixtures.edge, edge_fixtures.moto_endpoint


def _jobs_for(edge: Edge, key: str) -> list[str]:
    with edge.app.state.sessions() as session:
        return [j.id for j in session.query(Job).filter(Job.source == f"s3://{ALLOWED_BUCKET}/{key}")]


def test_s3_put_notifies_sqs_and_the_listener_creates_one_job(edge: Edge, moto_endpoint: str) -> None:
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName="specscribe-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    edge.s3.put_bucket_notification_configuration(
        Bucket=ALLOWED_BUCKET,
        NotificationConfiguration={"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]},
    )
    settings = edge.settings.model_copy(update={"sqs_queue_url": queue_url, "s3_listen_prefix": "incoming/"})
    listener = SqsListener(edge.app.state.sessions, edge.dispatcher, settings, sqs=sqs)
    listener.poll_once(wait_seconds=0)  # drain the configuration's test event
    edge.s3.put_object(Bucket=ALLOWED_BUCKET, Key="incoming/lecture 1.wav", Body=b"RIFF....")
    edge.s3.put_object(Bucket=ALLOWED_BUCKET, Key="elsewhere/lecture.wav", Body=b"RIFF....")
    edge.s3.put_object(Bucket=ALLOWED_BUCKET, Key="incoming/notes.txt", Body=b"text")
    captured = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    assert captured
    result = listener.poll_once(wait_seconds=1)
    assert len(result.created) == 1 and result.ignored == 2
    assert _jobs_for(edge, "incoming/lecture 1.wav") == result.created
    assert (
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
            "ApproximateNumberOfMessages"
        ]
        == "0"
    )
    for message in captured:  # the same notifications delivered again
        sqs.send_message(QueueUrl=queue_url, MessageBody=message["Body"])
    again = listener.poll_once(wait_seconds=1)
    assert again.created == [] and again.duplicates == 1
    assert len(_jobs_for(edge, "incoming/lecture 1.wav")) == 1


def _event(key: str, etag: str = "abc123") -> bytes:
    record = {"eventName": "s3:ObjectCreated:Put",
              "s3": {"bucket": {"name": ALLOWED_BUCKET}, "object": {"key": key, "eTag": etag}}}  # fmt: skip
    return json.dumps(
        {"EventName": "s3:ObjectCreated:Put", "Key": f"{ALLOWED_BUCKET}/{key}", "Records": [record]}
    ).encode()


def test_signed_webhook_creates_one_job_per_object_version(edge: Edge) -> None:
    body = _event("hooks/talk+1.mp3")
    assert edge.client.post("/v1/hooks/s3", content=body).status_code == 401
    bad = {SIGNATURE_HEADER: sign("wrong", body)}
    assert edge.client.post("/v1/hooks/s3", content=body, headers=bad).status_code == 401
    good = {SIGNATURE_HEADER: sign(WEBHOOK_SECRET, body)}
    first = edge.client.post("/v1/hooks/s3", content=body, headers=good)
    assert first.status_code == 200 and len(first.json()["created"]) == 1
    assert _jobs_for(edge, "hooks/talk 1.mp3") == first.json()["created"]
    again = edge.client.post("/v1/hooks/s3", content=body, headers=good).json()
    assert again == {"created": [], "duplicates": 1, "ignored": 0}
    newer = _event("hooks/talk+1.mp3", etag="def456")
    assert len(edge.client.post("/v1/hooks/s3", content=newer, headers={SIGNATURE_HEADER: sign(WEBHOOK_SECRET, newer)})
               .json()["created"]) == 1  # fmt: skip
    with edge.app.state.sessions() as session:
        assert session.query(S3Event).filter(S3Event.key == "hooks/talk 1.mp3").count() == 2


def test_upload_to_transcripts_in_s3(edge: Edge, tmp_path: Path) -> None:
    """POST an upload, run ingest -> transcribe -> stitch in process: outputs land under the output prefix."""
    wav = write_tones(tmp_path / "lecture.wav", bursts=2)
    fields = {"formats": "srt,txt", "output_prefix": f"s3://{ALLOWED_BUCKET}/out/",
              "callback_url": "http://127.0.0.1:9/hook"}  # fmt: skip
    with wav.open("rb") as f:
        answer = edge.client.post("/v1/jobs", files={"file": ("lecture.wav", f)}, data=fields, headers=edge.headers())
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]
    pipe = Pipeline(edge.app.state.sessions, MemoryChunkStore(), edge.dispatcher, edge.settings)
    decoder = FakeDecoder()
    queue = edge.dispatcher.queue
    queue.remove(("ingest", job_id))
    queue.appendleft(("ingest", job_id))
    while queue:
        stage, arg = queue.popleft()
        if stage == "ingest":
            if arg == job_id:
                ingest_job(pipe, arg)
        elif stage == "transcribe":
            transcribe_chunks(pipe, arg, lambda pair: decoder)
        else:
            stitch_recording(pipe, arg)
    detail = edge.client.get(f"/v1/jobs/{job_id}", headers=edge.headers()).json()
    assert detail["status"] == DONE and detail["progress_percent"] == 100.0, detail
    assert detail["acceptance_rate"] == 0.75 and detail["chunks_done"] == detail["chunks_total"] == 2
    outputs = detail["recordings"][0]["outputs"]
    assert outputs == {"srt": f"s3://{ALLOWED_BUCKET}/out/lecture.srt", "txt": f"s3://{ALLOWED_BUCKET}/out/lecture.txt"}
    srt = edge.s3.get_object(Bucket=ALLOWED_BUCKET, Key="out/lecture.srt")["Body"].read().decode()
    rid = detail["recordings"][0]["id"]
    served = edge.client.get(f"/v1/jobs/{job_id}/recordings/{rid}/transcript?format=srt", headers=edge.headers())
    assert served.text == srt and "-->" in srt
    assert job_id in edge.dispatcher.finished  # the callback is announced once the job ends


def test_events_owner_must_be_a_live_key(edge: Edge) -> None:
    from api.app import create_app
    from api.s3_events import check_events_owner

    with pytest.raises(ValueError, match="not a live API key"):
        create_app(edge.settings.model_copy(update={"s3_events_key_id": 987654}), edge.dispatcher)
    with edge.app.state.sessions() as session:
        key_id = session.query(Job.api_key_id).filter(Job.api_key_id.isnot(None)).first()[0]
    check_events_owner(edge.app.state.sessions, edge.settings.model_copy(update={"s3_events_key_id": key_id}))
