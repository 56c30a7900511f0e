"""Decode any audio or video file to 16 kHz mono int16 PCM with ffmpeg.

We use pydub to find the ffmpeg/ffprobe binaries (so ``AudioSegment.converter`` set by a user is
honoured) but go around ``AudioSegment.from_file`` for the decoding itself: it reads ffmpeg's whole
output at the source rate and channel count into one ``bytes`` object and then copies it again for
every ``set_frame_rate``/``set_channels``/``get_array_of_samples`` step, so a 3-hour 44.1 kHz stereo
lecture would need several GB. Instead ffmpeg resamples and downmixes, and its s16le stdout is read
block by block straight into a numpy buffer preallocated from ffprobe's duration (grown only if the
probe was short), so peak memory stays close to the final PCM size (2 bytes per sample, ~345 MB for 3 h).

Policy for damaged input: a file ffprobe does not recognise, or one without an audio stream, raises
``UnsupportedAudioError``; a file that decodes to nothing raises ``EmptyAudioError`` (or
``CorruptAudioError`` when ffmpeg complained); a truncated file (an upload cut short) is decoded as far
as it goes and ffmpeg's complaints are kept in ``DecodedAudio.warnings`` — the words that are there
are still worth transcribing.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from pydub import AudioSegment
from pydub.utils import get_prober_name

from workers.types import SAMPLE_RATE, DecodedAudio

_BLOCK_BYTES = 1 << 20
_MAX_WARNINGS = 20
_MAX_PADDING = 0.1  # seconds of decoded excess over an exact container duration treated as codec padding


class DecodeError(Exception):
    """A recording could not be decoded; the message names the file."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class EmptyAudioError(DecodeError):
    """The file is empty or holds no audio samples."""


class UnsupportedAudioError(DecodeError):
    """Not an audio/video file ffmpeg understands, or no audio stream in it."""


class CorruptAudioError(DecodeError):
    """ffmpeg recognised the file but could not decode it."""


class AudioTooLongError(DecodeError):
    """The recording decodes to more than the configured maximum duration."""


def probe(path: str | Path) -> dict:
    """ffprobe's view of a file (format and streams); raises ``UnsupportedAudioError`` if it has none."""
    cmd = [get_prober_name(), "-v", "error", "-of", "json", "-show_format", "-show_streams", str(path)]
    proc = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    message = _last_lines(proc.stderr.decode("utf-8", "replace"))
    if proc.returncode != 0:
        reason = f"not a recognised audio or video file ({message or 'ffprobe failed'})"
        raise UnsupportedAudioError(path, reason)
    info = json.loads(proc.stdout or b"{}")
    if not any(s.get("codec_type") == "audio" for s in info.get("streams", [])):
        raise UnsupportedAudioError(path, "no audio stream in file")
    return info


def probed_duration(info: dict) -> float | None:
    """The first audio stream's duration in seconds (else the container's), if the file states one."""
    audio = next(s for s in info.get("streams", []) if s.get("codec_type") == "audio")
    for value in (audio.get("duration"), info.get("format", {}).get("duration")):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            continue
        if seconds > 0:
            return seconds
    return None


def _exact_duration(info: dict) -> float | None:
    """The audio stream's duration where the container records it exactly (MP4 edit lists), else None.

    ffmpeg removes AAC's priming samples at the start but keeps the last frame's padding (up to ~23 ms);
    MP4/M4A/MOV files state the true length, so we trim to it. Durations elsewhere are estimates.
    """
    if not info.get("format", {}).get("format_name", "").startswith("mov,mp4"):
        return None
    audio = next(s for s in info.get("streams", []) if s.get("codec_type") == "audio")
    try:
        return float(audio["duration"])
    except (KeyError, TypeError, ValueError):
        return None


