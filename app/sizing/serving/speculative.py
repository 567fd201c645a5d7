"""Speculative decoding (SIZING.md section 9): what one target pass costs and how many tokens it yields.

A draft proposes `k` tokens per sequence (k cheap draft decode steps); the target model verifies them
in ONE pass over k + 1 positions per sequence and keeps the accepted prefix plus one token of its own.
With a per-token acceptance probability `a` (each drafted token accepted only if all before it were),
the expected tokens per target pass are

    E = 1 + a + a² + ... + a^k = (1 − a^(k+1)) / (1 − a)        (k + 1 when a = 1).

Cost per pass = k draft decode steps + one target pass over k + 1 tokens per sequence. It pays off at
small batches, where a decode step is a weight read that k + 1 tokens share almost for free, and can
lose at large batches, where the pass is compute-bound and the rejected tokens are wasted work.

`SpeculativeStepTime` presents this to the simulator, which advances every decoding sequence one
token per step: a step's decode work is the pass time divided by E (the mean time per token), while
prompt tokens prefilled in the same step are charged at full price (the pass's marginal cost of
carrying them, plus the draft's own prefill of the same tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike


def tokens_per_pass(acceptance_rate: float, draft_tokens: int) -> float:
    """Expected tokens one target pass yields: (1 − a^(k+1)) / (1 − a); k + 1 when a = 1."""
    if draft_tokens < 1:
        raise ValueError("draft_tokens must be >= 1")
    if not 0 <= acceptance_rate <= 1:
        raise ValueError("acceptance_rate must be in [0, 1]")
    if acceptance_rate == 1:
        return float(draft_tokens + 1)
    return (1 - acceptance_rate ** (draft_tokens + 1)) / (1 - acceptance_rate)


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """Draft length k and per-token acceptance a; `has_draft_model` False = a draft whose cost is
    negligible (n-gram / prompt-lookup proposals)."""

    draft_tokens: int
    acceptance_rate: float
    has_draft_model: bool = True

    def __post_init__(self) -> None:
        tokens_per_pass(self.acceptance_rate, self.draft_tokens)  # validates both

    @property
    def tokens_per_pass(self) -> float:
        return tokens_per_pass(self.acceptance_rate, self.draft_tokens)


class _StepTimes(Protocol):
    """What `perf.StepTimeModel` offers (and a test double can)."""

    def step_time_s(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                    prefill_context_tokens: ArrayLike,
                    prefill_seqs: ArrayLike | None = None) -> float | np.ndarray: ...


class SpeculativeStepTime:
    """A simulator step-time function (`simulate.StepTimeFn`) for a target model with a draft.

    For B decoding sequences whose cached contexts sum to C, one pass costs
        pass = target(verify B·(k+1) tokens) + k · draft(B decodes at C),
    where the verification is a prefill of k + 1 tokens after each sequence's context: its attended
    positions are (k+1)·C + B·(k+1)(k+2)/2 and it reads each sequence's KV once. The step then costs
        pass / E + (pass with the step's prompt tokens − pass without them),
    so decode time is amortized over the E tokens each pass yields and prefill is charged in full
    (the draft prefills the same prompt tokens in its first step). Without a draft model the drafting
    cost is taken as zero. Verification samples one position per sequence here; the k extra LM-head
    rows a real pass computes are about 1-2 % of its FLOPs and are left out.
    """

    def __init__(self, target: _StepTimes, speculative: SpeculativeDecoding, draft: _StepTimes | None) -> None:
        if speculative.has_draft_model != (draft is not None):
            raise ValueError("give the draft model's step times exactly when the speculation has a draft model")
        self.target = target
        self.draft = draft
        self.draft_tokens = speculative.draft_tokens
        self.tokens_per_pass = speculative.tokens_per_pass

    def __call__(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                 prefill_context_tokens: ArrayLike) -> float | np.ndarray:
        k = self.draft_tokens
        values = (decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens)
        # Plain floats for single steps (the simulator's usual call), arrays for vectors of steps.
        as_number = float if all(type(value) in (int, float) for value in values) else _as_array
        seqs, context, new, positions = (as_number(value) for value in values)  # type: ignore[operator]
        verify_tokens = seqs * (k + 1)
        verify_positions = (k + 1) * context + seqs * (k + 1) * (k + 2) / 2
        prefilling = (new > 0) * 1.0
        zeros = 0.0 * verify_tokens

        verify = self.target.step_time_s(zeros, zeros, verify_tokens, verify_positions, seqs)
        draft_decode = 0.0 if self.draft is None else self.draft.step_time_s(seqs, context, zeros, zeros)
        decode_pass = verify + k * draft_decode
        time = decode_pass / self.tokens_per_pass
        if np.any(new):  # the pass also carries prompt tokens: their marginal cost, in full
            verify_and_prompt = self.target.step_time_s(zeros, zeros, verify_tokens + new,
                                                        verify_positions + positions, seqs + prefilling)
            draft_first = 0.0 if self.draft is None else self.draft.step_time_s(seqs, context, new, positions)
            time = time + (verify_and_prompt + draft_first + (k - 1) * draft_decode - decode_pass)
        return float(time) if np.ndim(time) == 0 else np.asarray(time)


def _as_array(value: ArrayLike) -> np.ndarray:
    return np.asarray(value, dtype=float)
