"""Expand zip and tar archives of recordings safely, and turn a list of inputs into recordings.

Nothing from an archive is trusted: member names are only kept as recording names (files are written
under generated names in the destination folder, opened exclusively), names with ``..`` or absolute
paths are refused anyway, links and device files are refused, and sizes are counted while the bytes
stream out rather than read from headers, so a zip bomb stops at the configured limit. A member that
cannot be read becomes a ``MemberFailure`` and the other members still come through; members that are
not audio are skipped with a reason.
"""

from __future__ import annotations

import lzma
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from workers.settings import Settings, get_settings
from workers.types import MemberFailure, RecordingFile

AUDIO_EXTENSIONS = frozenset(
    {
        *(".wav", ".wave", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".oga", ".opus", ".webm", ".weba"),
        *(".mp4", ".m4v", ".mkv", ".mka", ".mov", ".avi", ".wma", ".wmv", ".aif", ".aiff", ".amr"),
        *(".3gp", ".mpga", ".mpeg", ".mpg", ".ts", ".caf"),
    }
)
"""Member suffixes treated as recordings (ffmpeg decides later whether they really are)."""

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
_COPY_BLOCK = 1 << 20
_ARCHIVE_READ_ERRORS = (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError)


class ArchiveError(Exception):
    """An archive as a whole could not be expanded; the message names the file."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class CorruptArchiveError(ArchiveError):
    """Not a readable zip/tar file."""


class ArchiveLimitError(ArchiveError):
    """Too many members or too many uncompressed bytes (a zip bomb, or simply too big)."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Bounds on one archive; bytes are counted as they are extracted."""

    max_members: int = 10_000
    max_member_bytes: int = 8 << 30
    max_total_bytes: int = 32 << 30

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> ArchiveLimits:
        s = settings or get_settings()
        return cls(s.archive_max_members, s.archive_max_member_bytes, s.archive_max_total_bytes)


@dataclass
class ExpandedArchive:
    """What came out of one archive: recordings (in archive order) and members that did not."""

    recordings: list[RecordingFile] = field(default_factory=list)
    failures: list[MemberFailure] = field(default_factory=list)


class _MemberTooLarge(Exception):
    pass


