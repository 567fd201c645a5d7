"""The fast step-time model: expected time of one engine iteration of a continuous-batching engine.

Built once per deployment (model, GPU, tp, pp, precisions, efficiency) from `flops.step_cost_model`'s
per-operator coefficients and evaluated with the roofline's own timing rules (`roofline.compute_fractions`
and `roofline.expected_time_s` per operator, the TP all-reduces, the overheads), so for a uniform batch
it reproduces `roofline(decode_cost(...))` and `roofline(prefill_cost(...))` to float rounding. Calls
take numbers or numpy arrays of any broadcastable shapes (vectorized) and return a float or an array.

A step mixes `decode_seqs` sequences decoding one token each (their cached contexts summing to
`decode_context_tokens`) with `prefill_tokens` prompt tokens whose attended positions sum to
`prefill_context_tokens`. Only sums are known, so two quantities are bounded rather than exact:
- window layers (sliding/chunked attention of w tokens): a decoding sequence attends min(c+1, w)
  positions; the sum over sequences is bounded by min(sum(c+1), decode_seqs·w) (exact when every
  context is on the same side of the window); prefill positions likewise by min(sum, prefill_tokens·w);
- prefill KV reads: each prefilling sequence reads its cached prefix p once. With `prefill_seqs`
  sequences of equal chunks n/s after equal prefixes, sum of positions = n·p + s·(n/s)(n/s+1)/2, so the
  prefix is recovered as p = sum/n − (n/s+1)/2 (exact for one sequence, or equal ones).

Pipeline parallelism: a step passes through every stage in turn, so its latency is the whole model's
time (each stage runs its L/pp layers on its own GPUs at the same per-layer cost) plus one
point-to-point send of the step's hidden states per stage boundary. Engines keep up to pp steps in
flight to fill the pipeline; that throughput overlap is for the caller (the simulator) to model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from app.sizing.comm import link_bandwidth, pipeline_hops_time_s, step_allreduce_time_s, tp_link_bandwidth
from app.sizing.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.flops import StepCostModel, step_cost_model
from app.sizing.params import pipeline_stages
from app.sizing.roofline import (
    compute_fractions,
    default_compute_dtype,
    expected_time_s,
    maximum,
    minimum,
    operator_peaks,
)
from app.sizing.specs import GpuSpec, ModelSpec

# One operator's ideal seconds as sparse linear forms over the step shape: ((feature, seconds per unit),
# ...) at peak FLOP/s, then the same at full HBM bandwidth.
_Terms = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True, eq=False)
class StepTimeModel:
    """Step times of one deployment; build it with `build_step_time_model`."""

    cost_model: StepCostModel
    operator_terms: tuple[tuple[_Terms, _Terms], ...]
    efficiency: Efficiency
    tensor_parallel: int
    pipeline_parallel: int
    tp_link_bandwidth_bytes_per_s: float
    pp_link_bandwidth_bytes_per_s: float
    compute_dtype: str

    def step_time_s(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                    prefill_context_tokens: ArrayLike,
                    prefill_seqs: ArrayLike | None = None) -> float | np.ndarray:
        """Expected seconds of one engine step (0 for an empty one).

        `prefill_seqs`: sequences the prefill tokens belong to (default: one when there are any); each
        samples its last position, as a prompt's final chunk does.
        """
        tokens, _, _, expected = self._operator_times(
            decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens, prefill_seqs)
        layers, message = self.cost_model.num_layers, self.cost_model.hidden_state_bytes_per_token
        latency = self.efficiency.allreduce_latency_s
        time = expected + self.efficiency.overhead_time_s(tokens, layers)
        if self.tensor_parallel > 1:
            time = time + step_allreduce_time_s(tokens, layers, message, self.tensor_parallel,
                                                self.tp_link_bandwidth_bytes_per_s, latency)
        if self.pipeline_parallel > 1:
            time = time + pipeline_hops_time_s(tokens, self.pipeline_parallel, message,
                                               self.pp_link_bandwidth_bytes_per_s, latency)
        return _as_result(time)

    def ideal_step_time_s(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike,
                          prefill_tokens: ArrayLike, prefill_context_tokens: ArrayLike,
                          prefill_seqs: ArrayLike | None = None) -> float | np.ndarray:
        """max(FLOPs / peak, bytes / bandwidth) of the step: no efficiencies, communication or overhead."""
        _, compute, memory, _ = self._operator_times(
            decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens, prefill_seqs)
        return _as_result(maximum(compute, memory))

    def _operator_times(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike,
                        prefill_tokens: ArrayLike, prefill_context_tokens: ArrayLike,
                        prefill_seqs: ArrayLike | None) -> tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike]:
        """(tokens, ideal compute seconds, ideal memory seconds, expected operator seconds) of a step.

        Evaluated operator by operator on whole arrays (few, small temporaries: this is what makes a
        10,000-step array cost about a millisecond) and with plain floats for scalar calls.
        """
        seqs, context, new, positions = (_as_number_or_array(value) for value in (
            decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens))
        prefilling = (new > 0) * 1.0 if prefill_seqs is None else _as_number_or_array(prefill_seqs)
        if any(_anywhere(value < 0) for value in (seqs, context, new, positions, prefilling)):
            raise ValueError("step sizes must be >= 0")
        if _anywhere(prefilling > new) or _anywhere((new > 0) & (prefilling == 0)):
            raise ValueError("prefill_seqs must be between 1 and prefill_tokens when tokens are prefilled")
        tokens, sampled = seqs + new, seqs + prefilling
        shape = self._shape(seqs, context, new, positions, prefilling, tokens, sampled)
        fractions = compute_fractions(self.cost_model.operator_names, tokens, sampled, self.efficiency)
        compute_total: ArrayLike = 0.0  # the first += makes a fresh array; later ones add in place
        memory_total: ArrayLike = 0.0
        expected_total: ArrayLike = 0.0
        for (compute_terms, memory_terms), fraction in zip(self.operator_terms, fractions, strict=True):
            compute = sum((seconds * shape[feature] for feature, seconds in compute_terms), 0.0)
            memory = sum((seconds * shape[feature] for feature, seconds in memory_terms), 0.0)
            compute_total += compute
            memory_total += memory
            expected_total += expected_time_s(compute, memory, fraction, self.efficiency.bandwidth_fraction)
        return tokens, compute_total, memory_total, expected_total

    def _shape(self, seqs: ArrayLike, context: ArrayLike, new: ArrayLike, positions: ArrayLike,
               prefilling: ArrayLike, tokens: ArrayLike, sampled: ArrayLike) -> list[ArrayLike]:
        decode_positions = context + seqs  # each decoding token attends its cached context and itself
        chunk = new / maximum(prefilling, 1.0)  # prompt tokens per prefilling sequence (0 if none)
        mean_position = positions / maximum(new, 1.0)
        prefix = maximum(mean_position - (chunk + 1) / 2, 0.0)  # cached tokens before each chunk
        prefill_read = new + prefilling * prefix
        attended, kv_read = [], []
        for window in self.cost_model.windows:
            if window is None:
                attended.append(decode_positions + positions)
                kv_read.append(decode_positions + prefill_read)
            else:
                decode_window = minimum(decode_positions, seqs * window)
                attended.append(decode_window + minimum(positions, new * window))
                kv_read.append(decode_window + minimum(prefill_read, new + prefilling * (window - 1)))
        return self.cost_model.shape(tokens=tokens, sampled=sampled, attended=attended, kv_read=kv_read)


def build_step_time_model(model: ModelSpec, gpu: GpuSpec, *, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, weight_dtype: str, kv_dtype: str,
                          compute_dtype: str | None = None, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                          activation_dtype: str = "bf16") -> StepTimeModel:
    pipeline_stages(model.num_hidden_layers, pipeline_parallel)  # validates 1 <= pp <= layers
    compute_dtype = compute_dtype or default_compute_dtype(gpu, weight_dtype)
    model_costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, tensor_parallel)
    peaks = operator_peaks(model_costs.operator_names, gpu, compute_dtype, activation_dtype)
    compute_seconds = model_costs.flops / peaks[:, np.newaxis]
    memory_seconds = model_costs.bytes / gpu.memory_bandwidth_bytes_per_s
    return StepTimeModel(
        cost_model=model_costs,
        operator_terms=tuple((_terms(compute_row), _terms(memory_row))
                             for compute_row, memory_row in zip(compute_seconds, memory_seconds, strict=True)),
        efficiency=efficiency,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        tp_link_bandwidth_bytes_per_s=tp_link_bandwidth(gpu, tensor_parallel),
        pp_link_bandwidth_bytes_per_s=link_bandwidth(gpu, tensor_parallel * pipeline_parallel),
        compute_dtype=compute_dtype,
    )


def _terms(row: np.ndarray) -> _Terms:
    return tuple((int(feature), float(row[feature])) for feature in np.flatnonzero(row))


def _as_number_or_array(value: ArrayLike) -> ArrayLike:
    """Plain floats for scalars (numpy's per-call overhead would dominate), float arrays otherwise."""
    return float(value) if np.ndim(value) == 0 else np.asarray(value, dtype=float)  # type: ignore[arg-type]


def _anywhere(condition: ArrayLike) -> bool:
    return condition if isinstance(condition, bool) else bool(np.any(condition))


def _as_result(value: ArrayLike) -> float | np.ndarray:
    return float(value) if np.ndim(value) == 0 else np.asarray(value)  # type: ignore[arg-type]
