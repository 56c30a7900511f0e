"""``/v1/hooks/s3``: S3/MinIO event notifications signed with a shared secret (HMAC-SHA256)."""

from __future__ import annotations

import hashlib
import hmac
import json

from fastapi import APIRouter, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from api.deps import DispatcherDep, SessionsDep, SettingsDep
from api.s3_events import handle_events
from api.schemas import ErrorBody, HookResult

router = APIRouter(prefix="/v1/hooks", tags=["hooks"])
SIGNATURE_HEADER = "X-Specscribe-Signature"
HOOK_MAX_BYTES = 1 << 20


def sign(secret: str, body: bytes) -> str:
    """The signature header value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@router.post(
    "/s3",
    response_model=HookResult,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}},
    responses={code: {"model": ErrorBody} for code in (401, 404, 413, 422)},
)
async def s3_hook(
    request: Request, settings: SettingsDep, sessions: SessionsDep, dispatch: DispatcherDep
) -> HookResult:
    """Create one job per new object in the event (redelivered events create none). Header
    ``X-Specscribe-Signature: sha256=<hex>`` is the HMAC-SHA256 of the raw body with the shared secret."""
    if not settings.webhook_secret:
        raise HTTPException(404, "webhook not configured")
    body = await request.body()
    if len(body) > HOOK_MAX_BYTES:
        raise HTTPException(413, "event too large")
    given = request.headers.get(SIGNATURE_HEADER, "")
    if not hmac.compare_digest(given.removeprefix("sha256="), sign(settings.webhook_secret, body)[7:]):
        raise HTTPException(401, "bad or missing signature")
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(422, "body is not JSON") from None
    if not isinstance(document, dict):
        raise HTTPException(422, "body is not a JSON object")
    return await run_in_threadpool(handle_events, sessions, dispatch, settings, document)