def decode(path: str | Path, *, max_seconds: float | None = None) -> DecodedAudio:
    """Decode the first audio stream of ``path`` to 16 kHz mono int16 PCM.

    Raises a ``DecodeError`` subclass for empty, unsupported, corrupt or over-long input (``max_seconds``,
    unlimited when ``None``), and ``FileNotFoundError`` for a missing file.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise EmptyAudioError(path, "file is empty (0 bytes)")
    info = probe(path)
    expected = probed_duration(info)
    max_samples = int(max_seconds * SAMPLE_RATE) if max_seconds else None
    # Headroom over the probed length (estimates for VBR mp3 run a little short), so it rarely grows.
    capacity = int(((expected or 60.0) * 1.01 + 1.0) * SAMPLE_RATE)
    if max_samples is not None:
        capacity = min(capacity, max_samples + 1)

    cmd = [
        AudioSegment.converter, "-nostdin", "-hide_banner", "-v", "error", "-i", str(path),
        "-map", "0:a:0", "-vn", "-sn", "-dn", "-ac", "1", "-ar", str(SAMPLE_RATE),
        "-f", "s16le", "-acodec", "pcm_s16le", "pipe:1",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as errfile:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errfile, bufsize=0)
        try:
            pcm, filled = _read_pcm(proc, capacity, max_samples, path)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()  # type: ignore[union-attr]
            returncode = proc.wait()
        errfile.seek(0)
        complaints = [line for line in errfile.read().decode("utf-8", "replace").splitlines() if line.strip()]

    n = filled // 2
    if returncode != 0:
        raise CorruptAudioError(path, f"ffmpeg failed ({_last_lines(complaints) or f'exit {returncode}'})")
    if n == 0:
        if complaints:
            raise CorruptAudioError(path, f"no audio could be decoded ({_last_lines(complaints)})")
        raise EmptyAudioError(path, "contains no audio samples")
    exact = _exact_duration(info)
    if exact and n > exact * SAMPLE_RATE > n - _MAX_PADDING * SAMPLE_RATE:
        n = round(exact * SAMPLE_RATE)  # drop the codec's end padding, as the container says
    pcm.resize(n, refcheck=False)  # shrink in place (realloc), no second copy
    warnings = complaints[-_MAX_WARNINGS:]
    if expected and n < 0.9 * expected * SAMPLE_RATE:
        warnings.append(f"decoded {n / SAMPLE_RATE:.2f} s of the {expected:.2f} s the file header announces")
    return DecodedAudio(source=str(path), pcm=pcm, warnings=warnings)


def _read_pcm(proc: subprocess.Popen, capacity: int, max_samples: int | None, path: Path) -> tuple[np.ndarray, int]:
    """Read ffmpeg's s16le stdout into an int16 buffer, growing it only once it is full.

    Returns (buffer, bytes filled). With a right probe the buffer never grows; when it must (a probe
    that under-reports), it grows by a quarter, which may copy: the rare case costs ~2.25x, not more.
    """
    pcm = np.empty(max(capacity, 1), dtype=np.int16)
    filled = 0
    stdout = proc.stdout
    assert stdout is not None
    while True:
        if filled == pcm.nbytes:
            if max_samples is not None and filled // 2 > max_samples:
                raise AudioTooLongError(path, f"longer than the {max_samples / SAMPLE_RATE:.0f} s limit")
            pcm.resize(pcm.shape[0] + max(_BLOCK_BYTES, pcm.shape[0] // 4), refcheck=False)
        with memoryview(pcm).cast("B") as view:
            got = stdout.readinto(view[filled : min(filled + _BLOCK_BYTES, pcm.nbytes)])
        if not got:
            break
        filled += got
    if max_samples is not None and filled // 2 > max_samples:
        raise AudioTooLongError(path, f"longer than the {max_samples / SAMPLE_RATE:.0f} s limit")
    return pcm, filled - filled % 2


def _last_lines(text: str | list[str], count: int = 3) -> str:
    lines = text.splitlines() if isinstance(text, str) else text
    return "; ".join(line.strip() for line in lines[-count:] if line.strip())
