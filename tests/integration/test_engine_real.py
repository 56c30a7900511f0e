"""The engine on the real bundled Whisper base weights and synthetic lecture speech."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.asr.bench import word_error_rate
from workers.asr.loading import LoadedPair, PairMismatchError, load_pair
from workers.asr.speculative import SpeculativeDecoder
from workers.asr.token_rules import DecodeOptions

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_pair(base_model_dir: Path) -> LoadedPair:
    return load_pair("bundled:whisper-base", "int8:")


@pytest.mark.parametrize("timestamps", [False, True])
def test_piper_clip_lossless_and_accurate(base_pair: LoadedPair, timestamps: bool) -> None:
    from workers.lecture_text import lecture_clips

    clip = lecture_clips(1, seed=3)[0]
    decoder = SpeculativeDecoder(base_pair)
    options = DecodeOptions(language=None, timestamps=timestamps)
    features = decoder.features(clip.pcm)
    plain = decoder.decode(features, options, duration=clip.seconds, draft=False)
    spec = decoder.decode(features, options, duration=clip.seconds)
    assert spec.tokens == plain.tokens
    assert plain.language == "en"  # detected
    assert word_error_rate([clip.text], [spec.text]) < 0.10
    assert spec.stats.acceptance > 0.7
    assert spec.stats.verifier_passes < plain.stats.verifier_passes / 3
    if timestamps:
        assert len(spec.segments) >= 2
        starts = [s.start for s in spec.segments]
        assert starts == sorted(starts) and spec.segments[-1].end <= clip.seconds + 0.5


def test_tiny_en_cannot_draft_for_base(base_model_dir: Path) -> None:
    with pytest.raises(PairMismatchError, match="vocab_size"):
        load_pair("bundled:whisper-base", "bundled:whisper-tiny.en")
