"""/v1/capacity and /v1/roofline for a disaggregated deployment: a prefill pool and a decode pool, each with
its own GPU, layout and workers, and the prompt's KV cache moved between them.

Llama-3.1-70B (config.json: 80 layers, 8 KV heads of 128, hidden 8,192, MLP 28,672, vocab 128,256) with fp8
weights and fp8 KV on H100 SXM (gpus.csv: 85,520,809,984 B as nvidia-smi reports; NVLink 450 GB/s per
direction, 8 GPUs per HGX node; one 400 Gb/s NIC = 50 GB/s per GPU), 8,192 tokens in and 1,024 out, a TP4
prefill pool and a TP8 decode pool. tests/domain/test_disaggregation.py derives the per-pool memory at
length; the figures below repeat it.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.problems import assert_problem

# The generic engine subtracts only what it is given: utilization 1.0 of 85,029,615,043 B (what CUDA reports),
# 5e9 B kept back.
CAPACITY = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
            "engine": "generic", "gpu_memory_utilization": 1.0, "reserved_bytes_per_gpu": 5_000_000_000,
            "deployment": "disaggregated", "prefill": {"tensor_parallel": 4, "workers": 2},
            "decode": {"tensor_parallel": 8}, "input_tokens": 8192, "output_tokens": 1024}
ROOFLINE = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
            "deployment": "disaggregated", "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 8},
            "prompt_tokens": 8192, "batch_size": 64}
# One prompt's KV: 2 x 8 KV heads x 128 x 1 B (fp8) x 80 layers = 163,840 B per token, x 8,192 tokens =
# 1,342,177,280 B; each TP8 decode GPU holds 1 KV head: 1,342,177,280 / 8 = 167,772,160 B.
PROMPT_KV_BYTES = 1_342_177_280
PROMPT_KV_BYTES_PER_TP8_GPU = 167_772_160
# 4 + 8 = 12 GPUs, more than one 8-GPU node: over the network, 22.4 us + 167,772,160 / 50e9 s = 3.3778432 ms.
NETWORK_TRANSFER_MS = 0.0224 + 167_772_160 / 50e9 * 1e3


def post(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_capacity_of_each_pool_and_the_transfer(client: TestClient) -> None:
    """Prefill worker (TP4): 85,029,615,043 - 18,166,071,296 weights - 5e9 = 61,863,543,747 B of KV per GPU;
    40,960 B per token per GPU (2 KV heads), blocks of 16 = 655,360 B: 94,396 blocks = 1,510,336 tokens; a
    prompt of 8,192 tokens (512 blocks) held until its transfer: 94,396 // 512 = 184 in flight per worker,
    368 for two workers.
    Decode worker (TP8): 85,029,615,043 - 9,084,354,560 - 5e9 = 70,945,260,483 B; 20,480 B per token per GPU,
    blocks of 327,680 B: 216,507 blocks = 3,464,112 tokens; a request of 8,192 + 1,024 = 9,216 tokens (576
    blocks): 216,507 // 576 = 375 concurrent requests."""
    answer = post(client, "/v1/capacity", CAPACITY)
    assert answer["deployment"] == "disaggregated" and answer["fits"] and answer["reasons"] == []
    pools = answer["disaggregation"]
    prefill, decode = pools["prefill"], pools["decode"]
    assert (prefill["role"], prefill["tensor_parallel"], prefill["workers"], prefill["gpus"]) == ("prefill", 4, 2, 8)
    assert prefill["memory"]["weights_bytes_per_gpu"] == 18_166_071_296
    assert prefill["memory"]["kv_budget_bytes_per_gpu"] == 61_863_543_747
    assert (prefill["kv_bytes_per_token_per_gpu"], prefill["kv_tokens_per_worker"]) == (40_960, 1_510_336)
    assert prefill["tokens_per_request"] == 8192
    assert prefill["requests_per_worker"] == {"sequences": 184, "kv_limited_sequences": 184, "limit": "kv_cache",
                                              "tokens_per_request": 8192.0}
    assert prefill["requests"] == 368
    assert (decode["role"], decode["tensor_parallel"], decode["workers"], decode["gpus"]) == ("decode", 8, 1, 8)
    assert decode["memory"]["weights_bytes_per_gpu"] == 9_084_354_560
    assert decode["memory"]["kv_budget_bytes_per_gpu"] == 70_945_260_483
    assert (decode["kv_bytes_per_token_per_gpu"], decode["kv_tokens_per_worker"]) == (20_480, 3_464_112)
    assert decode["tokens_per_request"] == 9216
    assert decode["requests_per_worker"]["sequences"] == decode["requests"] == 375
    # 2 x 4 prefill GPUs + 8 decode GPUs = 16, past one node: the network.
    assert pools["kv_transfer"] == pytest.approx({
        "link": "network", "mean_prompt_tokens": 8192, "bytes_per_request": PROMPT_KV_BYTES,
        "bytes_per_gpu": PROMPT_KV_BYTES_PER_TP8_GPU, "bandwidth_bytes_per_s": 50e9, "latency_ms": 0.0224,
        "time_ms": NETWORK_TRANSFER_MS})
    # The top level is one decode worker, as in /v1/slo-plan's disaggregated plans.
    assert (answer["tensor_parallel"], answer["num_gpus"], answer["kv_tokens"]) == (8, 8, 3_464_112)
    assert answer["max_concurrency"]["admission"]["sequences"] == 375
    point = answer["operating_point"]
    assert point["expected_prefill_ms"] == 0 and point["expected_tpot_ms"] == point["expected_decode_step_ms"]
    # Users thinking 60 s: the decode worker's 375 being answered plus its requests/s x 60 thinking.
    thinking = client.post("/v1/capacity", json={**CAPACITY, "think_time_s": 60}).json()["operating_point"]
    assert thinking["users_at_think_time"] == pytest.approx(375 + point["expected_requests_per_s"] * 60)


