"""The SLO planner: fleet arithmetic, analytic bounds, speculative decoding, the fast step times, and
the search itself. Expected values are derived by hand in each test's docstring."""

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from app.sizing.engines.launch import LaunchSpec, launch_command
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.model.weights import weight_bytes_per_gpu
from app.sizing.serving.plan import (
    MAX_CONFIGURATIONS,
    Configuration,
    DraftModel,
    HaPolicy,
    Infeasible,
    PlanInputs,
    SearchSpaceTooLarge,
    Slo,
    _Planner,
    _Run,
    configurations,
    cost_per_million_tokens,
    cross_node_expert_layouts,
    cross_node_pipelines,
    default_tensor_parallel,
    nodes_needed,
    pareto_frontier,
    plan,
    replicas_needed,
    search_space_size,
)
from app.sizing.serving.simulate import SchedulerConfig
from app.sizing.serving.speculative import SpeculativeDecoding, SpeculativeStepTime, tokens_per_pass
from app.sizing.serving.workload import Fixed, LogNormal, Workload
from app.sizing.specs import COMPUTE_DTYPES, GpuSpec
from tests.domain.models_for_tests import (
    DEEPSEEK_V3,
    FALCON_7B,
    GEMMA_2_9B,
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    QWEN2_5_0_5B,
)
from tests.domain.test_roofline import H100_SXM

# H100 SXM as the reference catalog has it (driver-reported memory, dense peaks, NVLink per direction).
H100 = GpuSpec(name="NVIDIA H100 SXM5 80GB", slug="h100-sxm", memory_bytes=85_520_809_984,
               memory_bandwidth_bytes_per_s=3.35e12, interconnect_bandwidth_bytes_per_s=450e9,
               bf16_flops_per_s=989.5e12, fp16_flops_per_s=989.5e12, fp8_flops_per_s=1979e12,
               price_per_hour_usd=3.64)


def efficiencies_for(*gpus, efficiency=DEFAULT_EFFICIENCY):
    return {(gpu.slug, dtype): efficiency for gpu in gpus for dtype in COMPUTE_DTYPES}


def inputs_for(model, workload, slo, *gpus, efficiency=DEFAULT_EFFICIENCY, **options):
    return PlanInputs(model=model, workload=workload, slo=slo,
                      efficiencies=efficiencies_for(*gpus, efficiency=efficiency), **options)


# Fleet arithmetic ----------------------------------------------------------------------------------

def test_replicas_follow_the_issue_formula():
    """5 req/s x peak-to-mean 1.2 = 6 req/s; each replica may carry 2.3 x 0.8 = 1.84 req/s;
    6 / 1.84 = 3.26 -> 4 replicas, + 1 spare (N+1) = 5."""
    assert replicas_needed(5, 2.3, HaPolicy(extra_replicas=1, max_utilization_ratio=0.8), peak_to_mean_ratio=1.2) == 5


def test_an_exact_multiple_does_not_round_up():
    """6 req/s over replicas of 2 req/s is 3 replicas, although 6 / 2 computed in floating point with
    a 1.0 utilization could land a hair above 3."""
    assert replicas_needed(6, 2, HaPolicy()) == 3
    assert replicas_needed(0.3, 0.1, HaPolicy()) == 3  # 0.3 / 0.1 = 2.9999999999999996 in binary
    assert replicas_needed(0.1, 5, HaPolicy()) == 1  # a light load still needs one replica


def test_a_load_cap_is_between_one_percent_and_one():
    """0.01 sizes for 100 times the load (6 req/s over replicas of 2 x 0.01 = 0.02 req/s: 300); below it, or
    above 1, is refused."""
    assert replicas_needed(6, 2, HaPolicy(max_utilization_ratio=0.01)) == 300
    for ratio in (0.0099, 0.0, 1.01):
        with pytest.raises(ValueError, match="max_utilization_ratio"):
            HaPolicy(max_utilization_ratio=ratio)


def test_nodes_keep_tensor_parallelism_inside_a_node():
    """8-GPU nodes. TP2: 8 // 2 = 4 replicas per node, so 5 replicas need ceil(5/4) = 2 nodes.
    TP8 x PP2: one stage per node (8 // 8), so each replica spans ceil(2/1) = 2 nodes: 3 replicas, 6.
    TP4 x PP4: two stages per node, ceil(4/2) = 2 nodes per replica."""
    assert nodes_needed(5, 2, 1, 8) == 2
    assert nodes_needed(3, 8, 2, 8) == 6
    assert nodes_needed(1, 4, 4, 8) == 2
    with pytest.raises(ValueError):
        nodes_needed(1, 16, 1, 8)


def test_cost_per_million_output_tokens():
    """4 GPUs at $3.64 = $14.56 per hour; 5 req/s x 500 output tokens = 2,500 tokens/s = 9.0e6 tokens
    per hour; 14.56 / 9.0e6 x 1e6 = $1.6178 per million tokens."""
    assert cost_per_million_tokens(14.56, 2500) == pytest.approx(1.617778, rel=1e-6)


def test_pareto_keeps_only_points_no_other_beats_on_cost_and_latency():
    """(cost, latency): (4, 9) is beaten by (3, 8); (5, 8) ties (3, 8) on latency at a higher cost;
    the frontier is (1, 10), (3, 8), (6, 2), in cost order: indices 2, 0, 4."""
    points = [(3, 8), (4, 9), (1, 10), (5, 8), (6, 2)]
    assert pareto_frontier(points) == (2, 0, 4)


# Configuration space -------------------------------------------------------------------------------

def test_default_tensor_parallel_divides_the_heads_within_a_node():
    """Llama-3-70B has 64 heads: 1, 2, 4, 8 on an 8-GPU node; Falcon-7B's 71 heads (a prime): only 1."""
    assert default_tensor_parallel(LLAMA_3_70B, H100) == (1, 2, 4, 8)
    assert default_tensor_parallel(FALCON_7B, H100) == (1,)
    nvl72 = dataclasses.replace(H100, gpus_per_node=72)
    assert default_tensor_parallel(LLAMA_3_70B, nvl72) == (1, 2, 4, 8, 16, 32, 64)


def test_the_search_space_is_counted_before_it_is_listed():
    """2 GPUs x 4 default TP degrees x 1 PP x 2 weight dtypes x 2 KV dtypes x 3 x 2 knob values = 192."""
    gpus = [H100, dataclasses.replace(H100, slug="other")]
    size = search_space_size(LLAMA_3_70B, gpus, None, [1], ["bf16", "fp8"], ["bf16", "fp8"], [64, 128, 256],
                             [4096, 8192])
    assert size == 192
    assert len(configurations(LLAMA_3_70B, gpus, None, [1], ["bf16", "fp8"], ["bf16", "fp8"], [64, 128, 256],
                              [4096, 8192])) == 192


def test_a_search_space_above_the_limit_is_refused():
    """8 TP degrees x 4 PP x 6 weight dtypes x 4 KV dtypes x 1 GPU = 768 > 512."""
    with pytest.raises(SearchSpaceTooLarge, match=str(MAX_CONFIGURATIONS)):
        configurations(LLAMA_3_70B, [H100], [1, 2, 4, 8, 16, 32, 64, 1], [1, 2, 4, 8],
                       ["bf16", "fp16", "fp8", "int8", "int4", "fp4"], ["bf16", "fp16", "fp8", "int8"])


