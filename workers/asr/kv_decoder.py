"""A Whisper decoder driven step by step over a preallocated key/value cache.

Why not the transformers decoder forward: speculative decoding crops the self-attention cache after
every verify pass and runs many tiny forwards. transformers' ``DynamicCache`` grows by concatenation
and its forward builds masks and output objects on every call; here the cache is one preallocated
tensor per layer, a crop is a length change, and cross-attention keys/values are computed once per
chunk (and shared with the int8 drafter, whose cross-attention would otherwise re-project the same
encoder output). The arithmetic is the transformers modules' own: the same ``nn.Linear``/``LayerNorm``
objects (quantised ones for the int8 drafter), the same query pre-scaling, exact GELU from the layer.

Ragged batches keep one cache length per row (no left padding): a row's new keys are written at its
own offset, and the attention mask lets each query see only its row's valid prefix. Positions come
from the row's own length, so a row decodes exactly as it would alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.asr.loading import WhisperParts

CrossKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per decoder layer: cross-attention keys and values, shaped [batch, heads, frames, head_dim]."""


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; for a float ``nn.Linear`` on several CPU rows computed as ``(W @ x.T).T``: the CPU GEMM
    kernel behind ``F.linear`` repacks the whole weight for a handful of rows (4 rows through base's vocabulary
    projection cost 2.7x one row; this form 0.7x). One row keeps the module's own kernel, so a plain greedy
    step stays bit-identical to transformers'."""
    rows = x.numel() // x.shape[-1]
    if rows == 1 or type(module) is not nn.Linear or x.device.type != "cpu":
        return module(x)
    out = (module.weight @ x.reshape(rows, -1).T).T
    out = out + module.bias if module.bias is not None else out.contiguous()
    return out.view(*x.shape[:-1], -1)


def _dtype_of(decoder: nn.Module) -> torch.dtype:
    return decoder.embed_tokens.weight.dtype


