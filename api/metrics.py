"""Prometheus metrics read from the job store and Redis at scrape time (so every API replica agrees)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select

from workers.celery_app import INGEST_QUEUE
from workers.db_models import CHUNK_DONE, DONE, TRANSITIONS, ChunkRow, Job, Recording
from workers.jobstore import SessionFactory


class PipelineCollector(Collector):
    """Jobs by state, audio seconds transcribed, drafted/accepted tokens, acceptance rate, queue depth."""

    def __init__(self, sessions: SessionFactory, redis: Callable[[], object]) -> None:
        self.sessions, self.redis = sessions, redis

    def collect(self) -> Iterator:
        jobs = GaugeMetricFamily("specscribe_jobs", "Jobs by state.", labels=["state"])
        with self.sessions() as session:
            counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            done = Recording.status == DONE
            audio = session.scalar(select(func.coalesce(func.sum(Recording.duration), 0.0)).where(done))
            tokens = select(func.coalesce(func.sum(ChunkRow.drafted), 0), func.coalesce(func.sum(ChunkRow.accepted), 0))
            drafted, accepted = session.execute(tokens.where(ChunkRow.status == CHUNK_DONE)).one()
        for state in TRANSITIONS:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield CounterMetricFamily(
            "specscribe_audio_seconds_transcribed", "Seconds of audio in finished recordings.", value=float(audio or 0)
        )
        yield CounterMetricFamily("specscribe_drafted_tokens", "Tokens proposed by drafters.", value=drafted)
        yield CounterMetricFamily("specscribe_accepted_tokens", "Drafted tokens the verifier accepted.", value=accepted)
        yield GaugeMetricFamily(
            "specscribe_acceptance_rate", "Accepted / drafted tokens over all decoded chunks.",
            value=accepted / drafted if drafted else 0.0,
        )  # fmt: skip
        depth = GaugeMetricFamily("specscribe_queue_depth", "Messages waiting per Celery queue.", labels=["queue"])
        try:
            client = self.redis()
            queues = {INGEST_QUEUE, *(k.decode() for k in client.scan_iter(match="asr.*", count=200))}
            for queue in sorted(queues):
                if client.type(queue) in (b"list", b"none"):
                    depth.add_metric([queue], client.llen(queue))
        except Exception:  # Redis down: no depth samples (healthz reports it)
            pass
        yield depth


def make_registry(sessions: SessionFactory, redis: Callable[[], object]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(sessions, redis))
    return registry
