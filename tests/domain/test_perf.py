"""The fast step-time model: the roofline's own numbers, for any mix of decode and prefill, vectorized.

Independent checks: the roofline of `prefill_cost`/`decode_cost` (worked by hand in test_flops.py and
test_roofline.py) for uniform batches, the roofline of any step shape evaluated operator by operator
from `flops.step_cost_model`, hand arithmetic for the window bound and pipeline hops, and scalar calls
against vectorized ones.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.sizing.hardware.comm import link_bandwidth, pipeline_hops_time_s
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.hardware.roofline import default_compute_dtype, roofline
from app.sizing.hardware.step_time import StepTimeModel, build_step_time_model, pipeline_period_scales
from app.sizing.model.flops import (
    DECODE,
    MOE,
    PREFILL,
    ROUTED_TOKENS,
    OperatorCost,
    PhaseCost,
    attended_positions,
    decode_cost,
    kv_tokens_read,
    prefill_cost,
    step_cost_model,
)
from app.sizing.specs import GpuSpec, ModelSpec
from tests.domain.models_for_tests import (
    ALL_MODELS,
    DEEPSEEK_V3,
    GEMMA_2_9B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    random_models,
)
from tests.domain.test_layout import H200
from tests.domain.test_roofline import A100_80GB_SXM, GPUS, H100_SXM

models = st.sampled_from(ALL_MODELS) | random_models()
weight_dtypes = st.sampled_from(["bf16", "fp8", "int4"])

# A profile unlike the default: its compute curve keeps rising up to 30,000 rows, well past any batch,
# so large prefill steps meet a fraction that is not the curve's flat top.
RISING_CURVE = Efficiency(
    bandwidth_fraction=0.55, compute_curve=((16, 0.05), (512, 0.5), (30_000, 0.8)), compute_scale=0.9,
    attention_fraction=0.45, per_step_overhead_s=2e-4, per_layer_overhead_s=5e-6, allreduce_latency_s=1.2e-5,
    source="test profile: a compute curve rising to 30,000 rows",
)
efficiencies = st.sampled_from([DEFAULT_EFFICIENCY, RISING_CURVE])


def step_model(model: ModelSpec, gpu: GpuSpec = H100_SXM, tp: int = 1, pp: int = 1,
               weight_dtype: str = "bf16", kv_dtype: str = "bf16",
               efficiency: Efficiency = DEFAULT_EFFICIENCY, dp: int = 1, ep: int = 1) -> StepTimeModel:
    return build_step_time_model(model, gpu, tensor_parallel=tp, pipeline_parallel=pp,
                                 weight_dtype=weight_dtype, kv_dtype=kv_dtype, efficiency=efficiency,
                                 data_parallel=dp, expert_parallel=ep)


def per_operator_times(model: ModelSpec, gpu: GpuSpec, tp: int, pp: int, weight_dtype: str, efficiency: Efficiency,
                       tokens: float, sampled: float, attended: list[float], kv_read: list[float],
                       decode_attended: list[float] | None = None, dp: int = 1, ep: int = 1) -> tuple[float, float]:
    """(expected, ideal) seconds of a step of this shape, timed by `roofline()` operator by operator from
    the cost model's linear forms (every operator's FLOPs and bytes at the shape, its own peak and
    achieved fractions, the all-reduces and MoE exchange, the overheads), plus the pipeline's
    stage-boundary sends. `attended`: the prompt tokens' positions, `decode_attended` the decoding tokens'."""
    if tokens == 0:
        return 0.0, 0.0
    costs = step_cost_model(model, weight_dtype, "bf16", "bf16", tp, dp, ep)
    shape = costs.shape(tokens, sampled, attended, kv_read, decode_attended=decode_attended)
    flops, weight, kv, activation = costs.evaluate(shape)
    names = costs.operator_names
    routed = float(costs.flops[names.index(MOE), ROUTED_TOKENS] * shape[ROUTED_TOKENS]) if MOE in names else 0.0
    step = PhaseCost(
        phase=DECODE if tokens == sampled else PREFILL, tokens=tokens,  # type: ignore[arg-type]
        operators=tuple(OperatorCost(name, *map(float, values))
                        for name, *values in zip(names, flops, weight, kv, activation, strict=True)),
        sequences=sampled, tensor_parallel=tp, num_layers=costs.num_layers,  # type: ignore[arg-type]
        hidden_state_bytes_per_token=costs.hidden_state_bytes_per_token, activation_dtype="bf16",
        data_parallel=dp, expert_parallel=ep, num_moe_layers=costs.num_moe_layers,
        moe_exchange_bytes_per_token=costs.moe_exchange_bytes_per_token,
        num_exchange_layers=costs.num_exchange_layers, routed_expert_flops=routed,
        rows_per_expert=float(costs.rows_per_expert(tokens)) if costs.num_experts else 0.0,
        expert_load_factor=float(shape[ROUTED_TOKENS]) / tokens if costs.num_experts else 1.0)
    result = roofline(step, gpu, default_compute_dtype(gpu, weight_dtype), efficiency)
    hops = (pipeline_hops_time_s(tokens, pp, costs.hidden_state_bytes_per_token, link_bandwidth(gpu, tp * pp),
                                 efficiency.allreduce_latency_s) if pp > 1 else 0.0)
    return result.expected_time_s + hops, result.ideal_time_s


def test_llama_3_8b_decode_step_matches_the_hand_roofline() -> None:
    """Batch 32 at 511 cached tokens each: 17,300,545,536 B / 3.35e12 = 5.1643 ms ideal (test_roofline)."""
    model = step_model(LLAMA_3_8B)
    assert model.ideal_step_time_s(32, 32 * 511, 0, 0) == pytest.approx(17_300_545_536 / 3.35e12, rel=1e-12)


def test_empty_step_takes_no_time() -> None:
    model = step_model(LLAMA_3_70B, tp=4, pp=2)
    assert model.step_time_s(0, 0, 0, 0) == 0.0
    assert model.ideal_step_time_s(0, 0, 0, 0) == 0.0
    np.testing.assert_array_equal(model.step_time_s(np.zeros(3), 0, np.zeros(3), 0), np.zeros(3))


@settings(max_examples=80, deadline=None)
@given(models, st.sampled_from(GPUS), st.integers(1, 256), st.integers(0, 20_000), st.sampled_from([1, 2, 8]),
       weight_dtypes, st.sampled_from(["bf16", "fp8"]))
def test_uniform_decode_agrees_with_the_roofline(model: ModelSpec, gpu: GpuSpec, batch: int, context: int,
                                                 tp: int, weight_dtype: str, kv_dtype: str) -> None:
    steps = step_model(model, gpu, tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    cost = decode_cost(model, context, batch, weight_dtype=weight_dtype, kv_dtype=kv_dtype, tensor_parallel=tp)
    result = roofline(cost, gpu, default_compute_dtype(gpu, weight_dtype))
    assert steps.step_time_s(batch, batch * context, 0, 0) == pytest.approx(result.expected_time_s, rel=1e-9)
    assert steps.ideal_step_time_s(batch, batch * context, 0, 0) == pytest.approx(result.ideal_time_s, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(models, st.sampled_from(GPUS), st.integers(1, 256), st.lists(st.integers(0, 20_000), min_size=1, max_size=12),
       st.sampled_from([1, 8]))
def test_a_run_of_decode_steps_agrees_with_the_roofline(model: ModelSpec, gpu: GpuSpec, batch: int,
                                                         contexts: list[int], tp: int) -> None:
    """The simulator's runs between arrivals: one batch size (a number), the contexts an array. Each
    step is `batch` sequences of equal context, as the roofline of decode_cost has it."""
    steps = step_model(model, gpu, tp)
    times = steps.step_time_s(batch, np.array([batch * context for context in contexts], dtype=float), 0, 0)
    assert times.shape == (len(contexts),)
    for time, context in zip(times, contexts, strict=True):
        cost = decode_cost(model, context, batch, tensor_parallel=tp)
        assert time == pytest.approx(roofline(cost, gpu, default_compute_dtype(gpu, "bf16")).expected_time_s, rel=1e-9)


def test_a_memory_bound_decode_run_is_timed_in_closed_form() -> None:
    """Llama-3-8B decoding one sequence: every operator is memory-bound at batch 1 (a GEMV reads each
    weight once for 2 FLOPs) and attention is global, so 100 steps from 1,000 cached tokens have no kink
    and the closed form applies: with no budget reached, all 100 run, taking the sum of the per-step
    rooflines; with half that sum as the budget, the run stops at the first step reaching it."""
    model_steps = step_model(LLAMA_3_8B)
    times = [roofline(decode_cost(LLAMA_3_8B, 1000 + k, 1), H100_SXM, "bf16").expected_time_s for k in range(100)]
    ends = list(itertools.accumulate(times))
    ran = model_steps.decode_run(1, 1000, 100, math.inf)
    assert ran is not None
    assert ran[0] == 100 and ran[1] == pytest.approx(ends[-1], rel=1e-12) and ran[2] == pytest.approx(times[-1])
    half = model_steps.decode_run(1, 1000, 100, ends[-1] / 2)
    assert half is not None
    assert half[0] == next(k + 1 for k, end in enumerate(ends) if end >= ends[-1] / 2)


@settings(max_examples=40, deadline=None)
@given(models, st.integers(1, 128), st.integers(0, 8000), st.integers(1, 300), st.floats(0.0, 3.0))
def test_a_decode_run_in_closed_form_is_the_sum_of_its_steps(model: ModelSpec, batch: int, context: int,
                                                               steps: int, budget_fraction: float) -> None:
    """`decode_run`: `steps` decode steps of `batch` sequences at `context` cached tokens each, growing
    by one token per sequence a step; each step is the roofline of decode_cost at its context. The run
    stops after the first step whose end reaches the budget (here a fraction of the whole run's time,
    beyond it when > 1). None (a kink inside the run: time it step by step) is allowed."""
    model_steps = step_model(model)
    times = [roofline(decode_cost(model, context + k, batch), H100_SXM, "bf16").expected_time_s
             for k in range(steps)]
    ends = list(itertools.accumulate(times))
    budget = ends[-1] * budget_fraction
    ran = model_steps.decode_run(batch, batch * context, steps, budget)
    if ran is None:
        return
    run, elapsed, last = ran
    expected_run = next((k + 1 for k, end in enumerate(ends) if end >= budget), steps)
    # (a step whose end is within rounding of the budget may fall on either side of it)
    assert run == expected_run or abs(ends[min(run, expected_run) - 1] - budget) <= 1e-9 * budget
    assert elapsed == pytest.approx(ends[run - 1], rel=1e-9)
    assert last == pytest.approx(times[run - 1], rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(models, st.integers(1, 4), st.integers(1, 3000), st.integers(0, 3000), st.sampled_from([1, 4]))
def test_uniform_prefill_agrees_with_the_roofline(model: ModelSpec, sequences: int, chunk: int, cached: int,
                                                  tp: int) -> None:
    """`sequences` prompts of `chunk` tokens after `cached` tokens each: positions attended sum to
    sequences x (chunk x cached + chunk x (chunk + 1) / 2). Exact wherever no window cuts through the
    chunk (all positions inside the window, or all beyond it)."""
    windows = step_cost_model(model).windows
    assume(all(w is None or cached + chunk <= w or cached + 1 >= w for w in windows))
    positions = sequences * (chunk * cached + chunk * (chunk + 1) // 2)
    steps = step_model(model, tp=tp)
    result = roofline(prefill_cost(model, chunk, cached, sequences, tensor_parallel=tp), H100_SXM, "bf16")
    time = steps.step_time_s(0, 0, sequences * chunk, positions, prefill_seqs=sequences)
    assert time == pytest.approx(result.expected_time_s, rel=1e-9)


def test_window_layers_are_bounded_by_the_window_per_sequence() -> None:
    """Gemma-2-9B decoding two sequences at 100 and 8,000 cached tokens: the model knows only the sum
    8,100. Sliding layers (21, window 4,096, 8,192 KV bytes per token each) really read
    min(101, 4096) + min(8001, 4096) = 4,197 tokens; the bound reads min(8,102, 2 x 4,096) = 8,102:
    3,905 tokens x 8,192 B x 21 layers = 671,784,960 B more. Global layers are exact."""
    steps = step_model(GEMMA_2_9B)
    exact_bytes = (decode_cost(GEMMA_2_9B, 100).bytes + decode_cost(GEMMA_2_9B, 8000).bytes
                   - step_cost_model(GEMMA_2_9B).weight_bytes_per_step)  # two steps share one weight read
    bound_bytes = steps.ideal_step_time_s(2, 8100, 0, 0) * 3.35e12  # memory-bound at batch 2
    assert bound_bytes - exact_bytes == pytest.approx(671_784_960, rel=1e-6)
    # Both sequences beyond the window: min(5001, 4096) + min(8001, 4096) = 8,192 = 2 x 4,096, exact.
    exact_beyond = (decode_cost(GEMMA_2_9B, 5000).bytes + decode_cost(GEMMA_2_9B, 8000).bytes
                    - step_cost_model(GEMMA_2_9B).weight_bytes_per_step)
    assert steps.ideal_step_time_s(2, 13_000, 0, 0) * 3.35e12 == pytest.approx(exact_beyond, rel=1e-12)


def test_pipeline_parallel_adds_one_hop_per_stage_boundary() -> None:
    """Llama-3-70B TP4 x PP2 = 8 GPUs, one NVLink node: a 32-token decode step crosses one boundary with
    32 x 8192 x 2 = 524,288 B: 7.5e-6 + 524,288 / 450e9 = 8.665 us on top of the same layer work."""
    flat, piped = step_model(LLAMA_3_70B, tp=4), step_model(LLAMA_3_70B, tp=4, pp=2)
    hop = 7.5e-6 + 524_288 / 450e9
    assert piped.step_time_s(32, 32 * 1000, 0, 0) - flat.step_time_s(32, 32 * 1000, 0, 0) == pytest.approx(
        hop, rel=1e-6)
    assert piped.ideal_step_time_s(32, 32_000, 0, 0) == flat.ideal_step_time_s(32, 32_000, 0, 0)


def test_pipeline_across_nodes_uses_the_scale_out_link() -> None:
    """TP8 x PP2 spans two nodes: the hop of 524,288 B goes over 50e9 B/s: 7.5e-6 + 10.486e-6 s."""
    flat, piped = step_model(LLAMA_3_70B, tp=8), step_model(LLAMA_3_70B, tp=8, pp=2)
    assert piped.step_time_s(32, 32_000, 0, 0) - flat.step_time_s(32, 32_000, 0, 0) == pytest.approx(
        7.5e-6 + 524_288 / 50e9, rel=1e-6)


def test_a_full_pipeline_steps_once_per_pp_times_its_slowest_stage() -> None:
    """Llama-3-70B TP4 x PP2 on H100, a decode step of 32 sequences at 1,000 tokens each. With both
    micro-batches in flight each stage serves both in turn, so a micro-batch's period is 2 x the slowest
    stage + the hop. The stages hold 40 layers each (80 / 2: the layers' terms scale by 2 x 40 / 80 = 1),
    the last one also the LM head and the first the embedding, and each runs a step of its own. So the
    period exceeds the trip by (2 - 1) x (LM head + embedding + per-step overhead):
      LM head, TP4: a vocabulary shard of ceil(128,256 / 4) = 32,064 rows x 8,192 x 2 B = 525,336,576 B
        of weights once, and (8,192 + 32,064) x 2 B = 80,512 B of hidden state in and logits out per
        sampled sequence: 32 x 80,512 = 2,576,384 B; (525,336,576 + 2,576,384) / (3.35e12 x 0.70)
        = 225.1228 us. Its compute, 2 x 32,064 x 8,192 x 32 = 16.81 GFLOP at 989.5 TFLOP/s x at least
        0.165 (the curve's 0.33 at 64 rows, proportional below) = at most 103 us: memory-bound.
      Embedding: per token 8,192 x 2 / 4 = 4,096 B of its table shard and 8,192 x 2 = 16,384 B of hidden
        state: 32 x 20,480 = 655,360 B / 2.345e12 = 0.27947 us.
      Per-step overhead: 0.3 ms.
    Total: 300 + 225.1228 + 0.2795 = 525.402 us."""
    trip = step_model(LLAMA_3_70B, tp=4, pp=2)
    period = build_step_time_model(LLAMA_3_70B, H100_SXM, tensor_parallel=4, pipeline_parallel=2, weight_dtype="bf16",
                                   kv_dtype="bf16", pipeline_period=True)
    extra = 300e-6 + 527_912_960 / (3.35e12 * 0.70) + 655_360 / (3.35e12 * 0.70)
    assert extra == pytest.approx(525.402e-6, rel=1e-6)
    assert period.step_time_s(32, 32_000, 0, 0) - trip.step_time_s(32, 32_000, 0, 0) == pytest.approx(extra, rel=1e-6)
    # The scalar and array paths agree, and one stage has no period to add.
    assert float(period.step_time_s(np.array([32.0]), np.array([32_000.0]), 0, 0)[0]) == pytest.approx(
        period.step_time_s(32, 32_000, 0, 0), rel=1e-12)
    alone = build_step_time_model(LLAMA_3_70B, H100_SXM, tensor_parallel=4, weight_dtype="bf16", kv_dtype="bf16",
                                  pipeline_period=True)
    assert alone.step_time_s(32, 32_000, 0, 0) == step_model(LLAMA_3_70B, tp=4).step_time_s(32, 32_000, 0, 0)


def test_the_period_takes_the_largest_stage() -> None:
    """Llama-3.1-405B's 126 layers on 4 stages are 31, 32, 32, 31 (vLLM's split): the slowest stage is taken
    as 32 layers with the model's ends, so the layers' terms scale by 4 x 32 / 126 and the per-step ones by
    4; 80 layers on 8 stages are 10 each: 8 x 10 / 80 = 1. The trip (or one stage) scales nothing."""
    assert pipeline_period_scales(126, 4) == (4 * 32 / 126, 4.0)
    assert pipeline_period_scales(80, 8) == (1.0, 8.0)
    assert pipeline_period_scales(80, 8, period=False) == pipeline_period_scales(80, 1) == (1.0, 1.0)


@settings(max_examples=60, deadline=None)
@given(models, st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4000), st.integers(0, 2048),
                                  st.integers(0, 2), st.integers(0, 8000)), min_size=1, max_size=12),
       st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_vectorized_calls_equal_scalar_calls(model: ModelSpec, steps: list[tuple[int, int, int, int, int]],
                                             tp: int, pp: int) -> None:
    assume(pp <= model.num_hidden_layers)
    seqs, per_seq_context, new, extra_seqs, cached = (np.array(column) for column in zip(*steps, strict=True))
    prefilling = np.where(new > 0, np.minimum(new, 1 + extra_seqs), 0)
    positions = new * cached + new * (new + 1) // 2
    context = seqs * per_seq_context
    model_steps = step_model(model, tp=tp, pp=pp)
    vector = model_steps.step_time_s(seqs, context, new, positions, prefill_seqs=prefilling)
    ideal = model_steps.ideal_step_time_s(seqs, context, new, positions, prefill_seqs=prefilling)
    for i in range(len(steps)):
        assert vector[i] == pytest.approx(model_steps.step_time_s(
            int(seqs[i]), int(context[i]), int(new[i]), int(positions[i]), int(prefilling[i])), rel=1e-12)
        assert ideal[i] == pytest.approx(model_steps.ideal_step_time_s(
            int(seqs[i]), int(context[i]), int(new[i]), int(positions[i]), int(prefilling[i])), rel=1e-12)
    assert np.all(vector >= ideal)


def test_array_shapes_are_kept_and_scalars_broadcast() -> None:
    steps = step_model(LLAMA_3_8B)
    times = steps.step_time_s(np.array([[1, 2], [4, 8]]), 1000, 0, 0)
    assert times.shape == (2, 2)
    assert times[1, 1] == pytest.approx(steps.step_time_s(8, 1000, 0, 0), rel=1e-12)
    assert isinstance(steps.step_time_s(8, 1000, 0, 0), float)


@settings(max_examples=60, deadline=None)
@given(models, st.integers(0, 256), st.integers(0, 256), st.integers(0, 100_000), st.integers(0, 100_000),
       st.integers(0, 512), st.sampled_from([1, 2, 8]))
def test_step_time_grows_with_decode_batch_and_context(model: ModelSpec, seqs_a: int, seqs_b: int,
                                                       context_a: int, context_b: int, prefill: int,
                                                       tp: int) -> None:
    (few, many), (short, long) = sorted((seqs_a, seqs_b)), sorted((context_a, context_b))
    steps = step_model(model, tp=tp)
    positions = prefill * (prefill + 1) // 2
    base = steps.step_time_s(few, short * (few > 0), prefill, positions)
    for seqs, context in ((many, short), (few, long), (many, long)):
        assert steps.step_time_s(seqs, context * (seqs > 0), prefill, positions) >= base * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([LLAMA_3_8B, MIXTRAL_8X7B, DEEPSEEK_V3]), st.integers(1, 128), st.integers(0, 4000),
       st.integers(1, 2048))
def test_a_mixed_step_shares_the_weight_read(model: ModelSpec, seqs: int, context: int, chunk: int) -> None:
    """Chunked prefill piggybacks on decode: one step reads the weights once, so it costs no more than
    the two steps apart and no less than either."""
    steps = step_model(model, tp=8)
    positions = chunk * (chunk + 1) // 2
    decode, prefill = steps.step_time_s(seqs, seqs * context, 0, 0), steps.step_time_s(0, 0, chunk, positions)
    mixed = steps.step_time_s(seqs, seqs * context, chunk, positions)
    assert max(decode, prefill) <= mixed * (1 + 1e-12)
    assert mixed <= decode + prefill


def test_compute_dtype_defaults_to_the_gpu_rate_for_the_weights() -> None:
    assert step_model(LLAMA_3_8B, weight_dtype="fp8").compute_dtype == "fp8"
    assert step_model(LLAMA_3_8B, A100_80GB_SXM, weight_dtype="fp8").compute_dtype == "bf16"


def test_invalid_steps_and_layouts_are_rejected() -> None:
    steps = step_model(LLAMA_3_8B)
    with pytest.raises(ValueError):
        steps.step_time_s(-1, 0, 0, 0)
    with pytest.raises(ValueError):
        steps.step_time_s(np.array([1, 2]), np.array([10, -5]), 0, 0)
    with pytest.raises(ValueError):
        steps.step_time_s(0, 0, 10, 55, prefill_seqs=11)  # more sequences than prompt tokens
    with pytest.raises(ValueError):
        steps.step_time_s(0, 0, 10, 55, prefill_seqs=0)  # prompt tokens that belong to no sequence
    with pytest.raises(ValueError):
        step_model(LLAMA_3_8B, pp=33)  # more stages than layers


@settings(max_examples=120, deadline=None)
@given(models, st.sampled_from(GPUS), st.sampled_from([1, 2, 8]), st.sampled_from([1, 2]), weight_dtypes,
       efficiencies,
       st.lists(st.tuples(st.integers(0, 64), st.integers(0, 20_000), st.integers(0, 4), st.integers(1, 6000),
                          st.integers(0, 20_000)), min_size=1, max_size=8),
       st.booleans())
def test_scalar_and_vector_calls_agree_with_the_per_operator_roofline(
        model: ModelSpec, gpu: GpuSpec, tp: int, pp: int, weight_dtype: str, efficiency: Efficiency,
        steps: list[tuple[int, int, int, int, int]], one_prompt_each: bool) -> None:
    """Each step: `seqs` sequences decoding after `context` cached tokens each, plus `prompts` prompts
    prefilling `chunk` tokens each after `cached` ones (up to 4 x 6,000 = 24,000 tokens: beyond the
    tabulated row counts too; at most one prompt when `prefill_seqs` is left to its default). With
    equal sequences the model's sums pin the shape down exactly, which `flops.attended_positions`/
    `kv_tokens_read` give per sequence, unless a window cuts through a chunk; such a prefix is moved
    past the window (every new token then attends w positions)."""
    assume(pp <= model.num_hidden_layers)
    model_steps = step_model(model, gpu, tp, pp, weight_dtype, efficiency=efficiency)
    windows = model_steps.cost_model.windows
    widest = max((w for w in windows if w is not None), default=0)
    rows, expected, ideal = [], [], []
    for seqs, context, prompts, chunk, cached in steps:
        if one_prompt_each:
            prompts = min(prompts, 1)
        if any(w is not None and cached + 1 < w < cached + chunk for w in windows):
            cached = widest  # (cached + 1 > every window)
        if not prompts:
            chunk = cached = 0
        tokens, sampled = seqs + prompts * chunk, seqs + prompts
        attended = [prompts * attended_positions(cached, chunk, w) for w in windows]
        decode_attended = [seqs * attended_positions(context, 1, w) for w in windows]
        kv_read = [seqs * kv_tokens_read(context, 1, w) + prompts * kv_tokens_read(cached, chunk, w)
                   for w in windows]
        times = per_operator_times(model, gpu, tp, pp, weight_dtype, efficiency, tokens, sampled, attended, kv_read,
                                   decode_attended)
        expected.append(times[0])
        ideal.append(times[1])
        rows.append((seqs, seqs * context, prompts * chunk, prompts * attended_positions(cached, chunk, None))
                    + (() if one_prompt_each else (prompts,)))
    columns = [np.array(column) for column in zip(*rows, strict=True)]
    vector, vector_ideal = model_steps.step_time_s(*columns), model_steps.ideal_step_time_s(*columns)
    for i, row in enumerate(rows):
        scalar, scalar_ideal = model_steps.step_time_s(*row), model_steps.ideal_step_time_s(*row)
        assert isinstance(scalar, float)
        assert scalar == pytest.approx(expected[i], rel=1e-9)
        assert vector[i] == pytest.approx(expected[i], rel=1e-9)
        assert scalar_ideal == pytest.approx(ideal[i], rel=1e-9)
        assert vector_ideal[i] == pytest.approx(ideal[i], rel=1e-9)


@pytest.mark.parametrize("model", [LLAMA_3_8B, DEEPSEEK_V3], ids=lambda model: model.slug)
def test_fractional_step_sizes_agree_with_the_per_operator_roofline(model: ModelSpec) -> None:
    """A mean micro-batch (capacity divides a batch by pp) is no whole number of rows: 2.5 sequences
    of 1,000 cached tokens each (global attention: 2.5 x 1,001 = 2,502.5 positions attended and read),
    and 2.5 + 1,000.5 prompt tokens in a mixed step; timed alike by scalar calls, a vectorized call and
    the roofline operator by operator (both without a window, so the model's sums are the shape)."""
    steps = step_model(model, tp=8)
    assert steps.cost_model.windows == (None,)
    decode = per_operator_times(model, H100_SXM, 8, 1, "bf16", DEFAULT_EFFICIENCY, 2.5, 2.5, [0.0], [2502.5],
                                [2502.5])
    # The prompt: 1,000.5 tokens of one sequence with no prefix attend 1,000.5 x 1,001.5 / 2 positions.
    positions = 1000.5 * 1001.5 / 2
    mixed = per_operator_times(model, H100_SXM, 8, 1, "bf16", DEFAULT_EFFICIENCY, 1003.0, 3.5,
                               [positions], [2502.5 + 1000.5], [2502.5])
    for (expected, ideal), args in ((decode, (2.5, 2500.0, 0.0, 0.0)), (mixed, (2.5, 2500.0, 1000.5, positions))):
        assert steps.step_time_s(*args) == pytest.approx(expected, rel=1e-9)
        assert steps.ideal_step_time_s(*args) == pytest.approx(ideal, rel=1e-9)
        assert steps.step_time_s(*(np.full(3, value) for value in args)) == pytest.approx([expected] * 3, rel=1e-9)


def test_a_model_timed_under_another_efficiency_equals_one_built_with_it() -> None:
    """`dataclasses.replace(steps, efficiency=...)` (how a calibration fit re-times a deployment) folds
    the new efficiency in, as building the model with it does."""
    rebuilt, replaced = step_model(MIXTRAL_8X7B, tp=2, efficiency=RISING_CURVE), replace(
        step_model(MIXTRAL_8X7B, tp=2), efficiency=RISING_CURVE)
    shapes = ((4, 4000, 0, 0), (1, 0, 2048, 2048 * 2049 // 2), (np.arange(1.0, 9.0), 8000, 0, 0))
    for shape in shapes:
        assert replaced.step_time_s(*shape) == pytest.approx(rebuilt.step_time_s(*shape), rel=1e-15)
    assert replaced.step_time_s(4, 4000, 0, 0) != step_model(MIXTRAL_8X7B, tp=2).step_time_s(4, 4000, 0, 0)


def test_long_runs_and_grids_of_steps_equal_scalar_calls() -> None:
    """5,000 decode steps of a growing batch in one call (evaluated in blocks), and a 2-D grid of
    batch sizes x contexts, step by step as single calls."""
    steps = step_model(GEMMA_2_9B, tp=2, pp=2)
    batch = np.arange(5000) % 300 + 1.0
    context = batch * (np.arange(5000) * 3.0)
    times = steps.step_time_s(batch, context, 0, 0)
    for i in (0, 1, 2047, 2048, 2049, 4095, 4096, 4999):
        assert times[i] == pytest.approx(steps.step_time_s(float(batch[i]), float(context[i]), 0, 0), rel=1e-12)
    grid = steps.step_time_s(np.array([[1.0], [64.0]]), np.array([[100.0, 10_000.0, 100_000.0]]), 0, 0)
    assert grid.shape == (2, 3)
    assert grid[1, 2] == pytest.approx(steps.step_time_s(64, 100_000, 0, 0), rel=1e-12)


# Kernel shapes: routed experts at their own rows, MLA absorbed decode, expert-parallel load -------

# A curve proportional to the rows below 1,024 (0.5 x M / 1,024), no overheads, full bandwidth: what the
# routed experts' GEMMs achieve is read straight off their rows.
PROPORTIONAL_CURVE = Efficiency(
    bandwidth_fraction=1.0, compute_curve=((1024, 0.5),), attention_fraction=0.5, per_step_overhead_s=0.0,
    per_layer_overhead_s=0.0, allreduce_latency_s=0.0, source="test profile: fraction 0.5 x M / 1024 below 1024 rows",
)


@pytest.mark.parametrize(("batch", "rows", "seconds"), [
    # T = 1: 1 row per touched expert (= T), 22,548,578,304 / 989.5e12 = 2.27878507e-5 s at peak, at
    # fraction 0.5 / 1,024 x 2,048 = 0.04666952 s.
    (1, 1.0, 0.0466695183),
    # T = 64: 16.0000002 rows per touched expert (test_flops), fraction 0.5 x 16 / 1,024 = 1/128 (not the
    # step's 64 rows' 1/32): 64 x 22,548,578,304 = 1,443,109,011,456 FLOPs / 989.5e12 = 1.45842245e-3 s,
    # x 128 = 0.186678074 s (x 32 = 0.0467 s with the step's rows).
    (64, 16.0000002, 0.186678074),
])
def test_routed_experts_run_at_the_rows_each_expert_multiplies(batch: int, rows: float, seconds: float) -> None:
    """Mixtral-8x7B bf16 decode on one H100 (989.5e12 FLOP/s bf16), no cached context. Routed FLOPs per
    token: 2 experts x 2 x 3 x 4096 x 14336 (176,160,768) x 32 layers = 22,548,578,304. Compute-bound at
    these fractions: the experts' weights are at most 8 x 176,160,768 x 2 B x 32 = 90.2 GB, 26.9 ms at
    3.35e12 B/s. The step-time model times the same step as the roofline."""
    cost = decode_cost(MIXTRAL_8X7B, 0, batch)
    assert cost.rows_per_expert == pytest.approx(rows, rel=1e-8)
    result = roofline(cost, H100_SXM, "bf16", PROPORTIONAL_CURVE)
    moe = next(op for op in result.operators if op.name == "moe")
    assert moe.expected_time_s == pytest.approx(seconds, rel=1e-7)
    steps = step_model(MIXTRAL_8X7B, efficiency=PROPORTIONAL_CURVE)
    assert steps.step_time_s(batch, 0, 0, 0) == pytest.approx(result.expected_time_s, rel=1e-9)


@pytest.mark.parametrize(("tp", "dp", "ep"), [(1, 8, 8), (2, 4, 8), (1, 4, 2), (8, 1, 1)])
def test_moe_mla_paths_agree_under_expert_parallelism(tp: int, dp: int, ep: int) -> None:
    """DeepSeek-V3 (MoE + MLA: routed experts at their rows, absorbed decode attention, the most loaded EP
    rank's load) fp8 on H200: one decode step (the decode-form path), a run of them over an array of
    contexts, the general array path, a scalar step forced through the general path (`prefill_seqs`), and
    `decode_run`'s closed form all time what `roofline(decode_cost(...))` times; mixed steps (also beyond
    the tabulated 16,384 rows) what the roofline of the cost model times operator by operator."""
    steps = step_model(DEEPSEEK_V3, H200, tp, weight_dtype="fp8", efficiency=RISING_CURVE, dp=dp, ep=ep)
    contexts = [0, 999, 2048, 30_000]
    for batch in (1, 7, 64, 300):
        rooflines = [roofline(decode_cost(DEEPSEEK_V3, context, batch, "fp8", "bf16", tensor_parallel=tp,
                                          data_parallel=dp, expert_parallel=ep), H200, "fp8", RISING_CURVE)
                     for context in contexts]
        expected = [result.expected_time_s for result in rooflines]
        totals = np.array([batch * context for context in contexts], dtype=float)
        assert [steps.step_time_s(batch, total, 0, 0) for total in totals] == pytest.approx(expected, rel=1e-9)
        assert steps.step_time_s(batch, totals, 0, 0) == pytest.approx(expected, rel=1e-9)
        assert steps.step_time_s(np.full(4, float(batch)), totals, 0, 0) == pytest.approx(expected, rel=1e-9)
        assert [steps.step_time_s(batch, total, 0, 0, prefill_seqs=0) for total in totals] == pytest.approx(
            expected, rel=1e-9)
        assert [steps.ideal_step_time_s(batch, total, 0, 0) for total in totals] == pytest.approx(
            [result.ideal_time_s for result in rooflines], rel=1e-9)
        ran = steps.decode_run(batch, batch * 999, 2, math.inf)
        one_more = roofline(decode_cost(DEEPSEEK_V3, 1000, batch, "fp8", "bf16", tensor_parallel=tp,
                                        data_parallel=dp, expert_parallel=ep), H200, "fp8", RISING_CURVE)
        if ran is not None:
            assert ran[1] == pytest.approx(expected[1] + one_more.expected_time_s, rel=1e-9)
    for seqs, context, chunk, cached in ((5, 700, 900, 0), (64, 2048, 20_000, 100), (0, 0, 3, 5)):
        decode_attended = [seqs * attended_positions(context, 1, None)]
        attended = [attended_positions(cached, chunk, None)]
        kv_read = [seqs * kv_tokens_read(context, 1, None) + kv_tokens_read(cached, chunk, None)]
        time, ideal = per_operator_times(DEEPSEEK_V3, H200, tp, 1, "fp8", RISING_CURVE, seqs + chunk, seqs + 1,
                                         attended, kv_read, decode_attended, dp, ep)
        args = (seqs, seqs * context, chunk, attended[0])
        assert steps.step_time_s(*args) == pytest.approx(time, rel=1e-9)
        assert steps.step_time_s(*(np.full(2, float(value)) for value in args)) == pytest.approx([time] * 2, rel=1e-9)
        assert steps.ideal_step_time_s(*args) == pytest.approx(ideal, rel=1e-9)
