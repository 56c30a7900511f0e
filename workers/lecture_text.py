"""Lecture-like English speech for tests and benchmarks: fixed sentences, clips and recordings with pauses.

The sentences cover physics, history, biology, computing, economics and a few neighbours; numbers are
written as words (and figures Whisper would print as digits are avoided) so a word error rate compares like
with like; spelling is American, as Whisper writes it. Audio comes from :func:`workers.speech.synthesize`
(cached on disk), so repeated runs do not synthesise again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workers.speech import synthesize
from workers.types import SAMPLE_RATE

LECTURE_SENTENCES: tuple[str, ...] = (
    # physics
    "Newton's second law tells us that force equals mass times acceleration.",
    "When the net force on an object is zero, its velocity does not change.",
    "Energy can move from one form to another, but the total amount in a closed system stays the same.",
    "A pendulum swings back and forth because gravity keeps pulling it toward its lowest point.",
    "Light travels through empty space faster than anything else we know of in the universe.",
    "The wavelength of a sound tells us how far apart two neighboring pressure peaks are.",
    "Heat always flows from a warmer body to a colder one unless we do work to reverse it.",
    "In an electric circuit, the current depends on both the voltage and the resistance.",
    "Magnets have two poles, and cutting a magnet in half simply gives you two smaller magnets.",
    "Quantum mechanics describes particles with wave functions that give the probability of each outcome.",
    "Einstein showed that moving clocks tick more slowly when measured by an observer at rest.",
    "Friction turns some of the kinetic energy of a sliding block into heat.",
    "A lens bends light so that rays from a distant object meet at a single focal point.",
    "The pressure of a gas rises when we squeeze it into a smaller volume at the same temperature.",
    "Today we will calculate how long a stone takes to fall from the top of the tower.",
    "Remember that momentum is conserved in every collision, even when kinetic energy is lost.",
    # history
    "The printing press made books far cheaper and helped new ideas spread across Europe.",
    "The Roman Empire built roads that connected distant provinces to the capital.",
    "During the industrial revolution, steam engines began to power mills and mines across Britain.",
    "Historians read letters, diaries and tax records to understand how ordinary people lived.",
    "The Silk Road carried spices, paper and religious ideas between China and the Mediterranean.",
    "After the war, many countries joined together to rebuild trade and prevent another conflict.",
    "Ancient Egyptian farmers depended on the yearly flooding of the Nile to water their fields.",
    "The French Revolution overthrew the monarchy and changed politics across the whole continent.",
    "Medieval cities were often surrounded by walls that protected merchants and their goods.",
    "The invention of the telegraph allowed news to cross an ocean in minutes instead of weeks.",
    "Many empires fell not because of a single battle but because of slow economic decline.",
    "Next week we will compare the causes of the two world wars in more detail.",
    "The first public libraries gave working families access to books they could never afford.",
    "Explorers relied on the stars and simple instruments to find their position at sea.",
    "Archaeologists date ancient settlements by studying layers of soil and the objects buried in them.",
    "The ancient Greeks held athletic contests at Olympia to honor their gods.",
    # biology
    "Cells are the basic units of life, and every living thing is made of at least one.",
    "The mitochondria release energy from food in a form that the cell can use.",
    "Plants capture sunlight and turn carbon dioxide and water into sugar during photosynthesis.",
    "Genes are stretches of DNA that carry the instructions for building proteins.",
    "Natural selection favors traits that help an organism survive and have more offspring.",
    "The human heart pumps blood through two separate loops, one to the lungs and one to the body.",
    "Enzymes speed up chemical reactions without being used up themselves.",
    "A healthy ecosystem depends on a balance between predators, prey and the plants they eat.",
    "Vaccines train the immune system to recognize a germ before it can cause serious illness.",
    "Neurons send electrical signals along thin fibres called axons.",
    "Bacteria can double their numbers very quickly when food and warmth are plentiful.",
    "The nucleus of the cell holds its genetic material inside a double membrane.",
    "Bees carry pollen from flower to flower, which helps many crops produce fruit.",
    "Let us look at how the kidneys filter waste from the blood every single day.",
    "Some animals survive the winter by slowing their heartbeat and living on stored fat.",
    "Coral reefs are built by tiny animals that live together in enormous colonies.",
    # computing
    "An algorithm is a precise list of steps that solves a problem in a finite amount of time.",
    "Binary search finds an item in a sorted list by repeatedly halving the range it looks in.",
    "A compiler translates source code into instructions that the processor can execute.",
    "Computer memory is organized as a long sequence of numbered cells called addresses.",
    "The internet breaks every message into small packets that travel independently to their destination.",
    "A hash table lets us look up a value by its key in nearly constant time.",
    "Encryption scrambles data so that only someone holding the right key can read it.",
    "When two programs share memory, we must be careful that they do not overwrite each other's work.",
    "Machine learning models improve by adjusting their parameters to reduce errors on training data.",
    "An operating system decides which program runs on the processor at any given moment.",
    "Recursion means that a function solves a problem by calling itself on a smaller piece of it.",
    "Databases store records in tables and answer questions written in a query language.",
    "For the assignment, please write a program that sorts a list of names alphabetically.",
    "A good test checks one behavior and fails with a message that explains what went wrong.",
    "Graphics cards contain thousands of simple cores that work on many pixels at the same time.",
    "Version control keeps a history of every change, so we can return to any earlier state.",
    # economics
    "When the price of a good rises, people usually buy less of it.",
    "Inflation means that the same amount of money buys fewer goods than it did before.",
    "Central banks raise interest rates to slow down borrowing and cool an overheated economy.",
    "Countries gain from trade when each one specializes in what it produces most efficiently.",
    "A market reaches equilibrium where the quantity supplied equals the quantity demanded.",
    "Unemployment tends to rise during a recession as businesses cut back on production.",
    "Taxes on tobacco are meant both to raise revenue and to discourage an unhealthy habit.",
    "Economists measure the size of an economy by adding up the value of everything it produces.",
    "Opportunity cost is the value of the best alternative that you give up when making a choice.",
    "Small firms often struggle to compete with large companies that enjoy economies of scale.",
    "If every household saves more at once, total spending can fall and incomes may shrink.",
    "We will use a simple supply and demand diagram to explain what happens to rents.",
    # chemistry, astronomy and earth science
    "Atoms bond together by sharing or transferring the electrons in their outer shells.",
    "Water boils at a lower temperature on a high mountain because the air pressure is lower.",
    "The Earth takes one year to travel once around the Sun, and its tilted axis gives us seasons.",
    "Stars shine because nuclear fusion in their cores turns hydrogen into helium.",
    "Earthquakes happen when huge plates of rock suddenly slip past one another.",
    "Rain forms when water vapor cools, condenses into droplets and grows heavy enough to fall.",
)


@dataclass
class SpeechClip:
    """Continuous speech: consecutive sentences joined by short pauses."""

    pcm: np.ndarray
    text: str
    sentences: list[str]
    seconds: float


@dataclass
class LectureRecording:
    """Speech with known pauses: ``spans[i]`` is (start, end) in seconds of ``sentences[i]`` in ``pcm``."""

    pcm: np.ndarray
    sentences: list[str]
    spans: list[tuple[float, float]]

    @property
    def seconds(self) -> float:
        """Total duration."""
        return len(self.pcm) / SAMPLE_RATE


def _trimmed(pcm: np.ndarray, threshold: int = 300, margin_seconds: float = 0.03) -> np.ndarray:
    """Cut the engine's leading/trailing silence, keeping a short margin, so pauses are what we ask for."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > threshold)
    if loud.size == 0:
        return pcm[:0]
    margin = round(margin_seconds * SAMPLE_RATE)
    return pcm[max(loud[0] - margin, 0) : loud[-1] + margin + 1]


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), dtype=np.int16)


