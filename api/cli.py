"""The ``specscribe`` command line."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="specscribe: lossless speculative Whisper transcription.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that print side-by-side ratios.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("engine")
def bench_engine(
    verifier: str = typer.Option("bundled:whisper-base", help="Verifier model reference."),
    drafter: str = typer.Option("int8:", help="Drafter reference (int8:, decoder:REF, distilled:PATH, REF)."),
    clips: int = typer.Option(20, min=1, help="Number of 20-30 s lecture clips."),
    device: str = typer.Option("cpu", help="cpu or cuda:N."),
    dtype: str = typer.Option("float32", help="float32, float16 or bfloat16."),
    threads: int = typer.Option(2, min=1, help="torch CPU threads."),
    timestamps: bool = typer.Option(False, help="Decode with timestamp tokens."),
    draft_initial: int = typer.Option(5, min=1, help="Initial draft length k."),
    draft_max: int = typer.Option(16, min=1, help="Largest draft length."),
    confidence: float = typer.Option(0.0, min=0.0, max=1.0, help="Stop drafting below this top probability."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
) -> None:
    """transformers plain/assisted vs our plain/speculative loop on the same synthetic lecture clips."""
    from rich.console import Console

    from workers.asr.bench import EngineBenchConfig, format_table, run_engine_bench, write_json
    from workers.asr.speculative import DraftPolicy

    console = Console(stderr=True)
    policy = DraftPolicy(initial=draft_initial, maximum=max(draft_max, draft_initial), confidence=confidence or None)
    config = EngineBenchConfig(verifier, drafter, clips, device, dtype, threads, timestamps=timestamps, policy=policy)
    report = run_engine_bench(config, progress=lambda msg: console.log(msg))
    print(format_table(report))
    if json_path:
        write_json(report, json_path)


if __name__ == "__main__":
    app()
