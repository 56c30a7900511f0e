"""Distilled drafters on disk: ``drafter.safetensors`` + ``drafter.json``, and loading them for a verifier.

A distilled drafter is a Whisper decoder of a few layers that reads the verifier's encoder output.
Its token/position embeddings and output projection are the verifier's own (tied, frozen during
training), so only its layers and final layer norm are stored (fp16). ``drafter.json`` records the
verifier it was trained for, with a fingerprint of the verifier's weights: loading it for any other
verifier is refused. ``distilled:whisper-base`` names the drafter shipped in this package.

A drafter may also store a *draft vocabulary* (``draft_vocab``): the token ids it may propose — the
most frequent in its training labels, filled up with the lowest ids, plus every special and timestamp
token. Its vocabulary projection is then the verifier's restricted to those rows (int8 on CPU: 16k of
51,865 rows cost ~1/3 of the full projection, which is a third of a 2-layer drafter's step). A token
outside the set is never drafted, so the verifier supplies it; decoding stays lossless.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import WhisperForCausalLM

from workers.asr.loading import Drafter, PairMismatchError, Verifier, WhisperParts

WEIGHTS = "drafter.safetensors"
DRAFT_VOCAB = "draft_vocab"
"""The tensor of ``drafter.safetensors`` holding the draft vocabulary (int32 token ids, ascending)."""
METADATA = "drafter.json"
FORMAT = 1
SHIPPED = Path(__file__).parent / "drafters"
"""Drafters shipped in the package, one directory per name (``distilled:whisper-base``)."""


def spaced_layers(total: int, count: int) -> list[int]:
    """``count`` maximally spaced layer indices of ``total`` (2 of 6 -> [0, 5])."""
    if not 1 <= count <= total:
        raise ValueError(f"cannot take {count} of {total} decoder layers")
    if count == 1:
        return [0]
    return [round(i * (total - 1) / (count - 1)) for i in range(count)]


def verifier_fingerprint(verifier: Verifier) -> str:
    """sha256 over the verifier's decoder dimensions and token embedding (as fp16 bytes, dtype-independent)."""
    config = verifier.model.config
    dims = (config.vocab_size, config.d_model, config.decoder_layers, config.decoder_attention_heads)
    digest = hashlib.sha256(repr(dims).encode())
    embedding = verifier.model.model.decoder.embed_tokens.weight.detach()
    digest.update(embedding.to("cpu", torch.float16).contiguous().numpy().tobytes())
    return digest.hexdigest()


def build_drafter(verifier: Verifier, layer_map: list[int], dtype: torch.dtype | None = None) -> WhisperForCausalLM:
    """A ``WhisperForCausalLM`` of ``len(layer_map)`` layers copied from the verifier's ``layer_map``.

    Embeddings and projection are the verifier's parameters (shared, frozen) when ``dtype`` is the
    verifier's; otherwise frozen copies in ``dtype``. Cross-attention key/value projections are
    frozen at the verifier's too; everything else in the layers trains."""
    dtype = dtype or verifier.dtype
    source = verifier.model.model.decoder
    config = copy.deepcopy(verifier.model.config)
    config.decoder_layers = len(layer_map)
    config.dropout = config.attention_dropout = config.activation_dropout = 0.0
    config.architectures = ["WhisperForCausalLM"]
    with torch.device("meta"):
        model = WhisperForCausalLM(config)
    decoder = model.model.decoder
    decoder.layers = nn.ModuleList(copy.deepcopy(source.layers[i]) for i in layer_map)
    for index, layer in enumerate(decoder.layers):  # cache slots are addressed by the layer's own index
        for attn in (layer.self_attn, layer.encoder_attn):
            attn.layer_idx = index
        # the verifier's own projections of its encoder output: frozen (their backward pass over 1500
        # frames would cost as much as the rest of a training step)
        layer.encoder_attn.k_proj.requires_grad_(False)
        layer.encoder_attn.v_proj.requires_grad_(False)
    decoder.layer_norm = copy.deepcopy(source.layer_norm)
    shared = dtype == verifier.dtype
    for name in ("embed_tokens", "embed_positions"):
        module = getattr(source, name) if shared else copy.deepcopy(getattr(source, name))
        setattr(decoder, name, module)
    model.proj_out = verifier.model.proj_out if shared else copy.deepcopy(verifier.model.proj_out)
    model.to(dtype)
    for module in (decoder.embed_tokens, decoder.embed_positions, model.proj_out):
        module.requires_grad_(False)
    return model.eval()


class DraftVocabulary(nn.Module):
    """A vocabulary projection restricted to ``vocab``: full-size logits, the dtype's minimum elsewhere."""

    def __init__(self, proj: nn.Linear, vocab: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = proj.out_features
        weight = proj.weight.detach()
        self.inner = nn.Linear(proj.in_features, len(vocab), bias=False, device=weight.device, dtype=weight.dtype)
        self.inner.weight.data.copy_(weight[vocab.to(weight.device).long()])
        self.inner.requires_grad_(False)
        self.register_buffer("vocab", vocab.to(weight.device).long())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.inner(hidden)
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), torch.finfo(logits.dtype).min)
        return full.index_copy_(-1, self.vocab, logits)


def choose_draft_vocab(label_tokens: Counter, size: int, first_special: int, vocab_size: int) -> torch.Tensor:
    """``size`` text tokens plus every id from ``first_special`` on (ascending): the most frequent label
    tokens first, then the lowest ids not yet taken (BPE ids follow merge order, so low ids are the
    common pieces of text: the labels of a few hours miss many words a new recording uses)."""
    common = [t for t, _ in sorted(label_tokens.items(), key=lambda kv: (-kv[1], kv[0])) if t < first_special]
    chosen = set(common[:size])
    fill = (t for t in range(first_special) if t not in chosen)
    chosen.update(next(fill) for _ in range(min(size, first_special) - len(chosen)))
    return torch.tensor(sorted([*chosen, *range(first_special, vocab_size)]), dtype=torch.int32)


