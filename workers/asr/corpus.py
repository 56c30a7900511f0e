"""``specscribe drafter corpus``: an offline English speech corpus for drafter distillation.

Prose comes from the user's text files or from what this system has on disk (licences, package
copyright notices, man pages); it is cut into sentences, filtered (length, mostly letters) and any
sentence overlapping the benchmark's :data:`~workers.lecture_text.LECTURE_SENTENCES` is dropped, so a
drafter is never trained on what it is measured on. Every installed English voice reads it at speeds
0.85-1.15 with mild noise; sentences are joined with pauses into 2-5 minute 16 kHz mono FLAC recordings,
listed in ``manifest.jsonl``. No transcripts are needed downstream: the verifier labels the audio.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from workers.types import SAMPLE_RATE

SYSTEM_TEXT_GLOBS = ("/usr/share/common-licenses/*", "/usr/share/doc/*/copyright")
MAN_PAGES = 300
"""How many (seeded, random) man pages to read when prose comes from the system."""
PREFERRED_VOICE = "piper:joe"
"""The natural voice reads every other recording; the other voices take turns with the rest."""
WORDS_PER_SECOND = 2.6
"""Rough speaking rate, to plan recordings of the wanted length before synthesising them."""
NGRAM = 5
"""A sentence sharing any word ``NGRAM``-gram with a benchmark sentence is excluded."""
_ENGLISH_FUNCTION_WORDS = frozenset(
    {"the", "a", "an", "of", "to", "and", "or", "in", "on", "for", "with", "by", "from", "as", "at", "is", "are"}
    | {"be", "was", "were", "it", "this", "that", "not", "no", "you", "your", "we", "can", "will", "if", "which"}
)


@dataclass(frozen=True)
class RecordingPlan:
    """One recording to synthesise: its sentences, voice, speed, pauses and noise level."""

    name: str
    sentences: tuple[str, ...]
    voice: str
    speed: float
    pauses: tuple[float, ...]
    noise_dbfs: float
    seed: int


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).replace("'", "").split()


def _ngrams(words: list[str], n: int = NGRAM) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)} or ({tuple(words)} if words else set())


def benchmark_ngrams() -> set[tuple[str, ...]]:
    """Word n-grams of every benchmark sentence (the exclusion list)."""
    from workers.lecture_text import LECTURE_SENTENCES

    grams: set[tuple[str, ...]] = set()
    for sentence in LECTURE_SENTENCES:
        grams |= _ngrams(_words(sentence))
    return grams


def overlaps_benchmark(sentence: str, excluded: set[tuple[str, ...]]) -> bool:
    """True when ``sentence`` shares a word n-gram with a benchmark sentence (or is a short piece of one)."""
    words = _words(sentence)
    if len(words) < NGRAM:
        return any(tuple(words) == gram[: len(words)] for gram in excluded) if words else False
    return not _ngrams(words).isdisjoint(excluded)


def split_sentences(text: str) -> list[str]:
    """Cut prose into sentences (paragraph breaks end sentences too); whitespace collapsed."""
    text = re.sub(r"(\w)[-\u2010\u00ad]\n\s*(\w)", r"\1\2", text)  # words hyphenated across lines
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        out += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", flat) if s.strip()]
    return out


def keep_sentence(sentence: str, min_words: int = 5, max_words: int = 40) -> bool:
    """Speakable English prose: 5-40 words, ends like a sentence, mostly letters, no URLs, paths or code."""
    words = sentence.split()
    if not min_words <= len(words) <= max_words or not sentence[0].isupper() or sentence[-1] not in ".!?":
        return False
    if re.search(r"https?:|www\.|@|/|\\|[<>{}\[\]=_|#*~^`$%]|\.\w+\(|--", sentence):
        return False
    if not sentence.isascii() or re.search(r"\s[.,;:]", sentence):
        return False
    if sum(w.lower().strip(".,;:!?\"'()") in _ENGLISH_FUNCTION_WORDS for w in words) < 0.15 * len(words):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in sentence)
    if letters / len(sentence) < 0.9 or sum(c.isupper() for c in sentence) > 0.2 * len(words) + 2:
        return False
    return all(len(w.strip(".,;:!?\"'()")) < 20 for w in words)


def system_prose(seed: int = 0, man_pages: int = MAN_PAGES) -> Iterator[str]:
    """Prose found on this system: licences, copyright notices, a seeded sample of man pages."""
    import glob

    for pattern in SYSTEM_TEXT_GLOBS:
        for path in sorted(glob.glob(pattern)):
            try:
                yield Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
    pages = sorted(glob.glob("/usr/share/man/man[1-8]/*.gz"))
    env = {**os.environ, "MANWIDTH": "4000", "MAN_KEEP_FORMATTING": "0"}
    for page in random.Random(seed).sample(pages, min(man_pages, len(pages))):
        result = subprocess.run(["man", "-P", "cat", "-l", page], capture_output=True, env=env, check=False)
        if result.returncode == 0:
            yield re.sub(r".\x08", "", result.stdout.decode("utf-8", errors="replace"))


def corpus_sentences(texts: Iterable[str]) -> list[str]:
    """Filtered, de-duplicated sentences of ``texts``, none overlapping a benchmark sentence."""
    excluded = benchmark_ngrams()
    seen: set[str] = set()
    out = []
    for text in texts:
        for sentence in split_sentences(text):
            key = " ".join(_words(sentence))
            if key in seen or not keep_sentence(sentence) or overlaps_benchmark(sentence, excluded):
                continue
            seen.add(key)
            out.append(sentence)
    return out


def english_voices(voices: Iterable[str]) -> list[str]:
    """The installed voices that read English prose: Piper, espeak-ng ``en*``, flite (not its clock-only voice)."""
    return [v for v in voices if v.startswith(("piper:", "flite:", "espeak:en")) and v != "flite:awb_time"]


def plan_recordings(
    sentences: list[str], voices: list[str], hours: float, seed: int, natural_share: float = 0.5
) -> list[RecordingPlan]:
    """Deal shuffled sentences into 2-5 minute recordings (by estimated length) until ``hours`` are planned;
    ``natural_share`` of them in the natural Piper voice, the rest round-robin over the other voices.

    Sentences are reused (by other voices and speeds) only when the text runs out."""
    if not sentences or not voices:
        raise ValueError("a corpus needs at least one sentence and one voice")
    rng = random.Random(seed)
    order = list(sentences)
    rng.shuffle(order)
    plans: list[RecordingPlan] = []
    planned, cursor, others_used = 0.0, 0, 0
    while planned < hours * 3600:
        others = [v for v in voices if v != PREFERRED_VOICE] or voices
        n = len(plans)
        natural = PREFERRED_VOICE in voices and math.floor((n + 1) * natural_share) > math.floor(n * natural_share)
        voice = PREFERRED_VOICE if natural else others[others_used % len(others)]
        others_used += 0 if natural else 1
        speed = round(rng.uniform(0.85, 1.15), 3)
        target = rng.uniform(120, 300)
        chosen: list[str] = []
        seconds = 0.0
        while seconds < target:
            sentence = order[cursor % len(order)]
            cursor += 1
            chosen.append(sentence)
            seconds += len(sentence.split()) / (WORDS_PER_SECOND * speed) + 0.6
        pauses = tuple(round(rng.uniform(0.3, 1.2), 2) for _ in chosen[1:])
        noise = round(rng.uniform(-60.0, -40.0), 1)
        plans.append(RecordingPlan(f"rec-{len(plans):04d}", tuple(chosen), voice, speed, pauses, noise, seed))
        planned += seconds
    return plans


def render(plan: RecordingPlan) -> np.ndarray:
    """Synthesise one planned recording: sentences with pauses, mild Gaussian noise, 16 kHz int16."""
    from workers.speech import synthesize

    rng = np.random.default_rng(zlib.crc32(f"{plan.seed}:{plan.name}".encode()))
    pieces = []
    for i, sentence in enumerate(plan.sentences):
        if i:
            pieces.append(np.zeros(int(plan.pauses[i - 1] * SAMPLE_RATE), dtype=np.float32))
        pieces.append(synthesize(sentence, plan.voice, plan.speed).astype(np.float32))
    audio = np.concatenate(pieces)
    audio += rng.normal(0.0, 32768.0 * 10 ** (plan.noise_dbfs / 20), audio.shape).astype(np.float32)
    return np.clip(np.round(audio), -32768, 32767).astype(np.int16)


def write_flac(pcm: np.ndarray, path: Path) -> None:
    """Write 16 kHz mono int16 PCM as FLAC (ffmpeg)."""
    cmd = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "s16le", "-ar", str(SAMPLE_RATE)]
    cmd += ["-ac", "1", "-i", "pipe:0", "-c:a", "flac", str(path)]
    subprocess.run(cmd, input=pcm.tobytes(), check=True, capture_output=True)


def _render_to(plan: RecordingPlan, out: str) -> dict:
    path = Path(out) / f"{plan.name}.flac"
    if not path.exists():
        pcm = render(plan)
        tmp = path.with_suffix(".tmp.flac")
        write_flac(pcm, tmp)
        tmp.replace(path)
        seconds = len(pcm) / SAMPLE_RATE
    else:
        from workers.decode import decode

        seconds = decode(path).duration
    return {"file": path.name, "seconds": round(seconds, 2), **asdict(plan), "sentences": list(plan.sentences)}


def build_corpus(
    out: Path,
    hours: float,
    texts: Iterable[str],
    voices: list[str],
    seed: int = 0,
    workers: int = 2,
    natural_share: float = 0.5,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Plan and synthesise the corpus into ``out`` (existing recordings are kept: a rerun resumes).

    Returns the manifest rows (also written to ``out/manifest.jsonl``)."""
    out.mkdir(parents=True, exist_ok=True)
    plans = plan_recordings(corpus_sentences(texts), english_voices(voices), hours, seed, natural_share)
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for row in pool.map(_render_to, plans, [str(out)] * len(plans)):
            rows.append(row)
            if progress:
                progress(len(rows), len(plans))
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return rows
