"""/v1/capacity: engine memory accounting, KV capacity and concurrency, fit answers, and bad input.

Expected numbers are worked by hand from the catalog rows (h100-sxm: 85,520,809,984 bytes as the driver
reports them, 85,029,615,043 as CUDA does, what every engine sizes from; h200-sxm 150,754,820,096) and the published architectures; tests/domain/test_capacity.py shows the
longer derivations these repeat.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.catalog.schemas import GPU_SPEC_EXAMPLE, MODEL_ARCHITECTURE_EXAMPLE
from app.estimates import capacity_schemas as shapes
from tests.api.problems import assert_problem

GIB = 2**30
WORKLOAD = {"input_tokens": 1000, "output_tokens": 500}
# Llama-3.1-8B in bf16: 8,030,261,248 parameters x 2 bytes.
LLAMA_8B_WEIGHTS = 16_060_522_496
SEED_EXAMPLE = {"model": "llama-3-70b", "gpu": "h100-sxm", "tensor_parallel": 4, "weight_dtype": "fp16",
                "kv_dtype": "fp16", "engine": "generic", "gpu_memory_utilization": 1.0,
                "reserved_bytes_per_gpu": 7_500_000_000, **WORKLOAD}


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_seed_worked_example(client: TestClient) -> None:
    """Seed s11, Llama-3-70B fp16 on 4 x H100 (TP4), 30 GB of overhead given explicitly (7.5e9 per GPU),
    utilization 1.0. Per GPU: weights 17,639,415,808 params x 2 = 35,278,831,616 B; KV budget
    85,029,615,043 (what CUDA reports, SIZING.md section 7) − 35,278,831,616 − 7,500,000,000 = 42,250,783,427 B;
    81,920 B per token (2 of 8 KV heads x 128 x 2 B x 80 layers); 42,250,783,427 // (16 x 81,920) = 32,234
    blocks (42,249,748,480 B); 1,500 tokens = 94 blocks per request -> 32,234 // 94 = 342 admitted (the seed's
    "~310" assumes 80 GB, not the 79.19 GiB CUDA reports)."""
    data = post(client, SEED_EXAMPLE)
    assert data["fits"] is True and data["reasons"] == [] and data["suggestion"] is None
    assert data["num_gpus"] == 4
    memory = data["memory"]
    assert memory["total_bytes_per_gpu"] == 85_029_615_043
    assert memory["weights_bytes_per_gpu"] == 35_278_831_616
    assert memory["reserved_bytes_per_gpu"] == memory["overhead_bytes_per_gpu"] == 7_500_000_000
    assert memory["kv_budget_bytes_per_gpu"] == 42_250_783_427
    assert data["kv_bytes_per_token_per_gpu"] == 81_920
    assert (data["kv_tokens"], data["kv_blocks"]) == (515_744, 32_234)
    assert data["max_concurrency"]["admission"] == {
        "sequences": 342, "kv_limited_sequences": 342, "limit": "kv_cache", "tokens_per_request": 1500}
    assert data["operating_point"]["batch_size"] == 342
    assert data["operating_point"]["concurrency_view"] == "admission"


def test_a_think_time_states_the_users_the_operating_point_carries(client: TestClient) -> None:
    """The seed's example, its 342 running requests of 1,000 in / 500 out, each user thinking 30 s between
    requests: the users being answered (342) plus those thinking, the rate x 30 s (Little's law over the
    thinking users), 342 + R x 30 with R the expected requests/s, which the think time leaves as it is. The
    rate's own arithmetic: 342 / (500 x TPOT). Without a think time: null."""
    thinking = post(client, {**SEED_EXAMPLE, "think_time_s": 30})["operating_point"]
    at_once = post(client, SEED_EXAMPLE)["operating_point"]
    rate = thinking["expected_requests_per_s"]
    assert rate == pytest.approx(342 / (500 * thinking["expected_tpot_ms"] / 1000))
    assert thinking["users_at_think_time"] == pytest.approx(342 + rate * 30)
    assert at_once["users_at_think_time"] is None and at_once["expected_requests_per_s"] == rate
    negative = client.post("/v1/capacity", json={**SEED_EXAMPLE, "think_time_s": -1})
    assert negative.status_code == 422 and "/body/think_time_s" in [e["pointer"] for e in negative.json()["errors"]]


def test_inline_specs_give_the_same_answer(client: TestClient) -> None:
    """The inline Llama-3-70B architecture and H100 spec (the schema examples) are the catalog rows."""
    body = {**SEED_EXAMPLE, "model_spec": MODEL_ARCHITECTURE_EXAMPLE, "gpu_spec": GPU_SPEC_EXAMPLE}
    del body["model"], body["gpu"]
    data = post(client, body)
    assert data["model"] == "model_spec (inline)"
    assert data["max_concurrency"]["admission"]["sequences"] == 342


