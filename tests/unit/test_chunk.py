"""Voice activity (silero ONNX, our own window loop) and the cut & merge chunk planner."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.ingest_audio import SR, lecture, noise, sentence, tone
from workers.chunk import ChunkOptions, chunk_pcm, chunk_recording, plan_chunks
from workers.types import ChunkPlan
from workers.vad import FRAME, FrameAnalysis, SileroVad, activity_spans, get_vad

LIMIT = 30 * SR


def assert_covers(plan: ChunkPlan) -> None:
    """Chunks and skipped spans tile [0, n): each piece starts where the previous ended, except that a
    chunk may start earlier by exactly its recorded overlap."""
    pieces = sorted(
        [(c.start_sample, c.end_sample, c.overlap_samples) for c in plan.chunks]
        + [(s.start_sample, s.end_sample, 0) for s in plan.skipped]
    )
    pos = 0
    for start, end, overlap in pieces:
        assert start == pos - overlap, (start, pos, overlap)
        assert end > start
        pos = end
    assert pos == plan.num_samples
    assert [c.index for c in plan.chunks] == list(range(len(plan.chunks)))
    assert all(c.end_sample - c.start_sample <= LIMIT for c in plan.chunks)


@pytest.fixture(scope="session")
def talk(tmp_path_factory):
    return lecture(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def talk_plan(talk):
    return chunk_recording("talk", talk.pcm)


def test_window_loop_matches_silero_onnx_wrapper_and_sequence_model(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    pcm = np.concatenate([sentence(base, 1), np.zeros(SR // 3, np.int16), sentence(base, 2)[:12345]])
    window = SileroVad(sequence=False).analyse(pcm)
    sequence = SileroVad(sequence=True).analyse(pcm)
    assert len(window.probs) == -(-len(pcm) // FRAME)
    np.testing.assert_array_equal(window.probs, sequence.probs)
    np.testing.assert_array_equal(window.levels_db, sequence.levels_db)
    assert window.probs.max() > 0.9 and window.probs[:3].max() > 0.5

    torch = pytest.importorskip("torch")
    from silero_vad import load_silero_vad

    reference = load_silero_vad(onnx=True).audio_forward(torch.from_numpy(pcm / 32768.0).float(), SR)
    np.testing.assert_allclose(window.probs, reference.numpy().reshape(-1), atol=1e-6)


def test_silence_gives_no_chunks():
    pcm = noise(20, std=20)  # -64 dBFS room tone
    plan = chunk_recording("quiet", pcm)
    assert plan.chunks == []
    assert [(s.start_sample, s.end_sample) for s in plan.skipped] == [(0, len(pcm))]
    assert chunk_recording("empty", np.zeros(0, np.int16)).chunks == []


def test_short_speech_is_one_chunk_with_silence_skipped(tmp_path_factory):
    speech = sentence(tmp_path_factory.getbasetemp(), 3)
    pcm = np.concatenate([np.zeros(3 * SR, np.int16), speech, np.zeros(5 * SR, np.int16)])
    plan = chunk_recording("one", pcm)
    assert_covers(plan)
    (chunk,) = plan.chunks
    assert chunk.start_sample <= 3 * SR and chunk.end_sample >= 3 * SR + len(speech)
    assert chunk.start > 2.5 and chunk.end < (3 * SR + len(speech)) / SR + 0.5
    assert [s.reason for s in plan.skipped] == ["silence", "silence"]
    assert np.array_equal(chunk_pcm(pcm, chunk), pcm[chunk.start_sample : chunk.end_sample])


def test_lecture_chunks_are_long_and_cut_in_pauses(talk, talk_plan):
    plan = talk_plan
    assert len(talk.pcm) >= 600 * SR
    assert_covers(plan)
    durations = [c.duration for c in plan.chunks]
    assert np.mean(durations) >= 20.0, durations
    assert all(c.overlap_samples == 0 for c in plan.chunks)  # pauses everywhere: no forced cut

    def in_pause(sample: int) -> bool:
        return sample in (0, len(talk.pcm)) or any(a <= sample <= b for a, b in talk.pauses)

    for chunk in plan.chunks:
        assert in_pause(chunk.start_sample) and in_pause(chunk.end_sample), chunk
    # No speech is dropped: every sentence lies inside one chunk.
    for a, b in talk.speech:
        assert any(c.start_sample <= a and b <= c.end_sample for c in plan.chunks), (a / SR, b / SR)
    # The long silence stretches are (mostly) skipped, not transcribed.
    for a, b in talk.silences:
        skipped = sum(max(0, min(b, s.end_sample) - max(a, s.start_sample)) for s in plan.skipped)
        assert skipped >= 0.8 * (b - a)


@pytest.mark.parametrize("kind", ["tone", "noise"])
def test_nonstop_sound_gets_forced_cuts_with_overlap(kind):
    pcm = tone(75, 330) if kind == "tone" else noise(75, std=3000, seed=2)
    plan = chunk_recording(kind, pcm)
    assert_covers(plan)
    assert plan.skipped == []
    assert len(plan.chunks) == 3
    assert plan.chunks[0].overlap_samples == 0
    assert all(c.overlap == pytest.approx(1.0) for c in plan.chunks[1:])
    assert all(c.duration >= 25 for c in plan.chunks[:-1])


def _analysis(n: int, active: list[tuple[int, int]]) -> tuple[FrameAnalysis, list[tuple[int, int]]]:
    """A synthetic analysis: probability 1 inside ``active`` sample ranges, 0 elsewhere."""
    probs = np.zeros(-(-n // FRAME), np.float32)
    for a, b in active:
        probs[a // FRAME : -(-b // FRAME)] = 1.0
    analysis = FrameAnalysis(probs, np.where(probs > 0, -20.0, -70.0).astype(np.float32), n)
    return analysis, activity_spans(analysis)


def test_planner_prefers_the_longest_pause_near_the_limit():
    # 5 s sentences; the pause after the 4th sentence is long (0.9 s), the others short (0.3 s).
    active, pos = [], 0
    for k in range(12):
        active.append((pos, pos + 5 * SR))
        pos += 5 * SR + (int(0.9 * SR) if k == 3 else int(0.3 * SR))
    analysis, spans = _analysis(pos, active)
    plan = plan_chunks("r", analysis, spans, ChunkOptions(cut_window_seconds=12))
    assert_covers(plan)
    first = plan.chunks[0]
    assert active[3][1] <= first.end_sample <= active[4][0]  # ends in the 0.9 s pause (21 s), not at 26 s


def test_planner_splits_at_long_pauses_and_keeps_short_ones_inside():
    active = [(0, 3 * SR), (int(5.5 * SR), 8 * SR), (13 * SR, 15 * SR)]
    analysis, spans = _analysis(16 * SR, active)
    plan = plan_chunks("r", analysis, spans, ChunkOptions(split_pause_seconds=4, min_skip_seconds=1))
    assert_covers(plan)
    assert len(plan.chunks) == 2  # the 2.5 s pause stays inside, the 5 s one splits and is skipped
    assert plan.chunks[0].end_sample < 9 * SR and plan.chunks[1].start_sample > 12 * SR


def test_settings_feed_the_options(monkeypatch):
    from workers.settings import Settings

    monkeypatch.setenv("SPECSCRIBE_CHUNK_MAX_SECONDS", "20")
    monkeypatch.setenv("SPECSCRIBE_CHUNK_OVERLAP_SECONDS", "0.5")
    options = ChunkOptions.from_settings(Settings())
    plan = chunk_recording("t", tone(45), vad=get_vad(), options=options)
    assert_covers(plan)
    assert max(c.duration for c in plan.chunks) <= 20 and plan.chunks[1].overlap == pytest.approx(0.5)
