"""Alembic environment: the database URL comes from ``upgrade_database(url)`` or from the settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from workers.db_models import Base
from workers.jobstore import make_engine
from workers.settings import get_settings

config = context.config
url = config.attributes.get("url") or get_settings().database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    )


def run_migrations() -> None:
    """Run the migrations on a live connection (offline SQL scripts are not supported)."""
    if context.is_offline_mode():
        raise SystemExit("offline migrations are not supported; run against a database")
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
