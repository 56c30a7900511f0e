"""The Celery application: Redis broker, one ``ingest`` queue and one ``asr.<pair>`` queue per model pair.

Reliability is chosen on purpose, because a worker crash must neither lose nor duplicate work:

- ``task_acks_late``: a message is acknowledged after its task returns, not when it is received, so a
  worker that dies mid-task leaves it unacknowledged and it is delivered again. Tasks are idempotent
  (see :mod:`workers.pipeline`), so at-least-once delivery is safe.
- ``task_reject_on_worker_lost``: when a prefork child is killed (OOM, SIGKILL), requeue its message at
  once instead of acknowledging it as failed (the default with late acks). With the solo pool (ASR
  workers) the whole worker dies with the task; then the Redis transport's visibility timeout redelivers
  the unacknowledged message, which is why every worker sweeps for abandoned messages often.
- ``worker_prefetch_multiplier=1``: a worker reserves one message at a time, so a long chunk or a
  dying worker holds back as little work as possible and idle workers get the rest.
- The visibility timeout is the same in the three places Celery reads it (broker transport, result
  backend transport, ``visibility_timeout``); it must exceed the longest task and the longest retry
  countdown, or a message is redelivered while it is still running (harmless, as tasks are idempotent,
  but wasted work).
- ``worker_cancel_long_running_tasks_on_connection_loss``: after losing the broker connection, the
  worker's unacknowledged messages are redelivered anyway; cancelling the running tasks avoids running
  them twice at once.
- Task events (``worker_send_task_events``, ``task_send_sent_event``) are on for Flower.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from workers.settings import Settings, get_settings

INGEST_QUEUE = "ingest"
"""Ingest and stitch tasks (CPU, I/O); transcribe tasks go to ``workers.pairs.pair_queue(pair)``."""


def make_celery(settings: Settings | None = None) -> Celery:
    """A configured Celery app for ``settings`` (the process settings by default)."""
    s = settings or get_settings()
    app = Celery("specscribe", broker=s.broker_url, backend=s.redis_url, include=["workers.tasks"])
    timeout = s.visibility_timeout
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": timeout,
            # sweep for abandoned messages every tenth of the timeout (at most every 10 s), each time
            "unacked_restore_interval": max(1, min(10, timeout // 10)),
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options={"visibility_timeout": timeout},
        visibility_timeout=timeout,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,  # state lives in the job store; results would only fill Redis
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=INGEST_QUEUE,
        task_queues=[Queue(INGEST_QUEUE)],
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


app = make_celery()
