"""The HTTP API against real PostgreSQL and a moto S3 server: auth, tenancy, validation, uploads."""

from __future__ import annotations

import hashlib
import io

import pytest

from tests.integration import edge_fixtures
from tests.integration.edge_fixtures import ALLOWED_BUCKET, UPLOAD_BUCKET, UPLOAD_LIMIT, Edge
from workers.db_models import Job

edge, moto_endpoint = edge_fixtures.edge, edge_fixtures.moto_endpoint

pytestmark = pytest.mark.integration


def _objects(edge: Edge, bucket: str) -> list[str]:
    return [o["Key"] for o in edge.s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def _upload(edge: Edge, data: bytes, name: str = "week1.wav", key: str | None = None, **fields: str):
    files = {"file": (name, io.BytesIO(data), "audio/wav")}
    return edge.client.post("/v1/jobs", files=files, data=fields, headers=edge.headers(key))


def test_missing_or_invalid_key_is_401(edge: Edge) -> None:
    assert edge.client.get("/v1/jobs").status_code == 401
    assert edge.client.get("/v1/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert edge.client.get("/v1/jobs", headers={"X-API-Key": "nope"}).status_code == 401
    assert edge.client.post("/v1/jobs", json={"source": f"s3://{ALLOWED_BUCKET}/a.wav"}).status_code == 401
    assert edge.client.get("/v1/jobs", headers={"X-API-Key": edge.key}).status_code == 200


def test_source_job_is_created_and_only_its_owner_sees_it(edge: Edge) -> None:
    answer = edge.client.post(
        "/v1/jobs", json={"source": f"s3://{ALLOWED_BUCKET}/week1/", "language": "en", "formats": ["srt"]},
        headers=edge.headers(),
    )  # fmt: skip
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]
    assert ("ingest", job_id) in edge.dispatcher.queue
    mine = edge.client.get(f"/v1/jobs/{job_id}", headers=edge.headers())
    assert mine.status_code == 200
    assert mine.json()["status"] == "queued" and mine.json()["options"]["formats"] == ["srt"]
    assert edge.client.get(f"/v1/jobs/{job_id}", headers=edge.headers(edge.other_key)).status_code == 404
    assert edge.client.post(f"/v1/jobs/{job_id}/cancel", headers=edge.headers(edge.other_key)).status_code == 404
    url = f"/v1/jobs/{job_id}/recordings/1/transcript"
    assert edge.client.get(url, headers=edge.headers(edge.other_key)).status_code == 404
    listed = edge.client.get("/v1/jobs", params={"status": "queued"}, headers=edge.headers()).json()
    assert job_id in [j["id"] for j in listed["items"]]
    others = edge.client.get("/v1/jobs", headers=edge.headers(edge.other_key)).json()
    assert job_id not in [j["id"] for j in others["items"]]
    cancelled = edge.client.post(f"/v1/jobs/{job_id}/cancel", headers=edge.headers())
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert edge.client.post(f"/v1/jobs/{job_id}/cancel", headers=edge.headers()).status_code == 409


def test_disallowed_bucket_is_400_without_any_s3_call(edge: Edge) -> None:
    before = len(edge.s3_calls)
    answer = edge.client.post("/v1/jobs", json={"source": "s3://bucket-not-allowed/x"}, headers=edge.headers())
    assert answer.status_code == 400
    answer = edge.client.post(
        "/v1/jobs", json={"source": f"s3://{ALLOWED_BUCKET}/x", "output_prefix": "s3://bucket-not-allowed/out/"},
        headers=edge.headers(),
    )  # fmt: skip
    assert answer.status_code == 400
    assert len(edge.s3_calls) == before


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"source": "s3://lectures/a.wav", "formats": ["docx"]}', b'{"source": "http://x/y"}', b"[]",
     b'{"source": "s3://lectures/a.wav", "surprise": 1}'],
)  # fmt: skip
def test_malformed_submission_is_422(edge: Edge, body: bytes) -> None:
    headers = {**edge.headers(), "Content-Type": "application/json"}
    assert edge.client.post("/v1/jobs", content=body, headers=headers).status_code == 422


def test_unknown_transcript_format_is_422(edge: Edge) -> None:
    url = "/v1/jobs/x/recordings/1/transcript"
    assert edge.client.get(url, params={"format": "docx"}, headers=edge.headers()).status_code == 422


def test_upload_over_the_limit_is_413_with_nothing_stored(edge: Edge) -> None:
    before = set(_objects(edge, UPLOAD_BUCKET))
    with edge.app.state.sessions() as session:
        jobs_before = session.query(Job).count()
    # declared too large: refused before any S3 call
    calls = len(edge.s3_calls)
    assert _upload(edge, b"\x00" * (UPLOAD_LIMIT * 2)).status_code == 413
    assert len(edge.s3_calls) == calls
    # within the declared slack: refused while streaming, the multipart upload aborted
    assert _upload(edge, b"\x00" * (UPLOAD_LIMIT + 20_000)).status_code == 413
    assert set(_objects(edge, UPLOAD_BUCKET)) == before
    assert not edge.s3.list_multipart_uploads(Bucket=UPLOAD_BUCKET).get("Uploads")
    with edge.app.state.sessions() as session:
        assert session.query(Job).count() == jobs_before


