"""Archive expansion: safe paths, refused links and devices, streamed limits, per-member failures."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.unit.ingest_audio import tone, write_wav
from workers.archive import (
    ArchiveLimitError,
    ArchiveLimits,
    CorruptArchiveError,
    archive_kind,
    expand_archive,
    iter_recordings,
)
from workers.decode import decode
from workers.types import MemberFailure, RecordingFile

LIMITS = ArchiveLimits(max_members=100, max_member_bytes=4 << 20, max_total_bytes=16 << 20)


@pytest.fixture(scope="module")
def wav_bytes(tmp_path_factory) -> bytes:
    path = write_wav(tmp_path_factory.mktemp("wav") / "t.wav", tone(0.5))
    return path.read_bytes()


def make_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=compression)
    return path


def add_tar(tf: tarfile.TarFile, name: str, data: bytes = b"", **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tf.addfile(info, io.BytesIO(data) if data else None)


def reasons(failures: list[MemberFailure]) -> dict[str, str]:
    return {f.member: f.reason for f in failures}


def test_zip_slip_absolute_and_junk(tmp_path, wav_bytes):
    archive = make_zip(
        tmp_path / "upload.zip",
        {
            "week1/lecture.wav": wav_bytes,
            "../evil.wav": wav_bytes,
            "week1/../../evil2.wav": wav_bytes,
            "/etc/evil.wav": wav_bytes,
            "C:/evil.wav": wav_bytes,
            "week1/notes.txt": b"hello",
            "__MACOSX/week1/._lecture.wav": b"\0\5\26\7",
            "week1/": b"",
            "week2\\talk.wav": wav_bytes,
        },
    )
    dest = tmp_path / "out" / "x"
    result = expand_archive(archive, dest, LIMITS)
    assert [r.name for r in result.recordings] == ["week1/lecture.wav", "week2/talk.wav"]
    for recording in result.recordings:
        assert recording.path.parent == dest and recording.archive == str(archive)
        assert decode(recording.path).num_samples == 8000
    got = reasons(result.failures)
    assert "escapes the archive" in got["../evil.wav"]
    assert "escapes the archive" in got["week1/../../evil2.wav"]
    assert "absolute" in got["/etc/evil.wav"] and "absolute" in got["C:/evil.wav"]
    assert "not an audio file" in got["week1/notes.txt"]
    skipped = {f.member for f in result.failures if f.skipped}
    assert skipped == {"week1/notes.txt", "__MACOSX/week1/._lecture.wav"}
    assert not list(tmp_path.rglob("evil*.wav"))


def test_zip_symlink_member_refused(tmp_path, wav_bytes):
    archive = tmp_path / "links.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        link = zipfile.ZipInfo("link.wav")
        link.create_system = 3
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr("real.wav", wav_bytes)
    result = expand_archive(archive, tmp_path / "out", LIMITS)
    assert [r.name for r in result.recordings] == ["real.wav"]
    assert reasons(result.failures) == {"link.wav": "symbolic link refused"}


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"])
def test_tar_variants_refuse_links_and_devices(tmp_path, wav_bytes, suffix):
    archive = tmp_path / f"semester{suffix}"
    mode = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.bz2": "w:bz2", ".tar.xz": "w:xz"}[suffix]
    with tarfile.open(archive, mode) as tf:
        add_tar(tf, "a/one.wav", wav_bytes)
        add_tar(tf, "a", type=tarfile.DIRTYPE)
        add_tar(tf, "a/sym.wav", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add_tar(tf, "a/hard.wav", type=tarfile.LNKTYPE, linkname="a/one.wav")
        add_tar(tf, "a/dev.wav", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        add_tar(tf, "a/fifo.wav", type=tarfile.FIFOTYPE)
        add_tar(tf, "../up.wav", wav_bytes)
        add_tar(tf, "a/readme.md", b"# notes")
        add_tar(tf, "a/two.mp3", wav_bytes)  # a WAV misnamed .mp3 still decodes: ffmpeg sniffs content
        add_tar(tf, "a/one.wav", wav_bytes)  # duplicate name
    assert archive_kind(archive) == "tar"
    result = expand_archive(archive, tmp_path / "out", LIMITS)
    assert [r.name for r in result.recordings] == ["a/one.wav", "a/two.mp3"]
    assert all(decode(r.path).num_samples == 8000 for r in result.recordings)
    got = reasons(result.failures)
    assert got["a/sym.wav"] == "symbolic link refused"
    assert got["a/hard.wav"] == "hard link refused"
    assert got["a/dev.wav"] == got["a/fifo.wav"] == "device or special file refused"
    assert "escapes the archive" in got["../up.wav"]
    assert got["a/one.wav"] == "duplicate member name"
    assert "not an audio file" in got["a/readme.md"]


def test_zip_bomb_member_stops_at_member_limit(tmp_path, wav_bytes):
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("good.wav", wav_bytes)
        with zf.open("bomb.wav", "w") as member:  # 32 MB of zeros -> ~32 KB compressed
            block = bytes(1 << 20)
            for _ in range(32):
                member.write(block)
        zf.writestr("also-good.wav", wav_bytes)
    assert archive.stat().st_size < 200_000
    limits = ArchiveLimits(max_members=10, max_member_bytes=1 << 20, max_total_bytes=64 << 20)
    result = expand_archive(archive, tmp_path / "out", limits)
    assert [r.name for r in result.recordings] == ["good.wav", "also-good.wav"]
    assert "member limit" in reasons(result.failures)["bomb.wav"]
    assert sum(f.stat().st_size for f in (tmp_path / "out").iterdir()) == 2 * len(wav_bytes)


def test_total_byte_limit_is_counted_not_trusted(tmp_path, wav_bytes):
    members = {f"part{i}.wav": wav_bytes + bytes(300_000) for i in range(4)}
    archive = make_zip(tmp_path / "big.zip", members)
    limits = ArchiveLimits(max_members=10, max_member_bytes=1 << 20, max_total_bytes=1_000_000)
    with pytest.raises(ArchiveLimitError, match=r"big\.zip.*uncompressed bytes.*part3\.wav"):
        expand_archive(archive, tmp_path / "out", limits)
    assert not list((tmp_path / "out").iterdir())  # what was extracted is removed again
    # Streaming over several inputs: the members before the limit come through, then one failure.
    items = list(iter_recordings([archive], tmp_path / "work", limits))
    assert [i.name for i in items if isinstance(i, RecordingFile)] == ["part0.wav", "part1.wav", "part2.wav"]
    assert isinstance(items[-1], MemberFailure) and items[-1].member == ""


def test_member_count_limit(tmp_path, wav_bytes):
    archive = make_zip(tmp_path / "many.zip", {f"{i}.wav": wav_bytes for i in range(5)})
    with pytest.raises(ArchiveLimitError, match="5 members"):
        expand_archive(archive, tmp_path / "out", ArchiveLimits(max_members=3))
    tar = tmp_path / "many.tar"
    with tarfile.open(tar, "w") as tf:
        for i in range(5):
            add_tar(tf, f"{i}.wav", wav_bytes)
    with pytest.raises(ArchiveLimitError, match="limit of 3"):
        expand_archive(tar, tmp_path / "out2", ArchiveLimits(max_members=3))


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_one_corrupt_member_among_good_ones(tmp_path, compression):
    pcms = [tone(0.5, freq) for freq in (300, 400, 500)]
    members = {f"m{i}.wav": write_wav(tmp_path / f"m{i}.wav", p).read_bytes() for i, p in enumerate(pcms)}
    archive = make_zip(tmp_path / "mixed.zip", members, compression)
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo("m1.wav")
    third = info.compress_size // 3  # flip the middle third of its compressed bytes
    start = info.header_offset + 30 + len(info.filename) + third
    data[start : start + third] = bytes(b ^ 0x5A for b in data[start : start + third])
    archive.write_bytes(bytes(data))
    result = expand_archive(archive, tmp_path / "out", LIMITS)
    assert [r.name for r in result.recordings] == ["m0.wav", "m2.wav"]
    assert "corrupt member" in reasons(result.failures)["m1.wav"]
    np.testing.assert_array_equal(decode(result.recordings[1].path).pcm, pcms[2])


def test_truncated_tgz_keeps_the_members_before_the_damage(tmp_path, wav_bytes):
    archive = tmp_path / "cut.tgz"
    noise = np.random.default_rng(0).integers(-20000, 20000, 16000 * 4).astype(np.int16)
    loud = write_wav(tmp_path / "n.wav", noise).read_bytes()  # incompressible: the cut lands in it
    with tarfile.open(archive, "w:gz") as tf:
        add_tar(tf, "first.wav", wav_bytes)
        add_tar(tf, "second.wav", loud)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    items = list(iter_recordings([archive], tmp_path / "work", LIMITS))
    assert isinstance(items[0], RecordingFile) and items[0].name == "first.wav"
    assert isinstance(items[-1], MemberFailure)
    assert items[-1].member in ("", "second.wav")


def test_not_an_archive(tmp_path):
    bogus = tmp_path / "upload.zip"
    bogus.write_bytes(b"this is not a zip file at all" * 10)
    with pytest.raises(CorruptArchiveError, match=r"upload\.zip"):
        expand_archive(bogus, tmp_path / "out", LIMITS)
    with pytest.raises(CorruptArchiveError):
        expand_archive(tmp_path / "x.tar.gz", tmp_path / "out", LIMITS)  # missing file


def test_iter_recordings_mixes_files_and_archives(tmp_path, wav_bytes):
    plain = write_wav(tmp_path / "solo.wav", tone(0.25))
    zipped = make_zip(tmp_path / "bundle.bin", {"x/a.wav": wav_bytes, "x/b.txt": b"b"})  # sniffed as zip
    assert archive_kind(zipped) == "zip" and archive_kind(plain) is None
    items = list(iter_recordings([plain, zipped, tmp_path / "missing.mp3"], tmp_path / "work", LIMITS))
    recordings = [i for i in items if isinstance(i, RecordingFile)]
    failures = [i for i in items if isinstance(i, MemberFailure)]
    assert [(r.name, r.archive) for r in recordings] == [("solo.wav", None), ("x/a.wav", str(zipped))]
    assert recordings[0].path == plain
    assert [(f.member, f.skipped) for f in failures] == [("x/b.txt", True), ("", False)]
    assert "not found" in failures[-1].reason


def test_reexpanding_into_the_same_folder_is_idempotent(tmp_path, wav_bytes):
    archive = make_zip(tmp_path / "again.zip", {"a.wav": wav_bytes})
    first = expand_archive(archive, tmp_path / "out", LIMITS)
    second = expand_archive(archive, tmp_path / "out", LIMITS)
    assert [r.path for r in first.recordings] == [r.path for r in second.recordings]
    assert second.recordings[0].path.read_bytes() == wav_bytes
