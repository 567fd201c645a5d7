"""Roofline: ideal and expected time of a step, which roof bounds it, and the decode knee batch.

SIZING.md section 5. Arithmetic intensity = FLOPs / bytes; ridge point = peak FLOP/s / bandwidth
(H100 SXM bf16: 989.5e12 / 3.35e12 = 295); below the ridge a step is memory-bound.

- Ideal time = max(FLOPs / peak, bytes / bandwidth) over the whole step.
- Expected time = sum over operators of max(FLOPs / (peak · compute fraction), bytes / (bandwidth ·
  bandwidth fraction)) + tensor-parallel all-reduces (2 per layer) + the per-step and per-layer
  overheads. A matmul's compute fraction follows the rows M it multiplies (the step's tokens; the
  sampled positions for the LM head; for the routed experts the rows each touched expert multiplies,
  so the MoE operator's compute is its shared experts' at the tokens' fraction plus its routed experts'
  at theirs), so a step never gets faster by adding work to it; attention runs at its own fixed
  fraction. Under expert parallelism the routed-expert work and the all-to-all are the most loaded
  rank's (`flops.expected_expert_load_factor`). Each operator term is >= its share of the ideal and the extras are
  >= 0, so expected >= ideal always (asserted).

Peaks: quantized linear layers run at `compute_dtype`'s rate; operators whose operands stay 16-bit
(attention, LM head, router: `flops.HIGH_PRECISION_OPERATORS`) at the activation precision's rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from app.sizing.hardware.comm import (
    link_bandwidth,
    moe_exchange_time_s,
    step_allreduce_time_s,
    tp_link_bandwidth,
    tp_network_latency_s,
)
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.model.flops import (
    HIGH_PRECISION_OPERATORS,
    MATMUL_ROWS,
    MOE,
    SAMPLED,
    TOKENS,
    PhaseCost,
    attended_positions,
    decode_cost,
    kv_tokens_read,
    step_cost_model,
)
from app.sizing.model.recipes import WeightRecipe
from app.sizing.specs import COMPUTE_DTYPES, GpuSpec, ModelSpec

MEMORY = "memory"
COMPUTE = "compute"

_NO_FRACTION = 1e-300  # stands in for a 0 compute fraction, where there are no FLOPs to divide

# Weight dtypes with no tensor rate of their own compute at 16 bits (int4 is weight-only: W4A16).
_FALLBACK_COMPUTE_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def peak_flops_per_s(gpu: GpuSpec, compute_dtype: str) -> float:
    peak = gpu.peak_flops_per_s(compute_dtype)
    if not peak:
        raise ValueError(f"{gpu.name or gpu.slug} has no {compute_dtype} tensor rate")
    return peak


def ridge_point(gpu: GpuSpec, compute_dtype: str) -> float:
    """FLOPs per byte where a step turns compute-bound: peak FLOP/s / HBM bandwidth."""
    return peak_flops_per_s(gpu, compute_dtype) / gpu.memory_bandwidth_bytes_per_s


def default_compute_dtype(gpu: GpuSpec, weight_dtype: str) -> str:
    """The weights' precision where the GPU has a tensor rate for it (fp8 on Hopper), else the best
    16-bit rate it has (fp8 weights on an A100 are weight-only: they compute in bf16)."""
    candidates = ((weight_dtype,) if weight_dtype in COMPUTE_DTYPES else ()) + _FALLBACK_COMPUTE_DTYPES
    for dtype in candidates:
        if gpu.peak_flops_per_s(dtype):
            return dtype
    raise ValueError(f"{gpu.name or gpu.slug} has no tensor rate for {weight_dtype} nor a 16/32-bit one")


def operator_peaks(operator_names: Sequence[str], gpu: GpuSpec, compute_dtype: str,
                   activation_dtype: str) -> np.ndarray:
    """Peak FLOP/s each operator runs at (see the module docstring)."""
    compute = peak_flops_per_s(gpu, compute_dtype)
    high_precision = (gpu.peak_flops_per_s(activation_dtype) or gpu.peak_flops_per_s("fp16")
                      or gpu.peak_flops_per_s("bf16") or compute)
    return np.array([high_precision if name in HIGH_PRECISION_OPERATORS else compute
                     for name in operator_names])


def compute_fractions(operator_names: Sequence[str], tokens: ArrayLike, sampled: ArrayLike,
                      efficiency: Efficiency) -> list[ArrayLike]:
    """Achieved fraction of peak of each operator (numbers, or arrays shaped like `tokens`)."""
    by_tokens, by_sampled = efficiency.compute_fraction(tokens), efficiency.compute_fraction(sampled)
    by_rows = {TOKENS: by_tokens, SAMPLED: by_sampled}
    return [efficiency.attention_compute_fraction if MATMUL_ROWS[name] is None else by_rows[MATMUL_ROWS[name]]
            for name in operator_names]


def expected_time_s(compute_s: ArrayLike, memory_s: ArrayLike, compute_fraction: ArrayLike,
                    bandwidth_fraction: float) -> ArrayLike:
    """An operator's expected seconds: max(compute / compute fraction, memory / bandwidth fraction).

    `compute_s` and `memory_s` are its ideal times (every FLOP at peak, every byte at full bandwidth);
    both fractions are <= 1, so the result is >= both. Elementwise over arrays.
    """
    safe_fraction = maximum(compute_fraction, _NO_FRACTION)  # 0 only where there are no rows, no FLOPs
    return maximum(compute_s / safe_fraction, memory_s / bandwidth_fraction)


def maximum(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Elementwise max; the builtin for two plain numbers (numpy's per-call cost dominates scalar use)."""
    return max(a, b) if isinstance(a, float) and isinstance(b, float) else np.maximum(a, b)


