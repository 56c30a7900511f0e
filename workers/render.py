"""Render a stitched transcript as TXT, SRT, VTT or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from workers.types import Transcript

FORMATS = ("txt", "srt", "vtt", "json")


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(round(seconds * 1000), 0)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def render_txt(transcript: Transcript) -> str:
    """One segment per line."""
    return "".join(f"{s.text}\n" for s in transcript.segments)


def render_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm`` times, blank line between cues."""
    cues = [
        f"{n}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text}\n"
        for n, s in enumerate(transcript.segments, 1)
    ]
    return "\n".join(cues)


def render_vtt(transcript: Transcript) -> str:
    """WebVTT: header, then cues with ``HH:MM:SS.mmm`` times."""
    cues = [f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text}\n" for s in transcript.segments]
    return "\n".join(["WEBVTT\n", *cues])


def render_json(transcript: Transcript) -> str:
    """Text, language, duration, segments and decoding statistics."""
    document = {
        "text": transcript.text,
        "language": transcript.language,
        "duration": round(transcript.duration, 3),
        "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in transcript.segments],
        "stats": transcript.stats,
    }
    return json.dumps(document, ensure_ascii=False, indent=2) + "\n"


RENDERERS: dict[str, Callable[[Transcript], str]] = {
    "txt": render_txt,
    "srt": render_srt,
    "vtt": render_vtt,
    "json": render_json,
}


def render_all(transcript: Transcript, formats: Iterable[str] = FORMATS) -> dict[str, str]:
    """The transcript rendered in each of ``formats``."""
    return {name: RENDERERS[name](transcript) for name in formats}
