"""Batched speculative decoding with per-sequence acceptance and continuous batching.

Each round every live row drafts up to its own ``k`` tokens (the drafter steps all drafting rows
together; a row that stops drafting leaves the step), one verifier pass scores every row's
``[pending tokens] + drafts``, and each row keeps its own longest agreeing prefix plus the verifier's
token. A finished row leaves the batch at once and its slot is refilled from the waiting chunks
(one encoder pass for the newcomers) without stalling the others.

Ragged rows: per-row cache lengths, not pad-and-mask. Every row owns a slot of a preallocated cache
and a length; new keys are written at the row's own offset, positions come from the row's own
length, and the attention mask limits each query to its row's valid prefix. Compared with left-padded
pad-and-mask (what transformers does), a crop is a length change instead of a re-pad of the whole
batch, a refilled slot needs no re-alignment with its neighbours, and a row's positions never shift,
so each row's arithmetic is the same as decoding it alone. Ragged inputs within one forward (a new
row's prompt next to a one-token row) are padded on the right and the padding is never kept.

Verify budget: a verify pass scores every row's drafts at once, so its cost grows with the total number
of positions (batch x (k + 1)) once the batch is large enough for the projections to be compute-bound
rather than memory-bound (on a CPU from about 4 rows). Each row's ``k`` is therefore capped so that one
pass holds at most ``verify_budget`` positions; rows still adapt ``k`` to their own acceptance below it.

``shared_acceptance=True`` reproduces what transformers and the distil-whisper paper measured: one
accepted length for the whole (static) batch, the minimum over its rows. It stays lossless; it is kept
as a benchmark mode only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from workers.asr.kv_decoder import KVDecoder
from workers.asr.loading import LoadedPair
from workers.asr.speculative import DraftPolicy, SpeculativeDecoder, _sync
from workers.asr.token_rules import DecodeOptions, DecodeRun
from workers.types import SAMPLE_RATE, DecodeResult, DecodeStats


@dataclass
class ChunkInput:
    """One chunk to decode: its log-mel features [1, mels, frames], options and audio duration."""

    features: torch.Tensor
    options: DecodeOptions
    duration: float


@dataclass
class _Row:
    item: int
    slot: int
    tokens: list[int]
    run: DecodeRun
    language_token: int | None
    duration: float
    k: int
    stats: DecodeStats = field(default_factory=DecodeStats)
    drafts: list[int] = field(default_factory=list)


class BatchedDecoder:
    """Decodes many chunks with up to ``batch_size`` in flight; results come back as rows finish."""

    def __init__(
        self,
        pair: LoadedPair,
        batch_size: int,
        policy: DraftPolicy | None = None,
        shared_acceptance: bool = False,
        verify_budget: int = 64,
    ) -> None:
        self.single = SpeculativeDecoder(pair, policy)
        self.pair = pair
        self.policy = self.single.policy
        self.rules = self.single.rules
        self.batch_size = batch_size
        self.shared = shared_acceptance
        self.verify_budget = verify_budget
        self.device = pair.verifier.device
        config = pair.verifier.model.config
        self.verifier = KVDecoder(pair.verifier.parts, batch_size, config.max_target_positions)
        drafter = pair.drafter
        self.drafter = (
            KVDecoder(drafter.parts, batch_size, drafter.parts.config.max_target_positions) if drafter else None
        )

    def features(self, pcm: np.ndarray) -> torch.Tensor:
        """Log-mel features of one chunk (see :meth:`SpeculativeDecoder.features`)."""
        return self.single.features(pcm)

    def transcribe_many(self, pcms: list[np.ndarray], options: DecodeOptions) -> list[DecodeResult]:
        """Transcribe chunks of 16 kHz PCM (at most 30 s each) together; results in input order."""
        chunks = [ChunkInput(self.features(pcm), options, len(pcm) / SAMPLE_RATE) for pcm in pcms]
        results = dict(self.decode_many(chunks))
        return [results[i] for i in range(len(pcms))]

    @torch.inference_mode()
    def decode_many(self, chunks: Iterable[ChunkInput], draft: bool = True) -> Iterator[tuple[int, DecodeResult]]:
        """Decode ``chunks``; yields ``(input index, result)`` in completion order."""
        draft = draft and self.drafter is not None
        waiting = iter(enumerate(chunks))
        free = list(range(self.batch_size))
        active: list[_Row] = []
        shared_k = self.policy.initial
        exhausted = False
        while True:
            if not exhausted and free and (not self.shared or not active):
                admitted = [item for _, item in zip(range(len(free)), waiting)]
                exhausted = len(admitted) < len(free)
                if admitted:
                    active += self._admit(admitted, [free.pop(0) for _ in admitted], draft)
            if not active:
                return
            t0 = time.perf_counter()
            if draft:
                if self.shared:
                    for row in active:
                        row.k = shared_k
                self._draft(active)
            taken = self._verify(active)
            if self.shared and draft:
                drafted = max(len(row.drafts) for row in active)
                shared_k = self.policy.next_k(shared_k, drafted, min(taken, drafted))
            _sync(self.device)
            share = (time.perf_counter() - t0) / len(active)
            finished = []
            for row in active:
                row.stats.decoder_seconds += share
                if row.run.stop_reason is not None:
                    finished.append(row)
            for row in finished:
                active.remove(row)
                free.append(row.slot)
                yield row.item, self.single.result(row.tokens, row.run, row.language_token, row.duration, row.stats)

    def _admit(self, items: list[tuple[int, ChunkInput]], slots: list[int], draft: bool) -> list[_Row]:
        """Encode newcomers in one pass, load their cross K/V into free slots, build their prompts."""
        t0 = time.perf_counter()
        features = torch.cat([chunk.features for _, chunk in items])
        encoder_out = self.pair.verifier.parts.encoder(features).last_hidden_state
        verifier_cross = self.verifier.cross_kv(encoder_out)
        self.verifier.load(slots, verifier_cross)
        drafter = self.pair.drafter
        if draft and drafter is not None and self.drafter is not None:
            if drafter.shares_cross_kv and self.drafter.dtype == self.verifier.dtype:
                self.drafter.share_cross(drafter.verifier_cross(self.verifier.cross))
                self.drafter.reset(slots)
            elif drafter.shares_cross_kv:
                self.drafter.load(slots, drafter.verifier_cross(verifier_cross))
            elif drafter.shares_encoder:
                self.drafter.load(slots, self.drafter.cross_kv(encoder_out))
            else:
                own = drafter.parts.encoder(features.to(self.drafter.dtype)).last_hidden_state
                self.drafter.load(slots, self.drafter.cross_kv(own))
        languages = self._languages([chunk.options for _, chunk in items], slots)
        _sync(self.device)
        encoder_share = (time.perf_counter() - t0) / len(items)
        rows = []
        for (item, chunk), slot, language in zip(items, slots, languages):
            tokens = self.rules.prompt(language, chunk.options)
            row = _Row(
                item,
                slot,
                tokens,
                DecodeRun(self.rules, tokens, chunk.options),
                language,
                chunk.duration,
                self.policy.initial,
            )
            row.stats.encoder_seconds = encoder_share
            rows.append(row)
        return rows

    def _languages(self, options: list[DecodeOptions], slots: list[int]) -> list[int | None]:
        """Requested language tokens; rows without one are detected in one verifier step on ``<|sot|>``."""
        if not self.rules.multilingual:
            return [None] * len(options)
        out: list[int | None] = [
            self.rules.language_token(o.language) if o.language is not None else None for o in options
        ]
        detect = [i for i, o in enumerate(options) if o.language is None]
        if detect:
            tokens = torch.full((len(detect), 1), self.rules.sot, device=self.device)
            logits = self.verifier.forward(tokens, rows=[slots[i] for i in detect])[:, -1]
            ids = torch.tensor(self.rules.language_ids(), device=logits.device)
            choice = ids[logits[:, ids].argmax(-1)]
            for i, token in zip(detect, choice.tolist()):
                out[i] = int(token)
        return out

    def _draft(self, rows: list[_Row]) -> None:
        """Every row drafts up to its own ``k`` tokens; the drafter steps all still-drafting rows at once."""
        drafter = self.drafter
        assert drafter is not None
        prefixes = {row.slot: list(row.tokens) for row in rows}
        pending: dict[int, list[int]] = {}
        drafting = []
        cap = max(self.verify_budget // len(rows) - 1, 1)
        for row in rows:
            row.drafts = []
            row.k = min(row.k, cap)
            if min(row.k, row.run.max_length - len(row.tokens) - 1) > 0:
                pending[row.slot] = row.tokens[drafter.lengths[row.slot] :]
                drafting.append(row)
        while drafting:
            t0 = time.perf_counter()
            counts = [len(pending[row.slot]) for row in drafting]
            logits = drafter.forward(
                self._padded([pending[row.slot] for row in drafting]),
                rows=[row.slot for row in drafting],
                counts=counts,
                gather=[c - 1 for c in counts],
            )
            share = (time.perf_counter() - t0) / len(drafting)
            still = []
            for j, row in enumerate(drafting):
                row.stats.drafter_steps += 1
                row.stats.draft_seconds += share
                prefix = prefixes[row.slot]
                scores = row.run.process(prefix, logits[j])
                token = int(scores.argmax())
                budget = min(row.k, row.run.max_length - len(row.tokens) - 1)
                row.drafts.append(token)
                prefix.append(token)
                if token != self.rules.eos and len(row.drafts) < budget and not self.policy.unsure(scores, token):
                    pending[row.slot] = [token]
                    still.append(row)
            drafting = still

    def _verify(self, rows: list[_Row]) -> int:
        """One verifier pass over every row; each row keeps its agreeing prefix (or the batch minimum).

        Returns the number of tokens taken per row in shared mode (the minimum), else the maximum."""
        t0 = time.perf_counter()
        verifier = self.verifier
        inputs, firsts = [], []
        for row in rows:
            fed = verifier.lengths[row.slot]
            inputs.append(row.tokens[fed:] + row.drafts)
            firsts.append(len(row.tokens) - 1 - fed)
        logits = verifier.forward(
            self._padded(inputs), rows=[row.slot for row in rows], counts=[len(i) for i in inputs]
        )
        choices = []
        for j, row in enumerate(rows):
            prefix = list(row.tokens)
            chosen: list[int] = []
            for i in range(len(row.drafts) + 1):
                token = row.run.next_token(prefix, logits[j, firsts[j] + i])
                chosen.append(token)
                prefix.append(token)
                if i == len(row.drafts) or token != row.drafts[i]:
                    break
            choices.append(chosen)
        take = min(len(c) for c in choices) if self.shared else max(len(c) for c in choices)
        share = (time.perf_counter() - t0) / len(rows)
        for row, chosen in zip(rows, choices):
            before = len(row.tokens)
            kept = chosen[: min(take, len(chosen))]
            accepted = sum(1 for i, t in enumerate(kept) if i < len(row.drafts) and t == row.drafts[i])
            for token in kept:
                if row.run.append(row.tokens, token):
                    break
            stats = row.stats
            stats.verifier_passes += 1
            stats.verify_seconds += share
            stats.drafted += len(row.drafts)
            stats.accepted += accepted
            verifier.crop(row.slot, len(row.tokens) - 1)
            if self.drafter is not None:
                self.drafter.crop(row.slot, min(before + accepted, len(row.tokens) - 1))
            if not self.shared:
                row.k = self.policy.next_k(row.k, len(row.drafts), accepted)
        return take

    def _padded(self, sequences: list[list[int]]) -> torch.Tensor:
        """Right-pad ragged token lists into one tensor (padding is computed but never kept)."""
        width = max(len(s) for s in sequences)
        return torch.tensor([s + [self.rules.eos] * (width - len(s)) for s in sequences], device=self.device)
