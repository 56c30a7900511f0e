"""The data-flow nouns passed between stages: plain dataclasses, no behaviour beyond small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SAMPLE_RATE = 16_000
"""Every stage after decoding works on 16 kHz mono int16 PCM."""


@dataclass(frozen=True)
class Segment:
    """A span of transcribed text, in seconds from the start of its chunk (or recording once stitched)."""

    start: float
    end: float
    text: str


@dataclass
class DecodeStats:
    """What one decode cost and how well the drafter did. ``draft_seconds`` and ``verify_seconds`` are the
    parts of ``decoder_seconds`` spent in drafter and verifier forwards; the rest is rule/loop overhead."""

    verifier_passes: int = 0
    drafter_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    encoder_seconds: float = 0.0
    decoder_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        """Fraction of drafted tokens the verifier kept (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def add(self, other: DecodeStats) -> None:
        """Accumulate another decode's statistics into this one."""
        self.verifier_passes += other.verifier_passes
        self.drafter_steps += other.drafter_steps
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.encoder_seconds += other.encoder_seconds
        self.decoder_seconds += other.decoder_seconds
        self.draft_seconds += other.draft_seconds
        self.verify_seconds += other.verify_seconds


@dataclass
class DecodeResult:
    """One chunk decoded: generated token ids (prompt excluded), text, language, segments and stats."""

    tokens: list[int]
    text: str
    language: str | None
    segments: list[Segment] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)


@dataclass(frozen=True)
class RecordingFile:
    """One recording to ingest: its name (file name, or member path inside an archive) and local path."""

    name: str
    path: Path
    archive: str | None = None
    """The archive it came out of, if any."""


@dataclass(frozen=True)
class MemberFailure:
    """An input or archive member that yields no recording, and why.

    ``skipped`` marks benign skips (a README, a directory of thumbnails); otherwise it is a failure the
    job should report (unsafe path, corrupt data, over a limit). ``member`` is empty when the whole
    archive failed.
    """

    source: str
    member: str
    reason: str
    skipped: bool = False


@dataclass
class DecodedAudio:
    """A recording decoded to 16 kHz mono int16 PCM, with what the decoder had to say about it."""

    source: str
    pcm: np.ndarray
    sample_rate: int = SAMPLE_RATE
    warnings: list[str] = field(default_factory=list)
    """Decoder complaints that did not stop decoding (e.g. a truncated mp3 decoded as far as it goes)."""

    @property
    def num_samples(self) -> int:
        return int(self.pcm.shape[0])

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.num_samples / self.sample_rate


@dataclass(frozen=True)
class Chunk:
    """A <=30 s piece of one recording, in samples (16 kHz) of the recording's own timeline.

    ``overlap_samples`` is how much of this chunk's start the previous chunk also covers: 0 when the
    cut fell in a pause, > 0 after a forced cut (no pause within the window), for the stitcher to merge.
    """

    recording: str
    index: int
    start_sample: int
    end_sample: int
    overlap_samples: int = 0

    @property
    def start(self) -> float:
        """Start in seconds."""
        return self.start_sample / SAMPLE_RATE

    @property
    def end(self) -> float:
        """End in seconds."""
        return self.end_sample / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return (self.end_sample - self.start_sample) / SAMPLE_RATE

    @property
    def overlap(self) -> float:
        """Overlap with the previous chunk, in seconds."""
        return self.overlap_samples / SAMPLE_RATE


@dataclass(frozen=True)
class SkippedSpan:
    """A stretch of a recording that no chunk covers (silence), kept so the plan accounts for every sample."""

    recording: str
    start_sample: int
    end_sample: int
    reason: str

    @property
    def start(self) -> float:
        return self.start_sample / SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.end_sample / SAMPLE_RATE


@dataclass
class ChunkPlan:
    """How one recording is cut: chunks plus skipped spans, together covering ``[0, num_samples)``."""

    recording: str
    num_samples: int
    chunks: list[Chunk] = field(default_factory=list)
    skipped: list[SkippedSpan] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.num_samples / SAMPLE_RATE


# --- transcribe and stitch -----------------------------------------------------------------------


@dataclass
class ChunkResult:
    """One decoded chunk placed on its recording's timeline (``segments`` are relative to ``start``)."""

    index: int
    start: float
    end: float
    overlap: float
    """Seconds at this chunk's start that the previous chunk also covers (forced cuts only)."""
    text: str
    segments: list[Segment] = field(default_factory=list)
    language: str | None = None
    tokens: list[int] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)


@dataclass
class Transcript:
    """One recording's stitched transcript: text, segments on the recording's timeline, language, stats."""

    text: str
    segments: list[Segment]
    language: str | None
    duration: float
    stats: dict[str, float] = field(default_factory=dict)
