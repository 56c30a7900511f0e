"""``specscribe bench engine``: our speculative loop against plain greedy and transformers, side by side.

All four methods run in one process on the same clips and the same log-mel features:
transformers ``generate()`` plain, transformers ``generate(assistant_model=...)`` with the same
drafter, our loop plain, our loop speculative, clip by clip in an order that rotates. Clips are
synthesised lecture speech of chunk length (20-30 s) with their reference texts, so WER is measured too.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.asr.batched import BatchedDecoder, ChunkInput
from workers.asr.loading import LoadedPair, load_pair
from workers.asr.speculative import DraftPolicy, SpeculativeDecoder
from workers.asr.token_rules import DecodeOptions
from workers.types import DecodeStats

METHODS = ("hf_plain", "hf_assisted", "ours_plain", "ours_speculative")
EOS = 50257


def normalize_text(text: str) -> str:
    """Lowercase, drop punctuation, collapse spaces: the comparison form for WER."""
    text = re.sub(r"[^\w\s']", " ", text.lower()).replace("'", "")
    return " ".join(text.split())


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER over normalised texts."""
    import jiwer

    return float(jiwer.wer([normalize_text(r) for r in references], [normalize_text(h) for h in hypotheses]))


@dataclass
class MethodRun:
    """One method's outputs over all clips."""

    seconds: float = 0.0
    ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)


@dataclass(frozen=True)
class EngineBenchConfig:
    """What to benchmark: the pair, the clips, the numeric setting."""

    verifier: str = "bundled:whisper-base"
    drafter: str = "int8:"
    clips: int = 20
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 2
    language: str = "en"
    timestamps: bool = False
    policy: DraftPolicy = field(default_factory=DraftPolicy)
    batch_sizes: tuple[int, ...] = ()


def _timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def _hf_ids(sequence: torch.Tensor, prompt_length: int) -> list[int]:
    """transformers' generated ids without the prompt and without end-of-text padding."""
    ids = sequence.tolist()[prompt_length:]
    while ids and ids[-1] == EOS:
        ids.pop()
    return ids


def _same_text_ids(ours: list[int], theirs: list[int]) -> bool:
    """Equal ids up to the final end-of-text (transformers' Whisper ``generate()`` drops it)."""
    return _hf_ids(torch.tensor(ours), 0) == theirs


def run_engine_bench(config: EngineBenchConfig, progress: Callable[[str], None] = print) -> dict:
    """Run the four methods on the same clips and return the report (also the ``--json`` content)."""
    from workers.lecture_text import lecture_clips

    torch.set_num_threads(config.threads)
    progress(f"loading {config.verifier} + {config.drafter} on {config.device} ({config.dtype})")
    pair = load_pair(config.verifier, config.drafter, config.device, config.dtype)
    decoder = SpeculativeDecoder(pair, config.policy)
    progress(f"synthesising {config.clips} lecture clips")
    clips = lecture_clips(config.clips)
    features = [decoder.features(clip.pcm) for clip in clips]
    options = DecodeOptions(language=config.language, timestamps=config.timestamps)
    methods = _methods(pair, decoder, options, config)
    for fn in methods.values():  # warm-up: first calls allocate and pick kernels
        fn(features[0], clips[0].seconds)
    runs = {name: MethodRun() for name in METHODS}
    for i, (clip, feats) in enumerate(zip(clips, features)):
        progress(f"clip {i + 1}/{len(clips)} ({clip.seconds:.1f} s)")
        # the order rotates per clip: on a shared CPU a run's speed depends on what ran just before it
        for name in METHODS[i % len(METHODS) :] + METHODS[: i % len(METHODS)]:
            fn = methods[name]
            call = lambda fn=fn, feats=feats, seconds=clip.seconds: fn(feats, seconds)  # noqa: E731
            (ids, text, stats), seconds = _timed(call, decoder.device)
            run = runs[name]
            run.seconds += seconds
            run.ids.append(ids)
            run.texts.append(text)
            if stats is not None:
                run.stats.add(stats)
    report = _report(config, clips, runs, pair)
    if config.batch_sizes:
        batch_inputs = [ChunkInput(f, options, clip.seconds) for f, clip in zip(features, clips)]
        report["batched"] = {
            str(b): _batched_run(pair, config.policy, b, batch_inputs, runs["ours_plain"].ids, progress)
            for b in config.batch_sizes
        }
    return report