def minimum(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Elementwise min; the builtin for two plain numbers."""
    return min(a, b) if isinstance(a, float) and isinstance(b, float) else np.minimum(a, b)


@dataclass(frozen=True, slots=True)
class OperatorTime:
    name: str
    flops: float
    bytes: float
    arithmetic_intensity: float
    bound: str  # MEMORY or COMPUTE, on the ideal roofline
    ideal_time_s: float
    expected_time_s: float


@dataclass(frozen=True, slots=True)
class RooflineResult:
    flops: float
    bytes: float
    arithmetic_intensity: float
    ridge_point: float  # of compute_dtype
    bound: str  # MEMORY or COMPUTE: which ideal time is larger
    ideal_time_s: float  # max(compute_time_s, memory_time_s)
    expected_time_s: float  # operators at achieved efficiency + comm + overhead
    comm_time_s: float
    overhead_time_s: float
    operators: tuple[OperatorTime, ...]
    tokens: int
    compute_time_s: float  # every FLOP at peak
    memory_time_s: float  # every byte at full bandwidth
    compute_dtype: str
    efficiency: Efficiency  # what `expected_time_s` assumed, and its source

    @property
    def ideal_tokens_per_s(self) -> float:
        return self.tokens / self.ideal_time_s

    @property
    def expected_tokens_per_s(self) -> float:
        return self.tokens / self.expected_time_s


def roofline(cost: PhaseCost, gpu: GpuSpec, compute_dtype: str, efficiency: Efficiency = DEFAULT_EFFICIENCY,
             tensor_parallel: int | None = None, model: ModelSpec | None = None) -> RooflineResult:
    """Ideal and expected time of one step on one GPU of the tensor-parallel group.

    The cost already carries its TP degree and layer count; `tensor_parallel` and `model`, when given,
    must agree with it (a guard against pairing a cost with the wrong deployment).
    """
    if tensor_parallel is not None and tensor_parallel != cost.tensor_parallel:
        raise ValueError(f"cost was computed for tensor_parallel={cost.tensor_parallel}, not {tensor_parallel}")
    if model is not None and model.num_hidden_layers != cost.num_layers:
        raise ValueError("cost was computed for a model with a different number of layers")
    # Plain floats throughout: numpy's per-call cost dominates arithmetic on a step's ~8 operators.
    operators = cost.operators
    names = [op.name for op in operators]
    peaks = operator_peaks(names, gpu, compute_dtype, cost.activation_dtype).tolist()
    fractions = compute_fractions(names, cost.tokens, cost.sequences, efficiency)
    if cost.routed_expert_flops:  # the MoE operator: shared experts at the tokens' fraction, routed at theirs
        moe = names.index(MOE)
        moe_compute = operators[moe].flops / peaks[moe]
        routed = cost.routed_expert_flops / peaks[moe]
        slowed = (max(moe_compute - routed, 0.0) / fractions[moe]
                  + routed / efficiency.compute_fraction(cost.rows_per_expert))
        fractions[moe] = moe_compute / slowed
    bandwidth, bandwidth_fraction = gpu.memory_bandwidth_bytes_per_s, efficiency.bandwidth_fraction
    flops, bytes_, compute, memory, expected = [], [], [], [], []
    for op, peak, fraction in zip(operators, peaks, fractions, strict=True):
        op_flops, op_bytes = op.flops, op.bytes
        op_compute, op_memory = op_flops / peak, op_bytes / bandwidth
        flops.append(op_flops)
        bytes_.append(op_bytes)
        compute.append(op_compute)
        memory.append(op_memory)
        expected.append(expected_time_s(op_compute, op_memory, float(fraction), bandwidth_fraction))
    link_fraction = efficiency.link_fraction(gpu.pcie_links)
    comm = step_allreduce_time_s(cost.tokens, cost.num_layers, cost.hidden_state_bytes_per_token,
                                 cost.tensor_parallel, tp_link_bandwidth(gpu, cost.tensor_parallel) * link_fraction,
                                 efficiency.allreduce_latency_s, tp_network_latency_s(gpu, cost.tensor_parallel))
    exchange_gpus = cost.tensor_parallel * cost.data_parallel
    comm += moe_exchange_time_s(cost.tokens * cost.expert_load_factor, cost.num_exchange_layers,
                                cost.moe_exchange_bytes_per_token,
                                link_bandwidth(gpu, exchange_gpus) * link_fraction, efficiency.allreduce_latency_s,
                                exchange_gpus)
    overhead = float(efficiency.overhead_time_s(cost.tokens, cost.num_layers))
    compute_time, memory_time = math.fsum(compute), math.fsum(memory)
    ideal = max(compute_time, memory_time)
    expected_total = math.fsum(expected) + comm + overhead
    assert expected_total >= ideal, "expected time below the ideal roofline"
    total_flops, total_bytes = math.fsum(flops), math.fsum(bytes_)
    return RooflineResult(
        flops=total_flops, bytes=total_bytes, arithmetic_intensity=total_flops / total_bytes,
        ridge_point=ridge_point(gpu, compute_dtype), bound=_bound(compute_time, memory_time),
        ideal_time_s=ideal, expected_time_s=expected_total, comm_time_s=comm, overhead_time_s=overhead,
        operators=tuple(
            OperatorTime(name=op.name, flops=flops[i], bytes=bytes_[i], arithmetic_intensity=op.arithmetic_intensity,
                         bound=_bound(compute[i], memory[i]), ideal_time_s=max(compute[i], memory[i]),
                         expected_time_s=expected[i])
            for i, op in enumerate(operators)
        ),
        tokens=cost.tokens, compute_time_s=compute_time, memory_time_s=memory_time,
        compute_dtype=compute_dtype, efficiency=efficiency,
    )


def knee_batch_size(model: ModelSpec, gpu: GpuSpec, context_tokens: int, weight_dtype: str | WeightRecipe,
                    kv_dtype: str, compute_dtype: str, tensor_parallel: int = 1,
                    activation_dtype: str = "bf16", data_parallel: int = 1, expert_parallel: int = 1) -> int | None:
    """Smallest decode batch whose IDEAL step is compute-bound at `context_tokens` per sequence, or None
    when no batch ever is. With attention data parallelism the batch is one rank's, every rank bringing as
    many (`decode_cost`), and D(B) is the distinct experts a GPU reads of its 1/ep share when dp·B tokens
    route (`StepCostModel.distinct_experts`, X the bytes of one on this GPU): the same concave form. Under
    expert parallelism the step waits for the most loaded rank, whose routed tokens are B times a load
    factor that falls from its cap towards 1 as the batch grows (`flops.expected_expert_load_factor`): the
    expert FLOPs and activations are no longer B times one sequence's, so the knee is searched on the
    roofline itself (`_searched_knee`).

    A decode step of B sequences costs, in the ideal roofline,
        compute(B) = B · t                     (t: one sequence's FLOPs over the peaks; FLOPs have no
                                                per-step part)
        memory(B)  = (W + B · s + X · D(B)) / bw
    with W the weights read once per step, s one sequence's KV/activation/embedding-row bytes, X the
    bytes of one routed expert across the MoE layers (on this GPU: its 1/ep share, split over moe_tp) and
    D(B) = E·(1 − (1 − k/E)^(dp·B)) the distinct experts touched. The step is compute-bound when
    g(B) = B · (t · bw − s) − W − X · D(B) >= 0.

    - Dense (X = 0): g is linear; if t·bw <= s (at long context every sequence brings its own KV reads,
      so the intensity saturates below the ridge) it never is; else B* = ceil(W / (t·bw − s)).
    - MoE: D is concave and increasing (D'' = −E·dp²·(1−k/E)^(dp·B)·ln²(1−k/E) <= 0), so g is convex with
      g(0) = −W <= 0; a convex function that starts <= 0 stays >= 0 once it reaches 0, so "compute-bound"
      is monotone in B and the smallest such B is found by bisection between the dense bound
      ceil(W / (t·bw − s)) (D >= 0) and ceil((W + X·E) / (t·bw − s)) (D <= E).
    """
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    layout = {"tensor_parallel": tensor_parallel, "data_parallel": data_parallel, "expert_parallel": expert_parallel}
    if expert_parallel > 1 and model.is_moe:
        return _searched_knee(model, gpu, context_tokens, weight_dtype, kv_dtype, compute_dtype, activation_dtype,
                              layout)
    model_costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, **layout)
    one = decode_cost(model, context_tokens, 1, weight_dtype, kv_dtype, activation_dtype, **layout)
    peaks = operator_peaks([op.name for op in one.operators], gpu, compute_dtype, activation_dtype)
    bandwidth = gpu.memory_bandwidth_bytes_per_s
    seconds_per_sequence = sum(op.flops / peak for op, peak in zip(one.operators, peaks, strict=True))
    per_step = model_costs.weight_bytes_per_step
    per_expert = model_costs.bytes_per_distinct_expert
    experts_at_one = model_costs.distinct_experts(1) if model.is_moe else 0.0
    per_sequence = one.bytes - per_step - per_expert * experts_at_one
    slope = seconds_per_sequence * bandwidth - per_sequence
    if slope <= 0:
        return None

    def compute_bound(batch: int) -> bool:
        experts = model_costs.distinct_experts(batch) if model.is_moe else 0.0
        return batch * slope - per_step - per_expert * experts >= 0

    low = max(1, math.ceil(per_step / slope))
    high = max(low, math.ceil((per_step + per_expert * model.num_experts) / slope))
    while not compute_bound(high):  # float rounding at the bound; g grows linearly beyond it
        high += 1
    while low > 1 and compute_bound(low - 1):  # likewise, below the dense bound
        low -= 1
    while low < high:  # invariant: compute_bound(high); every batch below `low` is memory-bound
        middle = (low + high) // 2
        if compute_bound(middle):
            high = middle
        else:
            low = middle + 1
    return high


# Beyond this batch the most loaded rank's load factor is within half a percent of 1 (1 + E[max of ep standard
# normals] / sqrt(B·k/ep), with B·k/ep >= 2^20 up to the requests' 1,024 ranks: 1 + 3.2 / 1,024) and every
# expert is touched, so the step's times grow linearly: a step still memory-bound here stays so at any batch.
_LARGEST_SEARCHED_BATCH = 2**30
_SEARCH_POINTS = 256  # batches timed at once per pass: a DeepSeek-V3 EP8 sweep's core call 0.2-0.4 ms (2026-12-06)


def _searched_knee(model: ModelSpec, gpu: GpuSpec, context_tokens: int, weight_dtype: str | WeightRecipe,
                   kv_dtype: str, compute_dtype: str, activation_dtype: str, layout: dict[str, int]) -> int | None:
    """The knee under expert parallelism: the smallest batch whose ideal roofline is compute-bound. Batches
    spread geometrically over 1.._LARGEST_SEARCHED_BATCH are timed at once (the step's linear forms over
    arrays, as `roofline` times one: FLOPs over each operator's peak against bytes over the bandwidth); the
    first compute-bound one and the memory-bound one before it bracket the knee, and each further pass times
    evenly spread batches of the bracket until it holds every batch in it. That takes compute-boundness to be
    monotone between the batches of a pass, as it is where the load factor is 1 (`knee_batch_size`); the
    tests check the result against every batch below it."""
    costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, **layout)
    peaks = operator_peaks(costs.operator_names, gpu, compute_dtype, activation_dtype)[:, None]
    bandwidth = gpu.memory_bandwidth_bytes_per_s
    read = [kv_tokens_read(context_tokens, 1, window) for window in costs.windows]
    attended = [attended_positions(context_tokens, 1, window) for window in costs.windows]

    def compute_bound(batches: np.ndarray) -> np.ndarray:
        seqs = batches.astype(float)
        shape = costs.shape(tokens=seqs, sampled=seqs, attended=[0.0] * len(read), kv_read=[seqs * r for r in read],
                            decode_attended=[seqs * a for a in attended])
        flops, weight, kv, activation = costs.evaluate([np.broadcast_to(value, seqs.shape) for value in shape])
        return (flops / peaks).sum(axis=0) >= (weight + kv + activation).sum(axis=0) / bandwidth

    low, high = 1, _LARGEST_SEARCHED_BATCH
    batches = np.unique(np.geomspace(low, high, _SEARCH_POINTS).round().astype(np.int64))
    while True:
        bound = compute_bound(batches)
        if not bound.any():
            if high == _LARGEST_SEARCHED_BATCH:
                return None  # linear from here on (above)
            raise AssertionError("a bracket's compute-bound end was timed memory-bound")
        first = int(np.argmax(bound))
        if first == 0 or batches[first] - batches[first - 1] == 1:
            return int(batches[first])
        low, high = int(batches[first - 1]) + 1, int(batches[first])
        batches = np.unique(np.linspace(low, high, min(_SEARCH_POINTS, high - low + 1)).round().astype(np.int64))


def _bound(compute_time: float, memory_time: float) -> str:
    return COMPUTE if compute_time >= memory_time else MEMORY