def test_vllm_measurement_is_reproduced(client: TestClient) -> None:
    """vLLM, Llama-3.1-8B on H100, utilization 0.9, max-model-len 16k, measured KV 51.38 GiB (SIZING.md s7),
    with that log's activation (4.76 GiB) and non-torch (0.13 GiB) given, on a version that sizes the KV
    cache before capturing CUDA graphs, from what CUDA reports (79.19 GiB = 85,029,615,043 B):
    0.9 x 85,029,615,043 = 76,526,653,538 − 16,060,522,496 (weights) − 5,111,011,082 − 139,586,437
    = 55,215,533,523 B = 51.42 GiB."""
    data = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "vllm", "engine_version": "0.19.0",
                         "gpu_memory_utilization": 0.9, "max_model_len": 16384,
                         "activation_bytes_per_gpu": 5_111_011_082, "non_torch_bytes_per_gpu": 139_586_437,
                         **WORKLOAD})
    memory = data["memory"]
    assert memory["total_bytes_per_gpu"] == 85_029_615_043
    assert memory["usable_bytes_per_gpu"] == 76_526_653_538
    assert memory["overhead_bytes_per_gpu"] == 139_586_437
    assert memory["cuda_graph_bytes_per_gpu"] == 0
    assert memory["kv_budget_bytes_per_gpu"] == 55_215_533_523
    assert memory["kv_budget_per_gpu"]["gib"] == pytest.approx(51.38, rel=0.001)
    # 55,215,533,523 // (16 x 131,072) = 26,328 blocks; 16,384 tokens = 1,024 blocks per request -> 25.
    assert (data["kv_tokens"], data["kv_blocks"]) == (421_248, 26_328)
    assert data["max_concurrency"]["worst_case"]["sequences"] == 25
    assert data["max_context_tokens"] == 16_384
    engine = data["engine"]
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"]) == (1024, 8192)
    assert (engine["block_size"], engine["engine_version"]) == (16, "0.19.0")
    assert engine["sources"]["gpu_memory_utilization"] == "given"
    assert "CUDA reports" in engine["sources"]["total_bytes_per_gpu"]
    assert "after sizing the KV cache" in engine["sources"]["cuda_graph_bytes_per_gpu"]
    assert data["operating_point"]["concurrency_view"] == "steady_state"
    assert data["calculation_version"] == "2026.12.07.7"
    assumptions = data["assumptions"]
    assert assumptions["efficiency"]["calibration_profile"] == "builtin"
    assert (assumptions["weight_dtype"], assumptions["kv_dtype"]) == ("bf16", "bf16")
    assert assumptions["weight_recipe"].startswith("bf16: every linear matrix")
    assert assumptions["kv_dtype_source"].startswith("the model's dtype")
    assert any(line.startswith("max_num_seqs = 1024") for line in assumptions["defaults_used"])


def test_405b_on_one_h100_is_an_answer_not_an_error(client: TestClient) -> None:
    """Llama-3.1-405B bf16: 405,853,388,800 params x 2 = 811,706,777,600 B (811.7 GB) against one GPU of
    85,029,615,043 B (85.0 GB) as CUDA reports it."""
    data = post(client, {"model": "llama-3.1-405b", "gpu": "h100-sxm", **WORKLOAD})
    assert data["fits"] is False
    assert data["memory"]["weights_bytes_total"] == 811_706_777_600
    assert data["memory"]["weights_total"]["gb"] == pytest.approx(811.706778)
    (reason,) = data["reasons"]
    assert reason.startswith("weights need 811.7 GB (bf16); 1 x 85.0 GB (TP1, PP1)")
    assert data["operating_point"] is None
    assert data["kv_tokens"] == 0
    suggestion = data["suggestion"]
    assert suggestion is not None and suggestion["num_gpus"] <= 8
    again = post(client, {"model": "llama-3.1-405b", "gpu": "h100-sxm", **WORKLOAD,
                          "tensor_parallel": suggestion["tensor_parallel"],
                          "pipeline_parallel": suggestion["pipeline_parallel"],
                          "weight_dtype": suggestion["weight_dtype"]})
    assert again["fits"] is True


def test_sglang_fraction_on_h200(client: TestClient) -> None:
    """SGLang 0.5.10 on H200 (143,771 MiB): reserved 13,440 MiB + the piecewise CUDA graphs' 58 x 8 = 464,
    fraction round((143,771 − 13,904) / 143,771, 3) = 0.903; 0.903 x 150,754,820,096 = 136,131,602,546
    (.688 dropped) − 16,060,522,496 = 120,071,080,050 B of KV; page size 1: // 131,072 = 916,069 tokens."""
    data = post(client, {"model": "llama-3.1-8b", "gpu": "h200-sxm", "engine": "sglang", **WORKLOAD})
    assert data["engine"]["gpu_memory_utilization"] == 0.903
    assert data["engine"]["block_size"] == 1
    assert data["memory"]["kv_budget_bytes_per_gpu"] == 120_071_080_050
    assert data["kv_tokens"] == 916_069


def test_sglang_picks_its_fraction_by_the_drivers_total_and_applies_it_to_what_cuda_reports(
        client: TestClient) -> None:
    """SGLang 0.5.10 on one H100: the fraction from nvidia-smi's 81,559 MiB, round((81,559 − 13,904) / 81,559, 3) =
    0.830 (ENGINES.md's worked example), applied to the memory torch finds free before the weights load (ENGINES.md
    1.2: KV pool = free after the weights − free before them x (1 − fraction)), at most what CUDA reports:
    0.830 x 85,029,615,043 = 70,574,580,485 (.69 dropped) − 16,060,522,496 = 54,514,057,989 B of KV;
    // 131,072 = 415,909 tokens. (Of the driver's 85,520,809,984 it would be 407,691,801 B more.)"""
    data = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "sglang", **WORKLOAD})
    assert data["engine"]["gpu_memory_utilization"] == 0.830
    assert data["memory"]["total_bytes_per_gpu"] == 85_029_615_043
    assert data["memory"]["kv_budget_bytes_per_gpu"] == 54_514_057_989
    assert data["kv_tokens"] == 415_909


def test_trtllm_rule(client: TestClient) -> None:
    """TensorRT-LLM, from what CUDA reports: 0.9 x (85,029,615,043 − 16,060,522,496 − 5,111,011,082
    − 139,586,437) = 0.9 x 63,718,495,028 = 57,346,645,525 B (.2 dropped); blocks of 32 x 131,072 =
    4,194,304 B: 13,672 (13,673 would need 57,348,718,592); 47 blocks per 1,500-token request -> 290."""
    data = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "trtllm", **WORKLOAD})
    assert data["engine"]["utilization_of"] == "free_memory_after_weights_and_activations"
    assert data["memory"]["kv_budget_bytes_per_gpu"] == 57_346_645_525
    assert data["kv_blocks"] == 13_672
    assert data["max_concurrency"]["admission"]["sequences"] == 290


def test_tensorrt_llm_on_a_gpu_not_made_by_nvidia_is_an_answer_that_it_cannot_run(client: TestClient) -> None:
    """TensorRT-LLM runs on NVIDIA GPUs only: on an MI300X (the catalog's maker: AMD) the answer is that it does
    not fit, with that reason and no other layout suggested; vLLM on the same GPU fits."""
    data = post(client, {"model": "llama-3.1-8b", "gpu": "mi300x", "engine": "trtllm", **WORKLOAD})
    assert data["fits"] is False
    assert data["reasons"] == ["trtllm runs on NVIDIA GPUs only, and AMD Instinct MI300X is AMD's"]
    assert data["suggestion"] is None and data["operating_point"] is None
    assert post(client, {"model": "llama-3.1-8b", "gpu": "mi300x", "engine": "vllm", **WORKLOAD})["fits"] is True


