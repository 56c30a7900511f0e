"""A job's callback: one POST of its outcome to the URL given at submission, sent by its own task after
the job ends (retried with backoff by Celery), so a slow or dead receiver never holds up the pipeline."""

from __future__ import annotations

from typing import Any

from workers.db_models import Job
from workers.jobstore import SessionFactory


class CallbackFailed(RuntimeError):
    """The receiver could not be reached or did not answer 2xx (the task retries)."""


def job_outcome(sessions: SessionFactory, job_id: str) -> tuple[str | None, dict[str, Any] | None]:
    """The job's callback URL and body: its final status and each recording's status, error and outputs."""
    with sessions() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None, None
        return (job.options or {}).get("callback_url"), {
            "job_id": job.id,
            "status": job.status,
            "error": job.error,
            "source": job.source,
            "recordings": [
                {
                    "id": r.id,
                    "name": r.source_key,
                    "status": r.status,
                    "error": r.error,
                    "duration": r.duration,
                    "outputs": r.output_locations or {},
                }
                for r in job.recordings
            ],
        }


def send_callback(url: str, body: dict[str, Any], timeout: float = 10.0) -> int:
    """POST ``body`` as JSON; returns the status code, raising :class:`CallbackFailed` unless 2xx."""
    import httpx

    try:
        answer = httpx.post(url, json=body, timeout=timeout, headers={"User-Agent": "specscribe-callback"})
    except httpx.HTTPError as exc:
        raise CallbackFailed(f"{url}: {exc}") from exc
    if not 200 <= answer.status_code < 300:
        raise CallbackFailed(f"{url}: HTTP {answer.status_code}")
    return answer.status_code
