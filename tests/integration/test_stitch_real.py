"""A lecture transcribed in chunks (forced cuts with overlap, and a pause cut) against each sentence decoded
in one pass: at every chunk boundary no word is dropped or doubled."""

from __future__ import annotations

import difflib
import wave
from pathlib import Path

import pytest

from workers.asr.bench import normalize_text, word_error_rate
from workers.asr.token_rules import DecodeOptions
from workers.db_models import Job
from workers.lecture_text import LECTURE_SENTENCES, lecture_recording
from workers.local import local_pipeline, run_job
from workers.pairs import pair_decoder
from workers.settings import Settings
from workers.types import SAMPLE_RATE

pytestmark = pytest.mark.integration

SENTENCES = LECTURE_SENTENCES[32:38]
PAUSES = [0.0, 0.0, 1.2, 0.0, 0.0]  # two stretches of nonstop speech, one real pause
WINDOW = 3
"""Words either side of a boundary that must align one-to-one with the single-pass reference."""


def _write_wav(path: Path, pcm) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def test_no_word_dropped_or_doubled_at_chunk_boundaries(base_model_cached: Path, tmp_path: Path) -> None:
    lecture = lecture_recording(SENTENCES, PAUSES)
    _write_wav(tmp_path / "lecture.wav", lecture.pcm)
    settings = Settings(
        cache_dir=tmp_path / "cache",
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        chunk_max_seconds=10.0,
        vad_min_silence_seconds=0.6,  # pauses at commas do not count: speech is nonstop, cuts are forced
    )
    pipe = local_pipeline(settings)
    job_id = run_job(pipe, [str(tmp_path / "lecture.wav")], pair=settings.default_pair, language="en")
    with pipe.sessions() as session:
        recording = session.get(Job, job_id).recordings[0]
        assert recording.status == "done", recording.error
        hypothesis = normalize_text(recording.transcript).split()
        boundaries = [c.start_seconds + (c.overlap_samples / SAMPLE_RATE) / 2 for c in recording.chunks[1:]]
        forced = sum(c.overlap_samples > 0 for c in recording.chunks)
    assert len(boundaries) >= 3 and forced >= 2

    decoder = pair_decoder(settings.default_pair, "cpu")
    sentences = [lecture.pcm[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)] for start, end in lecture.spans]
    decoded = decoder.transcribe_many(sentences, DecodeOptions(language="en"))
    per_sentence = [normalize_text(result.text).split() for result in decoded]
    reference = [w for words in per_sentence for w in words]
    assert word_error_rate([" ".join(reference)], [" ".join(hypothesis)]) < 0.1

    truth = normalize_text(" ".join(SENTENCES)).split()
    for boundary in boundaries:
        position = _reference_position(boundary, lecture.spans, [len(w) for w in per_sentence])
        bad = _misaligned(reference, hypothesis, position)
        # where the single pass itself misheard a word, the chunked text must match what was said instead
        truth_position = _reference_position(
            boundary, lecture.spans, [len(normalize_text(s).split()) for s in SENTENCES]
        )
        if bad and _misaligned(truth, hypothesis, truth_position):
            context = " ".join(reference[max(position - 6, 0) : position + 6])
            pytest.fail(f"boundary at {boundary:.2f} s ({context!r}): {bad}")


def _misaligned(reference: list[str], hypothesis: list[str], position: int) -> list[tuple]:
    """Alignment differences within ``WINDOW`` words of ``position`` that drop or add words."""
    opcodes = difflib.SequenceMatcher(a=reference, b=hypothesis, autojunk=False).get_opcodes()
    return [
        (reference[i1:i2], hypothesis[j1:j2])
        for tag, i1, i2, j1, j2 in opcodes
        if tag != "equal" and i1 <= position + WINDOW and i2 >= position - WINDOW and i2 - i1 != j2 - j1
    ]


def _reference_position(seconds: float, spans: list[tuple[float, float]], counts: list[int]) -> int:
    """The index in the concatenated reference of the word spoken at ``seconds`` (spread by time)."""
    before = 0
    for (start, end), count in zip(spans, counts):
        if seconds < start:
            return before
        if seconds <= end:
            return before + round(count * (seconds - start) / (end - start))
        before += count
    return before
