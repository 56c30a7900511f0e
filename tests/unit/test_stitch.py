"""The stitcher on synthetic chunk results: timeline mapping, overlap merges, empty chunks, rendering."""

from __future__ import annotations

import json

from workers.render import render_all
from workers.stitch import merge_overlap, segment_words, stitch
from workers.types import ChunkResult, DecodeStats, Segment


def chunk(
    index: int, start: float, end: float, *segments: tuple[float, float, str], overlap: float = 0.0
) -> ChunkResult:
    segs = [Segment(a, b, t) for a, b, t in segments]
    return ChunkResult(index, start, end, overlap, " ".join(s.text for s in segs), segs, "en")


def words(text: str) -> list[str]:
    return text.replace(".", "").replace(",", "").lower().split()


def test_segments_move_onto_the_recording_timeline_in_chunk_order() -> None:
    results = [
        chunk(1, 12.0, 20.0, (0.0, 3.0, "Second chunk.")),
        chunk(0, 0.0, 10.0, (0.5, 4.0, "First one."), (4.0, 9.0, "Still first.")),
    ]
    transcript = stitch(results, 20.0)
    assert [(s.start, s.end, s.text) for s in transcript.segments] == [
        (0.5, 4.0, "First one."),
        (4.0, 9.0, "Still first."),
        (12.0, 15.0, "Second chunk."),
    ]
    assert transcript.text == "First one. Still first. Second chunk."
    assert transcript.language == "en"


def test_empty_chunks_are_dropped_and_segments_clamped_to_their_chunk() -> None:
    results = [
        chunk(0, 0.0, 5.0, (0.0, 7.0, "Runs past the end.")),
        chunk(1, 6.0, 10.0),
        chunk(2, 10.0, 14.0, (0.0, 1.0, "  "), (1.0, 2.0, "...")),
        chunk(3, 14.0, 18.0, (0.0, 2.0, "Last.")),
    ]
    transcript = stitch(results, 18.0)
    assert [(s.start, s.end, s.text) for s in transcript.segments] == [
        (0.0, 5.0, "Runs past the end."),
        (14.0, 16.0, "Last."),
    ]
    assert transcript.stats["chunks"] == 4 and transcript.stats["empty_chunks"] == 2


def test_overlap_keeps_the_shared_words_once() -> None:
    # chunk 1 starts 1 s before chunk 0 ends; both heard "times acceleration"
    results = [
        chunk(0, 0.0, 10.0, (0.0, 5.0, "Newton said that"), (5.0, 10.0, "force equals mass times acceleration")),
        chunk(1, 9.0, 19.0, (0.0, 4.0, "times acceleration in every frame."), overlap=1.0),
    ]
    transcript = stitch(results, 19.0)
    assert words(transcript.text) == words("Newton said that force equals mass times acceleration in every frame.")


def test_overlap_drops_a_word_cut_in_half_on_either_side() -> None:
    # chunk 0 heard half of "acceleration" as "accel"; chunk 1 heard the tail of "times" as "mes"
    results = [
        chunk(0, 0.0, 10.0, (0.0, 5.0, "Newton said that"), (5.0, 10.0, "force equals mass times accel")),
        chunk(1, 9.0, 19.0, (0.0, 4.0, "mes acceleration in every frame."), overlap=1.0),
    ]
    transcript = stitch(results, 19.0)
    assert words(transcript.text) == words("Newton said that force equals mass times acceleration in every frame.")


def test_overlap_match_ignores_case_punctuation_and_far_away_repeats() -> None:
    # "the" occurs early in chunk 0 and at the boundary; only the boundary one is shared
    results = [
        chunk(0, 0.0, 10.0, (0.0, 10.0, "The cell and the membrane protect, the")),
        chunk(1, 9.4, 19.0, (0.0, 5.0, "The nucleus holds DNA."), overlap=1.0),
    ]
    transcript = stitch(results, 19.0)
    assert words(transcript.text) == words("The cell and the membrane protect the nucleus holds DNA.")


def test_overlap_without_common_words_splits_at_its_middle() -> None:
    before = segment_words(Segment(0.0, 10.0, "one two three four five six seven eight nine ten"), (0, 0))
    after = segment_words(Segment(9.0, 11.0, "alpha beta gamma delta"), (1, 0))
    kept_before, kept_after = merge_overlap(before, after, 9.0, 10.0)
    assert [w.text for w in kept_before] == ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert [w.text for w in kept_after] == ["beta", "gamma", "delta"]


def test_no_overlap_means_no_merge_even_with_repeated_words() -> None:
    results = [chunk(0, 0.0, 5.0, (0.0, 5.0, "Again and again")), chunk(1, 6.0, 10.0, (0.0, 2.0, "again."))]
    assert words(stitch(results, 10.0).text) == ["again", "and", "again", "again"]


def test_trimmed_segments_and_cues_never_overlap() -> None:
    results = [
        chunk(0, 0.0, 10.0, (0.0, 6.0, "Alpha beta gamma."), (6.0, 10.0, "Delta epsilon zeta")),
        chunk(1, 9.0, 20.0, (0.0, 4.0, "epsilon zeta eta theta."), (4.0, 9.0, "Iota kappa."), overlap=1.0),
    ]
    transcript = stitch(results, 20.0)
    assert words(transcript.text) == words("Alpha beta gamma. Delta epsilon zeta eta theta. Iota kappa.")
    for previous, current in zip(transcript.segments, transcript.segments[1:]):
        assert previous.start < previous.end <= current.start < current.end


def test_statistics_roll_up_per_recording() -> None:
    results = [chunk(0, 0.0, 5.0, (0.0, 5.0, "a b")), chunk(1, 5.0, 10.0, (0.0, 5.0, "c d"))]
    results[0].stats = DecodeStats(verifier_passes=3, drafted=10, accepted=8, encoder_seconds=1.0)
    results[1].stats = DecodeStats(verifier_passes=2, drafted=10, accepted=9, decoder_seconds=2.0)
    stats = stitch(results, 10.0).stats
    assert stats["drafted"] == 20 and stats["accepted"] == 17 and stats["acceptance"] == 0.85
    assert stats["verifier_passes"] == 5 and stats["encoder_seconds"] == 1.0 and stats["decoder_seconds"] == 2.0


def test_renderers() -> None:
    transcript = stitch([chunk(0, 3600.0, 3630.0, (1.5, 4.25, "Hello there."), (4.25, 7.0, "Bye."))], 3630.0)
    out = render_all(transcript)
    assert out["txt"] == "Hello there.\nBye.\n"
    assert out["srt"] == "1\n01:00:01,500 --> 01:00:04,250\nHello there.\n\n2\n01:00:04,250 --> 01:00:07,000\nBye.\n"
    assert out["vtt"].startswith("WEBVTT\n\n01:00:01.500 --> 01:00:04.250\nHello there.\n")
    document = json.loads(out["json"])
    assert document["language"] == "en" and document["segments"][1] == {"start": 3604.25, "end": 3607.0, "text": "Bye."}
    assert document["stats"]["chunks"] == 1
