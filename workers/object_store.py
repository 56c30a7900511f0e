"""Object storage (S3, MinIO, moto) through boto3: the bucket allow-list, streamed uploads, fetching
``s3://`` job inputs for the ingest stage, and writing rendered transcripts to an output prefix.

The endpoint comes from ``settings.s3_endpoint_url``; credentials from boto3's usual sources
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` environment variables, profiles, instance roles).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from workers.settings import Settings

S3_SCHEME = "s3://"
PART_BYTES = 8 << 20
"""Multipart upload part size (S3 needs at least 5 MiB for every part but the last)."""
CONTENT_TYPES = {"txt": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt", "json": "application/json"}


class SourceNotAllowed(ValueError):
    """An ``s3://`` URI that is malformed or names a bucket outside the allow-list."""


class UploadTooLarge(ValueError):
    """An upload grew past the configured limit (the partial upload was aborted)."""


def is_s3_uri(value: str) -> bool:
    return value.startswith(S3_SCHEME)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; the key may be empty or a prefix."""
    if not is_s3_uri(uri):
        raise SourceNotAllowed(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise SourceNotAllowed(f"no bucket in {uri!r}")
    return bucket, key


def allowed_buckets(settings: Settings) -> frozenset[str]:
    """The buckets ``s3://`` sources and output prefixes may name (the upload bucket always may)."""
    names = {b.strip() for b in settings.s3_allowed_buckets.split(",") if b.strip()}
    return frozenset(names | {settings.upload_bucket})


def check_allowed(uri: str, settings: Settings) -> tuple[str, str]:
    """Parse ``uri`` and refuse a bucket outside the allow-list, without any S3 call."""
    bucket, key = parse_s3_uri(uri)
    if bucket not in allowed_buckets(settings):
        raise SourceNotAllowed(f"bucket {bucket!r} is not in the allow-list")
    return bucket, key


@lru_cache(maxsize=8)
def _client(endpoint: str, region: str) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region, config=config)


def s3_client(settings: Settings) -> Any:
    """A (cached) boto3 S3 client for the configured endpoint."""
    return _client(settings.s3_endpoint_url, settings.s3_region)


class StreamingUpload:
    """Writes a stream to one object with a multipart upload, part by part, never holding it whole.

    Exceeding ``max_bytes`` aborts the upload (nothing stays stored) and raises :class:`UploadTooLarge`.
    """

    def __init__(self, client: Any, bucket: str, key: str, max_bytes: int, content_type: str = "") -> None:
        self.client, self.bucket, self.key, self.max_bytes = client, bucket, key, max_bytes
        extra = {"ContentType": content_type} if content_type else {}
        self.upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, **extra)["UploadId"]
        self.parts: list[dict[str, Any]] = []
        self.buffer = bytearray()
        self.size = 0
        self.finished = False
        """Completed or aborted."""

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            self.abort()
            raise UploadTooLarge(f"upload larger than {self.max_bytes} bytes")
        self.buffer += data
        while len(self.buffer) >= PART_BYTES:
            self._flush(PART_BYTES)

    def _flush(self, size: int | None = None) -> None:
        """Send the first ``size`` buffered bytes (all by default) as the next part."""
        size = len(self.buffer) if size is None else size
        number = len(self.parts) + 1
        answer = self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=bytes(self.buffer[:size])
        )
        self.parts.append({"PartNumber": number, "ETag": answer["ETag"]})
        del self.buffer[:size]

    def complete(self) -> int:
        """Finish the object; returns its size in bytes."""
        if self.buffer or not self.parts:
            self._flush()
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": self.parts}
        )
        self.finished = True
        return self.size

    def abort(self) -> None:
        """Drop the parts sent so far (once)."""
        self.buffer.clear()
        if not self.finished:
            self.finished = True
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)


def _object_keys(client: Any, bucket: str, key: str) -> list[str]:
    """The object ``key`` itself, or (for a prefix) every object under it in key order."""
    if key and not key.endswith("/"):
        try:
            client.head_object(Bucket=bucket, Key=key)
            return [key]
        except client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        key += "/"
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        keys += [item["Key"] for item in page.get("Contents", []) if not item["Key"].endswith("/")]
    return sorted(keys)


def fetch_inputs(inputs: Iterable[str], work_dir: Path, settings: Settings) -> Iterator[str]:
    """Local paths for a job's inputs: local paths pass through; ``s3://`` objects (or every object under
    an ``s3://`` prefix, in key order) are downloaded under ``work_dir``. A missing source yields a path
    that does not exist, so the ingest stage fails that input ("input file not found"), not the job."""
    for number, item in enumerate(inputs):
        if not is_s3_uri(item):
            yield item
            continue
        bucket, key = check_allowed(item, settings)
        client = s3_client(settings)
        keys = _object_keys(client, bucket, key)
        if not keys:
            yield str(work_dir / f"s3-{number:04d}" / (PurePosixPath(key).name or bucket))
        for index, object_key in enumerate(keys):
            dest = work_dir / f"s3-{number:04d}" / f"{index:05d}" / PurePosixPath(object_key).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, object_key, str(dest))
            yield str(dest)


def output_prefix_for(source: str, settings: Settings) -> str:
    """Where a bucket-triggered job's outputs go: the configured output prefix, else next to the object."""
    if settings.s3_output_prefix:
        return settings.s3_output_prefix
    bucket, key = parse_s3_uri(source)
    parent = str(PurePosixPath(key).parent)
    return f"{S3_SCHEME}{bucket}/" + ("" if parent in ("", ".") else parent + "/")


def publish_outputs(outputs: dict[str, str], prefix: str, stem: str, settings: Settings) -> dict[str, str]:
    """Write rendered transcripts as ``<prefix>/<stem>.<format>``; returns their URIs by format."""
    bucket, key = check_allowed(prefix, settings)
    base = key.rstrip("/")
    client = s3_client(settings)
    written = {}
    for name, text in outputs.items():
        object_key = f"{base}/{stem}.{name}" if base else f"{stem}.{name}"
        client.put_object(
            Bucket=bucket, Key=object_key, Body=text.encode("utf-8"), ContentType=CONTENT_TYPES.get(name, "text/plain")
        )
        written[name] = f"{S3_SCHEME}{bucket}/{object_key}"
    return written
