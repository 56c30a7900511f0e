"""``specscribe drafter distill --audio s3://...``: the unlabeled recordings come from an allow-listed bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import edge_fixtures
from tests.integration.edge_fixtures import ALLOWED_BUCKET, Edge, write_tones
from workers.asr.distill import audio_chunks, local_audio
from workers.object_store import SourceNotAllowed

pytestmark = pytest.mark.integration
edge, moto_endpoint = edge_fixtures.edge, edge_fixtures.moto_endpoint


@pytest.fixture
def edge_settings(edge: Edge, monkeypatch: pytest.MonkeyPatch) -> Edge:
    """``get_settings()`` answers with the edge's settings (moto endpoint, allow-list)."""
    monkeypatch.setattr("workers.settings.get_settings", lambda: edge.settings)
    return edge


def test_recordings_under_an_s3_prefix_are_chunked(edge_settings: Edge, tmp_path: Path) -> None:
    edge = edge_settings
    for name in ("a.wav", "b.wav"):
        edge.s3.upload_file(str(write_tones(tmp_path / name)), ALLOWED_BUCKET, f"corpus/{name}")
    work = tmp_path / "work"
    audio = local_audio(f"s3://{ALLOWED_BUCKET}/corpus/", work)
    assert sorted(p.name for p in audio.rglob("*.wav")) == ["a.wav", "b.wav"]
    recordings = {recording for recording, _, _ in audio_chunks(audio, work, None)}
    assert recordings == {"a.wav", "b.wav"}
    with pytest.raises(FileNotFoundError, match="nothing found"):
        local_audio(f"s3://{ALLOWED_BUCKET}/no-such-prefix/x.wav", tmp_path / "w2")
    with pytest.raises(SourceNotAllowed):
        local_audio("s3://bucket-not-allowed/corpus/", tmp_path / "w3")