def own_state(model: WhisperForCausalLM) -> dict[str, torch.Tensor]:
    """The drafter's own tensors (layers, final layer norm) — what ``drafter.safetensors`` stores."""
    decoder = model.model.decoder
    state = {f"layers.{k}": v for k, v in decoder.layers.state_dict().items()}
    state.update({f"layer_norm.{k}": v for k, v in decoder.layer_norm.state_dict().items()})
    return state


def load_own_state(model: WhisperForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """Load tensors named as by :func:`own_state` into the drafter (cast to its dtype)."""
    decoder = model.model.decoder
    for name in ("layers", "layer_norm"):
        prefix = f"{name}."
        own = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
        getattr(decoder, name).load_state_dict(own)


def save_drafter(model: WhisperForCausalLM, out: Path, metadata: dict, draft_vocab: torch.Tensor | None = None) -> None:
    """Write the drafter's own weights (fp16), its draft vocabulary if any, and its metadata into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in own_state(model).items()}
    if draft_vocab is not None:
        tensors[DRAFT_VOCAB] = draft_vocab.to("cpu", torch.int32).contiguous()
    save_file(tensors, str(out / WEIGHTS))
    (out / METADATA).write_text(json.dumps({"format": FORMAT, **metadata}, indent=2) + "\n")


_INT8_LAYERS = ("fc1", "fc2", "proj_out", "proj_out.inner")


def drafter_dir(path: str) -> Path:
    """A drafter directory: ``path`` itself, or the shipped drafter of that name."""
    direct = Path(path)
    if (direct / METADATA).is_file():
        return direct
    if (SHIPPED / path / METADATA).is_file():
        return SHIPPED / path
    raise FileNotFoundError(f"no distilled drafter at {path!r} (expected {METADATA} + {WEIGHTS})")


def read_metadata(path: str) -> dict:
    """The ``drafter.json`` of a drafter directory or shipped name."""
    return json.loads((drafter_dir(path) / METADATA).read_text())


def load_distilled_drafter(path: str, verifier: Verifier, quantize: bool | None = None) -> Drafter:
    """Load a distilled drafter for ``verifier`` (refused when it was trained for another verifier).

    ``quantize`` (default: on a float32 CPU verifier) converts the drafter's vocabulary projection (a copy,
    or its draft-vocabulary rows) and its feed-forward layers to dynamic int8; the 512x512 attention
    projections stay float (for one row, dynamic int8 costs more than it saves there)."""
    directory = drafter_dir(path)
    meta = json.loads((directory / METADATA).read_text())
    fingerprint = verifier_fingerprint(verifier)
    if meta.get("verifier_fingerprint") != fingerprint:
        raise PairMismatchError(
            f"distilled drafter {str(directory)!r} was trained for verifier {meta.get('verifier')!r} "
            f"(fingerprint {str(meta.get('verifier_fingerprint'))[:12]}), not for {verifier.ref!r} "
            f"(fingerprint {fingerprint[:12]}); distil one with `specscribe drafter distill --verifier {verifier.ref}`"
        )
    model = build_drafter(verifier, meta["layer_map"])
    tensors = load_file(str(directory / WEIGHTS))
    load_own_state(model, tensors)
    model.to(verifier.device, verifier.dtype)
    if DRAFT_VOCAB in tensors:
        model.proj_out = DraftVocabulary(model.proj_out, tensors[DRAFT_VOCAB])
    if quantize is None:
        quantize = verifier.device.type == "cpu" and verifier.dtype == torch.float32
    if quantize:
        if not isinstance(model.proj_out, DraftVocabulary):
            model.proj_out = copy.deepcopy(model.proj_out)  # the verifier keeps its float projection
        names = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.endswith(_INT8_LAYERS)}
        model = torch.ao.quantization.quantize_dynamic(model, names, dtype=torch.qint8, inplace=True)
    cross_layers = None
    if _verifier_cross_projections(tensors, verifier, meta["layer_map"]):
        cross_layers = tuple(meta["layer_map"])
        source = verifier.model.model.decoder.layers
        for layer, index in zip(model.model.decoder.layers, cross_layers):
            layer.encoder_attn.k_proj = source[index].encoder_attn.k_proj
            layer.encoder_attn.v_proj = source[index].encoder_attn.v_proj
    ref = f"distilled:{path}"
    parts = WhisperParts(model.model.decoder, model.proj_out, model.config)
    return Drafter(parts, ref, shares_encoder=True, cross_layers=cross_layers, hf_model=model)


def _verifier_cross_projections(tensors: dict[str, torch.Tensor], verifier: Verifier, layer_map: list[int]) -> bool:
    """Whether the stored cross-attention key/value projections are the verifier's ``layer_map`` layers' (as
    trained: frozen, stored fp16). Then the drafter attends with the verifier's cross K/V of those layers
    instead of projecting the encoder output again (2 x 1500 x 512 x 512 per layer and chunk)."""
    source = verifier.model.model.decoder.layers
    for i, index in enumerate(layer_map):
        for name in ("k_proj", "v_proj"):
            own = source[index].encoder_attn.get_submodule(name).state_dict()
            for key, value in own.items():
                stored = tensors.get(f"layers.{i}.encoder_attn.{name}.{key}")
                if stored is None or not torch.equal(stored, value.detach().to("cpu", stored.dtype)):
                    return False
    return True