def lecture_recording(
    sentences: Sequence[str],
    pause_seconds: float | Sequence[float] = 0.3,
    voice: str = "piper:joe",
    speed: float = 1.0,
    lead_seconds: float = 0.0,
    tail_seconds: float = 0.0,
) -> LectureRecording:
    """Speak ``sentences`` with the given pauses between them (one value, or one per gap).

    ``lead_seconds``/``tail_seconds`` add silence before the first and after the last sentence. Sentence
    audio is cached on disk (see :func:`workers.speech.synthesize`).
    """
    gaps = [pause_seconds] * (len(sentences) - 1) if isinstance(pause_seconds, int | float) else pause_seconds
    if len(gaps) != max(len(sentences) - 1, 0):
        raise ValueError(f"{len(sentences)} sentences need {len(sentences) - 1} pauses, got {len(gaps)}")
    parts = [_silence(lead_seconds)]
    spans = []
    position = len(parts[0])
    for i, sentence in enumerate(sentences):
        if i:
            parts.append(_silence(gaps[i - 1]))
            position += len(parts[-1])
        audio = _trimmed(synthesize(sentence, voice, speed, cache=True))
        parts.append(audio)
        spans.append((position / SAMPLE_RATE, (position + len(audio)) / SAMPLE_RATE))
        position += len(audio)
    parts.append(_silence(tail_seconds))
    return LectureRecording(np.concatenate(parts), list(sentences), spans)


def lecture_clips(
    count: int,
    min_seconds: float = 20.0,
    max_seconds: float = 30.0,
    voice: str = "piper:joe",
    seed: int = 0,
) -> list[SpeechClip]:
    """``count`` clips of consecutive lecture sentences, each ``min_seconds`` to ``max_seconds`` long.

    Sentences are joined by natural pauses (0.25-0.4 s). The seed picks the first sentence and the pauses;
    the same arguments always give the same clips. Clips follow each other through the sentence list,
    wrapping around when it runs out.
    """
    rng = random.Random(seed)
    total = len(LECTURE_SENTENCES)
    start = rng.randrange(total)
    clips: list[SpeechClip] = []
    failed_starts = 0
    while len(clips) < count:
        durations, index = 0.0, start
        sentences: list[str] = []
        pauses: list[float] = []
        while durations < min_seconds and len(sentences) < total:
            if sentences:
                pauses.append(rng.uniform(0.25, 0.4))
            sentence = LECTURE_SENTENCES[index % total]
            sentences.append(sentence)
            durations += len(_trimmed(synthesize(sentence, voice, cache=True))) / SAMPLE_RATE
            durations += pauses[-1] if len(sentences) > 1 else 0.0
            index += 1
        if min_seconds <= durations <= max_seconds:
            recording = lecture_recording(sentences, pauses, voice)
            clips.append(SpeechClip(recording.pcm, " ".join(sentences), sentences, recording.seconds))
            start, failed_starts = index, 0
        else:
            failed_starts += 1
            if failed_starts >= total:
                raise ValueError(f"no run of lecture sentences lasts {min_seconds}-{max_seconds} s")
            start += 1
    return clips
