"""Dependencies injected into routes: settings, the job store, the dispatcher and the current API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from api.auth import key_id_for
from workers.jobstore import SessionFactory
from workers.pipeline import Dispatcher
from workers.settings import Settings

bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_sessions(request: Request) -> SessionFactory:
    return request.app.state.sessions


def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


def current_key(
    sessions: Annotated[SessionFactory, Depends(get_sessions)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
    header_key: Annotated[str | None, Security(api_key_header)] = None,
) -> int:
    """The id of the caller's API key (401 when missing, unknown or revoked)."""
    key = credentials.credentials if credentials is not None else header_key
    key_id = key_id_for(sessions, key or "")
    if key_id is None:
        raise HTTPException(401, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return key_id


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[SessionFactory, Depends(get_sessions)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
KeyDep = Annotated[int, Depends(current_key)]
