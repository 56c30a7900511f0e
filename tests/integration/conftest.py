"""Fixtures for integration tests: real services and real model weights."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.asr.ct2_import import BundledModelMissing, bundled_model_dir
from workers.settings import get_settings


@pytest.fixture(scope="session")
def bundled_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary SPECSCRIBE_CACHE_DIR for the whole session: bundled models are converted there once."""
    cache = tmp_path_factory.mktemp("specscribe-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECSCRIBE_CACHE_DIR", str(cache))
        get_settings.cache_clear()
        yield cache
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def base_model_dir(bundled_cache_dir: Path) -> Path:
    """Whisper base converted from the bundled CTranslate2 weights (skips without ``specscribe[bundled]``)."""
    try:
        return bundled_model_dir("whisper-base")
    except BundledModelMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def base_model_cached() -> Path:
    """Whisper base converted into the configured cache (the user's, unless a fixture above moved it), so
    runs after the first reuse it; skips without ``specscribe[bundled]``."""
    try:
        return bundled_model_dir("whisper-base")
    except BundledModelMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, uniquely named PostgreSQL database for the session, dropped at the end (skips if no server).

    The server is ``SPECSCRIBE_TEST_POSTGRES`` (an admin URL), by default the local ``test`` database.
    """
    import psycopg
    from sqlalchemy.engine import make_url

    admin = os.environ.get("SPECSCRIBE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"specscribe_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {admin}: {exc}")
    yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