def _batched_run(
    pair: LoadedPair,
    policy: DraftPolicy,
    batch_size: int,
    chunks: list[ChunkInput],
    alone: list[list[int]],
    progress: Callable[[str], None],
) -> dict:
    """Batched plain, per-sequence speculative and shared-length speculative on the same chunks."""
    modes = {
        "plain": (BatchedDecoder(pair, batch_size, policy), False),
        "speculative": (BatchedDecoder(pair, batch_size, policy), True),
        "shared": (BatchedDecoder(pair, batch_size, policy, shared_acceptance=True), True),
    }
    seconds, outputs = {}, {}
    for name, (decoder, draft) in modes.items():
        progress(f"batch {batch_size}: {name}")
        results, elapsed = _timed(lambda d=decoder, dr=draft: dict(d.decode_many(chunks, draft=dr)), decoder.device)
        seconds[name], outputs[name] = elapsed, results
    identical = {name: sum(out[i].tokens == alone[i] for i in out) for name, out in outputs.items()}
    spec_rows = list(outputs["speculative"].values())
    acceptance_rows = [r.stats.acceptance for r in spec_rows if r.stats.drafted]
    spec_stats, shared_stats = DecodeStats(), DecodeStats()
    for r in spec_rows:
        spec_stats.add(r.stats)
    for r in outputs["shared"].values():
        shared_stats.add(r.stats)
    return {
        "plain_s": round(seconds["plain"], 3),
        "speculative_s": round(seconds["speculative"], 3),
        "shared_s": round(seconds["shared"], 3),
        "speedup": round(seconds["plain"] / seconds["speculative"], 3),
        "speedup_vs_shared": round(seconds["shared"] / seconds["speculative"], 3),
        "identical": min(identical.values()),
        "identical_by_mode": identical,
        "acceptance": round(spec_stats.acceptance, 4),
        "acceptance_shared": round(shared_stats.acceptance, 4),
        "acceptance_per_row": {
            "min": round(min(acceptance_rows, default=0.0), 3),
            "mean": round(sum(acceptance_rows) / max(len(acceptance_rows), 1), 3),
            "max": round(max(acceptance_rows, default=0.0), 3),
        },
        "verifier_passes": {"speculative": spec_stats.verifier_passes, "shared": shared_stats.verifier_passes},
        "drafter_seconds": round(spec_stats.draft_seconds, 3),
        "verify_seconds": round(spec_stats.verify_seconds, 3),
    }


def _methods(pair: LoadedPair, decoder: SpeculativeDecoder, options: DecodeOptions, config: EngineBenchConfig):
    model = pair.verifier.model
    tokenizer = pair.verifier.processor.tokenizer
    prompt_length = 4 if not options.timestamps else 3
    assistant = pair.drafter.hf_model if pair.drafter else None

    def hf(feats: torch.Tensor, _seconds: float, assistant_model=None):
        extra = {"assistant_model": assistant_model} if assistant_model is not None else {}
        out = model.generate(
            feats, language=options.language, task="transcribe", return_timestamps=options.timestamps, **extra
        )
        ids = _hf_ids(out[0], prompt_length if out[0, 0] == decoder.rules.sot else 0)
        return ids, tokenizer.decode(decoder.rules.text_ids(ids)).strip(), None

    def ours(feats: torch.Tensor, seconds: float, draft: bool):
        result = decoder.decode(feats, options, duration=seconds, draft=draft)
        return result.tokens, result.text, result.stats

    return {
        "hf_plain": lambda f, s: hf(f, s),
        "hf_assisted": lambda f, s: hf(f, s, assistant),
        "ours_plain": lambda f, s: ours(f, s, False),
        "ours_speculative": lambda f, s: ours(f, s, True),
    }