# Speculative decoding ------------------------------------------------------------------------------

def test_tokens_per_pass_is_the_geometric_sum():
    """E = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a). a = 0.8, k = 4: (1 - 0.32768) / 0.2 = 3.3616.
    a = 0.5, k = 1: 1.5. a = 0: only the target's own token, 1. a = 1: every draft kept, k + 1."""
    assert tokens_per_pass(0.8, 4) == pytest.approx(3.3616)
    assert tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert tokens_per_pass(0.0, 5) == 1.0
    assert tokens_per_pass(1.0, 3) == 4.0
    with pytest.raises(ValueError):
        tokens_per_pass(1.2, 3)


class LinearSteps:
    """A model whose step costs `fixed` + `per_token` x every token it processes, and that records the
    calls (the verification pass's prefill_seqs included)."""

    def __init__(self, fixed, per_token):
        self.fixed, self.per_token, self.calls = fixed, per_token, []

    def step_time_s(self, decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
                    prefill_seqs=None):
        self.calls.append((decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens, prefill_seqs))
        tokens = np.asarray(decode_seqs, dtype=float) + np.asarray(prefill_tokens, dtype=float)
        return np.where(tokens > 0, self.fixed + self.per_token * tokens, 0.0)


def test_a_speculative_step_amortizes_one_pass_over_the_expected_tokens():
    """k = 4, a = 0.8: E = 3.3616. Batch 8 at contexts summing to 8,000:
    target pass over 8 x 5 = 40 tokens: 10 ms + 0.1 ms x 40 = 14 ms; 4 draft steps of 8 tokens:
    4 x (1 ms + 0.01 ms x 8) = 4.32 ms; per token: (14 + 4.32) / 3.3616 = 5.4498 ms.
    The verification attends (k+1)·C + B·(k+1)(k+2)/2 = 5 x 8,000 + 8 x 15 = 40,120 positions."""
    target, draft = LinearSteps(10e-3, 0.1e-3), LinearSteps(1e-3, 0.01e-3)
    step = SpeculativeStepTime(target, SpeculativeDecoding(4, 0.8), draft)
    assert step(8, 8000, 0, 0) == pytest.approx(18.32e-3 / 3.3616)
    verification = target.calls[0]
    assert (float(verification[2]), float(verification[3]), float(verification[4])) == (40.0, 40120.0, 8.0)


def test_prompt_tokens_in_a_speculative_step_are_charged_in_full():
    """The same step with a 100-token prompt chunk: the target pass grows by 100 x 0.1 ms = 10 ms and the
    draft's first step by 100 x 0.01 ms = 1 ms, both paid in full: 5.4498 + 11 = 16.4498 ms.
    A prefill-only step (no decodes) is the target's and the draft's prefill: 10 + 10 + 1 + 1 = 22 ms."""
    step = SpeculativeStepTime(LinearSteps(10e-3, 0.1e-3), SpeculativeDecoding(4, 0.8),
                               LinearSteps(1e-3, 0.01e-3))
    assert step(8, 8000, 100, 5050) == pytest.approx(18.32e-3 / 3.3616 + 11e-3)
    assert step(0, 0, 100, 5050) == pytest.approx(22e-3)


def test_n_gram_drafting_costs_nothing_but_the_verification():
    """No draft model, k = 3, a = 0.5: E = (1 - 0.0625) / 0.5 = 1.875; batch 1: one target pass over
    4 tokens, 10 + 0.4 = 10.4 ms, per token 10.4 / 1.875 = 5.5467 ms."""
    step = SpeculativeStepTime(LinearSteps(10e-3, 0.1e-3), SpeculativeDecoding(3, 0.5, has_draft_model=False), None)
    assert step(1, 1000, 0, 0) == pytest.approx(10.4e-3 / 1.875)


# Analytic bounds ------------------------------------------------------------------------------------

# A hypothetical accelerator with H100 bandwidth and practically unlimited FLOPs: every operator of a
# batch-1 decode step is memory-bound, so its time is bytes / (bandwidth x achieved fraction).
BANDWIDTH_ONLY = GpuSpec(name="bandwidth-only", slug="bandwidth-only", memory_bytes=400_000_000_000,
                         memory_bandwidth_bytes_per_s=3.35e12, interconnect_bandwidth_bytes_per_s=450e9,
                         bf16_flops_per_s=1e21, price_per_hour_usd=1.0)
HALF_BANDWIDTH = dataclasses.replace(DEFAULT_EFFICIENCY, bandwidth_fraction=0.5, per_step_overhead_s=1e-3,
                                     per_layer_overhead_s=0.0)


def test_tpot_floor_of_llama_3_70b_at_batch_1_by_hand():
    """One decode step of Llama-3-70B (bf16, TP1) attending a 1,000-token prompt reads, in bytes:
    - per layer: Q, K, V, O = 8192·8192 + 2·8192·1024 + 8192·8192 = 150,994,944 weights and the SwiGLU
      MLP 3·8192·28672 = 704,643,072, x 2 bytes = 1,711,276,032; + two norms 2·8192·2 = 32,768;
      x 80 layers = 136,904,704,000;
    - final norm 8192·2 = 16,384; LM head 128,256·8192·2 = 2,101,346,304; one embedding row 16,384;
    - KV: 327,680 B per token (2 · 8 heads · 128 · 2 B · 80 layers), reading 1,000 cached + 1 new
      and writing 1: 327,680 · 1,002 = 328,335,360;
    total 139,334,418,432 B (activations add ~8 MB, 5 us, below the rounding).
    At 3.35e12 B/s x 0.5 achieved: 83.185 ms. The 1 ms per-step overhead is host work that vLLM (V1) does while
    the GPU runs the step, so the step lasts max(83.185, 1) = 83.2 ms > 50 ms."""
    slo = Slo(ttft_s=10.0, tpot_s=0.050)
    inputs = inputs_for(LLAMA_3_70B, Workload(Fixed(1000), Fixed(500), requests_per_s=1.0), slo, BANDWIDTH_ONLY,
                        efficiency=HALF_BANDWIDTH)
    result = plan(inputs, [Configuration(BANDWIDTH_ONLY, 1, 1, "bf16", "bf16")])
    assert not result.feasible
    assert result.infeasible[0].reasons == (
        "TPOT floor 83.2 ms at batch 1 exceeds 50 ms (one decode step attending the median prompt of 1,000 tokens)",)
    assert result.stats.simulations == 0


# The opposite: unlimited bandwidth, 1 PFLOP/s, every matmul at 100 % of peak (a one-point curve).
COMPUTE_ONLY = GpuSpec(name="compute-only", slug="compute-only", memory_bytes=400_000_000_000,
                       memory_bandwidth_bytes_per_s=1e18, interconnect_bandwidth_bytes_per_s=450e9,
                       bf16_flops_per_s=1e15, price_per_hour_usd=1.0)
FULL_PEAK = dataclasses.replace(DEFAULT_EFFICIENCY, compute_curve=((1, 1.0),), attention_fraction=1.0,
                                per_step_overhead_s=1e-3, per_layer_overhead_s=0.0)


