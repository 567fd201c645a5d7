"""The fast step-time model: expected time of one engine iteration of a continuous-batching engine.

Built once per deployment (model, GPU, tp, pp, precisions, efficiency) from `flops.step_cost_model`'s
per-operator coefficients and evaluated with the roofline's own timing rules (per operator
max(compute / achieved fraction, memory / bandwidth fraction), the TP all-reduces, the overheads), so
for a uniform batch it reproduces `roofline(decode_cost(...))` and `roofline(prefill_cost(...))` to
float rounding, less the engine-dependent costs a roofline never charges (`engines.host_adjusted`: the
host work per sequence, and the cost per MoE layer of a step with prompt tokens, added once to every
such step; for an engine that overlaps host work with the GPU, that work and the per-step overhead as the
least a step lasts instead of time added to it). Calls take numbers or numpy arrays of any broadcastable
shapes (vectorized) and return a float or an array.

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
point-to-point send of the step's hidden states per stage boundary: the trip. Engines keep up to pp steps in
flight to fill the pipeline; that throughput overlap is for the caller (the simulator) to model. With all
pp micro-batches in flight (`pipeline_period`), a micro-batch's next step waits for its turn on the
slowest stage, which serves each of the pp micro-batches once per period: the period is pp x the slowest
stage plus the hand-offs (`pipeline_period_scales`). The stages are not equal: the largest holds
ceil(L/pp) layers, the last one the LM head (and the sampling), the first the embedding (SIZING.md
section 2), and each runs the engine's step of its own, paying the per-step overhead. So the period
exceeds the trip by (pp - 1) x (the head, the embedding and the per-step overhead), plus pp x the layers
the largest stage holds beyond L/pp: an LM head left in bf16 beside FP4 layers (ModelOpt's recipe) costs
several layers' time, and at 8 stages of 10 layers that is a third of the period.

Evaluation. The simulator times tens of thousands of steps per run, so a call must cost microseconds.
Everything that does not depend on the step is prepared once per model and efficiency, from the same
sources (`flops.py` coefficients, `efficiency.py` fractions, `comm.py` costs, evaluated at build time,
never re-typed):
- each operator's ideal compute and memory seconds as a sparse linear form over a few step features
  (tokens, sampled positions, "any token", "any sampled", per window the positions prompt tokens attend,
  the KV tokens read and the positions decoding tokens attend, distinct experts, routed tokens), memory
  already divided by the achieved bandwidth fraction;
- a matmul's compute slowdown (1 / achieved fraction, a function of the rows M it multiplies), and for
  an MoE model the distinct experts T tokens touch, the routed tokens of the most loaded EP rank and the
  routed experts' slowdown (a function of the rows per touched expert, itself a function of T),
  tabulated at every integer M or T up to `_TABLE_ROWS` with `Efficiency.compute_fraction` and the
  `StepCostModel`'s own functions (fractional or larger counts call them on the spot). A matmul's FLOPs
  are proportional to its rows, so "tokens x their slowdown" is one more feature (likewise "routed
  tokens x the experts' slowdown") and every operator's expected compute seconds are linear too;
- operators without FLOPs, the overheads and the communication (alpha per call plus bytes over
  bandwidth) need no max: one linear form for all of them.
A step's time is then the linear part plus, per operator, the larger of two linear forms: a handful of
float operations per operator for a single step (no numpy), one matrix product and a few elementwise
operations for an array of steps, whatever the operator count. Decode-only steps of one batch size (the
simulator's runs between arrivals) go further: every feature is then affine in the context, so the
operators that do not depend on it fold into one constant per batch size (`_DecodeForm`), and a run of
them between two kinks sums as an arithmetic series (`decode_run`).

Longer than 600 lines because the three evaluation paths (one step, arrays of steps, decode-only runs)
read the same prepared forms and must agree to float rounding: one module keeps them side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from app.sizing.hardware.comm import (
    PER_EXPERT,
    link_bandwidth,
    moe_exchange_time_s,
    pipeline_hops_time_s,
    step_allreduce_time_s,
    tp_link_bandwidth,
    tp_network_latency_s,
)
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.hardware.roofline import (
    default_compute_dtype,
    expected_time_s,
    maximum,
    minimum,
    operator_peaks,
)
from app.sizing.hardware.step_scalar import PREFILL_SEQS_ERROR, TABLE_ROWS, ScalarStepTime
from app.sizing.model.flops import (
    DISTINCT_EXPERTS,
    EMBEDDING,
    FIRST_WINDOW_GROUP,
    LM_HEAD,
    MATMUL_ROWS,
    ROUTED_TOKENS,
    SAMPLED,
    SAMPLED_STEP,
    STEP,
    TOKENS,
    WINDOW_FEATURES,
    StepCostModel,
    step_cost_model,
)
from app.sizing.model.params import pipeline_stages
from app.sizing.model.recipes import WeightRecipe, resolve_recipe
from app.sizing.specs import GpuSpec, ModelSpec

# A sparse linear form: ((feature, seconds per unit), ...). `StepTimeModel.operator_terms` holds each
# operator's ideal seconds at peak FLOP/s, then at full HBM bandwidth, over the cost model's features.
_Terms = tuple[tuple[int, float], ...]

# Evaluation features, in order: the matmul row counts (tokens, sampled positions), 1 when there are
# any (the per-step weight reads and costs), per attention window the positions prompt tokens attend,
# the KV tokens read and the positions decoding tokens attend (the cost model's order), the distinct
# experts and routed tokens of an MoE model, then the "slowed" features (see `_Forms`). Naive
# attention's score entries are not among them: FlashAttention here.
_TOKENS_AT, _SAMPLED_AT, _STEP_AT, _SAMPLED_STEP_AT, _FIRST_WINDOW_AT = range(5)
_FEATURE_AT = {TOKENS: _TOKENS_AT, SAMPLED: _SAMPLED_AT, STEP: _STEP_AT, SAMPLED_STEP: _SAMPLED_STEP_AT}
_BY_ROWS = {TOKENS: 0, SAMPLED: 1}  # the slowdown a matmul follows (flops.MATMUL_ROWS): tokens', sampled'
_BY_EXPERT_ROWS = 2  # the routed experts' slowdown (rows per touched expert), which ROUTED_TOKENS follows
_SLOWED_ROWS = ((_TOKENS_AT, 0), (_SAMPLED_AT, 1))  # the first slowed features: each row count x its own

# Matmul row counts (tokens or sampled positions per step) tabulated: every batch size and
# chunked-prefill budget in practice.
_TABLE_ROWS = TABLE_ROWS
_TABLE_GRID = np.arange(_TABLE_ROWS + 1, dtype=float)
_TABLE_GRID.setflags(write=False)

# Steps of an array evaluated together; longer arrays go block by block (see `_array_steps`).
_BLOCK_STEPS = 2048

# Rows of the array path's inputs: the prompt part last, `prefill_seqs` (optional) at the very end.
_SEQS, _CONTEXT, _POSITIONS, _NEW, _PREFILLING = range(5)

_NUMBERS = (int, float)

# The operators at the model's ends (first and last pipeline stage), not in every layer.
_MODEL_ENDS = frozenset({EMBEDDING, LM_HEAD})


@dataclass(frozen=True, slots=True, eq=False)
class _Forms:
    """A `StepTimeModel` prepared for evaluation (see the module docstring).

    The "slowed" features, after the evaluation features, are a feature times the slowdown of the rows
    a matmul multiplies: the tokens times theirs and the sampled positions times theirs (`_SLOWED_ROWS`,
    as a matmul's FLOPs are its rows times twice its weights), then any other pair `slowed` lists (an
    MoE model's routed tokens times the routed experts' slowdown among them).
    """

    width: int  # evaluation features, before the slowed ones (an MoE model's distinct experts, routed tokens last)
    # Beyond _SLOWED_ROWS: (feature, 0 tokens' / 1 sampled's / 2 the routed experts' slowdown).
    slowed: tuple[tuple[int, int], ...]
    # Operators with FLOPs: (expected compute seconds, memory seconds / bandwidth fraction); then the
    # seconds that need no max (operators without FLOPs, overheads, communication); the ideal totals.
    operators: tuple[tuple[_Terms, _Terms], ...]
    linear: _Terms
    ideal_compute: _Terms
    ideal_memory: _Terms
    # The same as matrices for arrays of steps: the operators' compute rows and a zero row, then their
    # memory rows and the linear row (the time is the sum of the elementwise max of the two halves);
    # the ideal compute and memory totals over the evaluation features.
    expected_matrix: np.ndarray
    ideal_matrix: np.ndarray
    slowdowns: np.ndarray  # at 0.._TABLE_ROWS matmul rows
    slowdown_list: memoryview  # the same, read as Python floats
    experts: StepCostModel | None  # an MoE model's cost model: its distinct experts, routed tokens, rows per expert
    distinct_experts: np.ndarray | None  # at 0.._TABLE_ROWS tokens
    distinct_experts_list: memoryview | None
    routed_tokens: np.ndarray | None  # at 0.._TABLE_ROWS tokens
    routed_tokens_list: memoryview | None
    expert_slowdowns: np.ndarray | None  # the routed experts' slowdown at 0.._TABLE_ROWS tokens
    expert_slowdown_list: memoryview | None
    # Expected seconds once per step that carries prompt tokens: the efficiency's overhead per MoE layer of
    # such a step times this GPU's MoE layers (0 for dense models and engines that graph such steps).
    prefill_overhead: float = 0.0
    # Seconds of overlapped host work per sequence a step samples: the step lasts at least that many
    # (`Efficiency.overlapped_host_per_sequence_s`; 0: no floor) plus `host_constant`, the per-step overhead
    # of an engine that hides them under the GPU's step (`Efficiency.step_overhead_overlapped`; 0 otherwise:
    # both are then added to the step). An empty step: 0.
    host_floor: float = 0.0
    host_constant: float = 0.0


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
    data_parallel: int = 1
    expert_parallel: int = 1
    moe_link_bandwidth_bytes_per_s: float = 0.0  # the link of the tp·dp GPUs of the MoE exchange
    tp_network_latency_s: float = 0.0  # added to each all-reduce's latency when the TP ring spans nodes
    pcie_links: bool = False  # the GPU's node links are PCIe: collectives at the efficiency's pcie_link_fraction
    # pp > 1: time the period of a pipeline with all pp micro-batches in flight, not one step's trip.
    pipeline_period: bool = False
    _forms: _Forms = field(init=False, repr=False)  # derived from the fields above, on construction
    # The same forms for one step at a time, and the decode forms it keeps (step_scalar.py, compiled).
    scalar: ScalarStepTime = field(init=False, repr=False)

    def __post_init__(self) -> None:
        forms = _prepare(self)
        object.__setattr__(self, "_forms", forms)
        object.__setattr__(self, "scalar", _scalar(forms, self.cost_model.windows, self.efficiency))

    def __call__(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                 prefill_context_tokens: ArrayLike, prefill_seqs: ArrayLike | None = None) -> float | np.ndarray:
        """`step_time_s`: the model is a step-time function (and offers `decode_run` beside it)."""
        return self._evaluate(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
                              prefill_seqs, expected=True)

    def step_time_s(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                    prefill_context_tokens: ArrayLike,
                    prefill_seqs: ArrayLike | None = None) -> float | np.ndarray:
        """Expected seconds of one engine step (0 for an empty one).

        `prefill_seqs`: sequences the prefill tokens belong to (default: one when there are any); each
        samples its last position, as a prompt's final chunk does.
        """
        return self._evaluate(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
                              prefill_seqs, expected=True)

    def ideal_step_time_s(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike,
                          prefill_tokens: ArrayLike, prefill_context_tokens: ArrayLike,
                          prefill_seqs: ArrayLike | None = None) -> float | np.ndarray:
        """max(FLOPs / peak, bytes / bandwidth) of the step: no efficiencies, communication or overhead."""
        return self._evaluate(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
                              prefill_seqs, expected=False)

    def _evaluate(self, decode_seqs: ArrayLike, decode_context_tokens: ArrayLike, prefill_tokens: ArrayLike,
                  prefill_context_tokens: ArrayLike, prefill_seqs: ArrayLike | None,
                  expected: bool) -> float | np.ndarray:
        numbers = _NUMBERS
        if (expected and prefill_seqs is None and type(decode_seqs) in numbers and type(prefill_tokens) in numbers
                and type(prefill_context_tokens) in numbers and prefill_tokens == 0 and prefill_context_tokens == 0
                and 0 < decode_seqs <= _TABLE_ROWS and decode_seqs == int(decode_seqs)):
            # Decode-only steps of one batch size (the simulator's runs between arrivals): context alone varies.
            if type(decode_context_tokens) in numbers:
                return self.scalar.decode_step(decode_seqs, decode_context_tokens)
            if isinstance(decode_context_tokens, np.ndarray) and decode_context_tokens.ndim == 1:
                return self._decode_steps(decode_seqs, decode_context_tokens)
        if (type(decode_seqs) in numbers and type(decode_context_tokens) in numbers and type(prefill_tokens) in numbers
                and type(prefill_context_tokens) in numbers and (prefill_seqs is None or type(prefill_seqs) in numbers)):
            return self.scalar.scalar_step(float(decode_seqs), float(decode_context_tokens), float(prefill_tokens),
                                           float(prefill_context_tokens),
                                           None if prefill_seqs is None else float(prefill_seqs), expected)
        values = (decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens)
        if prefill_seqs is not None:
            values += (prefill_seqs,)
        if all(np.ndim(value) == 0 for value in values):  # numpy scalars
            seqs, context, new, positions, *prefilling = map(float, values)
            return self.scalar.scalar_step(seqs, context, new, positions, prefilling[0] if prefilling else None,
                                           expected)
        return self._array_steps(values, expected)

    def decode_run(self, seqs: int, context: float, steps: int, budget_s: float) -> tuple[int, float, float] | None:
        """Up to `steps` decode-only steps of `seqs` sequences, their contexts summing to `context` and
        growing by `seqs` a step, stopped after the first step whose end reaches `budget_s` seconds:
        (steps run, their seconds, the last one's seconds). None when this shortcut does not apply
        (then time the steps one by one).

        Between two kinks (a window's cap reached, an operator turning from compute- to memory-bound, the
        GPU's time overtaking the host's floor) the step time is affine in the step index k, so the steps sum as an arithmetic series and the
        step reaching the budget solves a quadratic. Each kink side is affine in k within a window
        regime and the positions grow with k, so a run whose first and last steps are on the same side
        of every kink has none inside.
        """
        return self.scalar.decode_run(seqs, context, steps, budget_s)

    def _decode_steps(self, seqs: float, contexts: np.ndarray) -> np.ndarray:
        """Decode-only steps of one batch size at each of `contexts` (`_decode_form`), vectorized."""
        if np.count_nonzero(contexts < 0):
            raise ValueError("step sizes must be >= 0")
        form = self.scalar.decode_form(seqs)
        attended = contexts + seqs
        positions = [attended if cap is None else np.minimum(attended, cap) for cap in form.caps]

        def affine(constant: float, slopes: tuple[float, ...]) -> np.ndarray:
            part = np.full(len(contexts), constant)
            for slope, d in zip(slopes, positions, strict=True):
                if slope:
                    part += slope * d
            return part

        total = affine(form.constant, form.slopes)
        for compute, compute_slopes, memory, memory_slopes in form.operators:
            compute_part = affine(compute, compute_slopes)
            total += np.maximum(compute_part, affine(memory, memory_slopes), out=compute_part)
        if form.host_floor:
            np.maximum(total, form.host_floor, out=total)
        return total

    def _array_steps(self, values: tuple[ArrayLike, ...], expected: bool) -> np.ndarray:
        """Steps given as arrays (and numbers that broadcast), evaluated a block of steps at a time."""
        shape = np.broadcast(*values).shape
        steps = math.prod(shape)
        if len(shape) == 1 and steps <= _BLOCK_STEPS:
            return self._block_steps(values, steps, expected)
        # Longer runs in blocks: their temporaries stay small enough to be reused from call to call
        # (larger ones go back to the OS and are page-faulted in again), and BLAS stays on one thread.
        arrays = [np.broadcast_to(np.asarray(value, dtype=float), shape).ravel() for value in values]
        times = np.empty(steps)
        for start in range(0, steps, _BLOCK_STEPS):
            block = slice(start, start + _BLOCK_STEPS)
            times[block] = self._block_steps(tuple(array[block] for array in arrays), len(times[block]), expected)
        return times.reshape(shape)

    def _block_steps(self, values: tuple[ArrayLike, ...], steps: int, expected: bool) -> np.ndarray:
        """`steps` steps given as numbers or arrays of `steps` values."""
        inputs = np.empty((5, steps))
        given = inputs[:len(values)]
        inputs[_SEQS], inputs[_CONTEXT], inputs[_NEW], inputs[_POSITIONS] = values[:4]
        if len(values) == 5:
            inputs[_PREFILLING] = values[4]
        if np.count_nonzero(given < 0):
            raise ValueError("step sizes must be >= 0")
        forms = self._forms
        features = np.empty((forms.width + len(_SLOWED_ROWS) + len(forms.slowed), steps))
        rows = features[:_STEP_AT]  # tokens, sampled positions
        seqs, context = inputs[_SEQS], inputs[_CONTEXT]
        if np.count_nonzero(given[_POSITIONS:]):
            if len(values) == 4:  # one sequence where there are prompt tokens: sign(new), new >= 0
                np.sign(inputs[_NEW], out=inputs[_PREFILLING])
            # An all-zero part is the number 0, which broadcasts alike and costs no array arithmetic.
            positions, new, prefilling = (row if np.count_nonzero(row) else 0.0 for row in inputs[_POSITIONS:])
            if _anywhere(prefilling > new) or _anywhere((new > 0) & (prefilling == 0)):
                raise ValueError(PREFILL_SEQS_ERROR)
            np.add(inputs[_NEW:], seqs, out=rows)
        else:  # decode-only steps
            positions = new = prefilling = 0.0
            rows[...] = seqs
        np.sign(rows, out=features[_STEP_AT:_FIRST_WINDOW_AT])  # rows >= 0: 1 when there are any
        table_rows = np.fmin(rows, _TABLE_ROWS + 0.5).astype(np.intp)  # fmin: NaN and huge counts in range
        tabulated = not np.count_nonzero(_TABLE_GRID.take(table_rows) != rows)
        at = _FIRST_WINDOW_AT
        for decode, attended, read in self._window_parts(seqs, context, new, positions, prefilling):
            features[at] = attended
            np.add(decode, read, out=features[at + 1])
            features[at + 2] = decode
            at += WINDOW_FEATURES
        experts = forms.experts
        if experts is not None:
            if tabulated:
                forms.distinct_experts.take(table_rows[0], out=features[at], mode="clip")  # type: ignore[union-attr]
                forms.routed_tokens.take(table_rows[0], out=features[at + 1], mode="clip")  # type: ignore[union-attr]
            else:
                features[at] = experts.distinct_experts(rows[0])
                features[at + 1] = experts.routed_tokens(rows[0])
        if not expected:
            compute, memory = forms.ideal_matrix @ features[:forms.width]
            return np.maximum(compute, memory)
        slowdowns = forms.slowdowns.take(table_rows, mode="clip") if tabulated else _slowdown(self.efficiency, rows)
        np.multiply(rows, slowdowns, out=features[forms.width:forms.width + len(_SLOWED_ROWS)])
        by_rows_slowdowns = [slowdowns[0], slowdowns[1]]
        if experts is not None:
            by_rows_slowdowns.append(forms.expert_slowdowns.take(table_rows[0], mode="clip")  # type: ignore[union-attr]
                                     if tabulated else _expert_slowdown(self.efficiency, experts, rows[0]))
        for at, (feature, by_rows) in enumerate(forms.slowed, start=forms.width + len(_SLOWED_ROWS)):
            np.multiply(features[feature], by_rows_slowdowns[by_rows], out=features[at])
        seconds = forms.expected_matrix @ features
        compute, memory = seconds[:len(seconds) // 2], seconds[len(seconds) // 2:]
        times = np.maximum(compute, memory, out=compute).sum(axis=0)
        if forms.prefill_overhead and np.ndim(new):  # (`new` is the number 0 when no step has prompt tokens)
            times += forms.prefill_overhead * (new > 0)
        if forms.host_floor or forms.host_constant:
            sampled = features[_SAMPLED_AT]
            np.maximum(times, forms.host_floor * sampled + forms.host_constant * (sampled > 0), out=times)
        return times

    def _window_parts(self, seqs: ArrayLike, context: ArrayLike, new: ArrayLike, positions: ArrayLike,
                      prefilling: ArrayLike) -> list[tuple[ArrayLike, ArrayLike, ArrayLike]]:
        """Per attention window, summed over sequences (the bounds of the module docstring): the positions
        the decoding tokens attend (also the KV tokens they read), the positions the prompt tokens
        attend, the KV tokens the prompt tokens read."""
        decode_positions = context + seqs  # each decoding token attends its cached context and itself
        chunk = new / maximum(prefilling, 1.0)  # prompt tokens per prefilling sequence (0 if none)
        mean_position = positions / maximum(new, 1.0)
        prefix = maximum(mean_position - (chunk + 1) / 2, 0.0)  # cached tokens before each chunk
        prefill_read = new + prefilling * prefix
        return [(decode_positions, positions, prefill_read) if window is None
                else (minimum(decode_positions, seqs * window), minimum(positions, new * window),
                      minimum(prefill_read, new + prefilling * (window - 1)))
                for window in self.cost_model.windows]


# Immutable and a pure function of its arguments, so one model serves every request and plan candidate
# that asks for the same deployment (building one costs about as much as a whole /v1/capacity answer).
@lru_cache(maxsize=512)
def build_step_time_model(model: ModelSpec, gpu: GpuSpec, *, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, weight_dtype: str | WeightRecipe, kv_dtype: str,
                          compute_dtype: str | None = None, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                          activation_dtype: str = "bf16", data_parallel: int = 1,
                          expert_parallel: int = 1, pipeline_period: bool = False,
                          moe_exchange: str = PER_EXPERT) -> StepTimeModel:
    """Step times of one GPU of one attention data-parallel rank (`data_parallel` ranks of
    `tensor_parallel` GPUs each step together: the MoE layers exchange their tokens the engine's way,
    `moe_exchange`, `comm.py`).
    `weight_dtype`: a plain dtype or a checkpoint's recipe (each operator reads its group's format).
    `pipeline_period`: with pp > 1, the period of a full pipeline rather than one step's trip (see the
    module docstring)."""
    layer_scale, step_scale = pipeline_period_scales(model.num_hidden_layers, pipeline_parallel, pipeline_period)
    compute_dtype = compute_dtype or default_compute_dtype(gpu, resolve_recipe(weight_dtype).dtype)
    model_costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, tensor_parallel,
                                  data_parallel, expert_parallel, moe_exchange)
    peaks = operator_peaks(model_costs.operator_names, gpu, compute_dtype, activation_dtype)
    compute_seconds = model_costs.flops / peaks[:, np.newaxis]
    memory_seconds = model_costs.bytes / gpu.memory_bandwidth_bytes_per_s
    if pipeline_period and pipeline_parallel > 1:  # the slowest stage, pp times
        scales = np.array([step_scale if name in _MODEL_ENDS else layer_scale for name in model_costs.operator_names])
        compute_seconds, memory_seconds = compute_seconds * scales[:, np.newaxis], memory_seconds * scales[:, np.newaxis]
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
        data_parallel=data_parallel,
        expert_parallel=expert_parallel,
        moe_link_bandwidth_bytes_per_s=link_bandwidth(gpu, tensor_parallel * data_parallel),
        tp_network_latency_s=tp_network_latency_s(gpu, tensor_parallel),
        pipeline_period=pipeline_period,
        pcie_links=gpu.pcie_links,
    )


def pipeline_period_scales(num_layers: int, pipeline_parallel: int, period: bool = True) -> tuple[float, float]:
    """(per-layer, per-step) multipliers that turn a step's trip through the pipeline into the period of a
    full one (module docstring): pp x the slowest stage, taken as the largest stage's layers with the
    model's ends (embedding, LM head) and one engine step's overhead. The layers' terms scale by pp x
    ceil-share / L (1 when pp divides L), the ends' and the per-step terms by pp; the hand-offs stay as
    they are. (1, 1) for one stage or the trip. Taking the ends with the largest stage overstates the
    period by at most one layer's time pp times when pp does not divide L (vLLM gives the leftover layers
    to middle stages); an exact max over stages would not be one linear form per operator."""
    stages = pipeline_stages(num_layers, pipeline_parallel)  # validates 1 <= pp <= layers
    if not period or pipeline_parallel == 1:
        return 1.0, 1.0
    largest = max(len(stage) for stage in stages)
    return pipeline_parallel * largest / num_layers, float(pipeline_parallel)


def _prepare(steps: StepTimeModel) -> _Forms:
    """The model's coefficients over the evaluation features, its efficiency folded in."""
    structure, efficiency = _structure(steps.cost_model, steps.operator_terms), steps.efficiency
    bandwidth_fraction, attention_slowdown = efficiency.bandwidth_fraction, _slowdown(efficiency, None)
    # Overheads and communication are alpha per step plus a cost per token (comm.py), both 0 for an
    # empty step: evaluated at one token with the message, then the latency, zeroed.
    layers, message = steps.cost_model.num_layers, steps.cost_model.hidden_state_bytes_per_token
    # A full pipeline's period: the per-layer terms pp x the largest stage's share, the per-step ones pp times.
    layer_scale, step_scale = pipeline_period_scales(layers, steps.pipeline_parallel, steps.pipeline_period)
    latency = efficiency.allreduce_latency_s
    link_fraction = efficiency.link_fraction(steps.pcie_links)
    linear = structure.linear_memory_row / bandwidth_fraction
    # The per-step overhead: added to the step, or host work the step lasts at least (an overlapping engine's).
    overlapped = efficiency.step_overhead_overlapped
    linear[_STEP_AT] += efficiency.overhead_time_s(1.0, layers, 0.0 if overlapped else step_scale, layer_scale)
    linear[_STEP_AT] += step_scale * efficiency.decode_worker_step_overhead_s  # a decode pool's: never hidden
    # Host work per sequence it samples: the non-overlapping engine's, and an overlapping engine's where it is
    # not hidden (pipeline stages, `engines.host_adjusted`).
    linear[_SAMPLED_AT] += step_scale * (efficiency.per_sequence_overhead_s
                                         + (0.0 if overlapped else efficiency.overlapped_host_per_sequence_s))
    if steps.tensor_parallel > 1:
        tp, bandwidth = steps.tensor_parallel, steps.tp_link_bandwidth_bytes_per_s * link_fraction
        linear[_STEP_AT] += layer_scale * step_allreduce_time_s(1.0, layers, 0.0, tp, bandwidth, latency,
                                                                steps.tp_network_latency_s)
        linear[_TOKENS_AT] += layer_scale * step_allreduce_time_s(1.0, layers, message, tp, bandwidth, 0.0)
    if steps.pipeline_parallel > 1:
        pp, bandwidth = steps.pipeline_parallel, steps.pp_link_bandwidth_bytes_per_s * link_fraction
        linear[_STEP_AT] += pipeline_hops_time_s(1.0, pp, 0.0, bandwidth, latency)
        linear[_TOKENS_AT] += pipeline_hops_time_s(1.0, pp, message, bandwidth, 0.0)
    exchange = steps.cost_model.moe_exchange_bytes_per_token
    if exchange:  # per token of the most loaded EP rank (routed: one past the distinct experts), else of the rank
        layers_exchanging = steps.cost_model.num_exchange_layers
        bandwidth = steps.moe_link_bandwidth_bytes_per_s * link_fraction
        gpus = steps.tensor_parallel * steps.data_parallel
        per_token = layer_scale * moe_exchange_time_s(1.0, layers_exchanging, exchange, bandwidth, 0.0, gpus)
        routed = steps.cost_model.moe_exchange_routed
        assert not routed or structure.experts is not None and structure.width - 1 == (
            _FIRST_WINDOW_AT + WINDOW_FEATURES * len(steps.cost_model.windows) + 1)  # the routed tokens
        linear[_STEP_AT] += (layer_scale * moe_exchange_time_s(1.0, layers_exchanging, exchange, bandwidth, latency,
                                                               gpus) - per_token)
        linear[structure.width - 1 if routed else _TOKENS_AT] += per_token
    compute_rows = structure.compute_rows * np.where(structure.attention, attention_slowdown, 1.0)[:, np.newaxis]
    slowdowns = _slowdown_table(efficiency)
    experts = structure.experts
    distinct = _experts_table(experts, "distinct_experts") if experts else None
    routed = _experts_table(experts, "routed_tokens") if experts else None
    expert_slowdowns = _expert_slowdown_table(efficiency, experts) if experts else None
    return _Forms(
        width=structure.width,
        slowed=structure.slowed,
        operators=tuple((tuple((feature, seconds * attention_slowdown) for feature, seconds in compute)
                         if attention else compute,
                         tuple((feature, seconds / bandwidth_fraction) for feature, seconds in memory))
                        for compute, memory, attention in structure.operators),
        linear=_terms(linear),
        ideal_compute=structure.ideal_compute,
        ideal_memory=structure.ideal_memory,
        expected_matrix=np.vstack((compute_rows, np.zeros(len(linear)),  # (the linear part's compute: none)
                                   structure.memory_rows / bandwidth_fraction, linear)),
        ideal_matrix=structure.ideal_matrix,
        slowdowns=slowdowns,
        slowdown_list=memoryview(slowdowns),
        experts=experts,
        distinct_experts=distinct,
        distinct_experts_list=None if distinct is None else memoryview(distinct),
        routed_tokens=routed,
        routed_tokens_list=None if routed is None else memoryview(routed),
        expert_slowdowns=expert_slowdowns,
        expert_slowdown_list=None if expert_slowdowns is None else memoryview(expert_slowdowns),
        prefill_overhead=layer_scale * efficiency.prefill_moe_layer_overhead_s * steps.cost_model.num_moe_layers,
        host_floor=step_scale * efficiency.overlapped_host_per_sequence_s if overlapped else 0.0,
        host_constant=step_scale * efficiency.per_step_overhead_s if overlapped else 0.0,
    )


