"""Drafter distillation on tiny random models: it learns, resumes exactly, refuses foreign verifiers, stays lossless."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
import torch

from workers.asr.distill import (
    Labelled,
    TrainConfig,
    agreement,
    batch_indices,
    hallucination_reason,
    label_counts,
    split_heldout,
    teacher_top,
    train,
    vocab_coverage,
)
from workers.asr.distilled import (
    DRAFT_VOCAB,
    METADATA,
    WEIGHTS,
    DraftVocabulary,
    build_drafter,
    choose_draft_vocab,
    own_state,
    save_drafter,
    spaced_layers,
    verifier_fingerprint,
)
from workers.asr.loading import LoadedPair, PairMismatchError, Verifier, load_drafter, validate_pair
from workers.asr.speculative import DraftPolicy, SpeculativeDecoder, default_policy
from workers.asr.token_rules import DecodeOptions

from .conftest import EOS, tiny_features, tiny_verifier

DTYPE = torch.float32
OPTIONS = DecodeOptions(language="en", timestamps=False, max_new_tokens=12, repetition_window=None)


def labelled(verifier: Verifier, seeds: range) -> list[Labelled]:
    """Chunks labelled by the verifier's own greedy decode (short, so no end-of-text: fine for training)."""
    decoder = SpeculativeDecoder(LoadedPair(verifier, None))
    prompt = decoder.rules.prompt(decoder.rules.language_token("en"), OPTIONS)
    out = []
    for seed in seeds:
        features = tiny_features(seed, DTYPE)
        generated = decoder.decode(features, OPTIONS, 3.0, draft=False).tokens
        encoder = verifier.parts.encoder(features).last_hidden_state.detach()
        sequences = teacher_top(verifier, encoder, [(prompt + generated, len(prompt))], 8)
        out.append(Labelled(f"c{seed}", f"g{seed % 4}", 3.0, encoder[0].half(), sequences))
    return out


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[Verifier, list[Labelled]]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is far faster on a busy shared CPU
    verifier = tiny_verifier(3, DTYPE, layers=4)
    yield verifier, labelled(verifier, range(12))
    torch.set_num_threads(threads)


CONFIG = TrainConfig(steps=8, batch=4, lr=3e-3, warmup=2, checkpoint_every=4, eval_every=4)


def test_spaced_layers() -> None:
    assert spaced_layers(6, 2) == [0, 5]
    assert spaced_layers(4, 2) == [0, 3]
    assert spaced_layers(6, 3) == [0, 2, 5] or spaced_layers(6, 3) == [0, 3, 5]
    with pytest.raises(ValueError):
        spaced_layers(2, 3)


def test_hallucination_filter() -> None:
    assert hallucination_reason("  ", [EOS], EOS) == "empty"
    assert hallucination_reason("a fine sentence", [1, 2], EOS) == "no end-of-text"
    assert hallucination_reason("the cat sat " * 20, [1, EOS], EOS) is not None
    assert hallucination_reason("and so we say it again and so we say it again and so we say it again", [EOS], EOS)
    assert hallucination_reason("Heat flows from warm bodies to cold ones.", [1, EOS], EOS) is None


def test_batch_schedule_is_seeded() -> None:
    assert batch_indices(10, 4, 3, 0) == batch_indices(10, 4, 3, 0)
    assert batch_indices(10, 4, 3, 0) != batch_indices(10, 4, 3, 1)
    epoch = sorted(i for step in range(5) for i in batch_indices(10, 2, step, 7))
    assert epoch == list(range(10))


def test_training_raises_agreement(setup) -> None:
    verifier, chunks = setup
    torch.manual_seed(0)
    model = build_drafter(verifier, [0, 3])
    train_chunks, heldout = split_heldout(chunks)
    before = agreement(model, train_chunks)
    result = train(model, train_chunks, heldout, TrainConfig(steps=30, batch=4, lr=3e-3, warmup=2), show_progress=False)
    assert agreement(model, train_chunks) > before + 0.1
    assert result.agreement_init == pytest.approx(agreement(build_drafter(verifier, [0, 3]), heldout))
    assert result.history and result.history[-1]["step"] == 30


def test_resume_matches_uninterrupted_run(setup, tmp_path) -> None:
    verifier, chunks = setup
    straight = build_drafter(verifier, [0, 3])
    train(straight, chunks[:8], chunks[8:], CONFIG, tmp_path / "a.pt", show_progress=False)
    resumed = build_drafter(verifier, [0, 3])
    train(resumed, chunks[:8], chunks[8:], CONFIG, tmp_path / "b.pt", stop_after=4, show_progress=False)
    fresh = build_drafter(verifier, [0, 3])  # a new process: initial weights, state from the checkpoint
    train(fresh, chunks[:8], chunks[8:], CONFIG, tmp_path / "b.pt", resume=True, show_progress=False)
    for key, value in own_state(straight).items():
        assert torch.equal(value, own_state(fresh)[key]), key


