"""POST /v1/roofline/batch-sweep: the seed's "money slide", with hand-derived expectations.

Llama-3-8B on H100 SXM in bf16 (see tests/api/test_roofline.py for the per-operator arithmetic).
A decode step of B sequences at c cached tokens, ideal roofline:
- W = bytes read once per step whatever B: decoder weights 13,958,643,712 + norms 532,480 + LM head
  1,050,673,152 = 15,009,849,344 B;
- per sequence: FLOPs F(c) = 13,958,643,712 (linear) + 1,050,673,152 (LM head) + 524,288 x (c + 1)
  (attention); bytes s(c) = 8,192 (its embedding row) + 4,336,128 (activations) + 131,072 x (c + 2)
  (KV: c + 1 positions read, one written);
- compute time B x F / 989.5e12, memory time (W + B x s) / 3.35e12.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.problems import assert_problem

URL = "/v1/roofline/batch-sweep"
PEAK = 989.5e12
BANDWIDTH = 3.35e12
W = 15_009_849_344


def flops_per_sequence(context: int) -> int:
    return 13_958_643_712 + 1_050_673_152 + 524_288 * (context + 1)


def bytes_per_sequence(context: int) -> int:
    return 8_192 + 4_336_128 + 131_072 * (context + 2)


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(URL, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_roofline_steps(client: TestClient, deployment: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """Each sweep point is /v1/roofline's decode step of its batch at the same deployment, its bound included."""
    for point in points:
        step = client.post("/v1/roofline", json={**deployment, "phase": "decode", "batch_size": point["batch_size"]})
        assert step.status_code == 200, step.text
        assert point["bound"] == step.json()["bound"], point
        assert point["ideal_step_time_ms"] == pytest.approx(step.json()["ideal_time_ms"], rel=1e-9)
        assert point["expected_step_time_ms"] == pytest.approx(step.json()["expected_time_ms"], rel=1e-9)


def test_knee_of_llama_3_8b_at_short_context(client: TestClient) -> None:
    """At c = 128: F = 15,009,316,864 + 524,288 x 129 = 15,076,950,016 FLOPs and
    s = 4,344,320 + 131,072 x 130 = 21,383,680 B per sequence. Compute-bound once
    B x F / peak >= (W + B x s) / bw, i.e. B >= W / (F x bw / peak - s)
    = 15,009,849,344 / (51,043,741.8 - 21,383,680) = 506.06: the knee is 507.
    At 506 the memory time (W + 506 s) / bw = 7.7104 ms exceeds the compute time 7.7098 ms;
    at 507 the compute time 7.7251 ms wins."""
    knee = math.ceil(W / (flops_per_sequence(128) * BANDWIDTH / PEAK - bytes_per_sequence(128)))
    assert knee == 507
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128,
                           "batch_sizes": [507, 506]})
    assert answer["knee_batch_size"] == 507
    assert "From 507 sequences on" in answer["knee_explanation"]
    below, at = answer["points"]  # sorted by batch size
    assert (below["batch_size"], below["bound"]) == (506, "memory")
    assert (at["batch_size"], at["bound"]) == (507, "compute")
    assert below["ideal_step_time_ms"] == pytest.approx((W + 506 * bytes_per_sequence(128)) / BANDWIDTH * 1e3)
    assert at["ideal_step_time_ms"] == pytest.approx(507 * flops_per_sequence(128) / PEAK * 1e3)


def test_knee_at_zero_context(client: TestClient) -> None:
    """c = 0: F = 15,009,841,152, s = 4,606,464: 15,009,849,344 / (50,816,541 - 4,606,464) = 324.8 -> 325."""
    knee = math.ceil(W / (flops_per_sequence(0) * BANDWIDTH / PEAK - bytes_per_sequence(0)))
    assert knee == 325
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 0, "batch_sizes": [1]})
    assert answer["knee_batch_size"] == 325


def test_no_knee_at_long_context(client: TestClient) -> None:
    """c = 32,768: one more sequence adds F x bw / peak = (15,009,316,864 + 524,288 x 32,769) x 3.35 / 989.5
    = 109 MB worth of compute time but s = 4,344,320 + 131,072 x 32,770 = 4.30 GB of reads: memory time
    grows ~40x faster than compute time with every sequence, so decode never turns compute-bound."""
    assert flops_per_sequence(32_768) * BANDWIDTH / PEAK < bytes_per_sequence(32_768)
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 32_768})
    assert answer["knee_batch_size"] is None
    assert "memory-bound at any batch size" in answer["knee_explanation"]
    assert {point["bound"] for point in answer["points"]} == {"memory"}


