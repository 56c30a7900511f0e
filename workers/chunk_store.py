"""Chunk PCM in Redis between the ingest and transcribe stages.

Each chunk is one Redis string under ``{namespace}:chunk:{job}:{recording}:{index}`` holding a small
header (magic, sample count, blake2b digest of key and payload) and the int16 little-endian samples.
Keys expire after a TTL so abandoned jobs clean themselves up; a reader that finds a key gone raises
``ChunkMissingError``, one whose bytes do not match their digest (or were stored under another key)
raises ``ChunkCorruptError``. Batch writes and reads go through one pipeline round trip.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

import numpy as np
import redis

_MAGIC = b"SSC1"
_HEADER = struct.Struct("<4sQ16s")  # magic, number of samples, blake2b-128 digest
_BATCH = 64


class ChunkStoreError(Exception):
    """A chunk could not be read back."""

    def __init__(self, key: str, reason: str):
        self.key = key
        super().__init__(f"{key}: {reason}")


class ChunkMissingError(ChunkStoreError):
    """The chunk was never written, was deleted, or its TTL expired."""


class ChunkCorruptError(ChunkStoreError):
    """The stored bytes fail their checksum, or are not a chunk at all."""


class ChunkStore:
    """Store, fetch and delete chunk PCM; ``ttl_seconds=None`` uses the configured chunk TTL."""

    def __init__(self, client: redis.Redis, namespace: str = "specscribe", ttl_seconds: int | None = None):
        if ttl_seconds is None:
            from workers.settings import get_settings

            ttl_seconds = get_settings().chunk_ttl_seconds
        self.client = client
        self.namespace = namespace
        self.ttl_seconds = ttl_seconds

    def key(self, job: str, recording: str, index: int) -> str:
        return f"{self.namespace}:chunk:{job}:{recording}:{index}"

    def put(self, job: str, recording: str, index: int, pcm: np.ndarray | bytes) -> str:
        """Store one chunk (with TTL); returns its key."""
        return self.put_many(job, [(recording, index, pcm)])[0]

    def put_many(self, job: str, chunks: Iterable[tuple[str, int, np.ndarray | bytes]]) -> list[str]:
        """Store many chunks with pipelined ``SET .. EX`` (one round trip per 64 chunks)."""
        keys: list[str] = []
        pipe = self.client.pipeline(transaction=False)
        for recording, index, pcm in chunks:
            key = self.key(job, recording, index)
            pipe.set(key, _pack(key, pcm), ex=self.ttl_seconds)
            keys.append(key)
            if len(pipe) >= _BATCH:
                pipe.execute()
        if len(pipe):
            pipe.execute()
        return keys

    def get(self, job: str, recording: str, index: int) -> np.ndarray:
        """One chunk's samples (int16, read-only), checksum verified."""
        key = self.key(job, recording, index)
        return _unpack(key, self.client.get(key))

    def get_many(self, job: str, items: Sequence[tuple[str, int]]) -> list[np.ndarray]:
        """Several chunks in one round trip, in the order asked; any missing or corrupt one raises."""
        keys = [self.key(job, recording, index) for recording, index in items]
        values = self.client.mget(keys) if keys else []
        return [_unpack(key, value) for key, value in zip(keys, values, strict=True)]

    def exists(self, job: str, recording: str, index: int) -> bool:
        return bool(self.client.exists(self.key(job, recording, index)))

    def delete(self, job: str, recording: str, index: int) -> bool:
        """Remove one chunk after use; returns whether it was there."""
        return bool(self.client.delete(self.key(job, recording, index)))

    def delete_job(self, job: str) -> int:
        """Remove every chunk of a job (e.g. when it is cancelled); returns how many were removed."""
        pattern = _glob_escape(f"{self.namespace}:chunk:{job}:") + "*"
        removed = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=pattern, count=500):
            batch.append(key)
            if len(batch) >= 500:
                removed += self.client.delete(*batch)
                batch.clear()
        if batch:
            removed += self.client.delete(*batch)
        return removed


def _digest(key: str, payload: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(key.encode(), digest_size=16)
    h.update(payload)
    return h.digest()


def _pack(key: str, pcm: np.ndarray | bytes) -> bytes:
    if isinstance(pcm, np.ndarray):
        if pcm.dtype != np.int16 or pcm.ndim != 1:
            raise ValueError(f"chunk PCM must be 1-D int16, got {pcm.dtype} {pcm.shape}")
        payload = np.ascontiguousarray(pcm, dtype="<i2").tobytes()
    else:
        payload = bytes(pcm)
    if len(payload) % 2:
        raise ValueError("chunk PCM bytes must hold whole int16 samples")
    return _HEADER.pack(_MAGIC, len(payload) // 2, _digest(key, payload)) + payload


def _unpack(key: str, value: bytes | None) -> np.ndarray:
    if value is None:
        raise ChunkMissingError(key, "chunk missing (never stored, deleted, or expired)")
    if len(value) < _HEADER.size:
        raise ChunkCorruptError(key, f"value too short for a chunk ({len(value)} bytes)")
    magic, samples, digest = _HEADER.unpack_from(value)
    payload = memoryview(value)[_HEADER.size :]
    if magic != _MAGIC:
        raise ChunkCorruptError(key, "not a chunk (bad magic)")
    if len(payload) != samples * 2:
        raise ChunkCorruptError(key, f"length mismatch: header says {samples} samples, found {len(payload) // 2}")
    if _digest(key, payload) != digest:
        raise ChunkCorruptError(key, "checksum mismatch")
    return np.frombuffer(value, dtype="<i2", offset=_HEADER.size).astype(np.int16, copy=False)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
