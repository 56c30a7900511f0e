"""Voice activity: silero-vad's ONNX model run directly with onnxruntime (no torch), plus frame levels.

The model sees 512-sample windows (32 ms at 16 kHz), each prefixed by the last 64 samples of the
previous window, and carries a recurrent state from window to window — exactly what silero's own
``OnnxWrapper`` does (the final partial window is zero-padded). The package also ships a "sequence"
export of the same network that takes a whole block of windows per call and gives bit-identical
probabilities about three times faster; we use it when present and keep the per-window loop as the
reference (a test checks the two agree). Audio is converted to float32 one block at a time, so a
3-hour recording costs only its int16 PCM plus a few megabytes of per-frame results.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from workers.settings import Settings, get_settings
from workers.types import SAMPLE_RATE

FRAME = 512
"""Samples per VAD window (32 ms)."""
CONTEXT = 64
"""Samples of the previous window prepended to each window (silero v5/v6)."""
BLOCK_FRAMES = 512
"""Windows converted and scored per block (~16 s of audio)."""

_WINDOW_MODEL = "silero_vad.onnx"
_SEQUENCE_MODEL = "silero_vad_16k_sequence.onnx"


def silero_data_dir() -> Path:
    """The ``silero_vad/data`` folder, found without importing the package (whose import loads torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("silero-vad is not installed (pip install 'silero-vad[onnx-cpu]')")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@dataclass(frozen=True)
class VadOptions:
    """Thresholds turning per-frame probabilities and levels into activity spans."""

    threshold: float = 0.5
    neg_threshold: float = 0.35
    min_speech_seconds: float = 0.25
    min_silence_seconds: float = 0.1
    speech_pad_seconds: float = 0.1
    loud_db: float = -35.0
    """Frames louder than this (RMS, dBFS) count as activity even without speech (music, noise)."""

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> VadOptions:
        s = settings or get_settings()
        return cls(
            s.vad_threshold,
            s.vad_neg_threshold,
            s.vad_min_speech_seconds,
            s.vad_min_silence_seconds,
            s.vad_speech_pad_seconds,
            s.vad_loud_db,
        )


@dataclass
class FrameAnalysis:
    """Per-window speech probability and RMS level (dBFS) of a recording."""

    probs: np.ndarray
    levels_db: np.ndarray
    num_samples: int


class SileroVad:
    """Silero VAD on onnxruntime; ``sequence=None`` picks the block-wise export when it is shipped."""

    def __init__(self, data_dir: str | Path | None = None, *, sequence: bool | None = None):
        import onnxruntime as ort

        data = Path(data_dir) if data_dir else silero_data_dir()
        if sequence is None:
            sequence = (data / _SEQUENCE_MODEL).is_file()
        options = ort.SessionOptions()
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        model = data / (_SEQUENCE_MODEL if sequence else _WINDOW_MODEL)
        self.sequence = sequence
        self.session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])

    def analyse(self, pcm: np.ndarray) -> FrameAnalysis:
        """Speech probabilities and levels for every 512-sample window of 16 kHz int16 (or float) PCM."""
        n_frames = -(-len(pcm) // FRAME)
        probs = np.empty(n_frames, dtype=np.float32)
        levels = np.empty(n_frames, dtype=np.float32)
        scale = 1 / 32768 if pcm.dtype == np.int16 else 1.0
        context = np.zeros(CONTEXT, dtype=np.float32)
        state = self._initial_state()
        for first in range(0, n_frames, BLOCK_FRAMES):
            count = min(BLOCK_FRAMES, n_frames - first)
            frames = np.zeros((count, FRAME), dtype=np.float32)
            block = pcm[first * FRAME : (first + count) * FRAME]
            frames.reshape(-1)[: len(block)] = block
            frames *= scale
            windows = np.empty((count, CONTEXT + FRAME), dtype=np.float32)
            windows[0, :CONTEXT] = context
            windows[1:, :CONTEXT] = frames[:-1, -CONTEXT:]
            windows[:, CONTEXT:] = frames
            context = frames[-1, -CONTEXT:].copy()
            probs[first : first + count], state = self._score(windows, state)
            levels[first : first + count] = 10 * np.log10(np.mean(frames * frames, axis=1) + 1e-10)
        return FrameAnalysis(probs, levels, len(pcm))

    def _initial_state(self) -> tuple[np.ndarray, ...]:
        if self.sequence:
            return np.zeros((1, 1, 128), np.float32), np.zeros((1, 1, 128), np.float32)
        return (np.zeros((2, 1, 128), np.float32),)

    def _score(self, windows: np.ndarray, state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, tuple]:
        if self.sequence:
            h, c = state
            probs, h, c = self.session.run(["speech_probs", "hn", "cn"], {"input": windows, "h": h, "c": c})
            return probs.reshape(-1), (h, c)
        (recurrent,) = state
        sr = np.array(SAMPLE_RATE, dtype=np.int64)
        out = np.empty(len(windows), dtype=np.float32)
        for i in range(len(windows)):
            prob, recurrent = self.session.run(None, {"input": windows[i : i + 1], "state": recurrent, "sr": sr})
            out[i] = prob[0, 0]
        return out, (recurrent,)


@lru_cache(maxsize=2)
def get_vad(sequence: bool | None = None) -> SileroVad:
    """A process-wide VAD session (loading one takes ~0.1 s)."""
    return SileroVad(sequence=sequence)


def activity_spans(analysis: FrameAnalysis, options: VadOptions | None = None) -> list[tuple[int, int]]:
    """Sample spans ``[start, end)`` holding speech or loud sound, padded and merged, in order.

    Speech uses silero's hysteresis: it starts at ``threshold`` and ends once the probability stays
    under ``neg_threshold`` for ``min_silence_seconds``; runs shorter than ``min_speech_seconds`` drop.
    """
    opts = options or VadOptions()
    min_run = max(1, round(opts.min_speech_seconds * SAMPLE_RATE / FRAME))
    active = _speech_frames(analysis.probs, opts) | _drop_short(analysis.levels_db > opts.loud_db, min_run)
    pad = round(opts.speech_pad_seconds * SAMPLE_RATE)
    spans: list[tuple[int, int]] = []
    for start, end in _runs(active):
        lo = max(0, start * FRAME - pad)
        hi = min(analysis.num_samples, end * FRAME + pad)
        if spans and lo <= spans[-1][1]:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans


def _speech_frames(probs: np.ndarray, opts: VadOptions) -> np.ndarray:
    mask = np.zeros(len(probs), dtype=bool)
    min_silence = opts.min_silence_seconds * SAMPLE_RATE / FRAME
    min_speech = opts.min_speech_seconds * SAMPLE_RATE / FRAME
    start: int | None = None
    quiet_since: int | None = None
    for i, p in enumerate(probs.tolist()):
        if start is None:
            if p >= opts.threshold:
                start, quiet_since = i, None
        elif p >= opts.threshold:
            quiet_since = None
        elif p < opts.neg_threshold:
            quiet_since = i if quiet_since is None else quiet_since
            if i - quiet_since >= min_silence:
                if quiet_since - start >= min_speech:
                    mask[start:quiet_since] = True
                start = quiet_since = None
    if start is not None and len(probs) - start >= min_speech:
        mask[start:] = True
    return mask


def _drop_short(mask: np.ndarray, min_run: int) -> np.ndarray:
    out = np.zeros_like(mask)
    for start, end in _runs(mask):
        if end - start >= min_run:
            out[start:end] = True
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` index pairs of the True runs of a boolean array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