def test_default_sweep_is_the_money_slide(client: TestClient) -> None:
    """Default batches 1, 2, 4, ..., 1024. At c = 128 the seed's slide: batch 1 reads
    W + s = 15,031,233,024 B: 4.487 ms per token; batch 32 reads W + 32 s = 15,694,127,104 B in
    4.685 ms for 32 tokens: 6,831 tokens/s aggregate ("~6000+"), per user still 213 tokens/s."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128})
    points = {point["batch_size"]: point for point in answer["points"]}
    assert list(points) == [2**i for i in range(11)]
    one, thirty_two = points[1], points[32]
    assert one["ideal_step_time_ms"] == pytest.approx((W + bytes_per_sequence(128)) / BANDWIDTH * 1e3)
    assert thirty_two["ideal_step_time_ms"] == pytest.approx(15_694_127_104 / BANDWIDTH * 1e3)
    assert thirty_two["ideal_tokens_per_s"] == pytest.approx(32 * BANDWIDTH / 15_694_127_104)
    assert thirty_two["ideal_tokens_per_s"] > 6000
    assert thirty_two["ideal_tokens_per_s_per_user"] == pytest.approx(thirty_two["ideal_tokens_per_s"] / 32)
    for point in answer["points"]:
        assert point["expected_step_time_ms"] >= point["ideal_step_time_ms"]
        assert point["expected_tokens_per_s_per_user"] == pytest.approx(1e3 / point["expected_step_time_ms"])
        assert point["bound"] == ("compute" if point["batch_size"] >= 507 else "memory")
    times = [point["ideal_step_time_ms"] for point in answer["points"]]
    assert times == sorted(times)  # a bigger batch never steps faster
    assert "batch_sizes = 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024" in answer["assumptions"]["defaults_used"]
    assert answer["ridge_point"] == pytest.approx(PEAK / BANDWIDTH)


def test_kv_memory_is_the_other_ceiling(client: TestClient) -> None:
    """Weights 8,030,261,248 parameters x 2 B = 16,060,522,496 B. At 8,191 cached tokens each sequence
    holds 8,192 tokens after the step: 131,072 x 8,192 = 1,073,741,824 B. 64 sequences:
    16,060,522,496 + 68,719,476,736 = 84,779,999,232 B fit in the 85,029,615,043 B CUDA reports on an H100; 65 need
    85,853,741,056 B and do not."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 8191,
                           "batch_sizes": [64, 65]})
    fits, overflows = answer["points"]
    assert fits["kv_bytes_per_gpu"] == 68_719_476_736
    assert fits["weights_and_kv_bytes_per_gpu"] == 84_779_999_232
    assert fits["fits_in_gpu_memory"] is True
    assert overflows["weights_and_kv_bytes_per_gpu"] == 85_853_741_056
    assert overflows["fits_in_gpu_memory"] is False


