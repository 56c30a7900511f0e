"""The ``specscribe`` command line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

app = typer.Typer(help="specscribe: lossless speculative Whisper transcription.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that print side-by-side ratios.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
drafter_app = typer.Typer(help="Train drafters: synthesise a corpus, distil one for a verifier.", no_args_is_help=True)
app.add_typer(drafter_app, name="drafter")


@bench_app.command("engine")
def bench_engine(
    verifier: str = typer.Option("bundled:whisper-base", help="Verifier model reference."),
    drafter: str = typer.Option("int8:", help="Drafter reference (int8:, decoder:REF, distilled:PATH, REF)."),
    clips: int = typer.Option(20, min=1, help="Number of 20-30 s lecture clips."),
    device: str = typer.Option("cpu", help="cpu or cuda:N."),
    dtype: str = typer.Option("float32", help="float32, float16 or bfloat16."),
    threads: int = typer.Option(2, min=1, help="torch CPU threads."),
    timestamps: bool = typer.Option(False, help="Decode with timestamp tokens."),
    draft_initial: int | None = typer.Option(
        None, min=1, help="Initial draft length k (default: the drafter's policy)."
    ),
    draft_max: int | None = typer.Option(None, min=1, help="Largest draft length (default: the drafter's policy)."),
    confidence: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="Stop drafting below this top probability; 0: never (default: the drafter's policy).",
    ),
    batch_sizes: str = typer.Option("", help="Also run batched decoding at these batch sizes, e.g. 1,4,8,16."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
) -> None:
    """transformers plain/assisted vs our plain/speculative loop on the same synthetic lecture clips."""
    from rich.console import Console

    from workers.asr.bench import EngineBenchConfig, format_table, run_engine_bench, write_json
    from workers.asr.speculative import default_policy

    console = Console(stderr=True)
    policy = default_policy(drafter)
    initial = draft_initial or policy.initial
    maximum = max(draft_max or policy.maximum, initial)
    cut = policy.confidence if confidence is None else (confidence or None)
    policy = replace(policy, initial=initial, maximum=maximum, confidence=cut)
    sizes = tuple(int(b) for b in batch_sizes.split(",") if b.strip())
    config = EngineBenchConfig(
        verifier, drafter, clips, device, dtype, threads, timestamps=timestamps, policy=policy, batch_sizes=sizes
    )
    report = run_engine_bench(config, progress=lambda msg: console.log(msg))
    print(format_table(report))
    if json_path:
        write_json(report, json_path)


@drafter_app.command("corpus")
def drafter_corpus(
    out: Path = typer.Option(..., help="Directory for the FLAC recordings and manifest.jsonl."),
    hours: float = typer.Option(1.0, min=0.01, help="Hours of speech to synthesise."),
    text: list[Path] = typer.Option(None, help="Text files to read (default: prose found on this system)."),
    seed: int = typer.Option(0, help="Seed for sentence order, voices, speeds, pauses and noise."),
    workers: int = typer.Option(2, min=1, help="Parallel synthesis processes."),
    natural_share: float = typer.Option(0.5, min=0.0, max=1.0, help="Share of recordings in the natural Piper voice."),
) -> None:
    """Synthesise an English training corpus offline with every installed voice (no benchmark sentences)."""
    from rich.progress import Progress

    from workers.asr.corpus import build_corpus, system_prose
    from workers.speech import available_voices

    texts = [p.read_text(encoding="utf-8", errors="replace") for p in text] if text else system_prose(seed)
    with Progress() as bar:
        task = bar.add_task("synthesising", total=None)
        report = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
        rows = build_corpus(out, hours, texts, available_voices(), seed, workers, natural_share, report)
    seconds = sum(row["seconds"] for row in rows)
    print(f"{len(rows)} recordings, {seconds / 3600:.2f} h of speech in {out}")


@drafter_app.command("distill")
def drafter_distill(
    verifier: str = typer.Option(..., help="Verifier model reference (e.g. bundled:whisper-base)."),
    audio: str = typer.Option(..., help="Unlabeled recordings: a directory, an archive or s3://bucket/prefix/."),
    out: Path = typer.Option(..., help="Output directory (drafter.safetensors, drafter.json, checkpoint.pt)."),
    layers: int = typer.Option(2, min=1, help="Decoder layers of the drafter."),
    device: str = typer.Option("cpu", help="cpu or cuda:N."),
    hours_limit: float | None = typer.Option(None, min=0.0, help="Use at most this many hours of chunks."),
    steps: int = typer.Option(300, min=1, help="Training steps."),
    batch: int = typer.Option(8, min=1, help="Sequences per step."),
    lr: float = typer.Option(3e-4, min=0.0, help="Peak learning rate."),
    language: str | None = typer.Option(None, help="Label in this language (default: detect per chunk)."),
    cache_dir: Path | None = typer.Option(None, help="Label cache (default: <cache_dir>/distill)."),
    seed: int = typer.Option(0, help="Seed of the batch schedule."),
    resume: bool = typer.Option(False, help="Continue from OUT/checkpoint.pt."),
    draft_vocab: int = typer.Option(
        16384, min=0, help="Text tokens the drafter may propose (plus special tokens); 0: all."
    ),
    threads: int = typer.Option(1, min=1, help="torch CPU threads (1 is fastest on a busy shared CPU)."),
    label_batch: int = typer.Option(8, min=1, help="Chunks the verifier labels together (1: one at a time)."),
) -> None:
    """Distil a decoder-only drafter for VERIFIER from unlabeled audio (pseudo-labelled by the verifier)."""
    import shlex
    import sys

    import torch

    from workers.object_store import is_s3_uri

    if not is_s3_uri(audio) and not Path(audio).exists():
        raise typer.BadParameter(f"{audio} does not exist", param_hint="--audio")
    torch.set_num_threads(threads)
    from workers.asr.distill import DistillConfig, TrainConfig, run_distill

    train = TrainConfig(steps=steps, batch=batch, lr=lr, seed=seed)
    command = shlex.join(["specscribe", *sys.argv[1:]])
    config = DistillConfig(
        verifier, audio, out, layers, device, hours_limit, language, cache_dir=cache_dir, resume=resume, train=train,
        command=command, draft_vocab=draft_vocab, label_batch=label_batch,
    )  # fmt: skip
    meta = run_distill(config)
    print(
        f"{meta['data_hours']} h in {meta['chunks']} chunks ({meta['chunks_dropped']} dropped); held-out agreement "
        f"{meta['agreement_init']:.1%} -> {meta['agreement']:.1%}; written to {out}"
    )


# Pipeline commands (local mode, worker roles, job store, pipeline benchmark) live in api/pipeline_cli.py.
from api.pipeline_cli import bench_pipeline, db_app, transcribe, worker_app  # noqa: E402

app.command("transcribe")(transcribe)
app.add_typer(worker_app, name="worker")
app.add_typer(db_app, name="db")
bench_app.command("pipeline")(bench_pipeline)

# Service-edge commands (HTTP API, keys, S3 listener, Flower, API client) live in api/edge_cli.py.
from api import edge_cli  # noqa: E402

app.command("api")(edge_cli.serve)
app.add_typer(edge_cli.keys_app, name="keys")
app.command("s3-listen")(edge_cli.s3_listen)
app.command("flower")(edge_cli.flower)
app.command("submit")(edge_cli.submit)
app.command("status")(edge_cli.status)
app.command("fetch")(edge_cli.fetch)


if __name__ == "__main__":
    app()