def _report(config: EngineBenchConfig, clips, runs: dict[str, MethodRun], pair: LoadedPair) -> dict:
    references = [clip.text for clip in clips]
    plain, spec = runs["ours_plain"], runs["ours_speculative"]
    identical = sum(a == b for a, b in zip(spec.ids, plain.ids))
    hf_plain = runs["hf_plain"].ids
    identical_hf = sum(_same_text_ids(a, b) for a, b in zip(spec.ids, hf_plain))
    ps, ss = plain.stats, spec.stats
    report = {
        "verifier": config.verifier,
        "drafter": config.drafter,
        "device": config.device,
        "dtype": config.dtype,
        "threads": config.threads,
        "timestamps": config.timestamps,
        "clips": len(clips),
        "audio_seconds": round(sum(clip.seconds for clip in clips), 2),
        "identical": identical,
        "identical_hf": identical_hf,
        "identical_plain_hf": sum(_same_text_ids(a, b) for a, b in zip(plain.ids, hf_plain)),
        "identical_hf_assisted": sum(a == b for a, b in zip(runs["hf_assisted"].ids, hf_plain)),
        "differing_clips_hf": [i for i, (a, b) in enumerate(zip(spec.ids, hf_plain)) if not _same_text_ids(a, b)],
        "wer": {name: round(word_error_rate(references, run.texts), 4) for name, run in runs.items()},
        "wer_plain": round(word_error_rate(references, plain.texts), 4),
        "wer_speculative": round(word_error_rate(references, spec.texts), 4),
        "seconds": {name: round(run.seconds, 3) for name, run in runs.items()},
        "tokens_per_second": {name: round(run.tokens / run.seconds, 1) for name, run in runs.items()},
        "speedup_vs_greedy": round(plain.seconds / spec.seconds, 3),
        "speedup_vs_hf_assisted": round(runs["hf_assisted"].seconds / spec.seconds, 3),
        "speedup_vs_hf_plain": round(runs["hf_plain"].seconds / spec.seconds, 3),
        "acceptance": round(ss.acceptance, 4),
        "decoder_speedup": round(ps.decoder_seconds / ss.decoder_seconds, 3),
        "time_split": {
            "plain": _split(ps),
            "speculative": _split(ss),
        },
        "ceiling": _ceiling(ps, ss),
    }
    report["hf_near_ties"] = _near_ties(pair, runs, report["differing_clips_hf"], clips, config)
    return report


def _split(stats: DecodeStats) -> dict[str, float]:
    overhead = stats.decoder_seconds - stats.draft_seconds - stats.verify_seconds
    return {
        "encoder_s": round(stats.encoder_seconds, 3),
        "drafter_s": round(stats.draft_seconds, 3),
        "verify_s": round(stats.verify_seconds, 3),
        "overhead_s": round(overhead, 3),
        "verifier_passes": stats.verifier_passes,
        "drafter_steps": stats.drafter_steps,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
    }


def _ceiling(plain: DecodeStats, spec: DecodeStats) -> dict[str, float]:
    """Where the speculative gain is bounded: per-step costs and acceptance."""
    verifier_step_ms = 1000 * plain.verify_seconds / max(plain.verifier_passes, 1)
    drafter_step_ms = 1000 * spec.draft_seconds / max(spec.drafter_steps, 1)
    verify_pass_ms = 1000 * spec.verify_seconds / max(spec.verifier_passes, 1)
    mean_k = spec.drafted / max(spec.verifier_passes, 1)
    tokens_per_pass = (spec.accepted + spec.verifier_passes) / max(spec.verifier_passes, 1)
    return {
        "verifier_step_ms": round(verifier_step_ms, 2),
        "drafter_step_ms": round(drafter_step_ms, 2),
        "drafter_cost_ratio": round(drafter_step_ms / verifier_step_ms, 3) if verifier_step_ms else 0.0,
        "verify_pass_ms": round(verify_pass_ms, 2),
        "mean_draft_length": round(mean_k, 2),
        "tokens_per_verify_pass": round(tokens_per_pass, 2),
        "verify_pass_cost_in_steps": round(verify_pass_ms / verifier_step_ms, 2) if verifier_step_ms else 0.0,
    }