def test_capacity_states_what_each_pool_sustains_and_which_one_limits_the_deployment(client: TestClient) -> None:
    """The deployment sustains the lower of its pools' rates. A prompt of 8,192 tokens fills the 8,192-token budget
    alone, so a prefill worker prefills 1 / (its prompt's time) prompts/s (tests/domain/test_capacity.py); the decode
    pool sustains its workers x the top-level operating point (one decode worker). Two TP4 prefill workers (about
    2.4 prompts/s each) limit one TP8 decode worker of 375 requests (about 7.3 requests/s); 32 of them do not, and
    the decode worker's rate is then the deployment's (a fuzzing run found the prefill pool ignored)."""
    answer = post(client, "/v1/capacity", CAPACITY)
    pools, point = answer["disaggregation"], answer["operating_point"]
    prefill, decode = pools["prefill"], pools["decode"]
    assert prefill["expected_requests_per_s"] == pytest.approx(2 * prefill["expected_requests_per_s_per_worker"])
    assert decode["expected_requests_per_s_per_worker"] == point["expected_requests_per_s"]
    assert decode["expected_requests_per_s"] == point["expected_requests_per_s"]  # one decode worker
    assert prefill["expected_requests_per_s"] < decode["expected_requests_per_s"]
    assert (pools["expected_requests_per_s"], pools["limited_by"]) == (prefill["expected_requests_per_s"], "prefill")
    wide = post(client, "/v1/capacity", {**CAPACITY, "prefill": {"tensor_parallel": 4, "workers": 32}})["disaggregation"]
    assert wide["prefill"]["expected_requests_per_s_per_worker"] == prefill["expected_requests_per_s_per_worker"]
    assert wide["prefill"]["expected_requests_per_s"] == pytest.approx(32 * prefill["expected_requests_per_s_per_worker"])
    assert (wide["expected_requests_per_s"], wide["limited_by"]) == (decode["expected_requests_per_s"], "decode")