def test_tensorrt_llm_puts_the_leftover_layer_on_the_first_stage(client: TestClient) -> None:
    """Llama-3.1-405B bf16 at TP8 x PP4 (126 layers): vLLM's heaviest stage is one of 32 layers without the
    embedding, TensorRT-LLM's its first, 32 layers with it (tests/domain/test_weights.py). At TP8 the embedding's
    shard is 128,256 / 8 x 16,384 x 2 B = 525,336,576 B more weights on a GPU, which the KV budget loses."""
    layout = {"model": "llama-3.1-405b", "gpu": "h100-sxm", "tensor_parallel": 8, "pipeline_parallel": 4, **WORKLOAD}
    vllm = post(client, {**layout, "engine": "vllm"})["memory"]
    trtllm = post(client, {**layout, "engine": "trtllm"})["memory"]
    assert trtllm["weights_bytes_per_gpu"] - vllm["weights_bytes_per_gpu"] == 525_336_576


def test_each_pipeline_stage_is_listed_and_the_fewest_blocks_bind(client: TestClient) -> None:
    """DeepSeek-V3 fp8 at TP8 x PP4 under TensorRT-LLM on H100, worked in plain fp8 in tests/domain/test_capacity.py
    (stage weights 19,406,979,072, 21,826,928,640 twice, 22,058,612,736 B; KV = 0.9 x (85,029,615,043 - weights -
    7,373,698,279 - 644,245,094)). DeepSeek's fp8 checkpoint (deepseek_fp8) adds 4 B per 16,384 linear weights:
    a GPU's dense layer holds 36,634,624 attention + 49,545,216 MLP = 86,179,840 of them (21,040 B more), a MoE
    layer 36,634,624 + 1,409,286,144 routed + 5,505,024 shared = 1,451,425,792 (354,352 B more). So:
    - first (3 dense + 13 MoE): 19,406,979,072 + 63,120 + 4,606,576 = 19,411,648,768 B; KV 0.9 x 57,600,022,902
      = 51,840,020,611 B // (32 x 1,152 x 16 = 589,824) = 87,890 blocks;
    - middle (15 MoE): 21,826,928,640 + 5,315,280 = 21,832,243,920 B; 0.9 x 55,179,427,750 = 49,661,484,975 B
      // 552,960 = 89,810 blocks;
    - last: 22,058,612,736 + 5,315,280 = 22,063,928,016 B; 0.9 x 54,947,743,654 = 49,452,969,288 B // 552,960 =
      89,433 blocks.
    The replica holds the fewest, 87,890 blocks = 2,812,480 tokens, while `memory` shows the heaviest stage (the
    last)."""
    data = post(client, {"model": "deepseek-v3", "gpu": "h100-sxm", "tensor_parallel": 8, "pipeline_parallel": 4,
                         "weight_dtype": "fp8", "engine": "trtllm", "input_tokens": 1000, "output_tokens": 1000})
    stages = data["memory"]["pipeline_stages"]
    assert [(s["first_layer"], s["layers"], s["weights_bytes_per_gpu"], s["kv_blocks"]) for s in stages] == [
        (0, 16, 19_411_648_768, 87_890), (16, 15, 21_832_243_920, 89_810), (31, 15, 21_832_243_920, 89_810),
        (46, 15, 22_063_928_016, 89_433)]
    assert stages[0]["kv_budget_bytes_per_gpu"] == 51_840_020_611
    assert data["memory"]["weights_bytes_per_gpu"] == 22_063_928_016
    assert (data["kv_blocks"], data["kv_tokens"]) == (87_890, 2_812_480)
    single = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", **WORKLOAD})
    assert [(s["first_layer"], s["layers"], s["kv_blocks"]) for s in single["memory"]["pipeline_stages"]] == [
        (0, 32, single["kv_blocks"])]


def test_sglang_keeps_a_share_of_the_dense_mlps_under_attention_dp(client: TestClient) -> None:
    """DeepSeek-V3 fp8 as DP8 + EP8 on H200 (tests/domain/test_layout.py, in plain fp8: vLLM 100,817,025,024 B a
    GPU, SGLang 95,919,847,424): SGLang splits the 3 dense MLPs and the 58 shared experts over all 8 GPUs, which
    vLLM keeps whole on every rank. DeepSeek's fp8 checkpoint (deepseek_fp8) adds 4 B per 16,384 linear weights:
    vLLM's 96,895,434,752 of them (the batch sweep's test), 23,656,112 B -> 100,840,681,136; SGLang's 11,413,422,080
    attention + 148,635,648 dense + 81,738,596,352 routed + 319,291,392 shared = 93,619,945,472, 22,856,432 B ->
    97,564,392,176 (the dense 148,635,648 + 36,288 = 148,671,936 B, the shared 319,291,392 + 77,952 =
    319,369,344 B). SGLang's LM head follows its whole TP group too (`ParallelLMHead(use_attn_tp_group=
    enable_dp_lm_head)`, off by default): 129,280 / 8 = 16,160 rows of 7,168 in bf16, 231,669,760 B where vLLM holds
    the whole 1,853,358,080, so SGLang's GPU holds 97,564,392,176 - 1,621,688,320 = 95,942,703,856 B:
    4,897,977,280 B less than vLLM's."""
    layout = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "tensor_parallel": 1,
              "data_parallel": 8, "expert_parallel": 8, "input_tokens": 1000, "output_tokens": 1000}
    vllm = post(client, {**layout, "engine": "vllm"})["memory"]
    sglang = post(client, {**layout, "engine": "sglang"})["memory"]
    assert (vllm["weights_bytes_per_gpu"], sglang["weights_bytes_per_gpu"]) == (100_840_681_136, 95_942_703_856)
    groups = {g["group"]: g["bytes"] for g in sglang["weight_groups_per_gpu"]}
    assert (groups["dense_mlp"], groups["shared_experts"]) == (148_671_936, 319_369_344)