def test_ttft_floor_of_llama_3_70b_by_hand():
    """Prefill of a 1,000-token prompt (one chunk: vLLM's 8,192-token budget) in FLOPs:
    - linear layers 2 x 855,638,016 weights per layer (attention 150,994,944 + MLP 704,643,072) x 80
      layers x 1,000 tokens = 1.369021e14;
    - causal attention 2·64 heads·(128 + 128) = 32,768 FLOPs per attended position per layer, x 80
      layers x 1,000·1,001/2 = 500,500 positions = 1.312031e12;
    - LM head for the last position only: 2 x 128,256 x 8192 = 2.101346e9;
    total 1.382162e14 FLOPs at 1e15 FLOP/s = 138.2 ms; the 1 ms per-step overhead runs on the host meanwhile
    (vLLM V1 overlaps it): max(138.2, 1) = 138 ms > 100 ms."""
    slo = Slo(ttft_s=0.100, tpot_s=1.0)
    inputs = inputs_for(LLAMA_3_70B, Workload(Fixed(1000), Fixed(500), requests_per_s=1.0), slo, COMPUTE_ONLY,
                        efficiency=FULL_PEAK)
    result = plan(inputs, [Configuration(COMPUTE_ONLY, 1, 1, "bf16", "bf16")])
    assert result.infeasible[0].reasons == (
        "TTFT floor 138 ms exceeds 100 ms (the p95 prompt of 1,000 tokens prefilled alone)",)


def test_weights_that_do_not_fit_are_a_reason_not_an_error():
    """Llama-3-70B in bf16 is 141.1 GB of weights: one 85.5 GB H100 cannot hold them."""
    inputs = inputs_for(LLAMA_3_70B, Workload(Fixed(1000), Fixed(500), requests_per_s=1.0), Slo(1.0, 0.05), H100)
    result = plan(inputs, [Configuration(H100, 1, 1, "bf16", "bf16")])
    (reason,) = result.infeasible[0].reasons
    assert reason.startswith("weights need 141.1 GB per GPU (bf16, TP1 x PP1)")


def test_more_running_sequences_than_step_tokens_only_where_the_decodes_share_the_steps():
    """512 sequences with 256 tokens per step: vLLM mixes the decodes into the steps that carry prompt chunks,
    so it could not decode every running sequence in one step (and refuses to start); SGLang decodes in steps
    of their own, which the prompt chunk does not bound."""
    workload = Workload(Fixed(1000), Fixed(200), requests_per_s=1.0)
    setting = Configuration(H100, 1, 1, "bf16", "bf16", max_num_seqs=512, max_num_batched_tokens=256)
    vllm = plan(inputs_for(LLAMA_3_8B, workload, Slo(2.0, 0.05), H100, simulated_requests=100), [setting])
    refusal = ("max_num_seqs 512 exceeds max_num_batched_tokens 256: a step could not decode every running sequence "
               "(vLLM refuses this too)")
    assert vllm.infeasible[0].reasons == (refusal,)
    sglang = plan(inputs_for(LLAMA_3_8B, workload, Slo(2.0, 0.05), H100, simulated_requests=100, engine="sglang"),
                  [setting])
    assert sglang.plans and not sglang.infeasible


def test_tensor_parallelism_beyond_a_node_is_infeasible():
    inputs = inputs_for(LLAMA_3_70B, Workload(Fixed(1000), Fixed(500), requests_per_s=1.0), Slo(1.0, 0.05), H100)
    result = plan(inputs, [Configuration(H100, 16, 1, "bf16", "bf16")])
    assert "stays inside one node" in result.infeasible[0].reasons[0]


# The search -----------------------------------------------------------------------------------------

EIGHT_B_WORKLOAD = Workload(Fixed(1000), Fixed(200), requests_per_s=20.0)
EIGHT_B_SLO = Slo(ttft_s=1.0, tpot_s=0.030)


def eight_b_plan(**options):
    inputs = inputs_for(LLAMA_3_8B, options.pop("workload", EIGHT_B_WORKLOAD), options.pop("slo", EIGHT_B_SLO),
                        H100, simulated_requests=500, **options)
    return plan(inputs, configurations(LLAMA_3_8B, [H100], [1, 2], [1], ["bf16"], ["bf16"]))


def test_every_plan_meets_its_own_predicted_slo_and_the_fleet_arithmetic_holds():
    """For each plan: replicas = ceil(20 req/s / max verified load) (no burst, spares or cap); GPUs =
    replicas x TP; cost = GPUs x $3.64; output tokens/s = 20 x 200 = 4,000."""
    result = eight_b_plan()
    assert result.feasible
    for found in result.plans:
        assert found.meets_slo
        assert found.predicted.ttft.at_slo_percentile_s <= EIGHT_B_SLO.ttft_s
        assert found.predicted.tpot.at_slo_percentile_s <= EIGHT_B_SLO.tpot_s
        assert found.replicas == math.ceil(20.0 / found.max_load_per_replica - 1e-9)
        assert found.gpus == found.replicas * found.configuration.tensor_parallel
        assert found.cost_per_hour_usd == pytest.approx(found.gpus * 3.64)
        assert found.output_tokens_per_s == pytest.approx(4000.0)
        assert found.offered_load_per_replica == pytest.approx(20.0 / found.replicas)
    costs = [found.cost_per_hour_usd for found in result.plans]
    assert costs == sorted(costs)


def test_the_same_inputs_give_the_same_plans():
    assert eight_b_plan() == eight_b_plan()


def test_a_spare_replica_and_a_utilization_cap_add_capacity():
    """With N+1 and a 0.8 cap, R = ceil(20 / (0.8 x max)) + 1, and each replica is offered 20 / R."""
    result = eight_b_plan(policy=HaPolicy(extra_replicas=1, max_utilization_ratio=0.8))
    for found in result.plans:
        assert found.replicas == math.ceil(20.0 / 0.8 / found.max_load_per_replica - 1e-9) + 1
        assert found.offered_load_per_replica == pytest.approx(20.0 / found.replicas)
        assert found.utilization_ratio <= 0.8 * (found.replicas - 1) / found.replicas + 1e-9


def test_an_impossible_tpot_is_infeasible_with_reasons():
    """2 ms per token: the 8B model's batch-1 decode reads ~16 GB, ~7 ms on an H100."""
    result = eight_b_plan(slo=Slo(ttft_s=1.0, tpot_s=0.002))
    assert not result.feasible and result.plans == ()
    assert all(item.reasons[0].startswith("TPOT floor") for item in result.infeasible)


def test_closed_loop_plans_count_users():
    """64 users; each replica takes at most its max verified users; replicas = ceil(64 / max users)."""
    workload = Workload(Fixed(1000), Fixed(200), concurrent_users=64)
    result = eight_b_plan(workload=workload)
    assert result.feasible
    for found in result.plans:
        assert found.max_load_per_replica == int(found.max_load_per_replica)
        assert found.replicas == math.ceil(64 / found.max_load_per_replica - 1e-9)
        assert found.offered_load_per_replica == math.ceil(64 / found.replicas)


def test_speculative_decoding_reports_its_tokens_per_pass():
    """n-gram drafting, k = 3, a = 0.6: E = (1 - 0.6^4) / 0.4 = (1 - 0.1296) / 0.4 = 2.176."""
    result = eight_b_plan(speculative=SpeculativeDecoding(3, 0.6, has_draft_model=False))
    assert result.feasible
    assert result.plans[0].tokens_per_pass == pytest.approx(2.176)


