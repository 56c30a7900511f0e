"""API keys: generated once, shown once, stored as SHA-256 digests."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select

from workers.db_models import ApiKey
from workers.jobstore import SessionFactory, transaction

KEY_PREFIX = "ss_"


def hash_key(key: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(sessions: SessionFactory, name: str) -> tuple[int, str]:
    """Store a new key for ``name``; returns its id and the key itself (not recoverable later)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction(sessions) as session:
        row = ApiKey(name=name, key_hash=hash_key(key))
        session.add(row)
        session.flush()
        return row.id, key


def key_id_for(sessions: SessionFactory, key: str) -> int | None:
    """The id of a live (not revoked) key, or ``None``."""
    if not key or len(key) > 200:
        return None
    with sessions() as session:
        row = session.scalars(select(ApiKey).where(ApiKey.key_hash == hash_key(key))).one_or_none()
        return row.id if row is not None and row.revoked_at is None else None
