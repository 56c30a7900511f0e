"""Alembic migrations on an empty PostgreSQL database match the SQLAlchemy models exactly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from workers.db_models import Base
from workers.jobstore import make_engine, upgrade_database

pytestmark = pytest.mark.integration


def test_upgrade_head_matches_the_models(postgres_url: str) -> None:
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            tables = set(inspect(connection).get_table_names())
        assert {"jobs", "recordings", "chunks", "api_keys", "alembic_version"} <= tables
    finally:
        engine.dispose()