def test_an_sglang_plan_keeps_the_memory_sglang_sets_aside_for_its_draft_model():
    """SGLang 0.5.10 (the default) sets 6 GiB more aside for a standalone draft model and nothing more for
    n-gram drafting (ENGINES.md 1.2), and runs no piecewise CUDA graphs with either, so reserves nothing for them
    (`_handle_piecewise_cuda_graph`). H100, 81,559 MiB, chunks of 8,192, cuda_graph_max_bs 256 (tp < 4):
    TP1 reserves 512 + 12,288 + 512 + 128 = 13,440 MiB; with the draft model 19,584: (81,559 − 19,584) / 81,559
    = 0.75988 -> 0.760; n-gram 68,119 / 81,559 = 0.83521 -> 0.835.
    TP2: 512 + 12,288 + 512 + 256 = 13,568; with the draft 19,712: 61,847 / 81,559 = 0.75831 -> 0.758;
    n-gram 67,991 / 81,559 = 0.83364 -> 0.834."""
    drafted = eight_b_plan(engine="sglang", speculative=SpeculativeDecoding(3, 0.6),
                           draft=DraftModel(QWEN2_5_0_5B, "bf16"))
    ngram = eight_b_plan(engine="sglang", speculative=SpeculativeDecoding(3, 0.6, has_draft_model=False))
    assert drafted.plans and ngram.plans
    for found in drafted.plans:
        assert found.engine.gpu_memory_utilization == {1: 0.760, 2: 0.758}[found.configuration.tensor_parallel]
    for found in ngram.plans:
        assert found.engine.gpu_memory_utilization == {1: 0.835, 2: 0.834}[found.configuration.tensor_parallel]


def test_a_request_longer_than_the_model_is_refused():
    """Gemma-2-9B has 8,192 positions: 8,000 prompt + 500 answer tokens cannot be served."""
    with pytest.raises(ValueError, match="8,192 positions"):
        inputs_for(GEMMA_2_9B, Workload(Fixed(8000), Fixed(500), requests_per_s=1.0), EIGHT_B_SLO, H100)


def test_lognormal_lengths_are_planned():
    workload = Workload(LogNormal(mean=1000, p50=800, max_tokens=6000), Fixed(200), requests_per_s=10.0)
    result = eight_b_plan(workload=workload)
    assert result.feasible
    assert result.max_model_len == 6200


# Launch commands -----------------------------------------------------------------------------------

def launch(**changes):
    spec = LaunchSpec(engine="vllm", model_id="meta-llama/Meta-Llama-3.1-70B", model_dtype="bf16",
                      tensor_parallel=4, pipeline_parallel=1, weight_dtype="bf16", kv_dtype="bf16",
                      max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=1500,
                      gpu_memory_utilization=0.92)
    return launch_command(dataclasses.replace(spec, **changes))


def test_vllm_flags_realize_the_plan():
    command = launch(weight_dtype="fp8", kv_dtype="fp8").command
    assert command == ("vllm serve meta-llama/Meta-Llama-3.1-70B --tensor-parallel-size 4 --max-num-seqs 256 "
                       "--max-num-batched-tokens 8192 --max-model-len 1500 --gpu-memory-utilization 0.92 "
                       "--kv-cache-dtype fp8 --quantization fp8")


