"""A chunk is decoded to its end even when Whisper stops before the end of a full window."""

from __future__ import annotations

import numpy as np

from workers.asr.token_rules import DecodeOptions
from workers.transcribe import transcribe_chunk
from workers.types import SAMPLE_RATE, DecodeResult, DecodeStats, Segment


class StopsEarly:
    """Transcribes at most 20 s of what it is given, one 10 s segment per 10 s, named by absolute second."""

    def __init__(self, total_seconds: float) -> None:
        self.total = total_seconds
        self.calls: list[float] = []

    def transcribe_many(self, pcms: list[np.ndarray], options: DecodeOptions) -> list[DecodeResult]:
        return [self._transcribe(pcm) for pcm in pcms]

    def _transcribe(self, pcm: np.ndarray) -> DecodeResult:
        seconds = len(pcm) / SAMPLE_RATE
        offset = self.total - seconds
        self.calls.append(offset)
        ends = [e for e in (10.0, 20.0) if e <= seconds] or ([seconds] if seconds > 0.5 else [])
        segments = [Segment(e - 10.0 if e >= 10 else 0.0, e, f"until {offset + e:.0f}.") for e in ends]
        return DecodeResult(
            [1] * len(segments), " ".join(s.text for s in segments), "en", segments, DecodeStats(drafted=2)
        )


def test_the_rest_of_a_chunk_is_decoded_from_the_last_timestamp() -> None:
    decoder = StopsEarly(29.0)
    result = transcribe_chunk(decoder, np.zeros(29 * SAMPLE_RATE, dtype=np.int16), DecodeOptions())
    assert decoder.calls == [0.0, 20.0]
    assert [(s.start, s.end, s.text) for s in result.segments] == [
        (0.0, 10.0, "until 10."),
        (10.0, 20.0, "until 20."),
        (20.0, 29.0, "until 29."),
    ]
    assert result.text == "until 10. until 20. until 29." and result.stats.drafted == 4 and len(result.tokens) == 3


def test_a_chunk_decoded_to_its_end_is_decoded_once() -> None:
    decoder = StopsEarly(21.0)
    result = transcribe_chunk(decoder, np.zeros(21 * SAMPLE_RATE, dtype=np.int16), DecodeOptions())
    assert decoder.calls == [0.0] and result.segments[-1].end == 20.0