def _scalar(forms: _Forms, windows: tuple[int | None, ...], efficiency: Efficiency) -> ScalarStepTime:
    """The forms as `step_scalar` evaluates them: tuples, the tables read as Python floats, and what a table
    does not hold computed on the spot."""
    experts = forms.experts
    return ScalarStepTime(
        windows=windows, slowed=forms.slowed, operators=forms.operators, linear=forms.linear,
        ideal_compute=forms.ideal_compute, ideal_memory=forms.ideal_memory, slowdown_table=forms.slowdown_list,
        slowdown=lambda rows: float(_slowdown(efficiency, rows)),
        moe=experts is not None,
        distinct_experts_table=forms.distinct_experts_list or (),
        routed_tokens_table=forms.routed_tokens_list or (),
        expert_slowdown_table=forms.expert_slowdown_list or (),
        distinct_experts=lambda tokens: float(experts.distinct_experts(tokens)),  # type: ignore[union-attr]
        routed_tokens=lambda tokens: float(experts.routed_tokens(tokens)),  # type: ignore[union-attr]
        expert_slowdown=lambda tokens: float(_expert_slowdown(efficiency, experts, tokens)),  # type: ignore[arg-type]
        prefill_overhead=forms.prefill_overhead,
        host_floor=forms.host_floor,
        host_constant=forms.host_constant,
    )


