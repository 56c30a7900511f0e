"""Service-edge commands of the ``specscribe`` CLI: the API server, API keys, the S3 listener, Flower,
and the HTTP client commands (submit, status, fetch). :mod:`api.cli` mounts them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer

keys_app = typer.Typer(help="API keys (stored hashed).", no_args_is_help=True)
FINAL = {"done", "failed", "cancelled"}


def serve(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8000, help="Port."),
    workers: int = typer.Option(1, min=1, help="uvicorn worker processes."),
) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers, proxy_headers=True)


@keys_app.command("create")
def keys_create(name: str = typer.Argument(..., help="Who the key is for.")) -> None:
    """Create an API key and print it (only its hash is stored: it cannot be shown again)."""
    from api.auth import create_key
    from workers.jobstore import session_factory
    from workers.settings import get_settings

    key_id, key = create_key(session_factory(get_settings().database_url), name)
    typer.echo(f"key {key_id} for {name}:", err=True)
    typer.echo(key)


def s3_listen() -> None:
    """Long-poll the SQS queue of S3 ObjectCreated notifications; one job per new object."""
    import logging

    from api.s3_events import SqsListener
    from workers.jobstore import session_factory
    from workers.settings import get_settings
    from workers.tasks import CeleryDispatcher

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    if not settings.sqs_queue_url:
        raise typer.BadParameter("set SPECSCRIBE_SQS_QUEUE_URL")
    SqsListener(session_factory(settings.database_url), CeleryDispatcher(), settings).run()


def flower(port: int = typer.Option(5555, help="Port."), address: str = typer.Option("0.0.0.0", help="Bind.")) -> None:
    """Run Flower on the service's broker (task args are job ids, chunk ids and recording ids)."""
    celery = [sys.executable, "-m", "celery", "-A", "workers.celery_app"]  # this interpreter's: PATH may lack it
    os.execv(sys.executable, [*celery, "flower", f"--port={port}", f"--address={address}"])


def _client():
    from api.client import ApiClient
    from workers.settings import get_settings

    settings = get_settings()
    return ApiClient(settings.api_url, settings.api_key)


def submit(
    source: str = typer.Argument(..., help="A local recording/archive, or s3://bucket/key-or-prefix/."),
    wait: bool = typer.Option(False, help="Show progress until the job ends."),
    pair: str | None = typer.Option(None, help="VERIFIER+DRAFTER."),
    language: str | None = typer.Option(None, help="Language code."),
    formats: str = typer.Option("txt,srt,vtt,json", "--format", "-f", help="Comma-separated output formats."),
    output_prefix: str | None = typer.Option(None, help="s3:// prefix for the outputs."),
    callback_url: str | None = typer.Option(None, help="URL that gets one POST when the job ends."),
) -> None:
    """Submit a job to the service; prints its id."""
    if not source.startswith("s3://") and not Path(source).is_file():
        raise typer.BadParameter(f"{source} is not a file")
    client = _client()
    options = {"pair": pair, "language": language, "output_prefix": output_prefix, "callback_url": callback_url}
    job_id = client.submit(source, {**options, "formats": [f.strip() for f in formats.split(",") if f.strip()]})
    typer.echo(job_id)
    if wait:
        job = _wait(client, job_id)
        raise typer.Exit(0 if job["status"] == "done" else 1)


def _wait(client, job_id: str, interval: float = 2.0) -> dict:
    """Poll the job with a progress bar (chunks done / total) until it ends."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("queued", total=None)
        while True:
            job = client.job(job_id)
            bar.update(task, description=job["status"], completed=job["chunks_done"], total=job["chunks_total"] or None)
            if job["status"] in FINAL:
                return job
            time.sleep(interval)


def status(job_id: str = typer.Argument(..., help="Job id.")) -> None:
    """Print a job's status, progress and recordings."""
    job = _client().job(job_id)
    typer.echo(f"{job['id']} {job['status']} {job['progress_percent']}% ({job['chunks_done']}/{job['chunks_total']})")
    for key in ("eta_seconds", "acceptance_rate", "real_time_factor"):
        if job.get(key) is not None:
            typer.echo(f"  {key}: {job[key]}")
    for r in job["recordings"]:
        typer.echo(f"  [{r['id']}] {r['name']}: {r['status']}" + (f" ({r['error']})" if r["error"] else ""))


def fetch(
    job_id: str = typer.Argument(..., help="Job id."),
    fmt: str = typer.Option("srt", "--format", "-f", help="txt, srt, vtt or json."),
    out: Path = typer.Option(Path("."), "--out", "-o", help="Folder for the files."),
) -> None:
    """Download every finished recording's transcript as ``<out>/<recording>.<format>``."""
    client = _client()
    out.mkdir(parents=True, exist_ok=True)
    for r in client.job(job_id)["recordings"]:
        if r["status"] != "done":
            typer.echo(f"{r['name']}: {r['status']}, skipped", err=True)
            continue
        path = out / f"{Path(r['name']).stem or r['id']}.{fmt}"
        path.write_text(client.transcript(job_id, r["id"], fmt), encoding="utf-8")
        typer.echo(str(path))