def test_memory_is_what_cuda_reports(client: TestClient) -> None:
    """SIZING.md section 7: "use what CUDA reports (torch.cuda.mem_get_info total)": 85,029,615,043 B on an H100
    (gpus.csv), not the driver's 85,520,809,984. At 1,024 cached tokens a sequence holds 1,025 after the step:
    131,072 x 1,025 = 134,348,800 B. 510 sequences: 16,060,522,496 + 68,517,888,000 = 84,578,410,496 B fit; 514:
    16,060,522,496 + 69,055,283,200 = 85,115,805,696 B, under the driver's total but over CUDA's: they do not."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 1024,
                           "batch_sizes": [510, 514]})
    fits, overflows = answer["points"]
    assert fits["weights_and_kv_bytes_per_gpu"] == 84_578_410_496 and fits["fits_in_gpu_memory"] is True
    assert overflows["weights_and_kv_bytes_per_gpu"] == 85_115_805_696 and overflows["fits_in_gpu_memory"] is False


def test_duplicate_batch_sizes_are_evaluated_once_in_order(client: TestClient) -> None:
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 10,
                           "batch_sizes": [8, 1, 8, 2]})
    assert [point["batch_size"] for point in answer["points"]] == [1, 2, 8]


# Bad input ---------------------------------------------------------------------------------

BASE = {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 100}


@pytest.mark.parametrize(("change", "pointer"), [
    ({"batch_sizes": list(range(1, 66))}, "/body/batch_sizes"),  # more than 64 points
    ({"batch_sizes": []}, "/body/batch_sizes"),
    ({"batch_sizes": [4, 0]}, "/body/batch_sizes/1"),
    ({"batch_sizes": [1_000_001]}, "/body/batch_sizes/0"),
    ({"batch_sizes": [1.5]}, "/body/batch_sizes/0"),
    ({"context_tokens": -1}, "/body/context_tokens"),
    ({"context_tokens": 10_000_001}, "/body/context_tokens"),
    ({"tensor_parallel": 3}, "/body/tensor_parallel"),
    ({"tensor_parallel": 1025}, "/body/tensor_parallel"),
    ({"compute_dtype": "fp4"}, "/body/compute_dtype"),  # H100 has no fp4 tensor rate
])
def test_bad_input_is_422_naming_the_field(client: TestClient, change: dict[str, Any], pointer: str) -> None:
    assert_problem(client.post(URL, json={**BASE, **change}), 422, pointer)


def test_huge_list_is_422_not_slow(client: TestClient) -> None:
    assert_problem(client.post(URL, json={**BASE, "batch_sizes": [1] * 100_000}), 422, "/body/batch_sizes")


def test_nan_in_the_list_is_422(client: TestClient) -> None:
    response = client.post(URL, content=b'{"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 1, '
                                        b'"batch_sizes": [1, NaN]}', headers={"content-type": "application/json"})
    assert_problem(response, 422, "/body/batch_sizes/1")


def test_unknown_gpu_is_404(client: TestClient) -> None:
    assert_problem(client.post(URL, json={**BASE, "gpu": "h900"}), 404)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "gpt-oss-120b"]),
       gpu=st.sampled_from(["h100-sxm", "a100-80gb-sxm", "mi300x", "l4"]),
       context_tokens=st.integers(0, 10_000_000), tensor_parallel=st.sampled_from([1, 2, 4, 8]),
       batch_sizes=st.lists(st.integers(1, 1_000_000), min_size=1, max_size=64))
def test_sweeps_are_monotone_and_agree_with_the_roofline(
        client: TestClient, model: str, gpu: str, context_tokens: int, tensor_parallel: int,
        batch_sizes: list[int]) -> None:
    """A bigger batch never steps faster; expected never beats ideal; per-user throughput is aggregate /
    batch; and each point agrees with /v1/roofline for the same decode step (its bound found by comparing
    compute and memory time, independently of the sweep's analytic knee), at the ends of the sweep and on
    both sides of the knee."""
    deployment = {"model": model, "gpu": gpu, "context_tokens": context_tokens, "tensor_parallel": tensor_parallel}
    response = client.post(URL, json={**deployment, "batch_sizes": batch_sizes})
    assert response.status_code == 200, response.text
    answer = response.json()
    points = answer["points"]
    assert [point["batch_size"] for point in points] == sorted(set(batch_sizes))
    ideal = [point["ideal_step_time_ms"] for point in points]
    assert all(later >= earlier * (1 - 1e-12) for earlier, later in itertools.pairwise(ideal))
    for point in points:
        assert point["expected_step_time_ms"] >= point["ideal_step_time_ms"] > 0
        assert point["ideal_tokens_per_s_per_user"] == pytest.approx(point["ideal_tokens_per_s"] / point["batch_size"])
    knee = answer["knee_batch_size"]
    checks = {points[0]["batch_size"], points[-1]["batch_size"]} | ({knee - 1, knee} - {0} if knee else set())
    sweep = post(client, {**deployment, "batch_sizes": sorted(checks)})
    assert_roofline_steps(client, deployment, sweep["points"])


# Attention data parallelism and expert parallelism ------------------------------------------------------------

DEEPSEEK_H200 = {"model": "deepseek-v3", "gpu": "h200-sxm", "context_tokens": 2047, "weight_dtype": "fp8",
                 "kv_dtype": "bf16"}


def test_dp8_ep8_sweeps_one_ranks_batch_beside_its_weights(client: TestClient) -> None:
    """DeepSeek-V3 fp8 on H200 (150,754,820,096 B), bf16 MLA cache: 576 values x 2 B x 61 layers = 70,272 B per
    token on every GPU of a rank (the latent is not split by TP), 2,048 tokens after the step: 143,917,056 B a
    sequence. Weights per GPU (tests/domain/test_layout.py, by hand, in plain fp8): TP8 85,119,449,088 B, DP8 +
    EP8 100,817,025,024 B (the attention replicated on every rank). DeepSeek's fp8 checkpoint (deepseek_fp8) adds
    an FP32 scale per 128 x 128 block, 4 B per 16,384 weights, to its linear weights (attention, dense MLPs,
    routed and shared experts): at TP8 2,234,712,064 + 148,635,648 + 81,738,596,352 + 319,291,392 =
    84,441,235,456 of them, 20,615,536 B more: 85,140,064,624 B; at DP8 + EP8 11,413,422,080 + 1,189,085,184
    + 81,738,596,352 + 2,554,331,136 = 96,895,434,752, 23,656,112 B more: 100,840,681,136 B.
    - TP8: (150,754,820,096 - 85,140,064,624) / 143,917,056 = 455.92: 455 sequences fit, for the whole replica.
    - DP8 + EP8: (150,754,820,096 - 100,840,681,136) / 143,917,056 = 346.83: 346 fit (49,795,301,376 B of KV),
      347 need 49,939,218,432 B and do not; each of the 8 ranks holds its own, 2,768 in the replica."""
    tp8 = post(client, {**DEEPSEEK_H200, "tensor_parallel": 8, "batch_sizes": [455, 456]})
    dep8 = post(client, {**DEEPSEEK_H200, "data_parallel": 8, "expert_parallel": 8, "batch_sizes": [346, 347]})
    assert (tp8["tensor_parallel"], tp8["data_parallel"], tp8["expert_parallel"]) == (8, 1, 1)
    assert (dep8["tensor_parallel"], dep8["data_parallel"], dep8["expert_parallel"]) == (1, 8, 8)
    for answer, weights, fitting in ((tp8, 85_140_064_624, 455), (dep8, 100_840_681_136, 346)):
        fits, overflows = answer["points"]
        assert fits["kv_bytes_per_gpu"] == fitting * 143_917_056
        assert fits["weights_and_kv_bytes_per_gpu"] == weights + fitting * 143_917_056
        assert (fits["fits_in_gpu_memory"], overflows["fits_in_gpu_memory"]) == (True, False)
    assert dep8["points"][0]["kv_bytes_per_gpu"] == 49_795_301_376


@pytest.mark.parametrize("layout", [{"data_parallel": 8, "expert_parallel": 8}, {"tensor_parallel": 8,
                                                                                  "expert_parallel": 8},
                                    {"tensor_parallel": 2, "data_parallel": 4, "expert_parallel": 8}])
def test_a_dp_ep_sweep_agrees_with_the_roofline(client: TestClient, layout: dict[str, int]) -> None:
    """Each point is /v1/roofline's decode step at the same layout (its batch one rank's), its bound included,
    at the ends of the sweep and on both sides of the knee; the knee's text says the batch is per rank.

    Whether there is a knee, roughly by hand: a sequence brings s = 143,917,056 B of KV reads per GPU (above);
    it turns compute-bound only if its compute time t at the peaks moves more than s at 4.8 TB/s. Attention over
    2,048 positions costs 2 x heads x 1,088 (MLA's absorbed widths) x 2,048 x 61 FLOPs at the bf16 peak (989.5
    TFLOP/s), the linear layers 2 FLOPs per weight this GPU multiplies at the fp8 peak (1,979 TFLOP/s):
    - TP8 EP8: 16 heads, 4.35 GFLOP (4.4 us); about 37e9 / 8 weights, 9.2 GFLOP (4.7 us): t x bw = 43 MB < s,
      no knee at any batch;
    - DP8 EP8 (TP1): 128 heads, 34.8 GFLOP (35 us); 74 GFLOP (37 us): 346 MB > s;
    - TP2 DP4 EP8: 64 heads, 17.4 GFLOP (17.6 us); k x dp / ep = 4 whole experts per own token (20.4 GFLOP) and
      the rest at TP2 (about 15 GFLOP), 18 us: 171 MB > s."""
    deployment = {**DEEPSEEK_H200, **layout}
    answer = post(client, {**deployment, "batch_sizes": [1, 64]})
    knee = answer["knee_batch_size"]
    assert (knee is None) == (layout.get("data_parallel", 1) == 1)
    sweep = post(client, {**deployment, "batch_sizes": [1, 64, 4096] + ([knee - 1, knee] if knee else [])})
    assert_roofline_steps(client, deployment, sweep["points"])
    if knee is None:
        assert answer["knee_explanation"].startswith("None: ")
        assert {point["bound"] for point in sweep["points"]} == {"memory"}
    else:
        assert f"From {knee:,} sequences on each attention data-parallel rank on" in answer["knee_explanation"]


@pytest.mark.parametrize(("layout", "pointer"), [
    ({"data_parallel": 8, "expert_parallel": 3}, "/body/expert_parallel"),  # 3 does not divide 1 x 8
    ({"data_parallel": 0}, "/body/data_parallel"),
    ({"expert_parallel": 1025}, "/body/expert_parallel"),
])
def test_a_layout_the_model_cannot_take_is_a_422(client: TestClient, layout: dict[str, int], pointer: str) -> None:
    assert_problem(client.post(URL, json={**DEEPSEEK_H200, **layout}), 422, pointer)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["mixtral-8x7b", "deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "llama-3-8b"]),
       gpu=st.sampled_from(["h100-sxm", "h200-sxm", "b200"]), context_tokens=st.integers(0, 200_000),
       tensor_parallel=st.sampled_from([1, 2, 4, 8]), data_parallel=st.sampled_from([1, 2, 4, 8, 16]),
       expert_parallel=st.sampled_from([1, 2, 4, 8, 16, 32]),
       batch_sizes=st.lists(st.integers(1, 100_000), min_size=1, max_size=16))
def test_any_layout_is_swept_or_refused_and_agrees_with_the_roofline(
        client: TestClient, model: str, gpu: str, context_tokens: int, tensor_parallel: int, data_parallel: int,
        expert_parallel: int, batch_sizes: list[int]) -> None:
    """Every layout is a 200 or a 422 naming a layout field, never an error; a swept one is monotone, and at its
    ends and on both sides of its knee it is /v1/roofline's step at the same layout."""
    deployment = {"model": model, "gpu": gpu, "context_tokens": context_tokens, "tensor_parallel": tensor_parallel,
                  "data_parallel": data_parallel, "expert_parallel": expert_parallel}
    response = client.post(URL, json={**deployment, "batch_sizes": batch_sizes})
    if response.status_code == 422:
        pointers = {error["pointer"] for error in response.json()["errors"]}
        assert pointers <= {f"/body/{name}" for name in ("tensor_parallel", "data_parallel", "expert_parallel")}, \
            response.text
        return
    assert response.status_code == 200, response.text
    answer = response.json()
    points = answer["points"]
    ideal = [point["ideal_step_time_ms"] for point in points]
    assert all(later >= earlier * (1 - 1e-12) for earlier, later in itertools.pairwise(ideal))
    knee = answer["knee_batch_size"]
    checks = {points[0]["batch_size"], points[-1]["batch_size"]} | ({knee - 1, knee} - {0} if knee else set())
    assert_roofline_steps(client, deployment, post(client, {**deployment, "batch_sizes": sorted(checks)})["points"])