def test_vllm_speculative_config_names_the_draft():
    command = launch(draft_tokens=4, draft_model_id="meta-llama/Llama-3.2-1B").command
    config = json.loads(command.split("--speculative-config ")[1].strip("'"))
    assert config == {"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 4}


def test_pre_quantized_precisions_are_a_note_not_a_flag():
    result = launch(weight_dtype="int4")
    assert "--quantization" not in result.command
    assert any("AWQ or GPTQ" in note for note in result.notes)


def test_other_engines_use_their_own_flags():
    assert launch(engine="sglang").command.startswith("python -m sglang.launch_server --model-path ")
    assert "--max_batch_size 256" in launch(engine="trtllm").command
    assert launch(engine="generic").command is None


def test_layouts_in_each_engines_own_flags():
    """DP8 + EP8 (tp 1) for DeepSeek-V3: vLLM `--tensor-parallel-size 1 --data-parallel-size 8
    --enable-expert-parallel`; SGLang's TP group spans the DP ranks, `--tp-size 8 --dp-size 8
    --enable-dp-attention --ep-size 8`; TensorRT-LLM `--tp_size 8 --ep_size 8` with attention DP as an LLM-API
    option (a note)."""
    dep8 = {"model_id": "deepseek-ai/DeepSeek-V3", "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8}
    assert "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel " in launch(**dep8).command
    assert ("--tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8 "
            in launch(engine="sglang", **dep8).command)
    trtllm = launch(engine="trtllm", **dep8)
    assert "--tp_size 8 --pp_size 1 --ep_size 8 " in trtllm.command
    assert any("enable_attention_dp: true" in note for note in trtllm.notes)
    assert "--data-parallel-size" not in launch().command  # plain TP4 is unchanged


def test_trtllm_launch_turns_on_the_chunked_prefill_the_plan_simulates():
    """The simulator splits a prompt over steps when it does not fit max_num_tokens beside the running decodes
    (SchedulerConfig.chunked_prefill, on by default); TensorRT-LLM's LLM-API default is
    enable_chunked_prefill: false (ENGINES.md 1.3), and trtllm-serve has no flag for it, so the command passes
    an options file and the notes say what it holds."""
    plain = launch(engine="trtllm")
    assert SchedulerConfig(kv_capacity_tokens=1024, max_num_seqs=1, max_num_batched_tokens=1024).chunked_prefill
    assert plain.command.endswith(" --extra_llm_api_options extra_llm_api_options.yaml")
    assert any("enable_chunked_prefill: true" in note for note in plain.notes)
    assert not any("enable_attention_dp" in note for note in plain.notes)  # no attention DP asked for


def test_trtllm_launch_admits_the_prompts_the_plan_sends():
    """TensorRT-LLM's LLM-API max_input_len defaults to 1,024 tokens (ENGINES.md 1.3); a plan whose context reaches
    1,500 tokens (its prompts up to 1,499) sets it to the context in the options file, one of 1,000 leaves it."""
    long = launch(engine="trtllm")
    assert any("max_input_len: 1500" in note for note in long.notes)
    assert not any("max_input_len:" in note for note in launch(engine="trtllm", max_model_len=1000).notes)


def test_every_engine_launches_the_kv_cache_the_plan_sized():
    """A plan's KV dtype must be the one the command runs (a review found int8 and fp8 plans launched 16-bit):
    - vLLM and SGLang cache one-byte values as fp8: an int8 plan (sized at one byte a value) sets the fp8 flag and
      says so; `auto` would cache the model's bf16, half the tokens (ENGINES.md 1.1, 1.2).
    - TensorRT-LLM's kv_cache_config dtype `auto` keeps the checkpoint's KV dtype, `fp8` overrides it (ENGINES.md
      1.3): an fp8 plan on bf16 weights sets it in the options file; fp8 weights with a bf16 KV cache need a
      checkpoint that declares no FP8 KV cache; int8 comes only from a checkpoint.
    - fp32 KV follows a model served in fp32 only: a bf16 model's plan says its engines cache 16-bit."""
    for engine, flag in (("vllm", "--kv-cache-dtype fp8"), ("sglang", "--kv-cache-dtype fp8_e4m3")):
        one_byte = launch(engine=engine, kv_dtype="int8")
        assert flag in one_byte.command
        assert any(note.startswith("int8 KV cache: launched as fp8, the same size") for note in one_byte.notes)
        assert "--kv-cache-dtype" not in launch(engine=engine).command
    fp8_kv = launch(engine="trtllm", kv_dtype="fp8")
    assert any("kv_cache_config: {dtype: fp8}" in note for note in fp8_kv.notes)
    assert not any("ModelOpt" in note for note in fp8_kv.notes)  # bf16 weights: no quantized checkpoint asked for
    fp8_weights = launch(engine="trtllm", weight_dtype="fp8")
    assert any("fp8 weights from a checkpoint quantized with NVIDIA ModelOpt" in note for note in fp8_weights.notes)
    assert any("exported without an FP8 KV cache" in note for note in fp8_weights.notes)
    assert not any("kv_cache_config: {dtype: fp8}" in note for note in fp8_weights.notes)
    both = launch(engine="trtllm", weight_dtype="fp8", kv_dtype="fp8")
    assert not any("exported without an FP8 KV cache" in note for note in both.notes)
    assert any("int8 KV cache: TensorRT-LLM takes it from a checkpoint" in note
               for note in launch(engine="trtllm", kv_dtype="int8").notes)
    assert any(note.startswith("fp32 KV cache: the engines cache in the dtype the model is served in")
               for note in launch(kv_dtype="fp32").notes)


def test_trtllm_disaggregated_workers_keep_one_options_file():
    """A worker's role is LLM-API options too: the context servers of TensorRT-LLM's disaggregation recipe add
    cache_transceiver_config and disable_overlap_scheduler: true, the generation servers only the transceiver
    (ENGINES.md section 3). Both go in the one file the command already passes."""
    spec = LaunchSpec(engine="trtllm", model_id="deepseek-ai/DeepSeek-V3", model_dtype="fp8", tensor_parallel=1,
                      pipeline_parallel=1, weight_dtype="fp8", kv_dtype="fp8", max_num_seqs=64,
                      max_num_batched_tokens=8192, max_model_len=9216, gpu_memory_utilization=0.9,
                      data_parallel=8, expert_parallel=8)
    prefill, decode = launch_command(spec, role="prefill"), launch_command(spec, role="decode")
    for worker in (prefill, decode):
        assert worker.command.count("--extra_llm_api_options") == 1
        assert any("cache_transceiver_config: {backend: DEFAULT}" in note for note in worker.notes)
        assert any("enable_chunked_prefill: true, enable_attention_dp: true, moe_expert_parallel_size: 8" in note
                   for note in worker.notes)
    assert any("disable_overlap_scheduler: true" in note for note in prefill.notes)
    assert not any("disable_overlap_scheduler" in note for note in decode.notes)


def test_sglang_workers_switch_on_mnnvl_only_where_the_plan_moves_the_kv_over_nvlink():
    """SGLang's Mooncake transfer engine moves the KV over RDMA unless SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True and
    MC_FORCE_MNNVL=True are set (ENGINES.md section 3): a plan that moves it over NVLink (across an NVL72) starts
    each worker's command with them, one that moves it over the network does not; the other engines need none."""
    spec = LaunchSpec(engine="sglang", model_id="deepseek-ai/DeepSeek-V3", model_dtype="fp8", tensor_parallel=1,
                      pipeline_parallel=1, weight_dtype="fp8", kv_dtype="fp8", max_num_seqs=64,
                      max_num_batched_tokens=8192, max_model_len=9216, gpu_memory_utilization=0.9,
                      data_parallel=8, expert_parallel=8)
    for role in ("prefill", "decode"):
        nvlink = launch_command(spec, role=role, kv_over_nvlink=True).command
        assert nvlink.startswith("SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True MC_FORCE_MNNVL=True python -m "
                                 "sglang.launch_server ")
        assert nvlink.endswith(f" --disaggregation-mode {role}")
        assert launch_command(spec, role=role).command.startswith("python -m sglang.launch_server ")
        for engine in ("vllm", "trtllm"):
            other = launch_command(dataclasses.replace(spec, engine=engine), role=role, kv_over_nvlink=True)
            assert "MNNVL" not in other.command
    assert "MNNVL" not in launch_command(spec, kv_over_nvlink=True).command  # an aggregated replica moves no KV


def test_sglangs_prefill_chunk_flag_is_the_replicas_which_it_divides_among_the_dp_ranks():
    """Each of 8 attention ranks schedules 1,024-token chunks (the plan's max_num_batched_tokens). SGLang
    divides --chunked-prefill-size by dp_size, so the flag that gives them is 8 x 1,024 = 8,192; without DP the
    flag is the chunk itself."""
    dep8 = {"model_id": "deepseek-ai/DeepSeek-V3", "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8,
            "max_num_batched_tokens": 1024}
    assert "--chunked-prefill-size 8192 " in launch(engine="sglang", **dep8).command
    assert "--chunked-prefill-size 1024 " in launch(engine="sglang", max_num_batched_tokens=1024).command


def test_sglangs_running_requests_flag_is_the_replicas_which_it_divides_among_the_dp_ranks():
    """The plan's max_num_seqs is one scheduler's: each of 8 attention ranks runs up to 512 requests. SGLang
    0.5.10 sets each rank's limit to max_running_requests // dp_size (`_resolve_max_num_reqs`), so the flag that
    gives 512 a rank is 8 x 512 = 4,096; without DP the flag is the limit itself."""
    dep8 = {"model_id": "deepseek-ai/DeepSeek-V3", "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8,
            "max_num_seqs": 512}
    assert "--max-running-requests 4096 " in launch(engine="sglang", **dep8).command
    assert "--max-running-requests 512 " in launch(engine="sglang", max_num_seqs=512).command


def test_a_replica_larger_than_a_node_says_it_spans_nodes():
    """TP8 x PP2 is 8 x 2 = 16 GPUs on 2 nodes; DP16 at TP1, 16 GPUs on 2; one node's TP4 says nothing. A
    disaggregated worker says it of the worker."""
    spanning = launch(tensor_parallel=8, pipeline_parallel=2, nodes=2)
    assert ("one replica spans 2 nodes (16 GPUs, tensor parallelism inside each node): the command gives the whole "
            "replica's degrees; start it across those nodes with the engine's multi-node launch") in spanning.notes
    assert any(note.startswith("one replica spans 2 nodes (16 GPUs") for note in
               launch(tensor_parallel=1, data_parallel=16, expert_parallel=16, nodes=2).notes)
    assert not any("spans" in note for note in launch().notes)
    spec = LaunchSpec(engine="sglang", model_id="deepseek-ai/DeepSeek-V3", model_dtype="fp8", tensor_parallel=1,
                      pipeline_parallel=1, weight_dtype="fp8", kv_dtype="bf16", max_num_seqs=256,
                      max_num_batched_tokens=8192, max_model_len=9000, gpu_memory_utilization=0.8, data_parallel=32,
                      expert_parallel=32, nodes=4)
    assert any(note.startswith("one decode worker spans 4 nodes (32 GPUs") for note in
               launch_command(spec, role="decode").notes)


def test_the_default_search_adds_pipelines_across_nodes_only_where_one_node_cannot_hold_the_weights():
    """Llama-3.1-405B holds about 405e9 weights (its model card). An H100 reports 85,520,809,984 B; 90% of it
    (the share an engine budgets at all) is 76.97e9 B. The largest TP inside a node is 8 (128 heads, 8 KV
    heads, MLP width 53,248 all divide by 8).
    - bf16 at TP8: about 405e9 x 2 B / 8 = 101e9 B per GPU >= 76.97e9: one node cannot hold it. At PP2 half
      the layers per GPU: about 50.6e9 B < 76.97e9, so the fewest stages are 2, and twice as many, 4.
    - fp8 at TP8: about 405e9 x 1 B / 8 = 50.6e9 B < 76.97e9: one node holds it, no pipeline.
    - bf16 on an H200 (150,754,820,096 B, 90% = 135.7e9 B): 101e9 B fits, no pipeline.
    - Llama-3-70B bf16 at TP8 on H100: 70.6e9 x 2 / 8 = 17.6e9 B: no pipeline."""
    h200 = dataclasses.replace(H100_SXM, slug="h200-sxm", memory_bytes=150_754_820_096)
    assert cross_node_pipelines(LLAMA_3_1_405B, H100_SXM, "bf16", None) == ((8, 2), (8, 4))
    assert cross_node_pipelines(LLAMA_3_1_405B, H100_SXM, "fp8", None) == ()
    assert cross_node_pipelines(LLAMA_3_1_405B, h200, "bf16", None) == ()
    assert cross_node_pipelines(LLAMA_3_70B, H100_SXM, "bf16", None) == ()
    # Only the default search adds them, after the single-stage layouts; listed degrees are taken as given.
    default = configurations(LLAMA_3_1_405B, [H100_SXM], None, None, ["bf16"], ["bf16"])
    assert [(c.tensor_parallel, c.pipeline_parallel) for c in default[-2:]] == [(8, 2), (8, 4)]
    assert {c.pipeline_parallel for c in default[:-2]} == {1}
    assert len(default) == search_space_size(LLAMA_3_1_405B, [H100_SXM], None, None, ["bf16"], ["bf16"])
    assert {c.pipeline_parallel for c in configurations(LLAMA_3_1_405B, [H100_SXM], None, [1], ["bf16"],
                                                         ["bf16"])} == {1}


def test_the_default_search_adds_attention_dp_and_ep_across_nodes_for_an_moe_model_one_node_cannot_hold():
    """DeepSeek-V3 in fp8 on H100s (85,520,809,984 B each, 90% = 76,968,728,985.6 B; 8 GPUs per node).
    - At TP8 (the largest degree inside a node) its routed experts alone are 58 MoE layers x 256 experts
      x 3 x 7,168 x 2,048 / 8 = 81.74e9 B per GPU: one node cannot hold it.
    - DEP16 (two nodes; tp 1, each GPU its own attention rank and 256 / 16 = 16 experts), bytes per GPU:
      routed experts 16 x 58 x 3 x 7,168 x 2,048 = 40,869,298,176 (fp8);
      attention 61 x (7,168 x 1,536 + 1,536 x 128 x 192 + 7,168 x 576 + 512 x 128 x 256 + 128 x 128 x 7,168)
      = 61 x 187,105,280 = 11,413,422,080; dense MLP 3 x 3 x 7,168 x 18,432 = 1,189,085,184;
      shared experts 58 x 3 x 7,168 x 2,048 = 2,554,331,136; routers 58 x 256 x 7,168 x 2 B (bf16)
      = 212,860,928; embedding and LM head 2 x 129,280 x 7,168 x 2 B = 3,706,716,160; norms
      (61 x (2 x 7,168 + 1,536 + 512) + 7,168) x 2 B = 2,013,184. Total 59,947,726,848 B < 76.97e9: the
      fewest nodes are 2, and twice as many, DEP32 (4 nodes).
    - On H200s (150,754,820,096 B, 90% = 135.7e9) TP8 holds it (85.1e9 B per GPU): nothing added.
    - A dense model one node cannot hold (Llama-3.1-405B in bf16) gets pipelines only."""
    h200 = dataclasses.replace(H100_SXM, slug="h200-sxm", memory_bytes=150_754_820_096)
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 1, 1, 16, 16) == 59_947_726_848
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8) >= 0.9 * H100_SXM.memory_bytes
    assert cross_node_expert_layouts(DEEPSEEK_V3, H100_SXM, "fp8", None) == ((1, 16, 16), (1, 32, 32))
    for engine in ("vllm", "sglang", "trtllm"):
        assert cross_node_expert_layouts(DEEPSEEK_V3, H100_SXM, "fp8", None, engine) == ((1, 16, 16), (1, 32, 32))
    assert cross_node_expert_layouts(DEEPSEEK_V3, h200, "fp8", None) == ()
    assert cross_node_expert_layouts(LLAMA_3_1_405B, H100_SXM, "bf16", None) == ()
    # The default search lists them last, after the pipelines; any given degree leaves them out.
    default = configurations(DEEPSEEK_V3, [H100_SXM], None, None, ["fp8"], ["bf16"])
    assert [(c.tensor_parallel, c.pipeline_parallel, c.data_parallel, c.expert_parallel)
            for c in default[-4:]] == [(8, 2, 1, 1), (8, 4, 1, 1), (1, 1, 16, 16), (1, 1, 32, 32)]
    assert len(default) == search_space_size(DEEPSEEK_V3, [H100_SXM], None, None, ["fp8"], ["bf16"])
    for given in ({"tensor_parallel": [8]}, {"pipeline_parallel": [1]}, {"data_parallel": [8]}):
        listed = configurations(DEEPSEEK_V3, [H100_SXM], given.get("tensor_parallel"),
                                given.get("pipeline_parallel"), ["fp8"], ["bf16"],
                                data_parallel=given.get("data_parallel"))
        assert max(c.data_parallel for c in listed) <= 8
        assert len(listed) == search_space_size(DEEPSEEK_V3, [H100_SXM], given.get("tensor_parallel"),
                                                given.get("pipeline_parallel"), ["fp8"], ["bf16"],
                                                data_parallel=given.get("data_parallel"))


