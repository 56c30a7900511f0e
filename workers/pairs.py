"""Model pairs as jobs name them (``VERIFIER+DRAFTER``), their queue names, and one loaded decoder per process."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.asr.batched import BatchedDecoder


def split_pair(pair: str) -> tuple[str, str | None]:
    """``"bundled:whisper-base+int8:"`` -> ``("bundled:whisper-base", "int8:")``; no drafter -> ``None``."""
    verifier, _, drafter = pair.partition("+")
    if not verifier:
        raise ValueError(f"model pair {pair!r} names no verifier (expected VERIFIER+DRAFTER)")
    return verifier, drafter or None


def pair_queue(pair: str) -> str:
    """The Celery queue of a pair: ``asr.`` + the pair with characters outside ``[\\w.+-]`` turned into
    ``-`` (``bundled:whisper-base+int8:`` -> ``asr.bundled-whisper-base+int8``)."""
    verifier, drafter = split_pair(pair)
    parts = [re.sub(r"[^\w.-]+", "-", ref).strip("-") for ref in (verifier, drafter or "")]
    return "asr." + "+".join(p for p in parts if p)


def default_dtype(device: str) -> str:
    """float16 on CUDA, float32 on CPU."""
    return "float16" if device.startswith("cuda") else "float32"


@lru_cache(maxsize=1)
def pair_decoder(pair: str, device: str, batch_size: int = 1) -> BatchedDecoder:
    """The process's decoder for ``pair`` on ``device``, loaded on first use and kept (one pair per worker).

    It decodes up to ``batch_size`` chunks at once with per-sequence acceptance."""
    from workers.asr.batched import BatchedDecoder
    from workers.asr.loading import load_pair

    verifier, drafter = split_pair(pair)
    return BatchedDecoder(load_pair(verifier, drafter, device, default_dtype(device)), max(batch_size, 1))
