"""Pipeline commands of the ``specscribe`` CLI: local transcription, worker roles, schema upgrades, and
the pipeline benchmark. :mod:`api.cli` mounts them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

worker_app = typer.Typer(
    help="Run a Celery worker: ingest (CPU) or asr (one model pair on one device).", no_args_is_help=True
)
db_app = typer.Typer(help="Job store schema.", no_args_is_help=True)


def transcribe(
    inputs: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="Audio/video files or archives."),
    out: Path = typer.Option(Path("."), "--out", "-o", help="Folder for the transcripts."),
    formats: str = typer.Option("srt,vtt,txt,json", "--format", "-f", help="Comma-separated: srt, vtt, txt, json."),
    pair: str | None = typer.Option(None, help="VERIFIER+DRAFTER (default: the configured default pair)."),
    language: str | None = typer.Option(None, help="Language code (e.g. en); detected when omitted."),
    device: str = typer.Option("cpu", help="cpu or cuda:N."),
) -> None:
    """Transcribe files in this process (no Redis, PostgreSQL or workers needed)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from workers.local import local_pipeline, run_job, write_outputs

    console = Console(stderr=True)
    wanted = [f.strip() for f in formats.split(",") if f.strip()]
    pipe = local_pipeline()
    columns = (TextColumn("chunks"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("transcribe", total=None)
        job_id = run_job(
            pipe,
            [str(p) for p in inputs],
            pair=pair,
            language=language,
            device=device,
            progress=lambda done, total: bar.update(task, completed=done, total=total or None),
        )
    failed = 0
    for result in write_outputs(pipe, job_id, out, wanted):
        if result.files:
            console.print(f"[green]{result.name}[/]: " + ", ".join(str(f) for f in result.files))
        else:
            failed += 1
            console.print(f"[red]{result.name}[/]: {result.status}: {result.error}")
    raise typer.Exit(1 if failed else 0)


@worker_app.command("ingest")
def worker_ingest(
    concurrency: int = typer.Option(os.cpu_count() or 1, min=1, help="Prefork processes."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Consume the ``ingest`` queue: expand archives, decode, chunk; stitch finished recordings."""
    from workers.celery_app import INGEST_QUEUE, app

    app.worker_main(
        ["worker", "-Q", INGEST_QUEUE, "--pool", "prefork", "--concurrency", str(concurrency),
         "-n", "ingest@%h", "--loglevel", loglevel]
    )  # fmt: skip


@worker_app.command("asr")
def worker_asr(
    pair: str | None = typer.Option(None, help="VERIFIER+DRAFTER to serve (default: the configured default pair)."),
    device: str = typer.Option("cpu", help="cpu or cuda:N: the pair is loaded and pinned there."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="Chunks fetched and decoded as one group."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Consume one pair's ``asr.<pair>`` queue with the pair loaded once, in this process (solo pool).

    The solo pool keeps the model in the process that loaded it: no fork after CUDA initialisation, no
    per-child loading against Celery's 4 s ``worker_process_init`` limit. Run one worker per device.
    """
    os.environ["SPECSCRIBE_ASR_DEVICE"] = device
    os.environ["SPECSCRIBE_ASR_BATCH_SIZE"] = str(batch_size)
    from workers.settings import get_settings

    get_settings.cache_clear()
    pair = pair or get_settings().default_pair
    from workers.celery_app import app
    from workers.pairs import pair_decoder, pair_queue

    queue = pair_queue(pair)
    typer.echo(f"loading {pair} on {device} for queue {queue}", err=True)
    pair_decoder(pair, device, batch_size)
    app.worker_main(["worker", "-Q", queue, "--pool", "solo", "-n", f"{queue}.{device}@%h", "--loglevel", loglevel])


@db_app.command("upgrade")
def db_upgrade(
    url: str | None = typer.Option(None, help="Database URL (default: SPECSCRIBE_DATABASE_URL / settings)."),
    revision: str = typer.Option("head", help="Target revision."),
) -> None:
    """Create or migrate the job store schema (Alembic)."""
    from workers.jobstore import upgrade_database
    from workers.settings import get_settings

    upgrade_database(url or get_settings().database_url, revision)
    typer.echo(f"database at revision {revision}", err=True)


def bench_pipeline(
    sentences: int = typer.Option(14, min=1, help="Lecture sentences (about 4.5 s each)."),
    pair: str | None = typer.Option(None, help="VERIFIER+DRAFTER (default: the configured default pair)."),
    database_url: str | None = typer.Option(
        None, help="Job store for the distributed run (default: settings; PostgreSQL recommended)."
    ),
    timeout: float = typer.Option(900.0, help="Seconds to wait for the distributed job."),
) -> None:
    """Local-mode engine time vs distributed end-to-end time (real workers) on the same lecture."""
    from workers.pipeline_bench import format_report, run_pipeline_bench

    report = run_pipeline_bench(sentences, pair, database_url, timeout, log=lambda m: print(m, file=sys.stderr))
    print(format_report(report))
