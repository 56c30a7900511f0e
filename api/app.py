"""The FastAPI application factory."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.metrics import make_registry
from api.routes import health, hooks, jobs
from api.s3_events import check_events_owner
from api.schemas import JobSourceRequest
from workers.jobstore import session_factory
from workers.pipeline import Dispatcher
from workers.settings import Settings, get_settings


def create_app(settings: Settings | None = None, dispatcher: Dispatcher | None = None) -> FastAPI:
    """The service: jobs, S3 hooks, health and metrics over the configured job store, Redis and S3.

    ``dispatcher`` defaults to Celery (:class:`workers.tasks.CeleryDispatcher`).
    """
    settings = settings or get_settings()
    if dispatcher is None:
        from workers.tasks import CeleryDispatcher

        dispatcher = CeleryDispatcher()
    app = FastAPI(
        title="specscribe",
        version="0.1.0",
        description="Whisper transcription with lossless speculative decoding. Authenticate with an API key "
        "(`Authorization: Bearer <key>` or `X-API-Key`); a key sees only its own jobs.",
    )
    app.state.settings = settings
    app.state.sessions = session_factory(settings.database_url)
    if settings.webhook_secret:
        check_events_owner(app.state.sessions, settings)
    app.state.dispatcher = dispatcher
    app.state.redis = _redis_factory(settings.redis_url)
    app.state.registry = make_registry(app.state.sessions, app.state.redis)
    app.include_router(jobs.router)
    app.include_router(hooks.router)
    app.include_router(health.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _redis_factory(url: str):
    @lru_cache(maxsize=1)
    def client() -> Any:
        import redis

        return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    return client


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the JSON submission model (the submit route reads its body itself)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["JobSourceRequest"] = JobSourceRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        app.openapi_schema = schema
    return app.openapi_schema