class KVDecoder:
    """Incremental decoder over a fixed-size cache for ``batch_size`` rows of at most ``max_length`` tokens."""

    def __init__(self, parts: WhisperParts, batch_size: int, max_length: int) -> None:
        self.decoder = parts.decoder
        self.proj_out = parts.proj_out
        self.layers = list(parts.decoder.layers)
        attn = self.layers[0].self_attn
        self.heads = attn.num_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.dtype = _dtype_of(parts.decoder)
        self.device = parts.decoder.embed_tokens.weight.device
        self.batch_size = batch_size
        self.max_length = max_length
        shape = (batch_size, self.heads, max_length, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.lengths = [0] * batch_size
        self.cross: CrossKV = []

    def cross_kv(self, encoder_hidden: torch.Tensor) -> CrossKV:
        """Project an encoder output [rows, frames, d_model] into this decoder's cross-attention K/V."""
        hidden = encoder_hidden.to(self.dtype)
        rows, frames = hidden.shape[:2]
        out: CrossKV = []
        for layer in self.layers:
            attn = layer.encoder_attn
            k = attn.k_proj(hidden).view(rows, frames, self.heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(hidden).view(rows, frames, self.heads, self.head_dim).transpose(1, 2)
            out.append((k.contiguous(), v.contiguous()))
        return out

    def start(self, cross: CrossKV) -> None:
        """Begin decoding new chunks in every row: empty the caches and attend to ``cross`` (all rows)."""
        self.cross = [(k.to(self.dtype), v.to(self.dtype)) for k, v in cross]
        self.lengths = [0] * self.batch_size

    def load(self, rows: list[int], cross: CrossKV) -> None:
        """Start new chunks in ``rows`` only (continuous batching): their cross K/V, empty caches."""
        frames = cross[0][0].shape[2]
        if not self.cross or self.cross[0][0].shape[0] != self.batch_size or self.cross[0][0].shape[2] != frames:
            shape = (self.batch_size, self.heads, frames, self.head_dim)
            self.cross = [
                (
                    torch.zeros(shape, dtype=self.dtype, device=self.device),
                    torch.zeros(shape, dtype=self.dtype, device=self.device),
                )
                for _ in self.layers
            ]
        index = torch.tensor(rows, device=self.device)
        for (ck, cv), (k, v) in zip(self.cross, cross):
            ck[index] = k.to(self.dtype)
            cv[index] = v.to(self.dtype)
        self.reset(rows)

    def reset(self, rows: list[int]) -> None:
        """Empty the self-attention caches of ``rows`` (their cross K/V are set elsewhere)."""
        for r in rows:
            self.lengths[r] = 0

    def share_cross(self, cross: CrossKV) -> None:
        """Attend to cross K/V slots another decoder holds (a drafter reads the verifier's, uncopied)."""
        self.cross = cross

    def crop(self, row: int, length: int) -> None:
        """Forget everything past ``length`` tokens of ``row`` (after a rejected draft)."""
        if length < self.lengths[row]:
            self.lengths[row] = length

    def forward(
        self,
        tokens: torch.Tensor,
        rows: list[int] | None = None,
        counts: list[int] | None = None,
        gather: list[int] | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` [len(rows), q], appended to each row's cache, and return their logits.

        ``rows`` selects the cache rows (all by default). ``counts`` gives each row's real token count
        when rows are ragged (padding after it is computed but never kept). Returns logits
        [len(rows), q, V], or [len(rows), V] at the positions ``gather`` (one per row) when given.
        """
        rows = list(range(self.batch_size)) if rows is None else rows
        n, q = tokens.shape
        if n != len(rows):
            raise ValueError(f"{n} token rows for {len(rows)} cache rows")
        starts = [self.lengths[r] for r in rows]
        if max(starts) + q > self.max_length:
            raise ValueError(f"decoder cache of {self.max_length} tokens exceeded")
        offsets = torch.tensor(starts, device=self.device)[:, None] + torch.arange(q, device=self.device)
        hidden = self.decoder.embed_tokens(tokens) + self.decoder.embed_positions.weight[offsets]
        end = max(starts) + q
        mask = self._mask(starts, q, end)
        runs = _runs(rows)
        aligned = len(runs) == 1 and len(set(starts)) == 1
        row_index = torch.tensor(rows, device=self.device)
        for i, layer in enumerate(self.layers):
            hidden = self._layer(i, layer, hidden, row_index, runs, starts[0] if aligned else None, offsets, end, mask)
        for j, r in enumerate(rows):
            self.lengths[r] += q if counts is None else counts[j]
        if gather is not None:
            hidden = hidden[torch.arange(n, device=self.device), torch.tensor(gather, device=self.device)]
        return _linear(self.proj_out, self.decoder.layer_norm(hidden))

    def _mask(self, starts: list[int], q: int, end: int) -> torch.Tensor | None:
        if len(starts) == 1 and q == 1:
            return None  # one query attends to the whole valid prefix
        key_pos = torch.arange(end, device=self.device)
        limit = torch.tensor(starts, device=self.device)[:, None] + torch.arange(q, device=self.device)
        return (key_pos[None, None, :] <= limit[:, :, None])[:, None]  # [rows, 1, q, end]

    def _layer(
        self,
        i: int,
        layer: nn.Module,
        hidden: torch.Tensor,
        row_index: torch.Tensor,
        runs: list[tuple[int, int, int]],
        aligned_start: int | None,
        positions: torch.Tensor,
        end: int,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        n, q = hidden.shape[:2]
        attn = layer.self_attn
        residual = hidden
        h = layer.self_attn_layer_norm(hidden)
        query = (_linear(attn.q_proj, h) * self.scaling).view(n, q, self.heads, self.head_dim).transpose(1, 2)
        key = _linear(attn.k_proj, h).view(n, q, self.heads, self.head_dim).transpose(1, 2)
        value = _linear(attn.v_proj, h).view(n, q, self.heads, self.head_dim).transpose(1, 2)
        cache_k, cache_v = self.keys[i], self.values[i]
        if aligned_start is not None:  # consecutive rows at one length: a slice write
            lo, s = runs[0][1], aligned_start
            cache_k[lo : lo + n, :, s : s + q] = key
            cache_v[lo : lo + n, :, s : s + q] = value
        else:  # ragged: each row's keys go to its own offset, in one indexed write
            where = (row_index[:, None], slice(None), positions)
            cache_k[where] = key.transpose(1, 2)
            cache_v[where] = value.transpose(1, 2)
        h = _attention(query, cache_k[:, :, :end], cache_v[:, :, :end], runs, mask)
        h = _linear(attn.out_proj, h.transpose(1, 2).reshape(n, q, -1))
        hidden = residual + h

        cross = layer.encoder_attn
        residual = hidden
        h = layer.encoder_attn_layer_norm(hidden)
        query = (_linear(cross.q_proj, h) * self.scaling).view(n, q, self.heads, self.head_dim).transpose(1, 2)
        h = _attention(query, *self.cross[i], runs, None)
        h = _linear(cross.out_proj, h.transpose(1, 2).reshape(n, q, -1))
        hidden = residual + h

        residual = hidden
        h = layer.final_layer_norm(hidden)
        h = _linear(layer.fc2, layer.activation_fn(_linear(layer.fc1, h)))
        return residual + h


def _runs(rows: list[int]) -> list[tuple[int, int, int]]:
    """``rows`` as runs of consecutive cache rows: (first index in ``rows``, first cache row, length)."""
    runs: list[tuple[int, int, int]] = []
    for j, r in enumerate(rows):
        if runs and runs[-1][1] + runs[-1][2] == r:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((j, r, 1))
    return runs


def _attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    runs: list[tuple[int, int, int]],
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of each query row to its own cache row, one call per run of consecutive rows: cache rows are
    sliced (views), never gathered — gathering copied every active row's 1500-frame cross K/V per layer."""
    parts = [
        F.scaled_dot_product_attention(
            query[j : j + m],
            keys[lo : lo + m],
            values[lo : lo + m],
            attn_mask=None if mask is None else mask[j : j + m],
            scale=1.0,
        )
        for j, lo, m in runs
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)