@dataclass(frozen=True, slots=True, eq=False)
class _Structure:
    """What `_Forms` holds before an efficiency is folded in (see there), shared by every efficiency
    of one model: a fit times the same deployments under many."""

    width: int
    slowed: tuple[tuple[int, int], ...]
    # Operators with FLOPs: (compute seconds at peak, memory seconds at full bandwidth, whether they run
    # at the attention fraction rather than a matmul's); the memory seconds of those without FLOPs.
    operators: tuple[tuple[_Terms, _Terms, bool], ...]
    ideal_compute: _Terms
    ideal_memory: _Terms
    compute_rows: np.ndarray  # the operators' compute, then memory seconds as rows over the features
    memory_rows: np.ndarray
    attention: np.ndarray  # bool per operator
    linear_memory_row: np.ndarray
    ideal_matrix: np.ndarray
    experts: StepCostModel | None  # the cost model of an MoE model


@lru_cache(maxsize=256)
def _structure(cost_model: StepCostModel, operator_terms: tuple[tuple[_Terms, _Terms], ...]) -> _Structure:
    per_window = WINDOW_FEATURES * len(cost_model.windows)
    feature_at = _FEATURE_AT | {FIRST_WINDOW_GROUP + at: _FIRST_WINDOW_AT + at for at in range(per_window)}
    if cost_model.num_experts:  # (dense models touch no experts and route no tokens: the features are 0)
        feature_at[DISTINCT_EXPERTS] = _FIRST_WINDOW_AT + per_window
        feature_at[ROUTED_TOKENS] = _FIRST_WINDOW_AT + per_window + 1
    width = len(feature_at)
    slowed = {pair: width + at for at, pair in enumerate(_SLOWED_ROWS)}  # (feature, by rows) -> slowed feature
    operators: list[tuple[dict[int, float], dict[int, float], bool]] = []
    linear_memory: dict[int, float] = {}  # operators without FLOPs: memory time, with nothing to compare
    ideal_compute, ideal_memory = np.zeros(width), np.zeros(width)
    for name, (compute_terms, memory_terms) in zip(cost_model.operator_names, operator_terms, strict=True):
        compute = {feature_at[feature]: seconds for feature, seconds in compute_terms if feature in feature_at}
        memory = {feature_at[feature]: seconds for feature, seconds in memory_terms if feature in feature_at}
        for feature, seconds in compute.items():
            ideal_compute[feature] += seconds
        for feature, seconds in memory.items():
            ideal_memory[feature] += seconds
        if not compute:
            for feature, seconds in memory.items():
                linear_memory[feature] = linear_memory.get(feature, 0.0) + seconds
        elif MATMUL_ROWS[name] is None:  # not a row-wise matmul: the constant attention fraction
            operators.append((compute, memory, True))
        else:
            by_rows = _BY_ROWS[MATMUL_ROWS[name]]  # type: ignore[index]
            operators.append(({slowed.setdefault(
                (feature, _BY_EXPERT_ROWS if feature == feature_at.get(ROUTED_TOKENS) else by_rows),
                width + len(slowed)): seconds for feature, seconds in compute.items()}, memory, False))

    def rows(forms: list[dict[int, float]]) -> np.ndarray:
        dense = np.zeros((len(forms), width + len(slowed)))
        for row, terms in zip(dense, forms, strict=True):
            for feature, seconds in terms.items():
                row[feature] = seconds
        return dense

    return _Structure(
        width=width,
        slowed=tuple(slowed)[len(_SLOWED_ROWS):],
        operators=tuple((_sparse(compute), _sparse(memory), attention) for compute, memory, attention in operators),
        ideal_compute=_terms(ideal_compute),
        ideal_memory=_terms(ideal_memory),
        compute_rows=rows([compute for compute, _, _ in operators]),
        memory_rows=rows([memory for _, memory, _ in operators]),
        attention=np.array([attention for _, _, attention in operators], dtype=bool),
        linear_memory_row=rows([linear_memory])[0],
        ideal_matrix=np.array([ideal_compute, ideal_memory]),
        experts=cost_model if cost_model.num_experts else None,
    )


