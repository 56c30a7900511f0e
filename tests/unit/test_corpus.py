"""The distillation corpus: filtered prose, planned recordings, and never a benchmark sentence."""

from __future__ import annotations

import shutil

import pytest

from workers.asr.corpus import (
    RecordingPlan,
    corpus_sentences,
    english_voices,
    keep_sentence,
    plan_recordings,
    render,
    split_sentences,
    write_flac,
)
from workers.lecture_text import LECTURE_SENTENCES

CLEAN = (
    "The program reads its configuration from a file in the home directory. "
    "Each entry names a host and the port it listens on.\n\n"
    "Permission is granted to copy and distribute verbatim copies of this document. "
    "You may not impose any further restrictions on the exercise of the rights granted here."
)


def test_benchmark_sentences_never_enter_the_corpus() -> None:
    mixed = [CLEAN, " ".join(LECTURE_SENTENCES)]
    # a benchmark sentence quoted inside a longer one, and one with changed punctuation and case
    mixed.append(f"As the lecturer said, {LECTURE_SENTENCES[0].lower()} That is all for now.")
    mixed.append(LECTURE_SENTENCES[5].upper().replace(",", "") + " " + LECTURE_SENTENCES[9].replace(".", "!"))
    sentences = corpus_sentences(mixed)
    assert len(sentences) == 5 and sentences[-1] == "That is all for now."
    benchmark = {" ".join(s.lower().split()) for s in LECTURE_SENTENCES}
    for sentence in sentences:
        assert " ".join(sentence.lower().split()) not in benchmark
    plans = plan_recordings(sentences, ["piper:joe", "espeak:en-us"], 0.2, seed=1)
    assert {s for plan in plans for s in plan.sentences} <= set(sentences)


def test_sentence_filter() -> None:
    assert split_sentences("One two three four five. Six seven eight nine ten!\n\nNext par") == [
        "One two three four five.",
        "Six seven eight nine ten!",
        "Next par",
    ]
    assert keep_sentence("The file is read once at start and kept in memory.")
    assert not keep_sentence("See https://example.org for the full text of it.")
    assert not keep_sentence("Non puoi concedere l’Opera in sublicenza a nessuno.")
    assert not keep_sentence("Too short.")
    assert not keep_sentence("SECTION ONE GENERAL PROVISIONS FOR ALL THE USERS.")


def test_plans_are_seeded_and_mix_voices() -> None:
    sentences = corpus_sentences([CLEAN])
    voices = english_voices(["piper:joe", "espeak:en-us", "espeak:de", "flite:slt", "flite:awb_time"])
    assert voices == ["piper:joe", "espeak:en-us", "flite:slt"]
    plans = plan_recordings(sentences, voices, 0.5, seed=3)
    assert plans == plan_recordings(sentences, voices, 0.5, seed=3)
    assert {p.voice for p in plans} == set(voices)
    assert all(0.85 <= p.speed <= 1.15 and len(p.pauses) == len(p.sentences) - 1 for p in plans)


def test_natural_share_weights_the_piper_voice() -> None:
    voices = ["piper:joe", "espeak:en-us", "flite:slt"]
    for share in (0.0, 0.5, 0.75, 1.0):
        plans = plan_recordings(corpus_sentences([CLEAN]), voices, 3.0, seed=2, natural_share=share)
        natural = sum(p.voice == "piper:joe" for p in plans)
        assert abs(natural - share * len(plans)) <= 1
        others = [p.voice for p in plans if p.voice != "piper:joe"]
        assert share == 1.0 or set(others) == {"espeak:en-us", "flite:slt"}


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="espeak-ng not installed")
def test_render_writes_16k_flac(tmp_path) -> None:
    from workers.decode import decode

    plan = RecordingPlan(
        "r", ("The file is read once.", "It is kept in memory."), "espeak:en-us", 1.1, (0.5,), -50.0, 0
    )
    pcm = render(plan)
    assert (pcm == render(plan)).all()
    write_flac(pcm, tmp_path / "r.flac")
    decoded = decode(tmp_path / "r.flac")
    assert decoded.num_samples == len(pcm) and decoded.duration > 1.5
