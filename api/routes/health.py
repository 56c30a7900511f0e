"""``/healthz`` (database, Redis, S3) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import SessionsDep, SettingsDep
from api.schemas import Health
from workers.object_store import s3_client

router = APIRouter(tags=["health"])


def _check(probe) -> str:
    try:
        probe()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return "ok"


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(request: Request, sessions: SessionsDep, settings: SettingsDep) -> JSONResponse:
    """Whether the database, Redis and the upload bucket answer (503 if any does not)."""

    def database() -> None:
        with sessions() as session:
            session.execute(text("SELECT 1"))

    checks = {
        "database": _check(database),
        "redis": _check(lambda: request.app.state.redis().ping()),
        "s3": _check(lambda: s3_client(settings).head_bucket(Bucket=settings.upload_bucket)),
    }
    healthy = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if healthy else "degraded", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    """Prometheus metrics: jobs by state, audio seconds transcribed, acceptance rate, queue depth."""
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