def _slowdown(efficiency: Efficiency, matmul_rows: ArrayLike | None) -> ArrayLike:
    """Expected seconds per ideal compute second (1 / achieved fraction, as `roofline.expected_time_s`
    has it) of matmuls of `matmul_rows` rows; None: of attention."""
    fraction = (efficiency.attention_compute_fraction if matmul_rows is None
                else efficiency.compute_fraction(matmul_rows))
    return expected_time_s(1.0, 0.0, fraction, 1.0)


@lru_cache(maxsize=16)
def _slowdown_table(efficiency: Efficiency) -> np.ndarray:
    table = np.asarray(_slowdown(efficiency, _TABLE_GRID))
    table.setflags(write=False)
    return table


def _expert_slowdown(efficiency: Efficiency, cost_model: StepCostModel, tokens: ArrayLike) -> ArrayLike:
    """The routed experts' slowdown when every data-parallel rank brings `tokens`: a matmul's at the rows
    each touched expert multiplies."""
    return _slowdown(efficiency, cost_model.rows_per_expert(tokens))


# Skewed routing was tried on 2026-12-08, held out by GPU on H100, H200, B200 and GB200: expert i chosen by a token
# with probability q_i proportional to i^-s (capped at 1, summing to k), distinct experts sum_i 1 - (1 - q_i)^T, s set
# by hand, not fitted. At s = 0.6 (DeepSeek: 139.5 of 256 experts at T = 32, against 163.3 uniform) the DP+EP TPOT
# error went 10.4% -> 9.4% (SGLang DeepSeek-R1 15.6% -> 9.9%), DP+EP TTFT 30.5% -> 25.3%, disaggregated TPOT
# 9.3% -> 9.0%; but the refit moved the dense rows, H100's TP-only end-to-end latencies and throughputs 18.5% ->
# 21.3%, and all four GPUs' rows 18.5% -> 19.6%. At s = 1.0: DP+EP TPOT 7.4%, all rows 20.4%. A separate
# bandwidth fraction for expert reads, fitted on the MoE rows, made things worse with the skew (all rows 21.8%,
# DP+EP TPOT 15.1%) and without it (21.1%, 13.2%). What points at skew: TensorRT-LLM DeepSeek-R1 fp8 on H200 at
# TP8 EP8, 1k in / 8k out, measures 7.11, 9.33, 11.39 and 15.82 ms TPOT at 4, 8, 16 and 32 users; uniform routing
# reads 30.5, 57.4, 102.0 and 163.3 experts a layer, each 44.0e6 fp8 weights x 58 layers / 8 GPUs = 319 MB a GPU:
# 2.03-10.86 ms at the full 4.8 TB/s, leaving 5.1, 5.5, 4.6 and 5.0 ms. The measured slope is the datasheet's
# bandwidth, which no kernel reaches unless fewer experts are read (or MTP ran, which no field states). SGLang's
# NVFP4 (4.5-bit) DeepSeek-R1 on B200 at TP4 EP4, same lengths, rises 7.9 ms from 4 to 32 users: uniform routing at
# 0.75 of bandwidth, which needs no skew. Fitted instead, once in the global entry on its MoE rows (bounds 0-1.5, prior
# 0: uniform) and kept by every family: DP+EP TPOT 10.42% -> 10.03%, TP-only TPOT of MoE models 17.1% -> 17.8%, of
# dense ones 11.2% -> 11.7%, all rows 18.5% -> 19.1%: not taken.
@lru_cache(maxsize=256)
def _experts_table(cost_model: StepCostModel, quantity: str) -> np.ndarray:
    """An MoE cost model's `distinct_experts`, `routed_tokens` or `rows_per_expert` at 0.._TABLE_ROWS tokens:
    none depends on the efficiency, so each is computed once per cost model (a fit retimes the same cost
    models under hundreds of efficiencies). 256 tables of 16,385 floats are 34 MB at most; at 64, a fit
    entry's MoE rows (up to 80 cost models, three tables each) evicted every table before its next use."""
    table = np.asarray(getattr(cost_model, quantity)(_TABLE_GRID), dtype=float)
    table.setflags(write=False)
    return table


@lru_cache(maxsize=64)
def _expert_slowdown_table(efficiency: Efficiency, cost_model: StepCostModel) -> np.ndarray:
    """`_expert_slowdown` at 0.._TABLE_ROWS tokens."""
    table = np.asarray(_slowdown(efficiency, _experts_table(cost_model, "rows_per_expert")))
    table.setflags(write=False)
    return table


def _sparse(terms: dict[int, float]) -> _Terms:
    return tuple((feature, seconds) for feature, seconds in sorted(terms.items()) if seconds)


def _terms(row: np.ndarray) -> _Terms:
    return tuple((int(feature), float(row[feature])) for feature in np.flatnonzero(row))


def _anywhere(condition: ArrayLike) -> bool:
    return condition if isinstance(condition, bool) else bool(np.count_nonzero(condition))
