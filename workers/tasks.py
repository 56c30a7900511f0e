"""Celery tasks: thin wrappers that call a stage of :mod:`workers.pipeline` with the service's stores.

Transient infrastructure errors (Redis, the database or object storage unreachable) are retried with
exponential backoff and jitter; anything else is a bad input or a bug and is not retried: the task's
``on_failure`` records the error on the job, chunk or recording so nothing is left hanging.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import redis
import sqlalchemy.exc
from celery import Celery, Task

from workers.callbacks import CallbackFailed, job_outcome, send_callback
from workers.celery_app import INGEST_QUEUE, app
from workers.chunk_store import ChunkStore
from workers.jobstore import session_factory
from workers.pairs import pair_decoder, pair_queue
from workers.pipeline import (
    Pipeline,
    fail_chunks,
    fail_job,
    fail_recording,
    ingest_job,
    stitch_recording,
    transcribe_chunks,
)
from workers.settings import get_settings


def _transient_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [redis.ConnectionError, redis.TimeoutError, sqlalchemy.exc.OperationalError]
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # object storage not installed: nothing of it to retry
        pass
    else:
        errors += [BotoConnectionError, HTTPClientError]
    return tuple(errors)


TRANSIENT_ERRORS = _transient_errors()

_settings = get_settings()
_RELIABLE: dict[str, Any] = {
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": True,
    # a retry waits as an unacknowledged message: keep its countdown below the visibility timeout
    "retry_backoff_max": max(1, min(300, _settings.visibility_timeout // 2)),
    "retry_jitter": True,
    "max_retries": _settings.task_max_retries,
}


class CeleryDispatcher:
    """Sends the next stage's task to its queue (through ``celery``, the service's app by default).

    Each task's ``argsrepr`` (what Flower shows as its arguments) reads ``job=<id>``, ``chunks=<ids>``
    or ``recording=<id>``."""

    def __init__(self, celery: Celery | None = None) -> None:
        self.celery = celery or app

    def ingest(self, job_id: str) -> None:
        self.celery.send_task("specscribe.ingest", (job_id,), queue=INGEST_QUEUE, argsrepr=f"job={job_id}")

    def transcribe(self, pair: str, chunk_ids: list[int]) -> None:
        shown = f"chunks={','.join(map(str, chunk_ids))}"
        self.celery.send_task("specscribe.transcribe", (chunk_ids,), queue=pair_queue(pair), argsrepr=shown)

    def stitch(self, recording_id: int) -> None:
        shown = f"recording={recording_id}"
        self.celery.send_task("specscribe.stitch", (recording_id,), queue=INGEST_QUEUE, argsrepr=shown)

    def job_finished(self, job_id: str) -> None:
        self.celery.send_task("specscribe.callback", (job_id,), queue=INGEST_QUEUE, argsrepr=f"job={job_id}")


@lru_cache(maxsize=1)
def service_pipeline() -> Pipeline:
    """The service's stages: job store at ``database_url``, chunk PCM in Redis, Celery dispatch."""
    settings = get_settings()
    client = redis.Redis.from_url(settings.redis_url)
    return Pipeline(session_factory(settings.database_url), ChunkStore(client), CeleryDispatcher(), settings)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# Celery's on_failure hook signature: (task, exc, task_id, args, kwargs, einfo).
def _ingest_failed(self: Task, exc: BaseException, task_id: str, args: tuple, kwargs: dict, einfo: Any) -> None:
    fail_job(service_pipeline(), args[0], _error(exc))


def _transcribe_failed(self: Task, exc: BaseException, task_id: str, args: tuple, kwargs: dict, einfo: Any) -> None:
    fail_chunks(service_pipeline(), args[0], _error(exc))


def _stitch_failed(self: Task, exc: BaseException, task_id: str, args: tuple, kwargs: dict, einfo: Any) -> None:
    fail_recording(service_pipeline(), args[0], _error(exc))


@app.task(
    name="specscribe.ingest",
    on_failure=_ingest_failed,
    time_limit=_settings.ingest_time_limit,
    soft_time_limit=int(_settings.ingest_time_limit * 0.95),
    **_RELIABLE,
)
def ingest(job_id: str) -> None:
    """Expand, decode and chunk a job's inputs; dispatch their transcription."""
    ingest_job(service_pipeline(), job_id)


@app.task(
    name="specscribe.transcribe",
    on_failure=_transcribe_failed,
    time_limit=_settings.asr_time_limit,
    soft_time_limit=int(_settings.asr_time_limit * 0.9),
    **_RELIABLE,
)
def transcribe(chunk_ids: list[int]) -> int:
    """Decode chunks with this worker's pair (loaded on first use, then kept); returns how many were decoded."""
    settings = get_settings()
    return transcribe_chunks(
        service_pipeline(), chunk_ids, lambda pair: pair_decoder(pair, settings.asr_device, settings.asr_batch_size)
    )


@app.task(name="specscribe.stitch", on_failure=_stitch_failed, time_limit=600, soft_time_limit=540, **_RELIABLE)
def stitch(recording_id: int) -> None:
    """Stitch a recording whose chunks are all settled, and finish it."""
    stitch_recording(service_pipeline(), recording_id)


@app.task(
    name="specscribe.callback",
    autoretry_for=(CallbackFailed, *TRANSIENT_ERRORS),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=max(_settings.callback_max_attempts - 1, 0),
    time_limit=120,
)
def callback(job_id: str) -> None:
    """POST a finished job's outcome to its callback URL (retried with backoff; gives up after the last try)."""
    url, body = job_outcome(service_pipeline().sessions, job_id)
    if url and body is not None:
        send_callback(url, body)