def _saved(verifier: Verifier, chunks: list[Labelled], path, vocab: torch.Tensor | None = None) -> None:
    model = build_drafter(verifier, [0, 3])
    train(model, chunks, chunks[-2:], CONFIG, show_progress=False)
    meta = {"verifier": verifier.ref, "verifier_fingerprint": verifier_fingerprint(verifier), "layer_map": [0, 3]}
    save_drafter(model, path, meta, vocab)


def test_draft_vocabulary_keeps_frequent_and_special_tokens(setup) -> None:
    verifier, chunks = setup
    counts = label_counts(chunks)
    vocab = choose_draft_vocab(counts, 5, EOS, verifier.model.config.vocab_size)
    specials = list(range(EOS, verifier.model.config.vocab_size))
    assert vocab.tolist() == sorted([t for t, _ in counts.most_common() if t < EOS][:5] + specials)
    text = [t for t in counts if t < EOS]
    filled = choose_draft_vocab(counts, len(text) + 3, EOS, verifier.model.config.vocab_size).tolist()
    assert filled == sorted(text + [t for t in range(EOS) if t not in counts][:3] + specials)
    assert 0.0 < vocab_coverage(vocab, chunks) < 1.0
    proj = verifier.model.proj_out
    restricted = DraftVocabulary(proj, vocab)
    hidden = torch.randn(2, 3, proj.in_features)
    logits, full = restricted(hidden), proj(hidden)
    index = vocab.long()
    assert torch.allclose(logits[..., index], full[..., index], atol=1e-5)
    outside = torch.ones(full.shape[-1], dtype=torch.bool)
    outside[index] = False
    assert (logits[..., outside] == torch.finfo(logits.dtype).min).all()


def test_saved_drafter_holds_only_its_own_layers(setup, tmp_path) -> None:
    from safetensors.torch import load_file

    verifier, chunks = setup
    _saved(verifier, chunks, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS))
    assert all(k.startswith(("layers.", "layer_norm.")) for k in tensors)
    assert {v.dtype for v in tensors.values()} == {torch.float16}
    assert json.loads((tmp_path / METADATA).read_text())["layer_map"] == [0, 3]


def test_drafter_refuses_another_verifier(setup, tmp_path) -> None:
    verifier, chunks = setup
    _saved(verifier, chunks, tmp_path)
    other = tiny_verifier(4, DTYPE, layers=4)
    with pytest.raises(PairMismatchError, match="trained for verifier"):
        load_drafter(f"distilled:{tmp_path}", other)


@pytest.mark.parametrize(("quantize", "draft_vocab"), [(True, None), (False, None), (True, 6), (False, 6)])
def test_speculative_with_distilled_drafter_is_lossless(
    setup, tmp_path, quantize: bool, draft_vocab: int | None
) -> None:
    from workers.asr.distilled import load_distilled_drafter

    verifier, chunks = setup
    size = verifier.model.config.vocab_size
    vocab = None if draft_vocab is None else choose_draft_vocab(label_counts(chunks), draft_vocab, EOS, size)
    _saved(verifier, chunks, tmp_path, vocab)
    drafter = load_distilled_drafter(str(tmp_path), verifier, quantize=quantize)
    assert isinstance(drafter.parts.proj_out, DraftVocabulary) == (vocab is not None)
    validate_pair(verifier, drafter, None)
    assert drafter.parts.decoder.embed_tokens is verifier.model.model.decoder.embed_tokens
    pair = LoadedPair(verifier, drafter)
    for policy in (DraftPolicy(), DraftPolicy(confidence=0.6)):
        decoder = SpeculativeDecoder(pair, policy)
        for seed in range(20, 26):
            features = tiny_features(seed, DTYPE)
            options = DecodeOptions(language="en", timestamps=seed % 2 == 0, max_new_tokens=20, repetition_window=None)
            spec = decoder.decode(features, options, 3.0)
            assert spec.tokens == decoder.decode(features, options, 3.0, draft=False).tokens
            assert spec.stats.drafted > 0


