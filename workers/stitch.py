"""Stitch a recording's chunk results into one transcript on the recording's timeline.

Chunks are taken in order; empty ones (silence, nothing decoded) are dropped. Segment times become
``chunk start + segment offset``. Where a forced cut made a chunk overlap its predecessor
(``overlap > 0``), the words both chunks heard are merged at word level: word times are estimated by
spreading each segment's span over its words (by length), and the longest run of equal words (compared
without case and punctuation) between the end of the previous chunk and the start of this one, at
consistent times, is kept once (a word the cut halved, heard in part by one chunk, matches its whole
form in the other, which is kept); words the previous chunk heard after that run and words this chunk
heard before it are dropped. With no common run, the overlap is split at its middle.
Finally segments are made ordered and non-overlapping, so subtitle cues never collide.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from workers.types import ChunkResult, DecodeStats, Segment, Transcript

MATCH_WINDOW_WORDS = 12
"""At most this many words on each side of an overlap are compared."""
TIME_SLACK_SECONDS = 1.0
"""Word times are estimates: words this far outside the overlap still count as candidates."""
MATCH_MAX_SHIFT_SECONDS = 2.0
"""Matched words whose estimated times differ more than this are different occurrences."""
PARTIAL_MIN_CHARS = 3
"""A word cut in half at a forced cut matches its whole form only if this many characters survive."""


@dataclass(frozen=True)
class Word:
    """A word with an estimated time span, and the segment (chunk index, segment number) it came from."""

    start: float
    end: float
    text: str
    segment: tuple[int, int]

    @property
    def middle(self) -> float:
        return (self.start + self.end) / 2

    @property
    def key(self) -> str:
        """The comparison form: lowercase letters and digits only."""
        return _normalize(self.text)


def _normalize(word: str) -> str:
    return re.sub(r"[^\w]", "", word.lower())


def stitch(results: Iterable[ChunkResult], duration: float) -> Transcript:
    """One transcript from a recording's chunk results (any order), ``duration`` seconds long."""
    ordered = sorted(results, key=lambda r: r.index)
    segments: dict[tuple[int, int], Segment] = {}
    words: list[Word] = []
    previous_index: int | None = None
    for result in ordered:
        chunk_segments = global_segments(result)
        if not chunk_segments:
            continue
        for number, segment in enumerate(chunk_segments):
            segments[(result.index, number)] = segment
        chunk_words = [w for n, s in enumerate(chunk_segments) for w in segment_words(s, (result.index, n))]
        if result.overlap > 0 and previous_index == result.index - 1:
            words, chunk_words = merge_overlap(words, chunk_words, result.start, result.start + result.overlap)
        words.extend(chunk_words)
        previous_index = result.index
    final = non_overlapping(rebuild_segments(words, segments))
    return Transcript(
        text=" ".join(s.text for s in final),
        segments=final,
        language=_language(ordered),
        duration=duration,
        stats=acceptance_stats(ordered),
    )


def global_segments(result: ChunkResult) -> list[Segment]:
    """A chunk's non-empty segments on the recording's timeline (one spanning segment if it has none)."""
    if not result.segments:
        text = result.text.strip()
        return [Segment(result.start, result.end, text)] if _words(text) else []
    out = []
    for segment in result.segments:
        text = segment.text.strip()
        if not _words(text):
            continue
        start = min(result.start + max(segment.start, 0.0), result.end)
        end = min(max(result.start + segment.end, start), result.end)
        out.append(Segment(start, end, text))
    return out


def _words(text: str) -> list[str]:
    return [w for w in text.split() if _normalize(w)] if text else []


def segment_words(segment: Segment, key: tuple[int, int]) -> list[Word]:
    """Split a segment into words, spreading its time span over them in proportion to their length."""
    tokens = segment.text.split()
    weights = [len(t) + 1 for t in tokens]
    total = sum(weights)
    span = segment.end - segment.start
    out, position = [], segment.start
    for token, weight in zip(tokens, weights):
        end = position + span * weight / total
        out.append(Word(position, end, token, key))
        position = end
    return out


