"""A small HTTP client of the service for the CLI (``submit``, ``status``, ``fetch``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from workers.object_store import is_s3_uri


class ApiClient:
    """Calls the service at ``url`` with API key ``key``."""

    def __init__(self, url: str, key: str, http: httpx.Client | None = None) -> None:
        self.http = http or httpx.Client(base_url=url.rstrip("/"), timeout=60.0)
        if key:
            self.http.headers["Authorization"] = f"Bearer {key}"

    def _check(self, answer: httpx.Response) -> httpx.Response:
        if answer.status_code >= 400:
            try:
                detail = answer.json().get("detail")
            except ValueError:
                detail = answer.text
            raise RuntimeError(f"HTTP {answer.status_code}: {detail}")
        return answer

    def submit(self, source: str, options: dict[str, Any]) -> str:
        """Upload a file (streamed) or name an ``s3://`` source; returns the job id."""
        options = {k: v for k, v in options.items() if v}
        if is_s3_uri(source):
            return self._check(self.http.post("/v1/jobs", json={"source": source, **options})).json()["job_id"]
        fields = {k: ",".join(v) if isinstance(v, list) else str(v) for k, v in options.items()}
        with Path(source).open("rb") as f:
            answer = self.http.post("/v1/jobs", data=fields, files={"file": (Path(source).name, f)}, timeout=None)
        return self._check(answer).json()["job_id"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self._check(self.http.get(f"/v1/jobs/{job_id}")).json()

    def transcript(self, job_id: str, recording_id: int, fmt: str) -> str:
        url = f"/v1/jobs/{job_id}/recordings/{recording_id}/transcript"
        return self._check(self.http.get(url, params={"format": fmt})).text
