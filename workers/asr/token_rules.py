"""The verifier's decoding rules: prompt, logits processors, stop conditions, timestamps -> segments.

The logits processors are the ones ``WhisperForConditionalGeneration.generate`` builds, in its order:
begin-suppression, token suppression, then transformers' own ``WhisperTimeStampLogitsProcessor``.
The two suppressions are re-implemented as index fills with precomputed ids because transformers'
versions rebuild a vocabulary-sized ``isin`` mask on every call (11 ms a position on this CPU);
the result is the same ``-inf`` at the same ids. Every verified position sees the same rules as a
plain greedy step would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from workers.types import Segment

TIME_PRECISION = 0.02
"""Seconds per timestamp token step."""


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode one chunk. ``language=None`` detects it; ``repetition_window=None`` disables the guard."""

    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = True
    max_new_tokens: int | None = None
    repetition_window: int | None = 48


class SuppressTokens:
    """Set the logits of fixed token ids to ``-inf`` (from ``begin_index`` only, when given)."""

    def __init__(self, token_ids: list[int], begin_index: int | None = None) -> None:
        self.ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
        self.begin_index = begin_index

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.begin_index is not None and input_ids.shape[-1] != self.begin_index:
            return scores
        if self.ids.device != scores.device:
            self.ids = self.ids.to(scores.device)
        return scores.index_fill(-1, self.ids, float("-inf"))


class TokenRules:
    """Prompt construction, logits processing and stopping for one verifier's vocabulary."""

    def __init__(self, generation_config: GenerationConfig, max_target_positions: int) -> None:
        self.config = generation_config
        self.max_target_positions = max_target_positions
        self.eos = int(generation_config.eos_token_id)
        self.sot = int(generation_config.decoder_start_token_id)
        self.no_timestamps = int(generation_config.no_timestamps_token_id)
        self.timestamp_begin = self.no_timestamps + 1
        self.multilingual = bool(getattr(generation_config, "is_multilingual", False))
        self.lang_to_id: dict[str, int] = dict(getattr(generation_config, "lang_to_id", None) or {})
        self.id_to_lang = {v: k.strip("<|>") for k, v in self.lang_to_id.items()}

    def language_ids(self) -> list[int]:
        """Token ids of every language the model knows (empty for English-only models)."""
        return sorted(self.lang_to_id.values()) if self.multilingual else []

    def language_token(self, language: str) -> int:
        """The token id of a language code or name (``en``, ``english``, ``<|en|>``)."""
        from transformers.models.whisper.tokenization_whisper import LANGUAGES, TO_LANGUAGE_CODE

        code = language.lower().strip("<|>")
        code = TO_LANGUAGE_CODE.get(code, code)
        token = f"<|{code}|>"
        if code not in LANGUAGES or token not in self.lang_to_id:
            raise ValueError(f"unsupported language {language!r}")
        return self.lang_to_id[token]

    def prompt(self, language_token: int | None, options: DecodeOptions) -> list[int]:
        """The forced decoder prompt: start, language and task (multilingual), no-timestamps if asked."""
        tokens = [self.sot]
        if self.multilingual:
            if language_token is None:
                raise ValueError("a multilingual prompt needs a language token")
            task_to_id = self.config.task_to_id
            if options.task not in task_to_id:
                raise ValueError(f"unsupported task {options.task!r}")
            tokens += [language_token, task_to_id[options.task]]
        if not options.timestamps:
            tokens.append(self.no_timestamps)
        return tokens

    def max_length(self, prompt_length: int, options: DecodeOptions) -> int:
        """Total token budget (prompt included), as ``generate()`` computes it."""
        if options.max_new_tokens is not None:
            return min(prompt_length + options.max_new_tokens, self.max_target_positions)
        max_length = self.config.max_length or self.max_target_positions
        initial = min(self.max_target_positions // 2 - 1, prompt_length)
        return min(max_length + initial, self.max_target_positions)

    def processors(self, prompt_length: int, options: DecodeOptions) -> list:
        """The Whisper logits processors for one decode, in ``generate()``'s order."""
        out: list = []
        if self.config.begin_suppress_tokens is not None:
            out.append(SuppressTokens(self.config.begin_suppress_tokens, begin_index=prompt_length))
        if self.config.suppress_tokens is not None:
            out.append(SuppressTokens(self.config.suppress_tokens))
        if options.timestamps:
            out.append(WhisperTimeStampLogitsProcessor(self.config, begin_index=prompt_length))
        return out

    def text_ids(self, tokens: list[int]) -> list[int]:
        """Only the text tokens (no special or timestamp tokens)."""
        return [t for t in tokens if t < self.eos]

    def segments(self, tokens: list[int], duration: float, decode) -> list[Segment]:
        """Cut generated tokens at timestamp tokens into ``(start, end, text)`` segments.

        ``decode`` maps text token ids to a string. Without timestamp tokens the whole text is one
        segment spanning the chunk; text after the last timestamp ends at ``duration``.
        """
        segments: list[Segment] = []
        start: float | None = None
        pending: list[int] = []
        for token in tokens:
            if token >= self.timestamp_begin:
                time = (token - self.timestamp_begin) * TIME_PRECISION
                if start is None or not pending:
                    start = time
                    continue
                text = decode(pending).strip()
                if text:
                    segments.append(Segment(start, max(time, start), text))
                pending, start = [], time
            elif token < self.eos:
                pending.append(token)
        text = decode(pending).strip()
        if text:
            begin = start if start is not None else 0.0
            segments.append(Segment(begin, max(duration, begin), text))
        return segments


class DecodeRun:
    """The rules bound to one decode: the prompt length, the processors and the stop checks."""

    def __init__(self, rules: TokenRules, prompt: list[int], options: DecodeOptions) -> None:
        self.rules = rules
        self.prompt_length = len(prompt)
        self.options = options
        self.max_length = rules.max_length(len(prompt), options)
        self._processors = rules.processors(len(prompt), options)
        self.stop_reason: str | None = None

    def process(self, prefix: list[int], scores: torch.Tensor) -> torch.Tensor:
        """Apply the processors to one position's logits [V] given the tokens before it."""
        ids = torch.tensor([prefix], dtype=torch.long, device=scores.device)
        row = scores[None].float()
        for processor in self._processors:
            row = processor(ids, row)
        return row[0]

    def next_token(self, prefix: list[int], scores: torch.Tensor) -> int:
        """The greedy choice after ``prefix`` under the verifier's rules."""
        return int(self.process(prefix, scores).argmax())

    def append(self, tokens: list[int], token: int) -> bool:
        """Append ``token``; return True when decoding must stop (end-of-text, length, repetition)."""
        tokens.append(token)
        if token == self.rules.eos:
            self.stop_reason = "eos"
        elif len(tokens) >= self.max_length:
            self.stop_reason = "length"
        elif self.options.repetition_window and self._repeating(tokens):
            self.stop_reason = "repetition"
        return self.stop_reason is not None

    def _repeating(self, tokens: list[int]) -> bool:
        """True when the last ``window`` generated tokens are one unit repeated at least four times.

        The repeats after the first copy are removed from ``tokens`` (a hallucination loop)."""
        window = self.options.repetition_window or 0
        generated = len(tokens) - self.prompt_length
        if generated < window:
            return False
        tail = tokens[-window:]
        for period in range(1, window // 4 + 1):
            if all(tail[i] == tail[i - period] for i in range(period, window)):
                del tokens[len(tokens) - window + period :]
                return True
        return False
