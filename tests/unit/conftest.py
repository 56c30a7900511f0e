"""Tiny randomly initialised Whisper models (no downloads) with Whisper's real special-token layout."""

from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)

from workers.asr.loading import Verifier

torch.set_num_threads(1)  # tiny models: thread start-up and spin-waits cost more than they save

VOCAB = 51865
EOS, SOT, TRANSLATE, TRANSCRIBE, NO_TIMESTAMPS = 50257, 50258, 50358, 50359, 50363
LANGS = {"<|en|>": 50259, "<|zh|>": 50260, "<|de|>": 50261, "<|es|>": 50262, "<|fr|>": 50265}


def tiny_config(d_model: int = 32, layers: int = 2, heads: int = 4, vocab: int = VOCAB) -> WhisperConfig:
    """A Whisper config small enough to run hundreds of decodes per second."""
    return WhisperConfig(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        num_mel_bins=80,
        max_source_positions=150,  # 3 s windows: Whisper's shapes, a tenth of the work
        max_target_positions=448,
        decoder_start_token_id=SOT,
        eos_token_id=EOS,
        pad_token_id=EOS,
        bos_token_id=EOS,
    )


def tiny_generation_config(multilingual: bool = True) -> GenerationConfig:
    """Whisper's generation settings with the real multilingual special-token ids."""
    return GenerationConfig(
        decoder_start_token_id=SOT,
        eos_token_id=EOS,
        pad_token_id=EOS,
        bos_token_id=EOS,
        no_timestamps_token_id=NO_TIMESTAMPS,
        lang_to_id=LANGS if multilingual else {},
        task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE},
        is_multilingual=multilingual,
        suppress_tokens=[1, 2, 7, 8, 9, 10, 14, 25, 50358, 50359, 50360, 50361, 50362],
        begin_suppress_tokens=[220, EOS],
        max_initial_timestamp_index=50,
        max_length=448,
        return_timestamps=False,
    )


def tiny_processor(vocab: int = VOCAB) -> WhisperProcessor:
    """A word-level tokenizer over made-up tokens plus Whisper's real feature extractor."""
    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="w0")))
    return WhisperProcessor(feature_extractor=WhisperFeatureExtractor(), tokenizer=tokenizer)


def tiny_model(seed: int, dtype: torch.dtype = torch.float64, **config) -> WhisperForConditionalGeneration:
    """A randomly initialised tiny Whisper in eval mode, reproducible from ``seed``."""
    torch.manual_seed(seed)
    cfg = tiny_config(**config)
    cfg.init_std = 0.2  # peaked logits: greedy choices are decisive, not near-ties
    model = WhisperForConditionalGeneration(cfg).to(dtype).eval()
    model.generation_config = tiny_generation_config()
    return model


def tiny_verifier(seed: int, dtype: torch.dtype = torch.float64, **config) -> Verifier:
    """A tiny verifier as ``load_verifier`` would return it."""
    model = tiny_model(seed, dtype, **config)
    return Verifier(
        model, tiny_processor(model.config.vocab_size), copy.deepcopy(model.generation_config), f"tiny:{seed}"
    )


def tiny_features(seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Random log-mel features for the tiny models' 300-frame window."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 80, 300, generator=generator, dtype=dtype)


@pytest.fixture
def make_verifier():
    return tiny_verifier


@pytest.fixture
def make_model():
    return tiny_model