def test_drafter_reuses_the_verifiers_cross_kv_only_when_its_projections_are_the_verifiers(setup, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from workers.asr.distilled import load_distilled_drafter

    verifier, chunks = setup
    _saved(verifier, chunks, tmp_path)
    drafter = load_distilled_drafter(str(tmp_path), verifier)
    assert drafter.cross_layers == (0, 3)
    own_layer = drafter.parts.decoder.layers[1].encoder_attn
    assert own_layer.k_proj is verifier.model.model.decoder.layers[3].encoder_attn.k_proj
    cross = [(torch.full((1,), float(i)), torch.full((1,), -float(i))) for i in range(4)]
    assert [float(k) for k, _ in drafter.verifier_cross(cross)] == [0.0, 3.0]

    tensors = load_file(str(tmp_path / WEIGHTS))
    tensors["layers.1.encoder_attn.v_proj.bias"] = tensors["layers.1.encoder_attn.v_proj.bias"] + 1
    save_file(tensors, str(tmp_path / WEIGHTS))
    retrained = load_distilled_drafter(str(tmp_path), verifier)
    assert retrained.cross_layers is None and not retrained.shares_cross_kv
    decoder = SpeculativeDecoder(LoadedPair(verifier, retrained))
    features = tiny_features(30, DTYPE)
    spec = decoder.decode(features, OPTIONS, 3.0)
    assert spec.tokens == decoder.decode(features, OPTIONS, 3.0, draft=False).tokens


def test_batched_labelling_equals_greedy_and_reuses_its_cache(setup, tmp_path, monkeypatch) -> None:
    import numpy as np
    from transformers import WhisperFeatureExtractor

    from workers.asr.batched import BatchedDecoder
    from workers.asr.distill import load_or_label

    verifier, _ = setup
    verifier = copy.copy(verifier)
    verifier.processor = copy.copy(verifier.processor)
    verifier.processor.feature_extractor = WhisperFeatureExtractor(chunk_length=3)  # the tiny 300-frame window
    rng = np.random.default_rng(0)
    pcms = [(rng.standard_normal(16000 * (1 + i % 3)) * 3000).astype(np.int16) for i in range(7)]
    chunks = [(f"rec{i % 3}", f"rec{i % 3}-{i:03d}", pcm) for i, pcm in enumerate(pcms)]
    single = SpeculativeDecoder(LoadedPair(verifier, None))
    options = DecodeOptions(language="en", timestamps=True)
    expected = [single.decode(single.features(pcm), options, len(pcm) / 16000, draft=False).tokens for pcm in pcms]

    # random weights never say end-of-text: keep every label here (the filter has its own test)
    monkeypatch.setattr("workers.asr.distill.hallucination_reason", lambda *_: None)
    labeller = BatchedDecoder(LoadedPair(verifier, None), 3)
    kept, dropped = load_or_label(labeller, tmp_path, iter(chunks), "en", 4)
    assert [c.key for c in kept] == [key for _, key, _ in chunks] and not dropped
    for chunk, tokens in zip(kept, expected):
        timestamped, plain = chunk.sequences
        assert timestamped.tokens[timestamped.prompt :] == tokens
        assert plain.tokens[-1] == EOS and plain.top_ids.shape == (len(plain.tokens) - plain.prompt, 4)
        assert chunk.encoder.dtype == torch.float16 and chunk.encoder.shape[0] == 150

    monkeypatch.setattr("workers.asr.distill.hallucination_reason", lambda *_: "no end-of-text")
    again, dropped = load_or_label(labeller, tmp_path, iter(chunks), "en", 4)  # from the cache: no relabelling
    assert [c.key for c in again] == [c.key for c in kept] and not dropped
    fresh, dropped = load_or_label(labeller, tmp_path / "other", iter(chunks), "en", 4)
    assert not fresh and dropped == {"no end-of-text": len(chunks)}


def test_default_policy_for_distilled_drafters() -> None:
    assert default_policy("distilled:whisper-base").confidence is not None
    assert default_policy("int8:") == DraftPolicy()


def test_shipped_base_drafter_is_small_fp16_and_own_layers_only() -> None:
    from safetensors import safe_open

    from workers.asr.distilled import drafter_dir, read_metadata

    meta = read_metadata("whisper-base")
    assert meta["verifier"] == "bundled:whisper-base" and meta["layer_map"] == [0, 5]
    assert meta["data_hours"] >= 1.0 and "command" in meta and "seed" in meta
    path = drafter_dir("whisper-base") / WEIGHTS
    assert path.stat().st_size < 20 * 2**20
    with safe_open(str(path), "pt") as handle:
        names = handle.keys()
        keys = [k for k in names if k != DRAFT_VOCAB]
        assert all(k.startswith(("layers.", "layer_norm.")) for k in keys)
        assert {handle.get_tensor(k).dtype for k in keys} == {torch.float16}
        if DRAFT_VOCAB in names:
            vocab = handle.get_tensor(DRAFT_VOCAB)
            assert vocab.dtype == torch.int32 and bool((vocab[1:] > vocab[:-1]).all())
            assert meta["draft_vocab"]["tokens"] == len(vocab)