def test_given_data_and_expert_parallel_degrees_bound_the_pipelines_the_search_adds():
    """DeepSeek-V3 fp8 on H200s (150,754,820,096 B, 90% = 135.7e9 B), TP [1] with DP [8] and EP [8]: a pipeline
    (TP1 PPn) has neither DP nor EP, so the search lists DP8 EP8 alone. At TP1 one GPU cannot hold the model
    (about 680e9 B), at TP1 PP8 it can (about 85e9 B per GPU): without the DP and EP lists, or with lists that
    admit DP1 and EP1, the search adds that pipeline."""
    h200 = dataclasses.replace(H100_SXM, slug="h200-sxm", memory_bytes=150_754_820_096)
    only = configurations(DEEPSEEK_V3, [h200], [1], None, ["fp8"], ["bf16"], data_parallel=[8], expert_parallel=[8])
    assert {(c.tensor_parallel, c.pipeline_parallel, c.data_parallel, c.expert_parallel) for c in only} == {
        (1, 1, 8, 8)}
    assert len(only) == search_space_size(DEEPSEEK_V3, [h200], [1], None, ["fp8"], ["bf16"], data_parallel=[8],
                                          expert_parallel=[8])
    for lists in ({}, {"data_parallel": [1, 8], "expert_parallel": [1, 8]}):
        staged = configurations(DEEPSEEK_V3, [h200], [1], None, ["fp8"], ["bf16"], **lists)
        assert (1, 8, 1, 1) in {(c.tensor_parallel, c.pipeline_parallel, c.data_parallel, c.expert_parallel)
                                for c in staged}