def test_a_checkpoint_recipe_sets_the_weights_each_gpu_holds(client: TestClient) -> None:
    """Llama-3.1-405B at TP8 (126 layers, hidden 16,384, 128 heads and 8 KV heads of 128, SwiGLU width 53,248):
    Meta's FP8 checkpoint (weight_recipe meta_fp8) keeps attention and the first and last layers' MLPs in bf16,
    so each GPU holds, over a plain fp8 weight_dtype, one more byte for each of its attention weights,
    126 x (16,384 x (16 + 2) x 128 + 16 x 128 x 16,384) = 126 x 71,303,168 = 8,984,199,168, and for each
    weight of two MLPs, 2 x 3 x 16,384 x 53,248 / 8 = 654,311,424: 9,638,510,592 bytes in all."""
    base = {"model": "llama-3.1-405b", "gpu": "h100-sxm", "context_tokens": 1024, "tensor_parallel": 8,
            "batch_sizes": [1]}
    plain = post(client, {**base, "weight_dtype": "fp8"})["points"][0]
    meta = post(client, {**base, "weight_recipe": "meta_fp8"})["points"][0]
    assert meta["weights_and_kv_bytes_per_gpu"] - plain["weights_and_kv_bytes_per_gpu"] == 9_638_510_592
    assert meta["kv_bytes_per_gpu"] == plain["kv_bytes_per_gpu"]