def test_capacity_pools_inside_one_node_move_the_kv_over_nvlink(client: TestClient) -> None:
    """TP4 + TP4 = 8 GPUs, one HGX node: NVLink. Each TP4 decode GPU holds 2 KV heads of the prompt:
    8,192 x 2 x 2 x 128 x 1 B x 80 = 335,544,320 B; 11.8 us + 335,544,320 / 450e9 s = 0.75745 ms."""
    body = {**CAPACITY, "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 4}}
    transfer = post(client, "/v1/capacity", body)["disaggregation"]["kv_transfer"]
    assert transfer["link"] == "nvlink" and transfer["bytes_per_gpu"] == 335_544_320
    assert transfer["time_ms"] == pytest.approx(0.0118 + 335_544_320 / 450e9 * 1e3)


def test_sglang_pools_inside_one_node_move_the_kv_over_the_network(client: TestClient) -> None:
    """The same 8 GPUs under SGLang: its default Mooncake transfer engine moves the KV over RDMA, through the
    NICs, even inside one node (ENGINES.md section 3): 22.4 us + 335,544,320 / 50e9 s = 6.7333 ms."""
    body = {**CAPACITY, "engine": "sglang", "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 4}}
    for key in ("gpu_memory_utilization", "reserved_bytes_per_gpu"):
        body.pop(key)
    transfer = post(client, "/v1/capacity", body)["disaggregation"]["kv_transfer"]
    assert (transfer["link"], transfer["bandwidth_bytes_per_s"], transfer["bytes_per_gpu"]) == (
        "network", 50e9, 335_544_320)
    assert transfer["time_ms"] == pytest.approx(0.0224 + 335_544_320 / 50e9 * 1e3)


def test_sglang_pools_across_an_nvl72_move_the_kv_over_nvlink_with_mnnvl_on(client: TestClient) -> None:
    """Across a GB200 NVL72 (72 GPUs in one NVLink domain, beyond one host) SGLang moves the KV over NVLink
    only with SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True MC_FORCE_MNNVL=True (ENGINES.md section 3): the answer takes
    NVLink (gpus.csv: 900 GB/s per direction) and says the setting it assumes. DeepSeek-V3 fp8 with fp8 KV, an
    8,192-token prompt on a TP8 decode pool: its MLA latent (512 + 64 values x 61 layers x 1 B = 35,136 B per
    token) is whole on every decode GPU: 8,192 x 35,136 = 287,834,112 B; 11.8 us + 287,834,112 / 900e9 s =
    0.331616 ms."""
    body = {"model": "deepseek-v3", "gpu": "gb200", "weight_dtype": "fp8", "kv_dtype": "fp8", "engine": "sglang",
            "deployment": "disaggregated", "prefill": {"tensor_parallel": 8}, "decode": {"tensor_parallel": 8},
            "input_tokens": 8192, "output_tokens": 1024}
    answer = post(client, "/v1/capacity", body)
    transfer = answer["disaggregation"]["kv_transfer"]
    assert (transfer["link"], transfer["bandwidth_bytes_per_s"], transfer["bytes_per_gpu"]) == (
        "nvlink", 900e9, 287_834_112)
    assert transfer["time_ms"] == pytest.approx(0.0118 + 287_834_112 / 900e9 * 1e3)
    assert ("KV transfer over nvlink with SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True MC_FORCE_MNNVL=True set for both "
            "pools' workers") in answer["assumptions"]["defaults_used"]


def test_capacity_reasons_name_the_pool_that_cannot_serve(client: TestClient) -> None:
    """80e9 B kept back on each GPU: 85,520,809,984 - 18,166,071,296 (TP4 weights) - 80e9 < 0 and
    85,520,809,984 - 9,084,354,560 (TP8) - 80e9 < 0, so neither pool has KV cache left: both fail, each
    reason prefixed with its pool."""
    body = {**CAPACITY, "reserved_bytes_per_gpu": 80_000_000_000}
    answer = post(client, "/v1/capacity", body)
    assert not answer["fits"]
    assert [reason.split(":")[0] for reason in answer["reasons"]] == ["prefill pool", "decode pool"]
    assert not answer["disaggregation"]["prefill"]["fits"] and not answer["disaggregation"]["decode"]["fits"]


def test_roofline_of_each_pool_and_the_transfer(client: TestClient) -> None:
    """The prefill pool prefills one 8,192-token prompt at TP4, the decode pool decodes 64 sequences of 8,192
    cached tokens (default: the prompt) at TP8: the same steps /v1/roofline times for each alone. TTFT through
    idle pools = prefill step + transfer (over the network: 12 GPUs) + the decode step."""
    answer = post(client, "/v1/roofline", ROOFLINE)
    common = {key: ROOFLINE[key] for key in ("model", "gpu", "weight_dtype", "kv_dtype")}
    prefill = post(client, "/v1/roofline", {**common, "phase": "prefill", "prompt_tokens": 8192,
                                            "tensor_parallel": 4})
    decode = post(client, "/v1/roofline", {**common, "phase": "decode", "batch_size": 64, "context_tokens": 8192,
                                           "tensor_parallel": 8})
    pools = answer["disaggregation"]
    assert answer["deployment"] == "disaggregated"
    assert (answer["phase"], answer["tensor_parallel"], answer["expected_time_ms"]) == (
        "decode", 8, decode["expected_time_ms"])
    assert (pools["prefill"]["tokens"], pools["prefill"]["batch_size"]) == (8192, 1)
    assert pools["prefill"]["expected_time_ms"] == prefill["expected_time_ms"]
    assert (pools["decode"]["tokens"], pools["decode"]["context_tokens"]) == (64, 8192)
    assert pools["decode"]["expected_time_ms"] == decode["expected_time_ms"]
    assert pools["kv_transfer"]["link"] == "network"
    assert pools["kv_transfer"]["bytes_per_request"] == PROMPT_KV_BYTES
    assert pools["kv_transfer"]["bytes_per_gpu"] == PROMPT_KV_BYTES_PER_TP8_GPU
    assert pools["kv_transfer"]["time_ms"] == pytest.approx(NETWORK_TRANSFER_MS)
    assert pools["ttft_ms"] == pytest.approx(prefill["expected_time_ms"] + NETWORK_TRANSFER_MS
                                             + decode["expected_time_ms"])
    # A dense model's MLP splits over the TP group (moe_tensor_parallel = tp x dp / ep); one step has no stages.
    assert [(pools[role]["moe_tensor_parallel"], pools[role]["layout"]) for role in ("prefill", "decode")] == [
        (4, "TP4"), (8, "TP8")]


def test_requests_without_the_new_fields_mean_what_they_meant(client: TestClient) -> None:
    aggregated = post(client, "/v1/capacity", {"model": "llama-3.1-8b", "gpu": "h100-sxm", "input_tokens": 1000,
                                               "output_tokens": 500})
    assert (aggregated["deployment"], aggregated["disaggregation"]) == ("aggregated", None)
    assert aggregated["operating_point"]["expected_prefill_ms"] > 0
    step = post(client, "/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode",
                                         "context_tokens": 1024})
    assert (step["deployment"], step["disaggregation"]) == ("aggregated", None)


@pytest.mark.parametrize(("path", "change", "pointer"), [
    # Pools without deployment disaggregated, and the reverse.
    ("/v1/capacity", {"deployment": "aggregated"}, "/body/prefill"),
    ("/v1/capacity", {"decode": None}, "/body/decode"),
    # The request's own layout belongs to an aggregated deployment.
    ("/v1/capacity", {"tensor_parallel": 8}, "/body/tensor_parallel"),
    # 64 attention heads do not split over 3 GPUs.
    ("/v1/capacity", {"decode": {"tensor_parallel": 3}}, "/body/decode/tensor_parallel"),
    # Llama is dense: no experts to deal out.
    ("/v1/capacity", {"prefill": {"tensor_parallel": 4, "expert_parallel": 4}}, "/body/prefill/expert_parallel"),
    ("/v1/capacity", {"prefill": {"tensor_parallel": 4, "workers": 0}}, "/body/prefill/workers"),
    ("/v1/roofline", {"phase": "decode"}, "/body/phase"),
    ("/v1/roofline", {"prompt_tokens": None}, "/body/prompt_tokens"),
    ("/v1/roofline", {"prefill": {"tensor_parallel": 4, "pipeline_parallel": 2}}, "/body/prefill/pipeline_parallel"),
])
def test_invalid_combinations_name_the_field(client: TestClient, path: str, change: dict[str, Any],
                                             pointer: str) -> None:
    body = {**(CAPACITY if path == "/v1/capacity" else ROOFLINE), **change}
    assert_problem(client.post(path, json={k: v for k, v in body.items() if v is not None}), 422, pointer)


def test_an_aggregated_roofline_still_needs_its_phase(client: TestClient) -> None:
    assert_problem(client.post("/v1/roofline", json={"model": "llama-3-8b", "gpu": "h100-sxm",
                                                     "context_tokens": 10}), 422, "/body/phase")


@pytest.mark.parametrize("path", ["/v1/capacity", "/v1/roofline"])
def test_an_unknown_gpu_in_a_pool_is_404(client: TestClient, path: str) -> None:
    body = {**(CAPACITY if path == "/v1/capacity" else ROOFLINE), "decode": {"gpu": "no-such-gpu"}}
    assert_problem(client.post(path, json=body), 404, "/body/decode/gpu")


def test_a_pool_on_another_gpu(client: TestClient) -> None:
    """Decode on H200s, prefill on H100s: two GPU types never share NVLink, so the network at the slower NIC
    (both 50 GB/s); each pool's memory comes from its own GPU (an H200's 150,754,820,096 B: more KV)."""
    answer = post(client, "/v1/capacity", {**CAPACITY, "decode": {"gpu": "h200-sxm", "tensor_parallel": 8}})
    pools = answer["disaggregation"]
    assert (answer["gpu"], pools["decode"]["gpu"], pools["prefill"]["gpu"]) == ("h200-sxm", "h200-sxm", "h100-sxm")
    assert pools["decode"]["memory"]["total_bytes_per_gpu"] == 150_754_820_096
    assert pools["kv_transfer"]["link"] == "network"


def test_the_roofline_chart_draws_one_gpu_only(client: TestClient) -> None:
    assert_problem(client.post("/v1/roofline/chart", json=ROOFLINE), 422, "/body/deployment")


def test_a_pool_layout_its_engine_refuses(client: TestClient) -> None:
    """vLLM's --enable-expert-parallel is all or nothing (expert_parallel = data_parallel x tensor_parallel,
    ENGINES.md): Mixtral's 8 experts over EP2 inside a TP4 decode worker is refused by vLLM, named in the
    pool; the generic engine, which has no such rule, sizes it."""
    body = {"model": "mixtral-8x7b", "gpu": "h100-sxm", "deployment": "disaggregated",
            "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 4, "expert_parallel": 2},
            "input_tokens": 2000, "output_tokens": 500}
    assert_problem(client.post("/v1/capacity", json={**body, "engine": "vllm"}), 422, "/body/decode/expert_parallel")
    answer = post(client, "/v1/capacity", {**body, "engine": "generic"})
    assert answer["disaggregation"]["decode"]["expert_parallel"] == 2
    # Each expert over 4 x 1 / 2 = 2 GPUs; the pools name their layouts as the planner's do.
    decode, prefill = answer["disaggregation"]["decode"], answer["disaggregation"]["prefill"]
    assert (decode["moe_tensor_parallel"], decode["layout"]) == (2, "TP4 EP2 PP1")
    assert (prefill["moe_tensor_parallel"], prefill["layout"]) == (4, "TP4 PP1")


def test_sglang_workers_set_nothing_aside_for_piecewise_graphs(client: TestClient) -> None:
    """SGLang 0.5.10 turns its piecewise CUDA graphs off under PD disaggregation (`_handle_piecewise_cuda_graph`),
    before it sizes its reserve, so a worker of either pool sets nothing aside for them. Llama-3.1-8B on H100 at
    TP1 (81,559 MiB, chunks of 8,192, cuda_graph_max_bs 256): 512 + 1.5 x 8,192 + 2 x 256 + 1/8 x 1,024 = 13,440
    MiB, (81,559 - 13,440) / 81,559 = 0.83521 -> 0.835 (aggregated, with the graphs' 464 MiB: 0.830).
    DeepSeek-V3 fp8 at TP8 on H200 (143,771 MiB, cuda_graph_max_bs 512): 512 + 12,288 + 1,024 + 1,024 = 14,848
    MiB, (143,771 - 14,848) / 143,771 = 0.89672 -> 0.897 (aggregated, with MLA's 1,536 MiB: 0.886)."""
    pools = {"deployment": "disaggregated", "prefill": {"tensor_parallel": 1}, "decode": {"tensor_parallel": 1}}
    body = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "sglang", "input_tokens": 1000,
            "output_tokens": 200}
    answer = client.post("/v1/capacity", json={**body, **pools}).json()["disaggregation"]
    assert answer["prefill"]["engine"]["gpu_memory_utilization"] == answer["decode"]["engine"][
        "gpu_memory_utilization"] == 0.835
    assert "no piecewise CUDA graphs" in answer["decode"]["engine"]["sources"]["gpu_memory_utilization"]
    assert client.post("/v1/capacity", json=body).json()["engine"]["gpu_memory_utilization"] == 0.830
    deepseek = {"model": "deepseek-v3", "gpu": "h200-sxm", "engine": "sglang", "weight_dtype": "fp8",
                "input_tokens": 1000, "output_tokens": 200}
    answer = client.post("/v1/capacity", json={**deepseek, "deployment": "disaggregated",
                                               "prefill": {"tensor_parallel": 8},
                                               "decode": {"tensor_parallel": 8}}).json()["disaggregation"]
    assert answer["prefill"]["engine"]["gpu_memory_utilization"] == 0.897
    aggregated = client.post("/v1/capacity", json={**deepseek, "tensor_parallel": 8}).json()
    assert aggregated["engine"]["gpu_memory_utilization"] == 0.886
