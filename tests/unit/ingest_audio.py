"""Test audio for the ingest tests, made here with espeak-ng, numpy and ffmpeg (nothing is committed).

Everything is cached per process under one folder of the session's pytest temp dir, so test modules
that share a clip make it once.
"""

from __future__ import annotations

import functools
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SR = 16_000

SENTENCES = (
    "Today we continue our study of waves and oscillations",
    "A pendulum swings because gravity pulls it back toward the lowest point",
    "The period of the swing depends on the length of the string",
    "Energy moves between the kinetic and the potential form",
    "Let us write the equation of motion on the board",
    "The acceleration is proportional to the displacement from equilibrium",
    "This is the defining property of simple harmonic motion",
    "Now imagine that we add a small amount of friction",
    "The amplitude slowly decays while the frequency barely changes",
    "Engineers call this behaviour an underdamped oscillator",
    "If the friction is very strong the system does not oscillate at all",
    "Bridges and buildings are designed with these ideas in mind",
    "Resonance happens when we push the system at its natural frequency",
    "A singer can break a glass by holding exactly the right note",
    "The same mathematics describes electrical circuits with coils and capacitors",
    "Please read the next chapter before our meeting on Thursday",
    "We will also look at waves travelling along a stretched string",
    "The speed of such a wave depends on the tension and the mass per length",
    "Two waves can add up or cancel each other out",
    "This effect is called interference and you can hear it with two speakers",
)
VOICES = ("en-us", "en-gb", "en-us+m3", "en-us+f2")


def work_dir(base: Path) -> Path:
    d = base / "ingest-audio"
    d.mkdir(exist_ok=True)
    return d


def write_wav(path: Path, pcm: np.ndarray, rate: int = SR, channels: int = 1) -> Path:
    """Write int16 PCM (interleaved when ``channels`` > 1) to a WAV file."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
    return path


def ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", *args], check=True)


def to_pcm(path: Path) -> np.ndarray:
    """Decode with the ffmpeg CLI (independently of workers.decode) to 16 kHz mono int16."""
    out = subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-i",
            str(path),
            "-ac",
            "1",
            "-ar",
            str(SR),
            "-f",
            "s16le",
            "-",
        ],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(out, dtype=np.int16).copy()


@functools.cache
def sentence(base: Path, index: int) -> np.ndarray:
    """Sentence ``index`` spoken by espeak-ng, trimmed to its audible extent, 16 kHz int16."""
    path = work_dir(base) / f"sentence-{index:02d}.wav"
    if not path.exists():
        voice = VOICES[index % len(VOICES)]
        subprocess.run(["espeak-ng", "-v", voice, "-s", "165", "-w", str(path), SENTENCES[index]], check=True)
    pcm = to_pcm(path)
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0] : loud[-1] + 1]


def tone(seconds: float, freq: float = 440.0, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def noise(seconds: float, std: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0, std, round(seconds * SR)), -32768, 32767).astype(np.int16)


@dataclass(frozen=True)
class Lecture:
    """Synthetic speech with known layout: ``speech`` and ``pauses`` are sample ranges ``[start, end)``."""

    pcm: np.ndarray
    speech: list[tuple[int, int]]
    pauses: list[tuple[int, int]]
    silences: list[tuple[int, int]]
    """The long silence stretches (a subset of ``pauses``)."""


@functools.cache
def lecture(base: Path, seconds: float = 600.0, seed: int = 1) -> Lecture:
    """Sentences separated by pauses of 0.4-2.5 s, with a 6-12 s silence roughly every 100 s."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    speech, pauses, silences = [], [], []
    pos = 0
    next_silence = 100 * SR

    def gap(samples: int, long: bool = False) -> None:
        nonlocal pos
        parts.append(np.zeros(samples, np.int16))
        pauses.append((pos, pos + samples))
        if long:
            silences.append((pos, pos + samples))
        pos += samples

    gap(2 * SR)
    k = 0
    while pos < seconds * SR:
        s = sentence(base, k % len(SENTENCES))
        parts.append(s)
        speech.append((pos, pos + len(s)))
        pos += len(s)
        k += 1
        if pos >= next_silence:
            gap(int(rng.uniform(6, 12) * SR), long=True)
            next_silence = pos + 100 * SR
        else:
            gap(int(rng.choice([0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.5]) * SR))
    pcm = np.concatenate(parts)
    pcm = np.clip(pcm.astype(np.int32) + noise(len(pcm) / SR, std=20, seed=seed), -32768, 32767).astype(np.int16)
    return Lecture(pcm, speech, pauses, silences)
