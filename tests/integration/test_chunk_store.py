"""Chunk PCM in the real Redis at 127.0.0.1:6379: TTL, checksums, missing/expired chunks, batches, deletes."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import redis

from workers.chunk_store import ChunkCorruptError, ChunkMissingError, ChunkStore

pytestmark = pytest.mark.integration


@pytest.fixture
def client():
    r = redis.Redis(host="127.0.0.1", port=6379, db=0)
    yield r
    r.close()


@pytest.fixture
def store(client):
    """A store in a namespace of its own, emptied afterwards."""
    namespace = f"test-{uuid.uuid4().hex}"
    yield ChunkStore(client, namespace=namespace, ttl_seconds=120)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)


def pcm(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-32768, 32767, int(16000 * seconds), dtype=np.int16)


def test_round_trip_with_ttl(store, client):
    samples = pcm(2.5)
    key = store.put("job1", "rec-7", 0, samples)
    assert key == f"{store.namespace}:chunk:job1:rec-7:0"
    np.testing.assert_array_equal(store.get("job1", "rec-7", 0), samples)
    assert 0 < client.ttl(key) <= 120
    assert store.exists("job1", "rec-7", 0)


def test_default_ttl_comes_from_settings(client, monkeypatch):
    from workers import settings

    monkeypatch.setenv("SPECSCRIBE_CHUNK_TTL_SECONDS", "777")
    settings.get_settings.cache_clear()
    try:
        namespace = f"test-{uuid.uuid4().hex}"
        key = ChunkStore(client, namespace=namespace).put("j", "r", 0, pcm(0.1))
        assert 700 < client.ttl(key) <= 777
        client.delete(key)
    finally:
        settings.get_settings.cache_clear()


def test_checksum_detects_flipped_bytes(store, client):
    key = store.put("job", "rec", 3, pcm())
    client.setrange(key, 5000, b"\x00\x01")
    with pytest.raises(ChunkCorruptError, match="checksum mismatch"):
        store.get("job", "rec", 3)


def test_value_under_the_wrong_key_is_corrupt(store, client):
    key = store.put("job", "rec", 0, pcm())
    client.set(store.key("job", "rec", 1), client.get(key))
    with pytest.raises(ChunkCorruptError, match=":1: checksum mismatch"):
        store.get("job", "rec", 1)


@pytest.mark.parametrize("value", [b"", b"garbage", b"SSC1" + bytes(40)])
def test_foreign_values_are_corrupt(store, client, value):
    client.set(store.key("job", "rec", 0), value)
    with pytest.raises(ChunkCorruptError):
        store.get("job", "rec", 0)


def test_truncated_value_is_corrupt(store, client):
    key = store.put("job", "rec", 0, pcm())
    client.set(key, client.get(key)[:-2])
    with pytest.raises(ChunkCorruptError, match="length mismatch"):
        store.get("job", "rec", 0)


def test_missing_and_expired(store, client):
    with pytest.raises(ChunkMissingError, match="missing"):
        store.get("job", "never", 0)
    key = store.put("job", "rec", 0, pcm(0.1))
    client.pexpire(key, 20)
    time.sleep(0.1)
    with pytest.raises(ChunkMissingError, match="expired"):
        store.get("job", "rec", 0)


def test_pipelined_batch_write_and_read(store, client, monkeypatch):
    chunks = [(f"rec{r}", i, pcm(0.2, seed=10 * r + i)) for r in range(3) for i in range(50)]
    executes = []
    original = redis.client.Pipeline.execute

    def counting_execute(self, *args, **kwargs):
        executes.append(len(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counting_execute)
    keys = store.put_many("batch", chunks)
    assert len(keys) == 150 and executes == [64, 64, 22]  # three round trips, not 150
    got = store.get_many("batch", [(r, i) for r, i, _ in chunks])
    for (_, _, expected), actual in zip(chunks, got, strict=True):
        np.testing.assert_array_equal(actual, expected)
    assert all(0 < client.ttl(k) <= 120 for k in keys[::37])
    with pytest.raises(ChunkMissingError):
        store.get_many("batch", [("rec0", 0), ("rec0", 999)])


def test_delete_after_use_and_delete_job(store):
    store.put_many("j1", [("a", 0, pcm(0.1)), ("a", 1, pcm(0.1)), ("b*[x]", 0, pcm(0.1))])
    store.put("j10", "a", 0, pcm(0.1))  # a job whose id starts with the other's must survive
    assert store.delete("j1", "a", 0) is True
    assert store.delete("j1", "a", 0) is False
    with pytest.raises(ChunkMissingError):
        store.get("j1", "a", 0)
    assert store.delete_job("j1") == 2
    assert not store.exists("j1", "b*[x]", 0)
    assert store.exists("j10", "a", 0)


def test_bytes_input_and_bad_dtype(store):
    raw = pcm(0.1).tobytes()
    store.put("j", "r", 0, raw)
    assert store.get("j", "r", 0).tobytes() == raw
    with pytest.raises(ValueError, match="int16"):
        store.put("j", "r", 1, np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="whole int16"):
        store.put("j", "r", 2, b"abc")
