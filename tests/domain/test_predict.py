"""Predicting published measurements: hand-worked step times, the scenario definitions, and agreement
with the serving simulator run directly.

Independent checks: the seed's batch-1 decode arithmetic (an 8B model reads its weights once per token:
~4.5-4.8 ms on an H100), the prefill FLOPs of Llama-3-8B worked by hand in test_roofline.py, the
definitions of throughput (tokens / elapsed), and the simulator itself for the replayed schedules.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.sizing.calibration.predict import (
    Measurement,
    Unpredictable,
    closed_loop_requests,
    needs_simulation,
    prepare,
)
from app.sizing.engines import ENGINES, host_adjusted
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.serving.simulate import simulate
from app.sizing.serving.workload import Fixed, Workload, sample_requests
from tests.domain.models_for_tests import GPT_OSS_120B, LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B
from tests.domain.test_roofline import A100_80GB_SXM, H100_SXM

HOPPER = dataclasses.replace(H100_SXM, family="hopper")
AMPERE = dataclasses.replace(A100_80GB_SXM, family="ampere")

# Every kernel at its roof: full HBM bandwidth, full peak FLOP/s from one row on, no fixed costs.
AT_THE_ROOF = Efficiency(bandwidth_fraction=1.0, compute_curve=((1, 1.0),), attention_fraction=1.0,
                         per_step_overhead_s=0.0, per_layer_overhead_s=0.0, allreduce_latency_s=0.0,
                         source="test: ideal")


def measurement(**fields) -> Measurement:
    base = {"scenario": "batch1", "metric": "tpot_ms", "stat": "mean", "num_gpus": 1, "tp": 1, "weight_dtype": "bf16",
                "compute_dtype": "bf16", "kv_dtype": "bf16", "engine": "gpt-fast", "isl": 128, "osl": 128, "batch": 1}
    return Measurement(**{**base, **fields})


def predict(efficiency: Efficiency = DEFAULT_EFFICIENCY, model=LLAMA_3_8B, gpu=HOPPER, **fields) -> float:
    return prepare(measurement(**fields), model, gpu).predict(efficiency)


# Hand-worked step times --------------------------------------------------------------------------

def test_batch1_decode_reads_the_weights_once_per_token() -> None:
    """Seed: an 8B model at batch 1 on an H100 reads its weights every token, ~16 GB / 3.35 TB/s = 4.8 ms.
    Exactly: Llama-3-8B has 8,030,261,248 parameters, 525,336,576 of them the embedding table, of which a
    decode step reads one row (4,096 x 2 B); the LM head is a separate matrix and is read whole. Bytes =
    (8,030,261,248 − 525,336,576) x 2 + 8,192 = 15,009,857,536; / 3.35e12 B/s = 4.48055 ms. The KV of
    two tokens (2 x 131,072 B) and the activations add well under 0.1%. One decode step: isl 1, osl 2."""
    tpot = predict(AT_THE_ROOF, isl=1, osl=2)
    assert tpot == pytest.approx(15_009_857_536 / 3.35e12, rel=1e-3)
    assert tpot == pytest.approx(4.8e-3, rel=0.08)  # the seed's rounder figure


def test_batch1_ttft_is_the_compute_bound_prefill() -> None:
    """Prefill of 2,048 tokens of Llama-3-8B (test_roofline.py): 29,688,401,494,016 FLOPs of which the LM
    head's 1,050,673,152 run on one sampled position. At 989.5 TFLOP/s the rest takes
    (29,688,401,494,016 − 1,050,673,152) / 989.5e12 = 30.00258 ms; the LM head is memory-bound, its
    1,050,673,152 B at 3.35 TB/s take 0.31363 ms; the embedding reads 2,048 rows x 8,192 B = 16.8 MB,
    0.00501 ms. TTFT = 30.3212 ms."""
    ttft = predict(AT_THE_ROOF, metric="ttft_ms", isl=2048, osl=1)
    assert ttft == pytest.approx(30.3212e-3, rel=1e-3)


def test_static_batch_throughput_is_tokens_over_elapsed_time() -> None:
    """Definitions: a static batch of b requests takes TTFT (its one prefill step) + (osl − 1) decode
    steps of mean TPOT; output tokens/s = b·osl / that; total adds the prompts, (isl + osl)/osl times
    more; requests/s = output / osl; per GPU divides by the GPUs (2 replicas of TP1 here, the batch of
    8 split 4 + 4)."""
    shape = {"scenario": "static_batch", "engine": "trtllm", "num_gpus": 2, "batch": 8, "isl": 64, "osl": 32, "stat": "mean"}
    ttft = predict(metric="ttft_ms", **shape)
    tpot = predict(metric="tpot_ms", **shape)
    elapsed = ttft + 31 * tpot
    output = predict(metric="output_tokens_per_s", **shape)
    assert output == pytest.approx(8 * 32 / elapsed, rel=1e-9)
    assert predict(metric="total_tokens_per_s", **shape) == pytest.approx(output * 96 / 32, rel=1e-9)
    assert predict(metric="requests_per_s", **shape) == pytest.approx(output / 32, rel=1e-9)
    assert predict(metric="output_tokens_per_s_per_gpu", **shape) == pytest.approx(output / 2, rel=1e-9)


def test_batch1_output_rate_is_answer_tokens_over_end_to_end_time() -> None:
    """gpt-fast's tokens/s: generated tokens over the whole generate() call, prefill included:
    osl / (TTFT + (osl − 1)·TPOT)."""
    ttft, tpot = predict(metric="ttft_ms", isl=5, osl=100), predict(metric="tpot_ms", isl=5, osl=100)
    assert predict(metric="output_tokens_per_s", isl=5, osl=100) == pytest.approx(100 / (ttft + 99 * tpot))


def test_latency_percentiles_of_a_static_batch_are_over_its_decode_steps() -> None:
    """Contexts grow by one token per step, so later steps are slower: p90 > median > first step, and
    the mean lies between the first and the last step (LMDeploy's per-token latency percentiles)."""
    shape = {"scenario": "static_batch", "engine": "lmdeploy", "batch": 64, "isl": 2048, "osl": 512}
    first = predict(metric="tpot_ms", stat="mean", **{**shape, "osl": 2})
    median = predict(metric="tpot_ms", stat="p50", **shape)
    p90 = predict(metric="tpot_ms", stat="p90", **shape)
    assert first < median < p90
    assert predict(metric="tpot_ms", stat="median", **shape) == median
    assert predict(metric="itl_ms", stat="p90", **shape) == p90


def test_a_static_batch_ends_together_so_its_e2e_is_the_whole_run() -> None:
    """Argonne's "Latency": the batch's one prefill step plus its osl − 1 decode steps, E2E = TTFT +
    (osl − 1)·mean TPOT (here 63 decode steps); and the total-token rate is b·(isl + osl) / E2E."""
    shape = {"scenario": "static_batch", "engine": "trtllm", "batch": 16, "isl": 256, "osl": 64, "stat": "mean"}
    ttft, tpot = predict(metric="ttft_ms", **shape), predict(metric="tpot_ms", **shape)
    e2e = predict(metric="e2e_ms", **shape)
    assert e2e == pytest.approx(ttft + 63 * tpot, rel=1e-9)
    assert predict(metric="total_tokens_per_s", **shape) == pytest.approx(16 * (256 + 64) / e2e, rel=1e-9)


def test_an_unstated_statistic_is_predicted_as_the_mean() -> None:
    shape = {"scenario": "static_batch", "engine": "lmdeploy", "batch": 8, "isl": 512, "osl": 256}
    for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert predict(metric=metric, stat=None, **shape) == predict(metric=metric, stat="mean", **shape)
    assert predict(metric="tpot_ms", stat=None, **shape) != predict(metric="tpot_ms", stat="p90", **shape)


# Scenarios through the simulator ---------------------------------------------------------------

def direct_simulation(measured: Measurement, users: int, efficiency: Efficiency = DEFAULT_EFFICIENCY):
    """The simulator run directly with the step-time model, on the layout `prepare` chose, at the efficiency the
    measured engine runs at (`engines.host_adjusted`: these engines do their per-step overhead while the GPU
    runs)."""
    layout = prepare(measured, LLAMA_3_8B, HOPPER).layouts[0]
    engine = ENGINES[measured.engine]
    steps = build_step_time_model(LLAMA_3_8B, HOPPER, weight_dtype="bf16", kv_dtype="bf16", compute_dtype="bf16",
                                  efficiency=host_adjusted(efficiency, measured.engine, engine.default_version))
    workload = Workload(Fixed(measured.isl), Fixed(measured.osl), concurrent_users=users)
    count = measured.num_requests or users
    return simulate(steps.step_time_s, layout.scheduler, sample_requests(workload, count, 0),
                    closed_loop_users=users, warmup_fraction=0.0)


@pytest.mark.parametrize("engine", ["trtllm", "vllm"])
def test_offline_prediction_is_the_simulation_of_every_request_at_once(engine: str) -> None:
    """The replayed schedule (recorded at 1 s per step, re-timed) gives what the simulator gives when
    run with the step-time model directly: TensorRT-LLM's reservation of input + output at admission
    and vLLM's on-demand blocks. Decode runs are timed at 33 evenly spaced steps and interpolated, so
    agreement is to 0.1%, not to the last bit."""
    shape = {"scenario": "offline", "engine": engine, "isl": 1000, "osl": 600, "num_requests": 300, "stat": "mean"}
    result = direct_simulation(measurement(metric="ttft_ms", **shape), users=300)
    assert predict(metric="output_tokens_per_s", **shape) == pytest.approx(result.output_tokens_per_s, rel=1e-3)
    assert predict(metric="requests_per_s", **shape) == pytest.approx(result.requests_per_s, rel=1e-3)
    assert predict(metric="ttft_ms", **shape) == pytest.approx(float(np.mean(result.ttft_s)), rel=1e-3)
    assert predict(metric="tpot_ms", **shape) == pytest.approx(float(np.mean(result.tpot_s)), rel=1e-3)
    assert predict(metric="ttft_ms", **{**shape, "stat": "p90"}) == pytest.approx(
        result.percentile("ttft", 90), rel=1e-3)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_closed_loop_prediction_is_the_simulation_of_that_many_users(engine: str) -> None:
    """Through the engine's own schedule: vLLM mixes prompt chunks into decode steps, SGLang runs them
    first while the decodes wait."""
    shape = {"scenario": "closed_loop", "engine": engine, "isl": 500, "osl": 200, "concurrency": 16,
             "num_requests": 64, "stat": "mean"}
    measured = measurement(metric="ttft_ms", **shape)
    assert prepare(measured, LLAMA_3_8B, HOPPER).layouts[0].scheduler.mixed_prefill is (engine == "vllm")
    result = direct_simulation(measured, users=16)
    assert predict(metric="output_tokens_per_s", **shape) == pytest.approx(result.output_tokens_per_s, rel=1e-3)
    assert predict(metric="ttft_ms", **shape) == pytest.approx(float(np.mean(result.ttft_s)), rel=1e-3)
    assert predict(metric="e2e_ms", **shape) == pytest.approx(float(np.mean(result.e2e_s)), rel=1e-3)


def test_a_closed_loop_simulates_ten_requests_per_user_up_to_a_thousand_on_the_busiest_rank() -> None:
    """Unstated request count: 10 per user. 50 users on one replica: 500. 150 users: 1,500 > 1,000, so
    1,000. A disaggregated run of 576 users whose busiest pool has 72 users per rank (8 ranks): 5,760
    requests, 720 on a rank, under the cap. 8,192 users on 4 prefill ranks (2,048 each): the cap allows
    8,192 x 1,000 / 2,048 = 4,000, fewer than one per user, so 8,192. A stated count of 64 is kept; one of
    5 for 16 users becomes 16 (every user sends at least one)."""
    assert closed_loop_requests(50, 50, None) == 500
    assert closed_loop_requests(150, 150, None) == 1000
    assert closed_loop_requests(576, 72, None) == 5760
    assert closed_loop_requests(8192, 2048, None) == 8192
    assert closed_loop_requests(16, 16, 64) == 64
    assert closed_loop_requests(16, 16, 5) == 16


def test_a_trickle_of_poisson_arrivals_sees_the_single_stream_latencies() -> None:
    """At 0.05 requests/s a ~0.5 s request mostly runs alone (20 s apart on average; one in 40 overlaps
    its predecessor): the median TTFT is the batch-1 prefill and the median TPOT the batch-1 decode, both
    computed without the simulator."""
    open_loop = {"scenario": "poisson", "engine": "vllm", "request_rate": 0.05, "num_requests": 20, "isl": 512, "osl": 64,
                     "stat": "median"}
    alone = {"scenario": "batch1", "isl": 512, "osl": 64, "stat": "mean"}
    assert predict(metric="ttft_ms", **open_loop) == pytest.approx(predict(metric="ttft_ms", **alone), rel=1e-6)
    assert predict(metric="itl_ms", **open_loop) == pytest.approx(predict(metric="tpot_ms", **alone), rel=1e-6)
    prepared = prepare(measurement(metric="ttft_ms", **open_loop), LLAMA_3_8B, HOPPER)
    assert prepared.utilization(DEFAULT_EFFICIENCY) < 0.01
    assert not prepared.timing_invariant


def test_vllm_has_no_static_batch_its_fixed_batch_runs_offline() -> None:
    """vLLM's benchmark_throughput submits the batch at once to the continuous-batching scheduler."""
    static = predict(metric="output_tokens_per_s", scenario="static_batch", engine="vllm", batch=64, isl=256, osl=256)
    offline = predict(metric="output_tokens_per_s", scenario="offline", engine="vllm", num_requests=64, isl=256,
                      osl=256)
    assert static == offline


def test_replicas_share_the_load_and_add_their_throughput() -> None:
    """2 GPUs at TP1 are 2 replicas, each serving half the requests: twice one GPU's throughput with
    half as many requests; latencies are one replica's."""
    one = {"scenario": "offline", "engine": "trtllm", "isl": 256, "osl": 256, "num_gpus": 1, "num_requests": 100}
    two = {**one, "num_gpus": 2, "num_requests": 200}
    assert predict(metric="output_tokens_per_s", **two) == pytest.approx(2 * predict(metric="output_tokens_per_s",
                                                                                     **one))
    assert predict(metric="ttft_ms", stat="mean", **two) == pytest.approx(predict(metric="ttft_ms", stat="mean", **one))
    assert predict(metric="output_tokens_per_s_per_gpu", **two) == pytest.approx(
        predict(metric="output_tokens_per_s", **one))


def test_an_unstated_layout_is_the_best_one_on_the_gpus() -> None:
    """tp empty on 2 GPUs: TP1 x 2 replicas and TP2 are both tried; throughput takes the higher, latency
    the lower."""
    shape = {"scenario": "offline", "engine": "trtllm", "isl": 256, "osl": 256, "num_gpus": 2, "num_requests": 200}
    by_layout = {tp: predict(metric="output_tokens_per_s", tp=tp, **shape) for tp in (1, 2)}
    assert predict(metric="output_tokens_per_s", tp=None, **shape) == max(by_layout.values())
    latencies = {tp: predict(metric="ttft_ms", stat="mean", tp=tp, **shape) for tp in (1, 2)}
    assert predict(metric="ttft_ms", stat="mean", tp=None, **shape) == min(latencies.values())
    layouts = prepare(measurement(metric="ttft_ms", tp=None, **shape), LLAMA_3_8B, HOPPER).layouts
    assert [(layout.tensor_parallel, layout.replicas) for layout in layouts] == [(1, 2), (2, 1)]


def test_weight_only_fp8_on_a100_reads_8_bits_and_computes_in_16() -> None:
    """A100 has no fp8 tensor cores: fp8 weights compute at the fp16 rate but halve the bytes a decode
    reads, so a memory-bound decode is nearly twice as fast as bf16 weights."""
    bf16 = predict(AT_THE_ROOF, gpu=AMPERE, compute_dtype="fp16", isl=1, osl=2)
    fp8 = predict(AT_THE_ROOF, gpu=AMPERE, weight_dtype="fp8", compute_dtype="fp16", isl=1, osl=2)
    assert fp8 / bf16 == pytest.approx(0.535, abs=0.01)  # (7.5e9 params x 1 B + 1.05 GB bf16 head) / 15.0 GB
    assert prepare(measurement(weight_dtype="fp8", compute_dtype="fp16"), LLAMA_3_8B, AMPERE).compute_dtype == "fp16"


def test_fp4_weights_on_hopper_are_weight_only_whatever_the_row_calls_the_compute() -> None:
    """H100 has no fp4 tensor rate. A row giving fp4 as its compute precision (aiconfigurator's files derive it
    from the quant mode) is predicted as the engines run it: fp4 weights dequantized, multiplied in bf16
    (`default_compute_dtype`, the API's rule), and the assumption says so. Decode at batch 1 reads
    Llama-3-8B's 6,979,321,856 decoder linear weights (per layer q 16,777,216 + k, v 2 x 4,194,304 + o
    16,777,216 + MLP 3 x 4,096 x 14,336 = 218,103,808; x 32) at MXFP4's 4.25 bits: x 17/32 = 3,707,764,736 B,
    plus the bf16 LM head 1,050,673,152 B, the norms 266,240 x 2 = 532,480 B and one embedding row 8,192 B
    = 4,758,978,560 B; / 3.35e12 B/s = 1.42059 ms."""
    prepared = prepare(measurement(weight_dtype="fp4", compute_dtype="fp4", isl=1, osl=2), LLAMA_3_8B, HOPPER)
    assert prepared.compute_dtype == "bf16"
    assert prepared.assumptions == ("h100-sxm has no fp4 tensor rate: fp4 weights computed weight-only at bf16",)
    assert prepared.predict(AT_THE_ROOF) == pytest.approx(4_758_978_560 / 3.35e12, rel=1e-3)
    stated_bf16 = predict(AT_THE_ROOF, weight_dtype="fp4", compute_dtype="bf16", isl=1, osl=2)
    assert prepared.predict(AT_THE_ROOF) == stated_bf16


def test_moe_tp_is_read_only_for_a_model_with_experts() -> None:
    """A dense model has no experts to split: its moe_tp (aiconfigurator writes 1 whatever the tp) changes
    nothing; on an MoE model tp 2 x dp 1 != ep 1 x moe_tp 1 is a contradiction and skips the row."""
    shape = {"scenario": "batch1", "tp": 2, "num_gpus": 2}
    assert predict(moe_tp=1, **shape) == predict(**shape)
    with pytest.raises(Unpredictable, match="inconsistent layout"):
        prepare(measurement(moe_tp=1, **shape), MIXTRAL_8X7B, HOPPER)


def test_a_checkpoint_recipe_reads_each_group_in_its_own_format() -> None:
    """gpt-oss's MXFP4 checkpoint keeps attention in bf16 where plain fp4 stores it in MXFP4: a batch-1
    decode reads the 36 layers' attention matrices (q 2,880 x 4,096 + k, v 2 x 2,880 x 512 + o 4,096 x 2,880
    = 26,542,080 parameters; x 36 = 955,514,880) at 2 bytes instead of 17/32, 1,403,412,480 B more, which
    take 0.41893 ms at 3.35e12 B/s. The recipe must match the weight dtype."""
    everywhere = predict(AT_THE_ROOF, model=GPT_OSS_120B, weight_dtype="fp4", compute_dtype=None, isl=1, osl=2)
    recipe = predict(AT_THE_ROOF, model=GPT_OSS_120B, weight_dtype="fp4", weight_recipe="gpt_oss_mxfp4",
                     compute_dtype=None, isl=1, osl=2)
    assert recipe - everywhere == pytest.approx(1_403_412_480 / 3.35e12, rel=1e-3)
    with pytest.raises(ValueError, match="weight_recipe"):
        measurement(weight_dtype="fp8", weight_recipe="gpt_oss_mxfp4")


# What cannot be predicted --------------------------------------------------------------------

@pytest.mark.parametrize("fields, model, gpu, reason", [
    ({"isl": None, "osl": None, "scenario": "offline"}, LLAMA_3_8B, HOPPER, "dataset-driven lengths"),
    ({"weight_dtype": "bf16", "compute_dtype": "fp8"}, LLAMA_3_8B, AMPERE, "has no fp8 tensor rate"),
    ({"num_gpus": 1}, LLAMA_3_1_405B, HOPPER, "leave no KV cache"),
    ({"tp": 3, "num_gpus": 3}, LLAMA_3_70B, HOPPER, "does not divide the attention heads: TP3, 64 heads"),
    ({"tp": 2, "num_gpus": 3}, LLAMA_3_8B, HOPPER, "not a whole number of TP2"),
    ({"metric": "tpot_ms", "osl": 1}, LLAMA_3_8B, HOPPER, "at least 2 output tokens"),
    ({"scenario": "poisson", "request_rate": None}, LLAMA_3_8B, HOPPER, "without its request_rate"),
    ({"scenario": "static_batch", "batch": None}, LLAMA_3_8B, HOPPER, "without its batch size"),
    ({"scenario": "closed_loop", "concurrency": None}, LLAMA_3_8B, HOPPER, "without its concurrency"),
])
def test_rows_that_cannot_be_predicted_say_why(fields, model, gpu, reason) -> None:
    with pytest.raises(Unpredictable, match=reason):
        prepare(measurement(**fields), model, gpu)


def test_a_request_longer_than_the_kv_cache_cannot_be_simulated() -> None:
    """Llama-3-70B bf16 on 2 H100s (TP2) keeps ~6 GB of KV per GPU: far from a 1M-token request."""
    with pytest.raises(Unpredictable, match="does not fit the engine's KV cache"):
        prepare(measurement(scenario="offline", engine="vllm", tp=2, num_gpus=2, isl=1_000_000, osl=10,
                            metric="output_tokens_per_s", stat=None), LLAMA_3_70B, HOPPER)


def test_very_long_outputs_and_more_users_than_the_request_cap_are_predicted() -> None:
    """1,000 requests of 32,768 output tokens (3.3e7 tokens) are simulated, not skipped: the
    simulator jumps over decode-only runs. Their contexts grow 8x longer than at 4,096 tokens, so each
    decode step reads more KV and the output rate can only fall.

    A closed loop of more users than MAX_SIMULATED_REQUESTS (1,000) simulates one request per user
    (closed_loop_requests: 2,000 users want 20,000 requests, the cap allows 1,000 x 2,000 / 2,000 = 1,000,
    at least one per user is 2,000): every user's prompt arrives at t = 0, so the 2,000 prompts queue
    behind each other and the mean TTFT exceeds that of 1,000 users (also one round, half the prompts)."""
    shape = {"scenario": "offline", "engine": "vllm", "num_requests": 1000, "isl": 1024,
             "metric": "output_tokens_per_s", "stat": None}
    long_run = predict(**shape, osl=32_768)
    assert 0 < long_run < predict(**shape, osl=4_096)
    loop = {"scenario": "closed_loop", "engine": "vllm", "isl": 1024, "osl": 128, "metric": "ttft_ms", "stat": None}
    assert closed_loop_requests(2000, 2000, None) == 2000 and closed_loop_requests(1000, 1000, None) == 1000
    assert predict(**loop, concurrency=2000) > predict(**loop, concurrency=1000) > 0


def test_a_measurement_rejects_values_outside_the_schema() -> None:
    with pytest.raises(ValueError, match="scenario"):
        measurement(scenario="burst")
    with pytest.raises(ValueError, match="engine"):
        measurement(engine="triton")
    with pytest.raises(ValueError, match="num_gpus"):
        measurement(num_gpus=0)
    with pytest.raises(ValueError, match="request_rate"):
        measurement(request_rate=float("inf"))
    assert not hasattr(measurement(), "value")  # the published number never reaches a prediction


def test_which_scenarios_run_the_simulator() -> None:
    assert needs_simulation(measurement(scenario="offline"))
    assert needs_simulation(measurement(scenario="poisson", request_rate=1.0))
    assert needs_simulation(measurement(scenario="static_batch", engine="vllm"))
    assert not needs_simulation(measurement(scenario="static_batch", engine="trtllm"))
    assert not needs_simulation(measurement(scenario="batch1"))


# Parallel layouts -------------------------------------------------------------------------------------

def test_data_parallel_ranks_and_pipeline_micro_batches_share_the_load() -> None:
    """A closed loop of 64 users on 8 GPUs. Mixtral-8x7B as TP1 x DP8 x EP8: 8 ranks, each its own scheduler
    with 64 / 8 = 8 users. Llama-3-8B as TP2 x PP4: 4 micro-batches in flight, 16 users each. Throughput per
    GPU divides by the 8 GPUs either way."""
    dep8 = prepare(measurement(scenario="closed_loop", metric="output_tokens_per_s_per_gpu", stat=None, num_gpus=8,
                               tp=1, dp=8, ep=8, moe_tp=1, engine="trtllm", concurrency=64, batch=None),
                   MIXTRAL_8X7B, HOPPER)
    (layout,) = dep8.layouts
    assert (layout.replicas, layout.data_parallel, layout.expert_parallel, layout.num_gpus) == (8, 8, 8, 8)
    pp4 = prepare(measurement(scenario="closed_loop", metric="output_tokens_per_s", stat=None, num_gpus=8, tp=2, pp=4,
                              engine="trtllm", concurrency=64, batch=None), LLAMA_3_8B, HOPPER)
    (layout,) = pp4.layouts
    assert layout.replicas == 4
    per_gpu = prepare(measurement(scenario="closed_loop", metric="output_tokens_per_s_per_gpu", stat=None,
                                  num_gpus=8, tp=2, pp=4, engine="trtllm", concurrency=64, batch=None),
                      LLAMA_3_8B, HOPPER)
    assert per_gpu.predict(DEFAULT_EFFICIENCY) == pytest.approx(pp4.predict(DEFAULT_EFFICIENCY) / 8)


def test_sglang_decodes_more_sequences_than_its_prompt_chunk() -> None:
    """Mixtral-8x7B as DP8 x EP8 on H100s. SGLang divides its 8,192-token chunk among the 8 attention ranks:
    1,024 prompt tokens per step each. Its decode batches are steps of their own, so a rank may run more
    sequences than that: its derived max_running_requests (min(KV tokens // 2, a pool of 2,048 to 4,096 slots)
    = 2,048 or more), uncapped. vLLM mixes the decodes into the prompt steps, so every running sequence needs
    a token of the step's budget: its 1,024 sequences stay within its 8,192 tokens."""
    dep8 = {"scenario": "closed_loop", "metric": "tpot_ms", "stat": None, "num_gpus": 8, "tp": 1, "dp": 8, "ep": 8,
            "moe_tp": 1, "concurrency": 64, "batch": None}
    (sglang,) = prepare(measurement(engine="sglang", **dep8), MIXTRAL_8X7B, HOPPER).layouts
    assert sglang.scheduler.max_num_batched_tokens == 8192 // 8
    assert sglang.scheduler.max_num_seqs >= 2048 and not sglang.scheduler.mixed_prefill
    (vllm,) = prepare(measurement(engine="vllm", **dep8), MIXTRAL_8X7B, HOPPER).layouts
    assert (vllm.scheduler.max_num_seqs, vllm.scheduler.max_num_batched_tokens) == (1024, 8192)


def test_a_full_pipeline_decodes_at_its_period_a_lone_request_at_one_trip() -> None:
    """Llama-3-8B as PP2 on 2 GPUs, every kernel at its roof. One request alone (batch 1) makes one trip through
    both stages per token. Two closed-loop users fill both micro-batches (one each), so each steps once per
    period: 2 x the slowest stage (16 layers each, the same layers' time in total) = the trip plus once more
    the LM head and the embedding of one token (no per-step overhead here):
      LM head: 128,256 x 4,096 x 2 B = 1,050,673,152 B + (4,096 + 128,256) x 2 B = 264,704 B of hidden state
      and logits; embedding: 4,096 x 2 B of its row + 4,096 x 2 B of hidden state = 16,384 B; together
      1,050,954,240 B / 3.35e12 B/s = 0.313718 ms (its 1.05 GFLOP take 1.06 us at 989.5 TFLOP/s).
    One decode step each (isl 1, osl 2): the context is 1 token in both runs."""
    shape = {"num_gpus": 2, "tp": 1, "pp": 2, "isl": 1, "osl": 2, "engine": "vllm"}
    lone = predict(AT_THE_ROOF, metric="tpot_ms", scenario="batch1", **shape)
    full = predict(AT_THE_ROOF, metric="tpot_ms", scenario="closed_loop", concurrency=2, batch=None, stat="mean",
                   num_requests=8, **shape)
    assert full - lone == pytest.approx(1_050_954_240 / 3.35e12, rel=1e-4)


@pytest.mark.parametrize("fields, reason", [
    ({"tp": 8, "dp": 1, "ep": 8, "moe_tp": 2}, "inconsistent layout"),  # 8 x 1 != 8 x 2
    ({"tp": None, "dp": 8, "ep": 8, "num_gpus": 8}, "without its tensor-parallel degree"),
    ({"tp": 2, "ep": 4, "num_gpus": 2}, "must divide"),  # 4 does not divide 2 x 1
])
def test_layouts_that_cannot_be_predicted_say_why(fields, reason) -> None:
    with pytest.raises(Unpredictable, match=reason):
        prepare(measurement(**{"num_gpus": 8, **fields}), MIXTRAL_8X7B, HOPPER)


def test_only_a_layout_that_communicates_over_pcie_pays_the_pcie_link_fraction() -> None:
    """A fit measures `pcie_link_fraction` only on rows of GPUs that talk over PCIe whose layout moves data
    between GPUs every step in volume: TP2 (two all-reduces of every token's hidden state a layer) does; one
    GPU does not, nor PP2 (one hand-off of a hidden state per token at its one stage boundary, 80 to 160
    times less than TP2's all-reduces on a 40- to 80-layer model), nor a dense model's data parallelism
    (replicas that never exchange), while an MoE model's attention-DP ranks exchange their tokens in every
    MoE layer. The same layouts on NVLink GPUs never pay it."""
    pcie = dataclasses.replace(HOPPER, pcie_links=True)
    assert not prepare(measurement(), LLAMA_3_8B, pcie).pays_pcie_link
    assert prepare(measurement(num_gpus=2, tp=2), LLAMA_3_8B, pcie).pays_pcie_link
    assert not prepare(measurement(num_gpus=2, tp=1, pp=2), LLAMA_3_8B, pcie).pays_pcie_link
    assert not prepare(measurement(num_gpus=2, tp=1, dp=2), LLAMA_3_8B, pcie).pays_pcie_link
    assert prepare(measurement(num_gpus=2, tp=1, dp=2, ep=2), MIXTRAL_8X7B, pcie).pays_pcie_link
    assert not prepare(measurement(num_gpus=2, tp=2), LLAMA_3_8B, HOPPER).pays_pcie_link
    assert not prepare(measurement(num_gpus=2, tp=1, dp=2, ep=2), MIXTRAL_8X7B, HOPPER).pays_pcie_link
