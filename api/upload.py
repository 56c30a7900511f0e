"""Streaming multipart uploads: the ``file`` part goes to S3 part by part as it arrives (never whole in
memory or on local disk); the other parts are small option fields. Over the size limit the multipart
upload is aborted and nothing is stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from fastapi import HTTPException, Request
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool

from workers.object_store import S3_SCHEME, StreamingUpload, UploadTooLarge, s3_client
from workers.settings import Settings

FIELD_MAX_BYTES = 4096
FIELDS = ("pair", "language", "formats", "output_prefix", "callback_url")


@dataclass
class Received:
    """An upload stored in S3 and the option fields sent with it."""

    uri: str = ""
    filename: str = ""
    size: int = 0
    fields: dict[str, str] = field(default_factory=dict)


def safe_name(filename: str) -> str:
    """The last path component of a client's file name, or ``upload``."""
    name = PurePosixPath(filename.replace("\\", "/")).name.strip()
    return name[-200:] if name and name not in (".", "..") else "upload"


class _Events:
    """Collects the parser's callbacks as a list of events, processed after each feed."""

    def __init__(self) -> None:
        self.items: list[tuple[str, object]] = []
        self.header_field = b""
        self.header_value = b""
        self.headers: dict[bytes, bytes] = {}

    def callbacks(self) -> dict:
        def header_end() -> None:
            self.headers[self.header_field.lower()] = self.header_value
            self.header_field = self.header_value = b""

        def headers_finished() -> None:
            self.items.append(("headers", dict(self.headers)))
            self.headers = {}

        def header_field(data: bytes, start: int, end: int) -> None:
            self.header_field += data[start:end]

        def header_value(data: bytes, start: int, end: int) -> None:
            self.header_value += data[start:end]

        return {
            "on_part_begin": lambda: None,
            "on_part_data": lambda data, start, end: self.items.append(("data", bytes(data[start:end]))),
            "on_part_end": lambda: self.items.append(("end", None)),
            "on_header_field": header_field,
            "on_header_value": header_value,
            "on_header_end": header_end,
            "on_headers_finished": headers_finished,
        }


async def receive_upload(request: Request, settings: Settings, job_id: str) -> Received:
    """Stream the request's ``file`` part to ``s3://<upload bucket>/<prefix>/<job id>/<name>``."""
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise HTTPException(422, "multipart body without a boundary")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.upload_max_bytes + 65536:
        raise HTTPException(413, f"upload larger than {settings.upload_max_bytes} bytes")
    events = _Events()
    parser = MultipartParser(boundary, events.callbacks())
    received, upload, current = Received(), None, None
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            for kind, value in events.items:
                if kind == "headers":
                    current, upload = await _begin_part(value, received, upload, settings, job_id)
                elif kind == "data" and current == "file":
                    await run_in_threadpool(upload.write, value)
                elif kind == "data" and current:
                    text = received.fields.get(current, "") + value.decode("utf-8", "replace")
                    if len(text) > FIELD_MAX_BYTES:
                        raise HTTPException(422, f"field {current!r} too long")
                    received.fields[current] = text
                elif kind == "end":
                    current = None
            events.items.clear()
        parser.finalize()
        if upload is None:
            raise HTTPException(422, "no file part named 'file'")
        received.size = await run_in_threadpool(upload.complete)
        return received
    except UploadTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except BaseException as exc:
        if upload is not None and not upload.finished:
            await run_in_threadpool(upload.abort)
        if isinstance(exc, FormParserError):
            raise HTTPException(422, f"malformed multipart body: {exc}") from None
        raise


async def _begin_part(
    headers: dict[bytes, bytes], received: Received, upload: StreamingUpload | None, settings: Settings, job_id: str
) -> tuple[str | None, StreamingUpload | None]:
    """Start a part: the file part opens the multipart upload; known fields are collected; others skipped."""
    _, options = parse_options_header(headers.get(b"content-disposition", b""))
    name = options.get(b"name", b"").decode("utf-8", "replace")
    if name == "file":
        if upload is not None:
            raise HTTPException(422, "only one file per job")
        received.filename = safe_name(options.get(b"filename", b"").decode("utf-8", "replace"))
        key = f"{settings.upload_prefix.strip('/')}/{job_id}/{received.filename}".lstrip("/")
        bucket, limit = settings.upload_bucket, settings.upload_max_bytes
        upload = await run_in_threadpool(StreamingUpload, s3_client(settings), bucket, key, limit)
        received.uri = f"{S3_SCHEME}{settings.upload_bucket}/{key}"
        return "file", upload
    if name in FIELDS:
        if name in received.fields:
            raise HTTPException(422, f"field {name!r} given twice")
        received.fields[name] = ""
        return name, upload
    raise HTTPException(422, f"unknown form field {name!r}")
