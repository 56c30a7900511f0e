"""S3 bucket triggers: ObjectCreated events (from SQS or the webhook) become jobs, exactly once per object
version. The ``s3_events`` row (unique on bucket+key+version) is committed with the job, so a redelivered
event finds it and creates nothing; an SQS message is deleted only after its jobs are committed."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from sqlalchemy.exc import IntegrityError

from api.schemas import ALL_FORMATS, HookResult
from workers.db_models import ApiKey, Job, S3Event
from workers.jobstore import SessionFactory, transaction
from workers.object_store import S3_SCHEME, allowed_buckets, output_prefix_for
from workers.pipeline import Dispatcher
from workers.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ObjectCreated:
    """One new object version."""

    bucket: str
    key: str
    version: str

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key}"

    @property
    def dedup_key(self) -> str:
        return hashlib.sha256(f"{self.bucket}\0{self.key}\0{self.version}".encode()).hexdigest()


def parse_records(body: dict[str, Any]) -> list[ObjectCreated]:
    """The ObjectCreated records of an S3 or MinIO event document (test events and others are skipped)."""
    events = []
    for record in body.get("Records") or []:
        if not isinstance(record, dict) or "ObjectCreated" not in str(record.get("eventName", "")):
            continue
        s3 = record.get("s3") or {}
        bucket = (s3.get("bucket") or {}).get("name")
        obj = s3.get("object") or {}
        if not bucket or not obj.get("key"):
            continue
        version = obj.get("versionId") or obj.get("eTag") or obj.get("sequencer") or ""
        events.append(ObjectCreated(str(bucket), unquote_plus(str(obj["key"])), str(version)))
    return events


def wanted(event: ObjectCreated, settings: Settings) -> bool:
    """Allowed bucket, under the listen prefix, with a recording/archive suffix."""
    suffixes = tuple(s.strip().lower() for s in settings.s3_listen_suffixes.split(",") if s.strip())
    return (
        event.bucket in allowed_buckets(settings)
        and event.key.startswith(settings.s3_listen_prefix)
        and (not suffixes or event.key.lower().endswith(suffixes))
    )


def job_for_event(
    sessions: SessionFactory, dispatch: Dispatcher, settings: Settings, event: ObjectCreated
) -> str | None:
    """Create (and dispatch) the job of a new object; ``None`` if this object version already has one."""
    try:
        with transaction(sessions) as session:
            job = Job(
                source=event.uri,
                inputs=[event.uri],
                pair=settings.default_pair,
                api_key_id=settings.s3_events_key_id,
                options={"formats": list(ALL_FORMATS), "output_prefix": output_prefix_for(event.uri, settings)},
            )
            session.add(job)
            session.flush()
            row = S3Event(dedup_key=event.dedup_key, bucket=event.bucket, key=event.key, version=event.version)
            row.job_id = job.id
            session.add(row)
            session.flush()
            job_id = job.id
    except IntegrityError:
        return None
    dispatch.ingest(job_id)
    return job_id


def check_events_owner(sessions: SessionFactory, settings: Settings) -> None:
    """Refuse to start when ``s3_events_key_id`` names no live API key (events would fail one by one)."""
    if settings.s3_events_key_id is None:
        return
    with sessions() as session:
        key = session.get(ApiKey, settings.s3_events_key_id)
    if key is None or key.revoked_at is not None:
        raise ValueError(
            f"SPECSCRIBE_S3_EVENTS_KEY_ID={settings.s3_events_key_id} is not a live API key; "
            "create one with `specscribe keys create NAME` and use the id it prints"
        )


def handle_events(
    sessions: SessionFactory, dispatch: Dispatcher, settings: Settings, body: dict[str, Any]
) -> HookResult:
    """Jobs for every wanted ObjectCreated record of an event document."""
    result = HookResult()
    for event in parse_records(body):
        if not wanted(event, settings):
            result.ignored += 1
            continue
        job_id = job_for_event(sessions, dispatch, settings, event)
        if job_id is None:
            result.duplicates += 1
        else:
            result.created.append(job_id)
    return result


class SqsListener:
    """Long-polls an SQS queue of S3 notifications and turns them into jobs."""

    def __init__(
        self, sessions: SessionFactory, dispatch: Dispatcher, settings: Settings, sqs: Any | None = None
    ) -> None:
        import boto3

        check_events_owner(sessions, settings)
        self.sessions, self.dispatch, self.settings = sessions, dispatch, settings
        self.queue_url = settings.sqs_queue_url
        self.sqs = sqs or boto3.client(
            "sqs", endpoint_url=settings.s3_endpoint_url or None, region_name=settings.s3_region
        )

    def poll_once(self, wait_seconds: int = 20) -> HookResult:
        """Receive up to 10 messages, create their jobs, then delete them (unparseable ones are deleted too)."""
        total = HookResult()
        answer = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds)
        for message in answer.get("Messages", []):
            try:
                body = json.loads(message["Body"])
                if isinstance(body, dict) and "Message" in body and "Records" not in body:  # wrapped by SNS
                    body = json.loads(body["Message"])
            except (json.JSONDecodeError, TypeError):
                log.warning("dropping unparseable message %s", message.get("MessageId"))
                body = {}
            result = handle_events(self.sessions, self.dispatch, self.settings, body if isinstance(body, dict) else {})
            self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
            total.created += result.created
            total.duplicates += result.duplicates
            total.ignored += result.ignored
        return total

    def run(self, stop: Any = None) -> None:
        """Poll until ``stop()`` is true; errors are logged and retried after a pause."""
        while not (stop and stop()):
            try:
                result = self.poll_once()
                if result.created:
                    log.info("created jobs %s", ", ".join(result.created))
            except Exception:
                log.exception("polling %s failed; retrying in 5 s", self.queue_url)
                time.sleep(5)