def test_upload_creates_the_job_and_the_object(edge: Edge) -> None:
    data = bytes(range(256)) * 300
    answer = _upload(edge, data, name="../../evil/week 2.wav", formats="srt,txt", language="en")
    assert answer.status_code == 202, answer.text
    body = answer.json()
    uri = body["inputs"][0]
    assert uri == f"s3://{UPLOAD_BUCKET}/uploads/{body['job_id']}/week 2.wav"
    stored = edge.s3.get_object(Bucket=UPLOAD_BUCKET, Key=uri.split("/", 3)[3])["Body"].read()
    assert stored == data
    with edge.app.state.sessions() as session:
        job = session.get(Job, body["job_id"])
        assert job.inputs == [uri] and job.options["formats"] == ["srt", "txt"] and job.source == "week 2.wav"


def test_upload_of_several_parts_is_stored_whole(edge: Edge) -> None:
    """An upload bigger than one S3 part (8 MiB) arrives as a multipart object of three parts, byte for byte."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from workers.object_store import PART_BYTES

    settings = edge.settings.model_copy(update={"upload_max_bytes": 3 * PART_BYTES})
    client = TestClient(create_app(settings, edge.dispatcher))
    data = hashlib.sha256(b"seed").digest() * ((5 * PART_BYTES // 2) // 32)
    files = {"file": ("long lecture.wav", io.BytesIO(data), "audio/wav")}
    answer = client.post("/v1/jobs", files=files, headers=edge.headers())
    assert answer.status_code == 202, answer.text
    key = answer.json()["inputs"][0].split("/", 3)[3]
    head = edge.s3.head_object(Bucket=UPLOAD_BUCKET, Key=key)
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-3")
    stored = edge.s3.get_object(Bucket=UPLOAD_BUCKET, Key=key)["Body"].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()


def test_upload_with_bad_options_stores_nothing(edge: Edge) -> None:
    before = set(_objects(edge, UPLOAD_BUCKET))
    assert _upload(edge, b"abc", formats="docx").status_code == 422
    assert _upload(edge, b"abc", output_prefix="s3://bucket-not-allowed/o/").status_code == 400
    assert set(_objects(edge, UPLOAD_BUCKET)) == before


def test_health_and_metrics(edge: Edge) -> None:
    health = edge.client.get("/healthz")
    assert health.json()["checks"]["database"] == "ok" and health.json()["checks"]["s3"] == "ok"
    text = edge.client.get("/metrics").text
    assert 'specscribe_jobs{state="queued"}' in text and "specscribe_acceptance_rate" in text
    assert "specscribe_audio_seconds_transcribed_total" in text


def test_openapi_documents_both_submission_bodies(edge: Edge) -> None:
    schema = edge.client.get("/openapi.json").json()
    content = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(content)
    assert "JobSourceRequest" in schema["components"]["schemas"]


def test_cli_client_submits_and_reads_jobs(edge: Edge, tmp_path) -> None:
    from fastapi.testclient import TestClient

    from api.client import ApiClient

    client = ApiClient("", edge.key, http=TestClient(edge.app))
    job_id = client.submit(f"s3://{ALLOWED_BUCKET}/week3.wav", {"formats": ["vtt"], "language": None})
    assert client.job(job_id)["options"] == {"formats": ["vtt"]}
    (tmp_path / "w.wav").write_bytes(b"RIFF" + b"\x00" * 100)
    upload_id = client.submit(str(tmp_path / "w.wav"), {"formats": ["srt", "txt"]})
    assert client.job(upload_id)["source"] == "w.wav"
    with pytest.raises(RuntimeError, match="HTTP 404"):
        ApiClient("", edge.other_key, http=TestClient(edge.app)).job(job_id)


def test_callback_posts_the_outcome(edge: Edge) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from workers.callbacks import CallbackFailed, job_outcome, send_callback

    received: list[bytes] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204 if len(received) > 1 else 503)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    answer = edge.client.post(
        "/v1/jobs", json={"source": f"s3://{ALLOWED_BUCKET}/cb.wav", "callback_url": url}, headers=edge.headers()
    )
    job_id = answer.json()["job_id"]
    assert edge.client.post(f"/v1/jobs/{job_id}/cancel", headers=edge.headers()).status_code == 200
    assert job_id in edge.dispatcher.finished
    target, body = job_outcome(edge.app.state.sessions, job_id)
    assert target == url and body["status"] == "cancelled"
    with pytest.raises(CallbackFailed):  # 503: the task would retry with backoff
        send_callback(url, body)
    assert send_callback(url, body) == 204
    server.shutdown()
    assert len(received) == 2
