"""Queue names, pair parsing and the Celery reliability settings (no broker needed)."""

from __future__ import annotations

import pytest

from workers.celery_app import make_celery
from workers.pairs import pair_queue, split_pair
from workers.settings import Settings


def test_pairs_and_their_queues() -> None:
    assert split_pair("bundled:whisper-base+int8:") == ("bundled:whisper-base", "int8:")
    assert split_pair("openai/whisper-large-v2") == ("openai/whisper-large-v2", None)
    assert pair_queue("bundled:whisper-base+int8:") == "asr.bundled-whisper-base+int8"
    assert pair_queue("openai/whisper-large-v2+decoder:/models/distil v1") == (
        "asr.openai-whisper-large-v2+decoder-models-distil-v1"
    )
    with pytest.raises(ValueError, match="no verifier"):
        split_pair("+int8:")


def test_reliability_settings() -> None:
    settings = Settings(visibility_timeout=120, redis_url="redis://127.0.0.1:6379/5")
    conf = make_celery(settings).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] == 120
    assert conf.result_backend_transport_options["visibility_timeout"] == 120
    assert conf.visibility_timeout == 120
    assert conf.broker_transport_options["unacked_restore_interval"] == 10
    assert conf.worker_send_task_events and conf.task_send_sent_event
    assert conf.broker_url == "redis://127.0.0.1:6379/5"


def test_tasks_retry_transient_errors_only() -> None:
    import redis
    import sqlalchemy.exc

    from workers import tasks

    for task in (tasks.ingest, tasks.transcribe, tasks.stitch):
        assert redis.ConnectionError in task.autoretry_for
        assert sqlalchemy.exc.OperationalError in task.autoretry_for
        assert ValueError not in task.autoretry_for and task.retry_backoff and task.retry_jitter
        assert task.time_limit and task.soft_time_limit < task.time_limit
