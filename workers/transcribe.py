"""Transcribe chunks completely, many at a time.

Whisper was trained on sequential long-form decoding: when speech runs up to the end of its 30 s window
it often closes the last complete segment and stops, expecting the next window to start at that
timestamp. A chunk has no next window, so its last sentence would be lost. Like Whisper's own seek, when
the decoded segments end more than ``resume_seconds`` before the chunk does, the rest of the chunk
(from the last timestamp) is decoded again and its segments appended. All chunks of a call go through
the decoder together (batched), and so do all their resumptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from workers.asr.token_rules import DecodeOptions
from workers.types import SAMPLE_RATE, DecodeResult, DecodeStats, Segment

RESUME_SECONDS = 1.5
"""Untranscribed audio after the last segment, beyond which the rest is decoded again."""
MAX_RESUMES = 3


class Transcriber(Protocol):
    """What this needs from :class:`~workers.asr.batched.BatchedDecoder`."""

    def transcribe_many(self, pcms: list[np.ndarray], options: DecodeOptions) -> list[DecodeResult]: ...


@dataclass
class _Progress:
    pcm: np.ndarray
    offset: float = 0.0
    tokens: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    language: str | None = None

    def add(self, result: DecodeResult, resume_seconds: float) -> bool:
        """Take one decode of the rest; True when the rest must be decoded again."""
        self.tokens += result.tokens
        self.segments += [Segment(s.start + self.offset, s.end + self.offset, s.text) for s in result.segments]
        self.stats.add(result.stats)
        self.language = self.language or result.language
        end = self.segments[-1].end if self.segments else 0.0
        if not result.segments or end <= self.offset or len(self.pcm) / SAMPLE_RATE - end <= resume_seconds:
            return False
        self.offset = end
        return True

    def result(self) -> DecodeResult:
        text = " ".join(s.text.strip() for s in self.segments).strip()
        return DecodeResult(self.tokens, text, self.language, self.segments, self.stats)


def transcribe_chunks_to_end(
    decoder: Transcriber, pcms: list[np.ndarray], options: DecodeOptions, resume_seconds: float = RESUME_SECONDS
) -> list[DecodeResult]:
    """Decode each of ``pcms`` (at most 30 s each) to its end: one batched decode, plus resumptions."""
    progress = [_Progress(pcm) for pcm in pcms]
    pending = list(range(len(pcms)))
    for _ in range(MAX_RESUMES + 1):
        rests = [progress[i].pcm[round(progress[i].offset * SAMPLE_RATE) :] for i in pending]
        results = decoder.transcribe_many(rests, options)
        pending = [i for i, result in zip(pending, results) if progress[i].add(result, resume_seconds)]
        if not pending:
            break
    return [p.result() for p in progress]


def transcribe_chunk(
    decoder: Transcriber, pcm: np.ndarray, options: DecodeOptions, resume_seconds: float = RESUME_SECONDS
) -> DecodeResult:
    """Decode one chunk to its end (see module doc)."""
    return transcribe_chunks_to_end(decoder, [pcm], options, resume_seconds)[0]