def archive_kind(path: str | Path) -> str | None:
    """``"zip"`` or ``"tar"`` for archives (by suffix, else by content), ``None`` for anything else."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith(_TAR_SUFFIXES):
        return "tar"
    if path.suffix.lower() in AUDIO_EXTENSIONS or not path.is_file():
        return None
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    try:
        return "tar" if tarfile.is_tarfile(path) else None
    except _ARCHIVE_READ_ERRORS:
        return None


def expand_archive(path: str | Path, dest: str | Path, limits: ArchiveLimits | None = None) -> ExpandedArchive:
    """Extract the audio members of a zip/tar archive into ``dest``.

    Raises ``CorruptArchiveError`` if the archive cannot be opened and ``ArchiveLimitError`` if it
    holds too many members or bytes (files already extracted are removed then).
    """
    result = ExpandedArchive()
    try:
        for item in iter_archive(path, dest, limits):
            (result.recordings if isinstance(item, RecordingFile) else result.failures).append(item)
    except ArchiveError:
        for recording in result.recordings:
            recording.path.unlink(missing_ok=True)
        raise
    return result


def iter_archive(
    path: str | Path, dest: str | Path, limits: ArchiveLimits | None = None
) -> Iterator[RecordingFile | MemberFailure]:
    """Extract members one by one, yielding each recording or member failure as it is reached."""
    path, dest = Path(path), Path(dest)
    limits = limits or ArchiveLimits.from_settings()
    kind = archive_kind(path)
    if kind is None:
        raise CorruptArchiveError(path, "not a zip or tar archive")
    dest.mkdir(parents=True, exist_ok=True)
    members = _zip_members(path, limits) if kind == "zip" else _tar_members(path, limits)
    seen: set[str] = set()
    total = 0
    for index, (raw_name, refusal, open_member) in enumerate(members):
        name, reason, skipped = _admit(raw_name, refusal, seen)
        if reason:
            yield MemberFailure(str(path), name or raw_name, reason, skipped)
            continue
        seen.add(name)
        target = dest / f"{index:05d}{_safe_suffix(name)}"
        target.unlink(missing_ok=True)  # left over from an earlier, interrupted attempt
        try:
            with _opened(open_member) as src:
                written = _copy_limited(src, target, limits.max_member_bytes, limits.max_total_bytes - total)
        except _MemberTooLarge:
            target.unlink(missing_ok=True)
            reason = f"larger than the {limits.max_member_bytes} byte member limit"
            yield MemberFailure(str(path), name, reason)
            continue
        except ArchiveLimitError:
            target.unlink(missing_ok=True)
            raise ArchiveLimitError(
                path, f"more than {limits.max_total_bytes} uncompressed bytes (reached at {name!r})"
            ) from None
        except _ARCHIVE_READ_ERRORS as exc:
            target.unlink(missing_ok=True)
            yield MemberFailure(str(path), name, f"corrupt member: {exc}")
            continue
        total += written
        yield RecordingFile(name=name, path=target, archive=str(path))


def iter_recordings(
    inputs: Iterable[str | Path], work_dir: str | Path, limits: ArchiveLimits | None = None
) -> Iterator[RecordingFile | MemberFailure]:
    """Yield a recording for every plain input file and every audio member of every archive input.

    Archives are expanded under ``work_dir``; an archive that fails as a whole yields one
    ``MemberFailure`` with an empty member name, and the other inputs carry on.
    """
    work_dir = Path(work_dir)
    for number, item in enumerate(inputs):
        path = Path(item)
        if not path.is_file():
            yield MemberFailure(str(path), "", "input file not found")
            continue
        if archive_kind(path) is None:
            yield RecordingFile(name=path.name, path=path)
            continue
        dest = work_dir / f"archive-{number:04d}"
        try:
            yield from iter_archive(path, dest, limits)
        except ArchiveError as exc:
            yield MemberFailure(str(path), "", exc.reason)


# --- members ------------------------------------------------------------------------------------

_Member = tuple[str, str | None, Callable[[], IO[bytes] | None]]
"""(raw member name, refusal reason or None, opener of its bytes)."""


def _zip_members(path: Path, limits: ArchiveLimits) -> Iterator[_Member]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CorruptArchiveError(path, f"unreadable zip archive ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > limits.max_members:
            reason = f"{len(infos)} members, more than the limit of {limits.max_members}"
            raise ArchiveLimitError(path, reason)
        for info in infos:
            if info.is_dir():
                continue
            mode = info.external_attr >> 16
            refusal = None
            if stat.S_ISLNK(mode):
                refusal = "symbolic link refused"
            elif stat.S_IFMT(mode) and not stat.S_ISREG(mode):
                refusal = "special file refused"
            elif info.flag_bits & 0x1:
                refusal = "encrypted member"
            yield info.filename, refusal, (lambda info=info: zf.open(info))


def _tar_members(path: Path, limits: ArchiveLimits) -> Iterator[_Member]:
    try:
        # Stream mode: a compressed archive is read once, front to back (closed by the ``with`` below).
        tf = tarfile.open(path, mode="r|*")  # noqa: SIM115
    except _ARCHIVE_READ_ERRORS as exc:
        raise CorruptArchiveError(path, f"unreadable tar archive ({exc})") from None
    with tf:
        count = 0
        last = None
        while True:
            try:
                member = tf.next()
            except _ARCHIVE_READ_ERRORS as exc:
                where = f" after {last!r}" if last else ""
                raise CorruptArchiveError(path, f"tar archive is corrupt{where} ({exc})") from None
            if member is None:
                return
            count += 1
            if count > limits.max_members:
                raise ArchiveLimitError(path, f"more members than the limit of {limits.max_members}")
            last = member.name
            if member.isdir():
                continue
            refusal = None
            if member.issym():
                refusal = "symbolic link refused"
            elif member.islnk():
                refusal = "hard link refused"
            elif member.ischr() or member.isblk() or member.isfifo():
                refusal = "device or special file refused"
            elif not member.isreg():
                refusal = "unsupported tar entry type"
            yield member.name, refusal, (lambda member=member: tf.extractfile(member))


def _admit(raw_name: str, refusal: str | None, seen: set[str]) -> tuple[str, str | None, bool]:
    """(normalised name, failure/skip reason or None, whether it is a benign skip)."""
    name = raw_name.replace("\\", "/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return raw_name, "absolute path refused", False
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return raw_name, "path escapes the archive ('..') refused", False
    if not parts or "\x00" in name:
        return raw_name, "invalid member name", False
    name = "/".join(parts)
    if refusal:
        return name, refusal, False
    base = parts[-1]
    if parts[0] == "__MACOSX" or base.startswith("._") or base in (".DS_Store", "Thumbs.db"):
        return name, "operating-system metadata", True
    suffix = PurePosixPath(base).suffix.lower()
    if suffix not in AUDIO_EXTENSIONS:
        return name, f"not an audio file ({suffix or 'no extension'})", True
    if name in seen:
        return name, "duplicate member name", False
    return name, None, False


def _safe_suffix(name: str) -> str:
    suffix = PurePosixPath(name).suffix.lower()
    return suffix if re.fullmatch(r"\.[a-z0-9]{1,8}", suffix) else ""


@contextmanager
def _opened(open_member: Callable[[], IO[bytes] | None]) -> Iterator[IO[bytes]]:
    src = open_member()
    if src is None:
        raise OSError("member has no data")
    with src:
        yield src


def _copy_limited(src: IO[bytes], target: Path, member_limit: int, budget: int) -> int:
    """Copy ``src`` to a new file, counting bytes; raises when a limit is passed."""
    written = 0
    with open(target, "xb") as out:
        while block := src.read(_COPY_BLOCK):
            written += len(block)
            if written > member_limit:
                raise _MemberTooLarge
            if written > budget:
                raise ArchiveLimitError(target, "total byte limit")
            out.write(block)
    return written
