"""Cut a recording into chunks of at most 30 s at its pauses (WhisperX-style cut & merge).

Activity spans (speech, or loud non-speech such as music) from :mod:`workers.vad` are merged
greedily into chunks as long as the limit allows, so Whisper sees long contexts. When the next span
no longer fits, the chunk ends in the longest pause among those that still leave it long (in the last
``cut_window_seconds`` of the reachable window). A short pause at a cut is split in the middle; a
pause of at least ``min_skip_seconds`` at a cut, and any pause of ``split_pause_seconds`` or more, is
left out as a ``SkippedSpan`` (silence alone makes Whisper hallucinate). Where a span runs past the
limit with no pause (nonstop speech, music) the cut is forced at the least speech-like, quietest frame
near the limit, and the next chunk starts ``overlap_seconds`` earlier, recorded as its overlap for the
stitcher. Chunks and skipped spans together cover every sample of the recording.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.settings import Settings, get_settings
from workers.types import SAMPLE_RATE, Chunk, ChunkPlan, SkippedSpan
from workers.vad import FRAME, FrameAnalysis, SileroVad, VadOptions, activity_spans, get_vad


@dataclass(frozen=True)
class ChunkOptions:
    """How recordings are cut; seconds throughout."""

    max_seconds: float = 30.0
    overlap_seconds: float = 1.0
    min_skip_seconds: float = 1.0
    split_pause_seconds: float = 4.0
    cut_window_seconds: float = 12.0
    """A pause-cut goes in the longest pause among those leaving the chunk within this of the limit."""
    forced_search_seconds: float = 5.0
    """A forced cut goes in the quietest frame within this of the limit."""

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> ChunkOptions:
        s = settings or get_settings()
        return cls(
            max_seconds=s.chunk_max_seconds,
            overlap_seconds=s.chunk_overlap_seconds,
            min_skip_seconds=s.chunk_min_skip_seconds,
            split_pause_seconds=s.chunk_split_pause_seconds,
        )


def chunk_recording(
    recording: str,
    pcm: np.ndarray,
    *,
    vad: SileroVad | None = None,
    vad_options: VadOptions | None = None,
    options: ChunkOptions | None = None,
) -> ChunkPlan:
    """Run voice activity detection over 16 kHz PCM and plan its chunks."""
    analysis = (vad or get_vad()).analyse(pcm)
    return plan_chunks(recording, analysis, activity_spans(analysis, vad_options), options)


def chunk_pcm(pcm: np.ndarray, chunk: Chunk) -> np.ndarray:
    """The samples of one chunk (a view, no copy)."""
    return pcm[chunk.start_sample : chunk.end_sample]


def plan_chunks(
    recording: str,
    analysis: FrameAnalysis,
    spans: list[tuple[int, int]],
    options: ChunkOptions | None = None,
) -> ChunkPlan:
    """Group activity ``spans`` (sample ranges, in order) into chunks; see the module docstring."""
    opts = options or ChunkOptions()
    n = analysis.num_samples
    limit = _samples(opts.max_seconds)
    overlap = min(_samples(opts.overlap_seconds), limit // 4)
    min_skip = _samples(opts.min_skip_seconds)
    split = max(_samples(opts.split_pause_seconds), min_skip)
    cut_window = _samples(opts.cut_window_seconds)
    plan = ChunkPlan(recording, n)

    def skip(start: int, end: int, reason: str = "silence") -> None:
        if end > start:
            plan.skipped.append(SkippedSpan(recording, start, end, reason))

    def emit(start: int, end: int, overlap_samples: int = 0) -> None:
        plan.chunks.append(Chunk(recording, len(plan.chunks), start, end, overlap_samples))

    if not spans:
        skip(0, n, "no speech or sound")
        return plan

    # The boundary after span j: (end of the chunk there, start of what follows, pause length).
    def boundary(j: int, cs: int) -> tuple[int, int, int]:
        end_j = spans[j][1]
        nxt = spans[j + 1][0] if j + 1 < len(spans) else n
        pause = nxt - end_j
        if pause >= min_skip:
            return end_j, nxt, pause
        cut = nxt if j + 1 == len(spans) else (end_j + nxt) // 2
        cut = min(cut, cs + limit)
        return cut, cut, pause

    cs = spans[0][0] if spans[0][0] >= min_skip else 0
    skip(0, cs)
    carried_overlap = 0
    i = 0
    while i < len(spans):
        candidates: list[tuple[int, int, int, int]] = []  # (j, chunk end, next start, pause)
        for j in range(i, len(spans)):
            if spans[j][1] - cs > limit:
                break
            end, nxt, pause = boundary(j, cs)
            candidates.append((j, end, nxt, pause))
            if j + 1 == len(spans) or pause >= split:
                break
        if not candidates:  # span i runs past the limit: forced cut with overlap
            cut = _forced_cut(analysis, cs + limit - overlap // 2, opts.forced_search_seconds, cs + overlap)
            emit(cs, cut + overlap // 2, carried_overlap)
            cs, carried_overlap = cut - overlap // 2, overlap
            continue
        j, end, nxt, pause = candidates[-1]
        reached_break = j + 1 == len(spans) or pause >= split
        if not reached_break:
            long_enough = [c for c in candidates if c[1] - cs >= limit - cut_window] or [candidates[-1]]
            j, end, nxt, pause = max(long_enough, key=lambda c: (c[3], c[0]))
        emit(cs, end, carried_overlap)
        skip(end, nxt)
        cs, carried_overlap, i = nxt, 0, j + 1
    skip(cs, n)  # the rest of a short trailing pause the last chunk had no room for
    return plan


def _forced_cut(analysis: FrameAnalysis, latest: int, search_seconds: float, earliest: int) -> int:
    """The sample, in ``[latest - search, latest]``, at the least speech-like and quietest frame."""
    lo_frame = max(earliest, latest - _samples(search_seconds)) // FRAME
    hi_frame = max(lo_frame + 1, latest // FRAME)
    probs = analysis.probs[lo_frame:hi_frame]
    levels = analysis.levels_db[lo_frame:hi_frame]
    spread = float(levels.max() - levels.min()) if len(levels) else 0.0
    score = probs + 0.25 * (levels - levels.min()) / (spread + 1e-6)
    best = lo_frame + int(np.argmin(score))
    return int(min(max(best * FRAME + FRAME // 2, earliest), latest))


def _samples(seconds: float) -> int:
    return round(seconds * SAMPLE_RATE)
