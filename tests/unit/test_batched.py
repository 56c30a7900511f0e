"""Batched speculative decoding keeps every row identical to decoding it alone with plain greedy."""

from __future__ import annotations

import copy

import pytest
import torch

from workers.asr.batched import BatchedDecoder, ChunkInput
from workers.asr.distilled import build_drafter
from workers.asr.loading import Drafter, LoadedPair, Verifier, WhisperParts
from workers.asr.speculative import DraftPolicy, SpeculativeDecoder
from workers.asr.token_rules import DecodeOptions

from .conftest import tiny_features, tiny_verifier
from .test_speculative import often_drafter


def noisy_drafter(verifier: Verifier, scale: float = 0.3) -> Drafter:
    """The verifier's decoder with Gaussian noise on its weights: agrees sometimes, differently per row."""
    model = copy.deepcopy(verifier.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.model.decoder.layers.parameters():
            parameter.add_(
                scale * parameter.std() * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            )
    return Drafter(WhisperParts(model.model.decoder, model.proj_out, model.config), "noisy", True)


def layer_drafter(verifier: Verifier) -> Drafter:
    """The verifier's first and last decoder layers (a distilled drafter's start): attends with those
    layers' cross K/V of the verifier."""
    layers = (0, verifier.model.config.decoder_layers - 1)
    model = build_drafter(verifier, list(layers))
    return Drafter(WhisperParts(model.model.decoder, model.proj_out, model.config), "layers", True, layers)


DRAFTERS = {"often": often_drafter, "noisy": noisy_drafter, "layers": layer_drafter}


def _chunks(count: int, seed: int) -> list[ChunkInput]:
    """Chunks of very different lengths, with and without timestamps, some detecting their language."""
    limits = [3, 60, 11, 1, 37, 24, 5, 48, 17, 2, 30, 8]
    return [
        ChunkInput(
            tiny_features(seed * 100 + i),
            DecodeOptions(
                language=None if i % 4 == 0 else "en",
                timestamps=i % 3 == 1,
                max_new_tokens=limits[i % len(limits)],
                repetition_window=None,
            ),
            duration=3.0,
        )
        for i in range(count)
    ]


def _alone(verifier, chunks: list[ChunkInput]) -> list[list[int]]:
    decoder = SpeculativeDecoder(LoadedPair(verifier, None))
    return [decoder.decode(c.features, c.options, c.duration, draft=False).tokens for c in chunks]


@pytest.mark.parametrize("batch_size", [2, 5, 8])
@pytest.mark.parametrize("drafter_kind", sorted(DRAFTERS))
def test_every_row_equals_batch1_greedy(batch_size: int, drafter_kind: str) -> None:
    verifier = tiny_verifier(batch_size)
    drafter = DRAFTERS[drafter_kind](verifier)
    chunks = _chunks(2 * batch_size + 1, seed=batch_size)
    expected = _alone(verifier, chunks)
    decoder = BatchedDecoder(LoadedPair(verifier, drafter), batch_size)
    results = dict(decoder.decode_many(chunks))
    assert sorted(results) == list(range(len(chunks)))
    for i, result in results.items():
        assert result.tokens == expected[i], f"row {i}"
    if drafter_kind == "noisy":
        rates = [r.stats.acceptance for r in results.values() if r.stats.drafted >= 5]
        assert max(rates) - min(rates) > 0.1  # rows really accept at different rates
    plain = dict(BatchedDecoder(LoadedPair(verifier, drafter), batch_size).decode_many(chunks, draft=False))
    assert all(plain[i].tokens == expected[i] for i in plain)


def test_shared_acceptance_mode_is_lossless_but_accepts_less() -> None:
    verifier = tiny_verifier(21)
    chunks = _chunks(8, seed=21)
    expected = _alone(verifier, chunks)
    pair = LoadedPair(verifier, noisy_drafter(verifier))
    per_row = dict(BatchedDecoder(pair, 4).decode_many(chunks))
    shared = dict(BatchedDecoder(pair, 4, shared_acceptance=True).decode_many(chunks))
    assert all(per_row[i].tokens == shared[i].tokens == expected[i] for i in range(len(chunks)))
    passes = lambda results: sum(r.stats.verifier_passes for r in results.values())  # noqa: E731
    assert passes(per_row) < passes(shared)


def test_finished_rows_free_their_slots() -> None:
    """A long chunk stays in flight while short ones finish and new chunks fill the freed slots."""
    verifier = tiny_verifier(4)
    batch_size = 3
    chunks = _chunks(10, seed=4)
    chunks[0] = ChunkInput(
        chunks[0].features, DecodeOptions(language="en", max_new_tokens=120, repetition_window=None), 3.0
    )
    for i in range(1, 10):
        chunks[i] = ChunkInput(
            chunks[i].features, DecodeOptions(language="en", max_new_tokens=4, repetition_window=None), 3.0
        )
    decoder = BatchedDecoder(LoadedPair(verifier, often_drafter(verifier)), batch_size)
    order = [item for item, _ in decoder.decode_many(chunks)]
    assert order[-1] == 0  # the long row finished last ...
    assert len(order) == 10  # ... while nine short chunks passed through the other two slots
    expected = _alone(verifier, chunks[:1])
    assert dict(BatchedDecoder(LoadedPair(verifier, None), batch_size).decode_many(chunks[:1]))[0].tokens == expected[0]


@pytest.mark.parametrize("confidence", [0.9, 1.01])
def test_confidence_cut_off_is_lossless_and_verifies_its_unsure_draft(confidence: float) -> None:
    verifier = tiny_verifier(31)
    chunks = _chunks(7, seed=31)
    policy = DraftPolicy(initial=6, minimum=6, maximum=6, confidence=confidence)
    results = dict(BatchedDecoder(LoadedPair(verifier, noisy_drafter(verifier)), 4, policy).decode_many(chunks))
    expected = _alone(verifier, chunks)
    assert all(results[i].tokens == expected[i] for i in results)
    assert all(r.stats.drafted == r.stats.drafter_steps for r in results.values())  # no drafter step thrown away
    if confidence > 1:  # never sure: one draft per round
        assert all(r.stats.verifier_passes - r.stats.drafted <= 1 for r in results.values())
