"""Decoding every supported container/codec to 16 kHz mono int16, and typed errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.ingest_audio import SR, ffmpeg, sentence, tone, work_dir, write_wav
from workers import decode as decode_module
from workers.decode import (
    AudioTooLongError,
    CorruptAudioError,
    DecodeError,
    EmptyAudioError,
    UnsupportedAudioError,
    decode,
)

VIDEO = ["-f", "lavfi", "-i", "testsrc=size=64x48:rate=5"]
# name -> (output file, ffmpeg options before the output, tolerance in seconds)
FORMATS = {
    "wav": ("a.wav", ["-c:a", "pcm_s16le"], 0.010),
    "mp3": ("a.mp3", ["-c:a", "libmp3lame", "-b:a", "64k"], 0.010),
    "m4a": ("a.m4a", ["-c:a", "aac", "-b:a", "64k"], 0.010),
    "flac": ("a.flac", ["-c:a", "flac"], 0.010),
    "ogg-vorbis": ("a.ogg", ["-c:a", "libvorbis"], 0.010),
    "opus": ("a.opus", ["-c:a", "libopus", "-b:a", "32k"], 0.010),
    "webm": ("a.webm", ["-c:a", "libopus", "-b:a", "32k"], 0.010),
    "mp4-video": ("v.mp4", ["-map", "1:v", "-map", "0:a", "-c:v", "libx264", "-c:a", "aac"], 0.010),
    "mkv-video": ("v.mkv", ["-map", "1:v", "-map", "0:a", "-c:v", "mpeg4", "-c:a", "libopus"], 0.010),
    # Raw ADTS AAC has no container to carry the encoder delay (1024 priming samples at the source
    # rate), so ~23 ms of priming stays in: within 50 ms is the best any decoder can do.
    "aac-adts": ("a.aac", ["-c:a", "aac", "-b:a", "64k"], 0.050),
}


@pytest.fixture(scope="session")
def source(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """Speech then a tone, as a 44.1 kHz stereo WAV (so decoding must resample and downmix)."""
    base = tmp_path_factory.getbasetemp()
    pcm = np.concatenate([sentence(base, 0), np.zeros(SR // 2, np.int16), tone(0.75)])
    mono = write_wav(work_dir(base) / "decode-source-16k.wav", pcm)
    stereo = work_dir(base) / "decode-source.wav"
    ffmpeg("-i", str(mono), "-ar", "44100", "-ac", "2", str(stereo))
    return stereo, pcm


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_decodes_to_expected_duration(fmt, source, tmp_path):
    src, pcm = source
    name, options, tolerance = FORMATS[fmt]
    out = tmp_path / name
    video_input = VIDEO if "-map" in options else []
    ffmpeg("-i", str(src), *video_input, *options, "-t", f"{len(pcm) / SR:.6f}", str(out))
    audio = decode(out)
    assert audio.pcm.dtype == np.int16 and audio.pcm.ndim == 1
    assert audio.sample_rate == SR
    assert abs(audio.duration - len(pcm) / SR) <= tolerance, (fmt, audio.duration, len(pcm) / SR)
    assert audio.warnings == []
    # It is the same sound: loud where the source is loud (speech first, tone at the end).
    assert np.abs(audio.pcm[-SR // 2 :].astype(np.int32)).max() > 5000


def test_16k_mono_wav_decodes_bit_exact(tmp_path):
    pcm = (np.random.default_rng(0).normal(0, 3000, SR * 2)).astype(np.int16)
    audio = decode(write_wav(tmp_path / "x.wav", pcm))
    np.testing.assert_array_equal(audio.pcm, pcm)


def test_buffer_grows_when_probe_underestimates(tmp_path, monkeypatch):
    pcm = tone(5.0)
    monkeypatch.setattr(decode_module, "probed_duration", lambda info: 0.25)
    audio = decode(write_wav(tmp_path / "long.wav", pcm))
    np.testing.assert_array_equal(audio.pcm, pcm)
    assert audio.pcm.base is None and audio.pcm.nbytes == pcm.nbytes  # trimmed in place, owns its data


def test_zero_byte_file(tmp_path):
    path = tmp_path / "empty.mp3"
    path.write_bytes(b"")
    with pytest.raises(EmptyAudioError, match=r"empty\.mp3"):
        decode(path)


def test_text_file_named_mp3(tmp_path):
    path = tmp_path / "notes.mp3"
    path.write_text("These are my lecture notes, not audio.\n" * 20)
    with pytest.raises(UnsupportedAudioError, match=r"notes\.mp3.*not a recognised audio"):
        decode(path)


def test_truncated_mp3_decodes_what_is_there(source, tmp_path):
    src, pcm = source
    full = tmp_path / "full.mp3"
    ffmpeg("-i", str(src), "-c:a", "libmp3lame", "-b:a", "64k", str(full))
    data = full.read_bytes()
    cut = tmp_path / "cut.mp3"
    cut.write_bytes(data[: len(data) // 2])
    audio = decode(cut)
    assert 0.3 * len(pcm) / SR < audio.duration < 0.7 * len(pcm) / SR
    assert any("header announces" in w for w in audio.warnings)


def test_mp3_cut_inside_its_header(source, tmp_path):
    src, _ = source
    full = tmp_path / "full.mp3"
    ffmpeg("-i", str(src), "-c:a", "libmp3lame", str(full))
    stub = tmp_path / "stub.mp3"
    stub.write_bytes(full.read_bytes()[:40])
    with pytest.raises(DecodeError, match=r"stub\.mp3"):
        decode(stub)


def test_corrupt_flac_body(source, tmp_path):
    src, _ = source
    good = tmp_path / "good.flac"
    ffmpeg("-i", str(src), "-c:a", "flac", str(good))
    data = bytearray(good.read_bytes())
    data[200:] = bytes(len(data) - 200)  # header survives, every frame is zeroed
    bad = tmp_path / "bad.flac"
    bad.write_bytes(bytes(data))
    with pytest.raises((CorruptAudioError, EmptyAudioError), match=r"bad\.flac"):
        decode(bad)


def test_video_without_audio(tmp_path):
    path = tmp_path / "silent-film.mp4"
    ffmpeg(*VIDEO, "-t", "1", "-c:v", "libx264", str(path))
    with pytest.raises(UnsupportedAudioError, match="no audio stream"):
        decode(path)


def test_too_long(tmp_path):
    with pytest.raises(AudioTooLongError, match=r"long\.wav"):
        decode(write_wav(tmp_path / "long.wav", tone(3.0)), max_seconds=1.0)