def _near_ties(pair: LoadedPair, runs, differing: list[int], clips, config: EngineBenchConfig) -> list[dict]:
    """For clips where transformers' plain ids differ from ours: the verifier's top-2 logit gap at the
    first differing position (a near-tie explains a float-rounding flip)."""
    if not differing:
        return []
    decoder = SpeculativeDecoder(LoadedPair(pair.verifier, None))
    options = DecodeOptions(language=config.language, timestamps=config.timestamps)
    out = []
    for i in differing:
        ours, theirs = runs["ours_speculative"].ids[i], runs["hf_plain"].ids[i]
        position = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        gap = decoder.logit_gap(decoder.features(clips[i].pcm), options, ours[:position])
        out.append(
            {
                "clip": i,
                "position": position,
                "ours": ours[position : position + 1],
                "hf": theirs[position : position + 1],
                "top2_logit_gap": round(gap, 5),
            }
        )
    return out


def format_table(report: dict) -> str:
    """The human-readable table of a report."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{report['verifier']} + {report['drafter']} · {report['clips']} clips "
        f"({report['audio_seconds']} s audio) · {report['device']} {report['dtype']}"
    )
    for column in ("method", "seconds", "tokens/s", "acceptance", "WER", "ids identical"):
        table.add_column(column, justify="right" if column != "method" else "left")
    n = report["clips"]
    identical = {
        "hf_plain": "-",
        "hf_assisted": f"{report['identical_hf_assisted']}/{n} vs hf_plain",
        "ours_plain": f"{report['identical_plain_hf']}/{n} vs hf_plain",
        "ours_speculative": f"{report['identical']}/{n} vs ours_plain, {report['identical_hf']}/{n} vs hf_plain",
    }
    for name in METHODS:
        acceptance = f"{report['acceptance']:.1%}" if name == "ours_speculative" else "-"
        table.add_row(
            name,
            f"{report['seconds'][name]:.2f}",
            f"{report['tokens_per_second'][name]:.1f}",
            acceptance,
            f"{report['wer'][name]:.2%}",
            identical[name],
        )
    console = Console(file=StringIO(), width=140, record=True)
    console.print(table)
    summary = {
        key: report[key]
        for key in (
            "speedup_vs_greedy",
            "speedup_vs_hf_assisted",
            "speedup_vs_hf_plain",
            "decoder_speedup",
            "acceptance",
        )
    }
    console.print(f"ratios: {summary}")
    console.print(f"time split: {report['time_split']}")
    console.print(f"ceiling: {report['ceiling']}")
    for b, row in report.get("batched", {}).items():
        console.print(
            f"batch {b}: plain {row['plain_s']:.2f} s, per-row speculative {row['speculative_s']:.2f} s, "
            f"shared-length {row['shared_s']:.2f} s -> speedup {row['speedup']:.2f}x, "
            f"vs shared {row['speedup_vs_shared']:.2f}x, identical {row['identical']}/{report['clips']}, "
            f"acceptance {row['acceptance']:.1%} (shared {row['acceptance_shared']:.1%})"
        )
    if report["hf_near_ties"]:
        console.print(f"differences from transformers plain: {report['hf_near_ties']}")
    return console.export_text()


def write_json(report: dict, path: Path) -> None:
    """Write the report as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