def merge_overlap(before: list[Word], after: list[Word], start: float, end: float) -> tuple[list[Word], list[Word]]:
    """Merge the words two chunks both heard in ``[start, end)``: returns both lists with the duplicate
    (and any half-heard word at the cut) removed; see the module docstring."""
    tail_from = len(before)
    while (
        tail_from > 0
        and len(before) - tail_from < MATCH_WINDOW_WORDS
        and before[tail_from - 1].end > start - TIME_SLACK_SECONDS
    ):
        tail_from -= 1
    head_to = 0
    while head_to < min(len(after), MATCH_WINDOW_WORDS) and after[head_to].start < end + TIME_SLACK_SECONDS:
        head_to += 1
    tail, head = before[tail_from:], after[:head_to]
    match = _longest_common_run(tail, head, (start + end) / 2)
    if match is not None:
        i, j, length = match
        end_tail, end_head = tail_from + i + length, j + length
        if len(tail[i + length - 1].key) < len(head[j + length - 1].key):  # the cut halved the last word
            end_tail, end_head = end_tail - 1, end_head - 1
        return before[:end_tail], after[end_head:]
    middle = (start + end) / 2
    kept_tail = [w for w in tail if w.middle < middle]
    kept_head = [w for w in head if w.middle >= middle]
    return before[:tail_from] + kept_tail, kept_head + after[head_to:]


def _longest_common_run(tail: list[Word], head: list[Word], middle: float) -> tuple[int, int, int] | None:
    """(start in tail, start in head, length) of the longest run of matching words at consistent times;
    ties go to the run nearest the overlap's middle. See :func:`_same_word`."""
    best: tuple[int, float, int, int] | None = None  # (length, -distance, i, j)
    for i in range(len(tail)):
        for j in range(len(head)):
            length = 0
            while (
                i + length < len(tail)
                and j + length < len(head)
                and abs(tail[i + length].middle - head[j + length].middle) <= MATCH_MAX_SHIFT_SECONDS
                and _same_word(tail[i + length].key, head[j + length].key, j + length == 0, i + length == len(tail) - 1)
            ):
                length += 1
            if not length:
                continue
            candidate = (length, -abs(tail[i].middle - middle), i, j)
            if best is None or candidate[:2] > best[:2]:
                best = candidate
    return None if best is None else (best[2], best[3], best[0])


def _same_word(before: str, after: str, after_is_first: bool, before_is_last: bool) -> bool:
    """Equal words; or, right at the cut, a word one chunk heard only part of: the next chunk's first word
    ending the previous chunk's word (``mes`` of ``times``), or the previous chunk's last word starting
    the next chunk's (``accel`` of ``acceleration``)."""
    if before == after:
        return bool(before)
    if after_is_first and len(after) >= PARTIAL_MIN_CHARS and before.endswith(after):
        return True
    return before_is_last and len(before) >= PARTIAL_MIN_CHARS and after.startswith(before)


def rebuild_segments(words: list[Word], originals: dict[tuple[int, int], Segment]) -> list[Segment]:
    """Group kept words back into their segments; a segment that lost words is trimmed in text and time."""
    out: list[Segment] = []
    group: list[Word] = []
    for word in [*words, None]:
        if group and (word is None or word.segment != group[0].segment):
            original = originals[group[0].segment]
            complete = len(group) == len(original.text.split())
            out.append(
                original if complete else Segment(group[0].start, group[-1].end, " ".join(w.text for w in group))
            )
            group = []
        if word is not None:
            group.append(word)
    return out


def non_overlapping(segments: list[Segment], min_length: float = 0.01) -> list[Segment]:
    """Segments in order with each starting no earlier than the previous one ends."""
    out: list[Segment] = []
    last_end = 0.0
    for segment in segments:
        start = max(segment.start, last_end)
        end = max(segment.end, start + min_length)
        out.append(Segment(round(start, 3), round(end, 3), segment.text))
        last_end = out[-1].end
    return out


def _language(results: list[ChunkResult]) -> str | None:
    votes = Counter(r.language for r in results if r.language and _words(r.text))
    return votes.most_common(1)[0][0] if votes else None


def acceptance_stats(results: list[ChunkResult]) -> dict[str, float]:
    """Per-recording decoding statistics: drafted/accepted tokens, acceptance, passes and timings."""
    total = DecodeStats()
    for result in results:
        total.add(result.stats)
    return {
        "chunks": len(results),
        "empty_chunks": sum(not _words(r.text) for r in results),
        "verifier_passes": total.verifier_passes,
        "drafter_steps": total.drafter_steps,
        "drafted": total.drafted,
        "accepted": total.accepted,
        "acceptance": round(total.acceptance, 4),
        "encoder_seconds": round(total.encoder_seconds, 3),
        "decoder_seconds": round(total.decoder_seconds, 3),
    }