def test_fp8_kv_doubles_concurrency(client: TestClient) -> None:
    """A 10 GiB KV budget: reserve 85,029,615,043 − 16,060,522,496 − 10,737,418,240 = 58,231,674,307 B.
    bf16: 10,737,418,240 // (16 x 131,072) = 5,120 blocks = 81,920 tokens, 5,120 // 94 = 54 admitted;
    fp8: 10,240 blocks = 163,840 tokens, 108 admitted."""
    body = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "generic", "gpu_memory_utilization": 1.0,
            "reserved_bytes_per_gpu": 58_231_674_307, **WORKLOAD}
    bf16, fp8 = post(client, body), post(client, {**body, "kv_dtype": "fp8"})
    assert bf16["memory"]["kv_budget_bytes_per_gpu"] == fp8["memory"]["kv_budget_bytes_per_gpu"] == 10 * GIB
    assert (bf16["kv_tokens"], fp8["kv_tokens"]) == (81_920, 163_840)
    assert (bf16["max_concurrency"]["admission"]["sequences"],
            fp8["max_concurrency"]["admission"]["sequences"]) == (54, 108)


def test_mixtral_moe_at_tp2(client: TestClient) -> None:
    """Mixtral-8x7B on 2 x H100 (vLLM defaults, tests/domain/test_capacity.py): 0.92 x 85,029,615,043 =
    78,227,245,839 usable − 46,704,107,520 weights − 1,249,350,936 activation − 2,222,645,576 non-torch
    (2 GPUs) − 934,155,387 graphs = 27,116,986,420 B; // 1,048,576 B per block = 25,860."""
    data = post(client, {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tensor_parallel": 2, **WORKLOAD})
    assert data["memory"]["kv_budget_bytes_per_gpu"] == 27_116_986_420
    assert data["kv_blocks"] == 25_860
    assert "fitted on vLLM 0.19" in data["engine"]["sources"]["activation_bytes_per_gpu"]


def test_mla_latent_is_not_divided_at_tp8(client: TestClient) -> None:
    """DeepSeek-V3 fp8 at TP8 on H200: (512 + 64) x 2 B x 61 layers = 70,272 B per token on every GPU."""
    data = post(client, {"model": "deepseek-v3", "gpu": "h200-sxm", "tensor_parallel": 8,
                         "weight_dtype": "fp8", **WORKLOAD})
    assert data["fits"] is True
    assert data["kv_bytes_per_token_per_gpu"] == 70_272
    assert data["kv_blocks"] == data["memory"]["kv_budget_bytes_per_gpu"] // (16 * 70_272)


def test_max_num_seqs_binds(client: TestClient) -> None:
    data = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", "max_num_seqs": 32, **WORKLOAD})
    for view in ("admission", "steady_state"):
        assert data["max_concurrency"][view]["sequences"] == 32
        assert data["max_concurrency"][view]["limit"] == "max_num_seqs"
        assert data["max_concurrency"][view]["kv_limited_sequences"] > 32
    assert data["operating_point"]["batch_size"] == 32


def test_tensor_parallel_beyond_one_node_is_allowed(client: TestClient) -> None:
    """TP16 spans two 8-GPU H100 nodes; the answer uses the scale-out link and still fits."""
    data = post(client, {"model": "llama-3-70b", "gpu": "h100-sxm", "tensor_parallel": 16, **WORKLOAD})
    assert data["fits"] is True and data["num_gpus"] == 16
    assert data["kv_bytes_per_token_per_gpu"] == 40_960  # 1 replicated KV head x 128 x 2 x 2 B x 80 layers


@pytest.mark.parametrize(("change", "pointer"), [
    ({"tensor_parallel": 3}, "/body/tensor_parallel"),  # 64 heads
    ({"pipeline_parallel": 81}, "/body/pipeline_parallel"),  # 80 layers
    ({"gpu_memory_utilization": 1.5}, "/body/gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0}, "/body/gpu_memory_utilization"),
    ({"input_tokens": -1}, "/body/input_tokens"),
    ({"output_tokens": 0}, "/body/output_tokens"),
    ({"max_model_len": 8193}, "/body/max_model_len"),  # Llama-3-70B has 8,192 positions
    ({"max_model_len": 10_000_001}, "/body/max_model_len"),
    ({"max_num_seqs": 1_000_001}, "/body/max_num_seqs"),
    ({"reserved_bytes_per_gpu": -1}, "/body/reserved_bytes_per_gpu"),
    ({"engine": "tgi"}, "/body/engine"),
    ({"tensor_parallel": "4"}, "/body/tensor_parallel"),
    ({"kv_dtype": "int4"}, "/body/kv_dtype"),
    ({"gpu": "a100-80gb-sxm", "compute_dtype": "fp8"}, "/body/compute_dtype"),  # no fp8 tensor cores
    ({"surprise": 1}, "/body/surprise"),
])
def test_bad_input_is_a_422_naming_the_field(client: TestClient, change: dict[str, Any],
                                              pointer: str) -> None:
    body = {"model": "llama-3-70b", "gpu": "h100-sxm", "tensor_parallel": 4, **WORKLOAD, **change}
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert pointer in [error["pointer"] for error in response.json()["errors"]]


def test_model_must_be_given_exactly_once(client: TestClient) -> None:
    both = client.post("/v1/capacity", json={"model": "llama-3-70b", "model_spec": MODEL_ARCHITECTURE_EXAMPLE,
                                             "gpu": "h100-sxm", **WORKLOAD})
    neither = client.post("/v1/capacity", json={"gpu": "h100-sxm", **WORKLOAD})
    assert both.status_code == neither.status_code == 422


def test_unknown_slugs_and_profiles_are_404(client: TestClient) -> None:
    assert client.post("/v1/capacity", json={"model": "no-such-model", "gpu": "h100-sxm", **WORKLOAD}
                       ).status_code == 404
    assert client.post("/v1/capacity", json={"model": "llama-3-70b", "gpu": "no-such-gpu", **WORKLOAD}
                       ).status_code == 404
    assert_problem(client.post("/v1/capacity", json={"model": "llama-3-70b", "gpu": "h100-sxm", "calibration": "nope",
                                                     **WORKLOAD}), 404, "/body/calibration")


@pytest.mark.parametrize("body", [
    # Extremes a client may send: each is a 200 answer (fits or not), never a 500.
    {"model": "llama-3.1-8b", "gpu": "h100-sxm", "input_tokens": 10_000_000, "output_tokens": 10_000_000},
    {"model": "llama-3.1-8b", "gpu": "h100-sxm", "input_tokens": 100_000, "output_tokens": 1,
     "max_num_batched_tokens": 1},
    {"model": "llama-3.1-8b", "gpu": "t4", **WORKLOAD},
    {"model": "llama-3.1-8b", "gpu": "h100-sxm", "block_size": 65_536, "max_num_seqs": 1_000_000, **WORKLOAD},
    {"model": "llama-3.1-8b", "gpu": "h100-sxm", "reserved_bytes_per_gpu": 10**13, **WORKLOAD},
    {"model": "gpt-oss-120b", "gpu": "h100-sxm", "weight_dtype": "fp4", "engine": "sglang", **WORKLOAD},
    {"model": "gemma-2-9b", "gpu": "l4", "engine": "trtllm", "pipeline_parallel": 42, **WORKLOAD},
])
def test_extremes_are_answers(client: TestClient, body: dict[str, Any]) -> None:
    data = post(client, body)
    assert isinstance(data["fits"], bool)
    assert data["fits"] == (data["reasons"] == [])


def test_documented_examples_are_valid(client: TestClient) -> None:
    """Every request example Swagger UI offers is answered, and every response example is a valid response."""
    request_schema = shapes.CapacityRequest.model_config["json_schema_extra"]
    for example in request_schema["examples"]:  # type: ignore[index]
        post(client, example)
    for name in ("CapacityResponse", "MemoryOut", "ConcurrencyOut", "MaxConcurrencyOut", "OperatingPointOut",
                 "SuggestionOut", "EngineOut", "CapacityAssumptions"):
        shape = getattr(shapes, name)
        for example in shape.model_config["json_schema_extra"]["examples"]:
            shape.model_validate(example)


def test_qwen2_5_7b_at_tp7_is_a_422_naming_the_rules(client: TestClient) -> None:
    """Qwen2.5-7B: 28 heads (7 divides them) but 4 KV heads (7 is neither a divisor nor a multiple) and
    an MLP of 18,944 (= 2^9 x 37, not a multiple of 7). No engine starts with --tensor-parallel-size 7."""
    response = client.post("/v1/capacity", json={"model": "qwen2.5-7b", "gpu": "h100-sxm", "tensor_parallel": 7,
                                                 **WORKLOAD})
    problem = assert_problem(response, 422, "/body/tensor_parallel")
    details = [error["detail"] for error in problem["errors"]]
    assert details == ["tensor_parallel 7 must be a multiple of the 4 KV heads (each KV head is replicated tp/4 times)",
                       "tensor_parallel 7 must divide the MLP width 18,944"]


def test_a_block_fp8_checkpoint_that_vllm_cannot_split_is_a_422(client: TestClient) -> None:
    """Qwen3-235B-A22B in 128 x 128 FP8 blocks (weight_recipe deepseek_fp8, as Qwen/Qwen3-235B-A22B-FP8):
    at TP8 each of its 1,536-wide experts is 1,536 / 8 = 192 columns per rank, 1.5 blocks, which vLLM refuses
    to load (ENGINES.md section 2); with EP8 each rank holds whole experts (moe_tp 8 / 8 = 1) and it loads.
    A disaggregated decode pool at TP8 is refused the same way, named by its own field."""
    body = {"model": "qwen3-235b-a22b", "gpu": "h200-sxm", "weight_recipe": "deepseek_fp8", "engine": "vllm",
            **WORKLOAD}
    problem = assert_problem(client.post("/v1/capacity", json={**body, "tensor_parallel": 8}), 422,
                             "/body/tensor_parallel")
    assert [error["detail"] for error in problem["errors"]] == [
        ("the expert width 1,536 over 8 ranks is 192 per rank, not whole 128x128 blocks of weight_recipe "
         "deepseek_fp8 (fp8_block experts): vLLM loads a block format only in whole blocks per rank")]
    ep8 = post(client, {**body, "tensor_parallel": 8, "expert_parallel": 8})
    assert (ep8["moe_tensor_parallel"], ep8["fits"]) == (1, True)
    assert ep8["assumptions"]["weight_recipe"].startswith("deepseek_fp8: ")
    assert_problem(client.post("/v1/capacity", json={
        **body, "deployment": "disaggregated", "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 8}}),
        422, "/body/decode/tensor_parallel")


def test_deepseek_v3_in_fp8_is_its_block_scaled_checkpoint(client: TestClient) -> None:
    """DeepSeek-V3 ships in FP8 only as DeepSeek's 128 x 128 block checkpoint (models.json notes), so fp8 weights
    are that checkpoint's (deepseek_fp8, said in defaults_used), and vLLM refuses it where a rank would hold part of
    a block: at TP32 each 2,048-wide expert is 64 columns a rank (TP16: 128, one whole block, loads)."""
    body = {"model": "deepseek-v3", "gpu": "h100-sxm", "weight_dtype": "fp8", "engine": "vllm", **WORKLOAD}
    tp16 = post(client, {**body, "tensor_parallel": 16})
    assert tp16["assumptions"]["weight_recipe"].startswith("deepseek_fp8: ")
    assert any(line.startswith("weight_recipe = deepseek_fp8") for line in tp16["assumptions"]["defaults_used"])
    assert_problem(client.post("/v1/capacity", json={**body, "tensor_parallel": 32}), 422, "/body/tensor_parallel")


def test_deepseek_v3_dp8_ep8_keeps_each_ranks_own_kv(client: TestClient) -> None:
    """DeepSeek-V3 fp8 on 8 x H200 under vLLM's accounting. Weights per GPU (derived by hand in plain fp8 in
    tests/domain/test_layout.py; DeepSeek's fp8 checkpoint adds its block scales, the batch sweep's test): TP8
    85,140,064,624 B, DP8+EP8 100,840,681,136 B. The MLA latent costs
    61 x 576 x 2 = 70,272 B per token on a GPU, 1,124,352 B per 16-token block: TP8 copies every token onto all
    8 GPUs, DP8 keeps each rank's own, so the replica holds 8 x (budget // 1,124,352) blocks."""
    body = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "kv_dtype": "bf16", **WORKLOAD}
    tp8 = post(client, {**body, "tensor_parallel": 8})
    dep8 = post(client, {**body, "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8})
    assert (dep8["num_gpus"], dep8["moe_tensor_parallel"], tp8["moe_tensor_parallel"]) == (8, 1, 8)
    assert tp8["memory"]["weights_bytes_per_gpu"] == 85_140_064_624
    assert dep8["memory"]["weights_bytes_per_gpu"] == 100_840_681_136
    assert tp8["kv_bytes_per_token_per_gpu"] == dep8["kv_bytes_per_token_per_gpu"] == 70_272
    assert tp8["kv_blocks"] == tp8["memory"]["kv_budget_bytes_per_gpu"] // 1_124_352
    assert dep8["kv_blocks"] == 8 * (dep8["memory"]["kv_budget_bytes_per_gpu"] // 1_124_352)
    assert dep8["kv_tokens"] == 16 * dep8["kv_blocks"] > 3 * tp8["kv_tokens"]


def test_sglang_dp_attention_reserves_more_and_chunks_each_rank(client: TestClient) -> None:
    """SGLang 0.5.10, DeepSeek-V3 fp8 on 8 x H200 (150,754,820,096 B = 143,771 MiB) as DP8 + EP8: SGLang's tp is
    the 8 GPUs, so cuda_graph_max_bs 512; reserved 512 + 1.5 x 8,192 + 2 x 512 + 8/8 x 1,024 = 14,848 MiB, + 3 x
    512 x 8 = 12,288 and 1.5 x 512 x 8 = 6,144 under DP attention, and no piecewise CUDA graphs (SGLang turns
    them off under DP attention, so it reserves nothing for them): 33,280 MiB, mem_fraction_static
    (143,771 - 33,280) / 143,771 = 0.76852 -> 0.769; each rank prefills 8,192 / 8 = 1,024 tokens per step. As TP8
    (no DP): 14,848 + 1,536 for the piecewise graphs of an MLA model = 16,384 MiB reserved,
    (143,771 - 16,384) / 143,771 = 0.88604 -> 0.886, and chunks of 8,192."""
    body = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "engine": "sglang", **WORKLOAD}
    dep8 = post(client, {**body, "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8})["engine"]
    tp8 = post(client, {**body, "tensor_parallel": 8})["engine"]
    assert (dep8["gpu_memory_utilization"], dep8["max_num_batched_tokens"]) == (0.769, 1024)
    assert "divided by its 8 data-parallel ranks" in dep8["sources"]["max_num_batched_tokens"]
    assert (tp8["gpu_memory_utilization"], tp8["max_num_batched_tokens"]) == (0.886, 8192)


def test_an_sglang_chunk_whose_reserve_exceeds_the_gpu_says_so(client: TestClient) -> None:
    """SGLang 0.5.10, Llama-3.1-8B on one H100 (85,520,809,984 B = 81,559 MiB) with a 65,536-token prefill chunk:
    reserved 512 + 1.5 x 65,536 + 2 x 256 (cuda_graph_max_bs at TP1) + 1/8 x 1,024 + 58 x 8 (piecewise CUDA
    graphs) = 99,920 MiB, more than the GPU: mem_fraction_static (81,559 - 99,920) / 81,559 = -0.22513 -> -0.225.
    SGLang cannot start so: the answer says why, and uses none of the memory (not a negative amount)."""
    answer = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "sglang", "input_tokens": 1000,
                           "output_tokens": 100, "max_num_batched_tokens": 65536})
    assert answer["engine"]["gpu_memory_utilization"] == -0.225
    assert answer["memory"]["usable_bytes_per_gpu"] == 0
    assert answer["fits"] is False
    assert answer["reasons"] == [
        ("sglang sets aside all of the GPU's memory: its memory fraction is -0.225 (SGLang 0.5.10 default "
        "mem_fraction_static for this GPU size and TP x PP (chunked_prefill_size 65536, cuda_graph_max_bs 256)); "
        "give gpu_memory_utilization, or a smaller max_num_batched_tokens")]


@pytest.mark.parametrize(("change", "pointer"), [
    ({"tensor_parallel": 8, "expert_parallel": 2}, "/body/expert_parallel"),  # vLLM: ep is 1 or dp x tp
    ({"tensor_parallel": 2, "expert_parallel": 4}, "/body/expert_parallel"),  # 4 does not divide 2 x 1
    ({"model": "llama-3-70b", "tensor_parallel": 2, "expert_parallel": 2}, "/body/expert_parallel"),  # dense
])
def test_an_invalid_expert_layout_is_a_422(client: TestClient, change: dict[str, Any], pointer: str) -> None:
    body = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", **WORKLOAD, **change}
    assert_problem(client.post("/v1/capacity", json=body), 422, pointer)


@pytest.mark.parametrize("dtype", [{}, {"weight_dtype": "fp4"}])
def test_gpt_oss_in_fp4_is_sized_as_its_one_published_checkpoint(client: TestClient, dtype: dict[str, str]) -> None:
    """gpt-oss ships in fp4 only as OpenAI's MXFP4 checkpoint, so fp4 (given, or the model's published dtype)
    sizes that recipe: attention stays bf16, 1,911,029,760 B (955,514,880 params x 2 B), where reading every
    decoder matrix as MXFP4 would give it 955,514,880 x 4.25 / 8 = 507,617,280 B. All weights: 65,168,968,320 B
    (test_gpt_oss_recipe_counts_each_group_in_its_format), not 65,168,968,320 - 1,911,029,760 + 507,617,280
    = 63,765,555,840 B. defaults_used says which checkpoint was assumed."""
    data = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", **dtype, **WORKLOAD})
    memory = data["memory"]
    assert memory["weights_bytes_per_gpu"] == 65_168_968_320
    groups = {g["group"]: (g["format"], g["bytes"]) for g in memory["weight_groups_per_gpu"]}
    assert groups["attention"] == ("bf16", 1_911_029_760)
    assert data["assumptions"]["weight_recipe"].startswith("gpt_oss_mxfp4: OpenAI gpt-oss")
    assert any(line.startswith("weight_recipe = gpt_oss_mxfp4 (the model's one published fp4 checkpoint")
               for line in data["assumptions"]["defaults_used"])
    explicit = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", "weight_recipe": "gpt_oss_mxfp4",
                             **WORKLOAD})
    assert not any(line.startswith("weight_recipe =") for line in explicit["assumptions"]["defaults_used"])
    assert explicit["kv_tokens"] == data["kv_tokens"]


def test_gpt_oss_recipe_counts_each_group_in_its_format(client: TestClient) -> None:
    """gpt-oss-120b as published (tests/domain/test_recipes.py): MXFP4 experts 60,914,073,600 B, bf16
    attention 1,911,029,760 B, router 26,542,080 B, embedding and head 1,158,266,880 B each, norms and
    biases 789,120 B: 65,168,968,320 B."""
    data = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", "weight_recipe": "gpt_oss_mxfp4", **WORKLOAD})
    memory = data["memory"]
    assert memory["weights_bytes_total"] == memory["weights_bytes_per_gpu"] == 65_168_968_320
    groups = {g["group"]: (g["format"], g["bytes"]) for g in memory["weight_groups_per_gpu"]}
    assert groups["experts"] == ("mxfp4", 60_914_073_600)
    assert groups["attention"] == ("bf16", 1_911_029_760)
    assert data["assumptions"]["weight_dtype"] == "fp4"
    assert data["assumptions"]["weight_recipe"].startswith("gpt_oss_mxfp4: OpenAI gpt-oss")


def test_trtllm_with_a_modelopt_fp8_checkpoint_defaults_to_fp8_kv(client: TestClient) -> None:
    """TensorRT-LLM keeps a ModelOpt checkpoint's kv_cache_quant_algo FP8: 1 byte per value, so Llama-3.1-8B
    caches 2 x 8 x 128 x 1 x 32 = 65,536 B per token; vLLM 0.13 ignores it (bf16, 131,072 B), 0.14 reads it."""
    body = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "weight_recipe": "modelopt_fp8", **WORKLOAD}
    trtllm = post(client, {**body, "engine": "trtllm"})
    assert (trtllm["assumptions"]["kv_dtype"], trtllm["kv_bytes_per_token_per_gpu"]) == ("fp8", 65_536)
    assert "TensorRT-LLM" in trtllm["assumptions"]["kv_dtype_source"]
    assert post(client, {**body, "engine_version": "0.13.0"})["assumptions"]["kv_dtype"] == "bf16"
    assert post(client, {**body, "engine_version": "0.14.0"})["assumptions"]["kv_dtype"] == "fp8"
    assert post(client, {**body, "kv_dtype": "bf16", "engine": "trtllm"})["assumptions"]["kv_dtype_source"] == "given"


@pytest.mark.parametrize(("change", "pointer"), [
    ({"weight_recipe": "gpt_oss_mxfp4", "weight_dtype": "bf16"}, "/body/weight_dtype"),
    ({"weight_recipe": "mxfp4-everything"}, "/body/weight_recipe"),
    ({"engine_version": "latest"}, "/body/engine_version"),
])
def test_recipe_and_version_errors_name_the_field(client: TestClient, change: dict[str, Any], pointer: str) -> None:
    response = client.post("/v1/capacity", json={"model": "gpt-oss-120b", "gpu": "h100-sxm", **WORKLOAD, **change})
    assert response.status_code == 422
    assert pointer in [error["pointer"] for error in response.json()["errors"]]


def test_a_recipe_that_quantizes_none_of_the_models_weights_is_a_422(client: TestClient) -> None:
    """gpt_oss_mxfp4 stores gpt-oss's routed experts in MXFP4 and every other group in bf16: on dense Llama-3.1-8B,
    which has no experts, every weight would stay bf16 while the answer said fp4 (a fuzzing run found it so). It is
    a 422 naming the recipe; on gpt-oss-120b, whose experts it quantizes, it is sized."""
    problem = assert_problem(client.post("/v1/capacity", json={
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "weight_recipe": "gpt_oss_mxfp4", **WORKLOAD}), 422,
        "/body/weight_recipe")
    assert "every one would stay bf16, not fp4" in problem["detail"]
    sized = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", "weight_recipe": "gpt_oss_mxfp4", **WORKLOAD})
    assert "mxfp4" in {group["format"] for group in sized["memory"]["weight_groups_per_gpu"]}


def test_the_documented_answer_is_the_answer_to_the_documented_request(client: TestClient) -> None:
    """The OpenAPI examples of /v1/capacity (vLLM, Llama-3.1-8B on one H100, utilization 0.9, max_model_len 16,384,
    1,000 in / 500 out) show what the service answers to that request: its memory, KV and concurrency figures and
    engine settings (a fuzzing run found them a release of the accounting behind). The operating point's times
    follow the calibration profile and are not compared.

    The example's figures by hand: usable 0.9 x 85,029,615,043 = 76,526,653,538 (.7 dropped); minus the weights
    16,060,522,496, the activation peak 2,058,907,445 (test_the_formulas_state_the_activation_rule_the_answer_used),
    the non-torch 0.25 GiB = 268,435,456 and the CUDA graphs 0.87 GiB = 934,155,387 (vLLM 0.33 charges them) =
    57,204,632,754 B of KV; blocks of 16 x 131,072 = 2,097,152 B: 27,277 blocks = 436,432 tokens; 1,500-token
    requests take 94 blocks: 27,277 // 94 = 290 admitted; 16,384 take 1,024: 26 at the worst."""
    request = shapes.CapacityRequest.model_config["json_schema_extra"]["examples"][0]
    answer = post(client, request)
    example = shapes.CapacityResponse.model_config["json_schema_extra"]["examples"][0]
    assert (example["memory"]["kv_budget_bytes_per_gpu"], example["kv_blocks"], example["kv_tokens"]) == (
        57_204_632_754, 27_277, 436_432)
    assert (example["max_concurrency"]["admission"]["sequences"], example["max_concurrency"]["worst_case"]["sequences"]) \
        == (290, 26)
    for field in ("memory", "kv_bytes_per_token_per_gpu", "kv_tokens", "kv_blocks", "max_concurrency",
                  "max_context_tokens"):
        assert answer[field] == example[field], field
    assert answer["operating_point"]["batch_size"] == example["operating_point"]["batch_size"]
    engine = {key: value for key, value in answer["engine"].items() if key != "sources"}
    assert engine == {key: value for key, value in example["engine"].items() if key != "sources"}
    assert example["engine"]["sources"].items() <= answer["engine"]["sources"].items()


def test_the_formulas_state_the_activation_rule_the_answer_used(client: TestClient) -> None:
    """vLLM 0.33, Llama-3.1-8B on one H100: its V1 profile run peaks at the sampler's 1,024 sequences x 128,256
    vocab = 131,334,144 logits x (2 B + 12.213 B of float32 copies) = 1,866,652,189 B (rounded) + the 192,255,256 B
    base (0.179 GiB) = 2,058,907,445 B; the formulas say so (they gave only the 4.76 GiB scaling of vLLM before
    0.8 and TensorRT-LLM, which a fuzzing run found beside this answer)."""
    answer = post(client, {"model": "llama-3.1-8b", "gpu": "h100-sxm", **WORKLOAD})
    assert answer["memory"]["activation_bytes_per_gpu"] == 2_058_907_445
    rule = next(f for f in answer["assumptions"]["formulas"] if f.startswith("activation peak"))
    assert "vllm from 0.8 (V1) = 0.179 GiB + max(" in rule and "12.2 B of float32 copies per logit" in rule


def test_every_view_charges_a_windowed_model_in_full_attention_equivalent_tokens(client: TestClient) -> None:
    """gpt-oss-120b (36 layers, every other one a 128-token sliding window) on vLLM 0.19, 1,000 in / 1,000 out:
    kv_tokens counts tokens held in every layer, so each view charges a request the same way. In blocks of 16 a
    window layer holds at most ceil(127 / 16) + 1 = 9 blocks = 144 slots (its window straddling a block boundary).
    Admission, 2,000 tokens: (18 x 2,000 + 18 x 144) / 36 = 1,072 per layer; worst case, max_model_len 131,072:
    (18 x 131,072 + 18 x 144) / 36 = 65,608. kv_tokens / tokens_per_request then gives each view's sequences
    (a fuzzing run found admission and worst case charged 2,000 and 131,072 raw tokens beside the steady state's
    826 layer-equivalent ones)."""
    answer = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", "weight_dtype": "fp4", "engine_version": "0.19.0",
                           "input_tokens": 1000, "output_tokens": 1000})
    views, tokens = answer["max_concurrency"], answer["kv_tokens"]
    assert views["admission"]["tokens_per_request"] == 1072
    assert views["worst_case"]["tokens_per_request"] == 65_608
    for view in views.values():
        assert view["kv_limited_sequences"] == int(tokens / view["tokens_per_request"])


def test_an_fp32_checkpoint_served_in_bf16_caches_bf16(client: TestClient) -> None:
    """A model published in fp32 (Gemma-2's config says float32) is served in bf16 (weight dtypes stop at 16 bits),
    and vLLM's 'auto' KV dtype is the dtype it runs (ENGINES.md 1.1: "--kv-cache-dtype auto = model dtype"). The
    Llama-3-70B geometry caches 2 x 8 heads x 128 x 80 layers x 2 B = 327,680 B a token in bf16, 163,840 B on each
    GPU of TP2; it cached fp32 beside the bf16 weights (twice that: half the tokens)."""
    spec = {**MODEL_ARCHITECTURE_EXAMPLE, "dtype": "fp32"}
    body = {"model_spec": spec, "gpu": "h200-sxm", "tensor_parallel": 2, "input_tokens": 1000, "output_tokens": 500}
    served = post(client, body)
    assert (served["assumptions"]["weight_dtype"], served["assumptions"]["kv_dtype"]) == ("bf16", "bf16")
    assert served["kv_bytes_per_token_per_gpu"] == 163_840


def test_sglang_caps_a_given_running_limit_at_its_request_pool(client: TestClient) -> None:
    """SGLang 0.5.10 sizes one scheduler's request pool at clamp(KV tokens / context_len x 512, 2048, 4096) slots
    and caps a given --max-running-requests there (`_resolve_max_num_reqs`). Llama-3.1-8B on an H200 with
    max_model_len 8,192 holds far more than 8 x 8,192 = 65,536 KV tokens (16 GB of its 141 GB at 131,072 B a
    token), so the pool is 4,096 slots and 8,192 runs as 4,096; vLLM runs the 8,192 it is given."""
    body = {"model": "llama-3.1-8b", "gpu": "h200-sxm", "max_model_len": 8192, "max_num_seqs": 8192,
            "input_tokens": 1000, "output_tokens": 200}
    sglang = post(client, {**body, "engine": "sglang"})["engine"]
    assert sglang["max_num_seqs"] == 4096
    assert "caps it at its request pool: 4096 requests" in sglang["sources"]["max_num_seqs"]
    assert post(client, {**body, "engine": "vllm"})["engine"]["max_num_seqs"] == 8192


def test_sglang_divides_a_given_running_limit_among_the_attention_ranks(client: TestClient) -> None:
    """Under --enable-dp-attention SGLang gives each rank max_running_requests // dp_size (SGLang 0.5.10
    `_resolve_max_num_reqs`), as it divides the prefill chunk: DeepSeek-V3 over 8 ranks launched with 1,024 runs
    1,024 / 8 = 128 a rank, under the pool's 2,048 floor; vLLM gives each rank the whole 1,024."""
    body = {"model": "deepseek-v3", "gpu": "h200-sxm", "tensor_parallel": 1, "data_parallel": 8,
            "expert_parallel": 8, "weight_dtype": "fp8", "max_num_seqs": 1024, "input_tokens": 1000,
            "output_tokens": 200}
    sglang = post(client, {**body, "engine": "sglang"})["engine"]
    assert sglang["max_num_seqs"] == 128
    assert "divided by its 8 data-parallel ranks" in sglang["sources"]["max_num_seqs"]
    assert post(client, {**body, "engine": "vllm"})["engine"]["max_num_seqs"] == 1024