def test_the_analytic_ceiling_is_the_rate_at_the_largest_batch_within_the_tpot_slo():
    """1,000-token prompts, 101-token answers (100 decode steps each), TPOT SLO 50 ms, a step of
    10 ms + 1 ms per decoding sequence + 10 us per prompt token. A whole 1,000-token prompt rides along
    each decode step (chunk = min(1,000, 8,192 - B)), so a prompt's prefill costs p = 1,000 x 10 us =
    10 ms beside any batch, and TPOT(B) = decode(B) + B p / 100 = 10 + B + 0.1 B = 10 + 1.1 B ms:
    B = 36 gives 49.6 ms, B = 37 gives 50.7 ms. The KV cache (1M tokens) and max_num_seqs (256) do not
    bind. At B = 36 each request costs 100 steps of 46 ms shared by 36, plus its prefill:
    100 x 0.046 / 36 + 0.010 = 0.13778 s, so the ceiling is 36 / 4.96 = 7.2581 req/s."""
    workload = Workload(Fixed(1000), Fixed(101), requests_per_s=1.0)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=0.050), H100))

    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 0.010 + 0.001 * decode_seqs + 1e-5 * prefill_tokens

    assert planner._ceiling(step, SchedulerConfig(1_000_000)) == pytest.approx(36 / 4.96, rel=1e-12)


def test_a_decode_workers_ceiling_prefills_nothing():
    """The example above on a disaggregated deployment's decode worker: its prompts arrive prefilled, so
    TPOT(B) = decode(B) = 10 + B ms and the largest batch within 50 ms is B = 40 (50 ms; 41 gives 51). A request
    costs 100 steps of 50 ms shared by 40: 100 x 0.050 / 40 = 0.125 s, a ceiling of 8 req/s (against 7.2581 with
    each prompt prefilled beside the decode steps)."""
    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 0.010 + 0.001 * decode_seqs + 1e-5 * prefill_tokens

    workload = Workload(Fixed(1000), Fixed(101), requests_per_s=1.0)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=0.050), H100))
    assert planner._ceiling(step, SchedulerConfig(1_000_000), decode_only=True) == pytest.approx(8.0, rel=1e-12)


def test_a_decode_workers_ceiling_for_one_token_answers_counts_the_step_that_streams_the_token():
    """One-token answers: the decode worker still runs one step a request, the one that streams the prefill
    worker's token (`decode_role_requests`: at least one step). B = 40 as above (10 + 40 = 50 ms), so a request
    costs 1 x 0.050 / 40 = 1.25 ms: 800 req/s (it divided by zero steps). An aggregated replica runs no decode
    step for it: each 1,000-token prompt rides along a step at 10 us a token, p = 10 ms, so whatever batch meets
    the SLO (B = 3: 10 + 3 + 3 x 10 = 43 ms), its ceiling is 1 / (0 x decode(B) / B + 0.010) = 100 req/s."""
    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 0.010 + 0.001 * decode_seqs + 1e-5 * prefill_tokens

    workload = Workload(Fixed(1000), Fixed(1), requests_per_s=1.0)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=0.050), H100))
    assert planner._ceiling(step, SchedulerConfig(1_000_000), decode_only=True) == pytest.approx(800.0, rel=1e-12)
    assert planner._ceiling(step, SchedulerConfig(1_000_000)) == pytest.approx(100.0, rel=1e-12)


def test_a_band_of_batches_missing_tpot_below_the_largest_does_not_cap_the_ceiling():
    """A closed loop of 1,024 + 1,024-token requests reserved in full, 1,300 blocks of 16 = 20,800
    tokens: 20,800 / 2,048 = 10.2 -> at most 10 users. Steps of 1 ms, except 1 s for batches of 4 to 6
    (a band missing the 100 ms TPOT SLO). Batch 10 meets it, so the ceiling is all 10 users, not the 3
    before the band."""
    workload = Workload(Fixed(1024), Fixed(1024), concurrent_users=100)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=0.100), H100))

    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 1.0 if 4 <= decode_seqs <= 6 else 1e-3

    config = SchedulerConfig(1300 * 16, block_size=16, max_num_seqs=256, kv_tokens_reserved_per_request="full")
    assert planner._ceiling(step, config) == 10


def test_the_analytic_ceiling_counts_window_layers_as_the_simulator_does():
    """A closed loop of 1,024 + 1,024-token requests, reserved in full, with steps so fast that the KV cache
    binds: the ceiling is the largest batch that fits. 1,300 blocks of 16 (20,800 tokens) with every layer
    full: 20,800 / 2,048 = 10.2 -> 10 users. With half the layers a 128-token window (9 blocks of 16 =
    144 slots): 2,600 full-layer blocks = 41,600 slots, each request 2,048 + 144 = 2,192 of them: 41,600 /
    2,192 = 18.98 -> 18 users, the 18 that start at once in the simulator
    (test_simulate.test_window_layers_let_more_requests_run_at_once)."""
    workload = Workload(Fixed(1024), Fixed(1024), concurrent_users=100)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=100.0), H100))

    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 1e-3 + 0.0 * np.asarray(decode_seqs, dtype=float)

    shape = {"block_size": 16, "max_num_seqs": 256, "kv_tokens_reserved_per_request": "full"}
    assert planner._ceiling(step, SchedulerConfig(1300 * 16, **shape)) == 10
    assert planner._ceiling(step, SchedulerConfig(1300 * 16, full_layers=1, window_layers=((1, 144),),
                                                  **shape)) == 18


def test_users_who_think_raise_the_analytic_ceiling_by_e_plus_z_over_e():
    """The KV-bound closed loop above (10 users at once, steps of 1 ms whatever they carry, so a prompt riding a
    decode step costs nothing more): a request holds its slot E = 0 + (1,024 - 1) x 1 ms = 1.023 s. Users who
    think Z = 3.069 s between requests hold it E of every E + Z = 4.092 s: the slots carry 10 x 4.092 / 1.023 =
    40 users."""
    def step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 1e-3 + 0.0 * np.asarray(decode_seqs, dtype=float)

    config = SchedulerConfig(1300 * 16, block_size=16, max_num_seqs=256, kv_tokens_reserved_per_request="full")
    for think, users in ((0.0, 10), (3.069, 40)):
        workload = Workload(Fixed(1024), Fixed(1024), concurrent_users=100, think_time_s=think)
        planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=100.0), H100))
        assert planner._ceiling(step, config) == pytest.approx(users, rel=1e-12)


