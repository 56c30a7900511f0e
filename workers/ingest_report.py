"""Measure the ingest stage on one file: ``python -m workers.ingest_report lecture.mp3``.

Prints decode and chunking time (also per audio hour), the chunk-length histogram and this process's
peak resident memory, which is what bounds an ingest worker.
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np

from workers.chunk import chunk_recording
from workers.decode import decode
from workers.vad import get_vad


def report(path: str) -> dict[str, float]:
    """Decode and chunk ``path``; returns the measurements (seconds, MB) and prints a summary."""
    vad = get_vad()
    started = time.perf_counter()
    audio = decode(path)
    decoded = time.perf_counter()
    plan = chunk_recording("report", audio.pcm, vad=vad)
    chunked = time.perf_counter()
    hours = audio.duration / 3600
    lengths = np.array([c.duration for c in plan.chunks])
    result = {
        "audio_seconds": audio.duration,
        "pcm_mb": audio.pcm.nbytes / 1e6,
        "decode_seconds": decoded - started,
        "chunk_seconds": chunked - decoded,
        "decode_s_per_audio_hour": (decoded - started) / hours,
        "chunk_s_per_audio_hour": (chunked - decoded) / hours,
        "chunks": len(plan.chunks),
        "mean_chunk_seconds": float(lengths.mean()) if len(lengths) else 0.0,
        "skipped_seconds": sum(s.end - s.start for s in plan.skipped),
        "forced_cuts": sum(c.overlap_samples > 0 for c in plan.chunks),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    for key, value in result.items():
        print(f"{key:>26}: {value:.2f}")
    counts, edges = np.histogram(lengths, bins=[0, 5, 10, 15, 20, 25, 28, 30.001])
    for count, lo, hi in zip(counts, edges, edges[1:], strict=False):
        print(f"{lo:>5.0f}-{min(hi, 30):<3.0f} s  {count:4d}  {'#' * int(count)}")
    return result


if __name__ == "__main__":
    report(sys.argv[1])