def test_closed_loop_plans_of_users_who_think_carry_them_at_n_over_e_plus_z():
    """64 users thinking 20 s between requests of 1,000 in / 200 out, 2,000 simulated requests: each replica takes
    at most its max verified users and replicas = ceil(64 / max users), as without think time; a replica's
    predicted rate is its users over their mean cycle, N / (E + Z) (Little's law), E about the median request
    (fixed lengths at a light load barely queue). The rate measured over 1,800 requests, each user's pauses
    exponential, has a sampling error of about 2.3% (a cycle's coefficient of variation, about 1 with exponential
    pauses, over sqrt(1,800)): 8% is over 3 of them."""
    thinking = inputs_for(LLAMA_3_8B, Workload(Fixed(1000), Fixed(200), concurrent_users=64, think_time_s=20.0),
                          EIGHT_B_SLO, H100, simulated_requests=2000)
    result = plan(thinking, configurations(LLAMA_3_8B, [H100], [1, 2], [1], ["bf16"], ["bf16"]))
    at_once = eight_b_plan(workload=Workload(Fixed(1000), Fixed(200), concurrent_users=64))
    assert result.feasible
    for found in result.plans:
        assert found.replicas == math.ceil(64 / found.max_load_per_replica - 1e-9)
        users = found.offered_load_per_replica
        assert found.predicted.requests_per_s == pytest.approx(users / (20.0 + found.predicted.e2e.p50_s), rel=0.08)
    assert result.plans[0].gpus <= at_once.plans[0].gpus


def test_after_a_ttft_miss_of_a_replica_that_fell_behind_the_search_steps_to_its_finishing_rate():
    """5 req/s sized load (peak-to-mean 1, utilization cap 1). A run at 2.5 req/s per replica that finished
    2.445 req/s and missed TTFT: its queue grew, so the replicas that carry 5 req/s at 2.445 each are
    ceil(5 / 2.445) = ceil(2.045) = 3 (the bound on the next step). With two schedulers side by side, each
    finishing 1.2 req/s: 2.4 per replica, ceil(5 / 2.4) = ceil(2.083) = 3. No bound (None) after a TPOT
    miss, for a replica that finished all it was sent (2.5 of 2.5), or in a closed loop."""
    open_loop = _Planner(inputs_for(LLAMA_3_8B, Workload(Fixed(1000), Fixed(200), requests_per_s=5.0),
                                    Slo(ttft_s=1.0, tpot_s=0.05), H100))

    def run(finished_per_s, worst, schedulers=1):
        ttft = ("ttft", 6.9, 1.0, 6.9 if worst == "ttft" else 0.5)
        tpot = ("tpot", 0.06, 0.05, 1.2 if worst == "tpot" else 0.5)
        return _Run(2.5, SimpleNamespace(requests_per_s=finished_per_s), (ttft, tpot), schedulers)

    assert open_loop.sized_load == 5.0
    assert open_loop._replicas_served(run(2.445, "ttft")) == 3
    assert open_loop._replicas_served(run(1.2, "ttft", schedulers=2)) == 3
    assert open_loop._replicas_served(run(2.445, "tpot")) is None
    assert open_loop._replicas_served(run(2.5, "ttft")) is None
    closed_loop = _Planner(inputs_for(LLAMA_3_8B, Workload(Fixed(1000), Fixed(200), concurrent_users=64),
                                      Slo(ttft_s=1.0, tpot_s=0.05), H100))
    assert closed_loop._replicas_served(run(2.445, "ttft")) is None


def _falling_short(planner, meets_up_to: float) -> list[float]:
    """Stub the planner's runs: a replica finishes 99% of the load it is sent (short of it, as a finite run's drain
    makes it), meets the SLO up to `meets_up_to` req/s, and misses the TTFT by 1.23x above; returns the loads run."""
    loads: list[float] = []

    def run(screened, load, replicas):
        loads.append(load)
        ratio = 0.5 if load <= meets_up_to else 1.23
        return _Run(load, SimpleNamespace(requests_per_s=0.99 * load), (("ttft", ratio, 1.0, ratio),))

    planner.run = run
    return loads


def test_a_replica_held_twice_to_its_finishing_rate_lets_the_light_load_decide():
    """100 req/s sized, a 1 req/s ceiling per replica: the search starts at 100 replicas (1 req/s each), misses
    by 1.23 (a step of x1.25 to 125), but the replica finished 0.99 req/s: held to ceil(100 / 0.99) = 102. Missing
    there too (finishing 0.99 x 100/102 = 0.9706: 104 replicas, again under the x1.25 step), it is held no more:
    the light load, 5% of the ceiling (0.05 req/s: 2,000 replicas), is run next. Missing at every load: refused
    after 3 runs (one replica at a time, it took hundreds). Meeting up to 0.5 req/s: the light load meets, and
    bisection between 102 and 2,000 replicas finds 200 (0.5 req/s each), or the fewest within 8% above."""
    screened = SimpleNamespace(min_replicas=1, ceiling=1.0, configuration="L40S TP1")
    planner = _Planner(inputs_for(LLAMA_3_8B, Workload(Fixed(1000), Fixed(200), requests_per_s=100.0),
                                  Slo(ttft_s=1.0, tpot_s=0.05), H100))
    loads = _falling_short(planner, meets_up_to=0.0)
    refused = planner.settle(screened)
    assert isinstance(refused, Infeasible) and "light load" in refused.reasons[0]
    assert loads == pytest.approx([1.0, 100 / 102, 0.05])
    loads = _falling_short(planner, meets_up_to=0.5)
    settled = planner.settle(screened)
    assert loads[:3] == pytest.approx([1.0, 100 / 102, 0.05]) and len(loads) <= 12
    assert 200 <= settled.replicas <= 200 * 1.08


def test_a_tensorrt_llm_prefill_pool_is_screened_with_its_host_work_added_to_each_step():
    """The planner times a TensorRT-LLM prefill worker as its disaggregation recipe runs it, without the
    overlap scheduler (`Engine.overlaps_host_work_in_prefill_pool`): with 10 ms per step, its prefill of one
    1,000-token prompt is the GPU's time plus 10 ms, where the decode pool and an aggregated replica hide the
    overhead under a step that long (the overhead is the least a step lasts)."""
    efficiency = dataclasses.replace(DEFAULT_EFFICIENCY, per_step_overhead_s=10e-3, per_layer_overhead_s=0.0)
    workload = Workload(Fixed(1000), Fixed(100), requests_per_s=1.0)
    planner = _Planner(inputs_for(LLAMA_3_8B, workload, Slo(ttft_s=100.0, tpot_s=100.0), H100, efficiency=efficiency,
                                  engine="trtllm"))
    configuration = configurations(LLAMA_3_8B, [H100], [1], [1], ["bf16"], ["bf16"], engine="trtllm")[0]
    screened = {role: planner.screen(configuration, role) for role in ("aggregated", "prefill", "decode")}
    assert [screened[role].efficiency.step_overhead_overlapped for role in screened] == [True, False, True]
    prompt = (0, 0.0, 1000, 0.0)
    hidden, added = screened["aggregated"].step_time(*prompt), screened["prefill"].step_time(*prompt)
    assert hidden > 10e-3
    assert added == pytest.approx(hidden + 10e-3, rel=1e-12)
