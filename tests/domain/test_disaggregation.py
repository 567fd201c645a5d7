"""Disaggregated prefill/decode: the KV transfer, the per-request composition of TTFT, and pool sizing.

Expected values are worked by hand in each docstring from the architecture (Llama-3.1-70B's config.json)
and the GPU datasheet (H100 SXM: NVLink 4, 900 GB/s bidirectional = 450 GB/s per direction; one
400 Gb/s NIC per GPU = 50 GB/s per direction; gpus.csv and SIZING.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from app.sizing.engines import EngineConfig
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.layout import Layout
from app.sizing.serving.capacity import LIMIT_KV_CACHE, LIMIT_MAX_NUM_SEQS, ConcurrencyView
from app.sizing.serving.disaggregated_loop import (
    PoolRanks,
    closed_loop,
    fixed_closed_loop_requests,
    plan_closed_loop,
)
from app.sizing.serving.disaggregation import (
    NETWORK,
    NETWORK_TRANSFER_LATENCY_S,
    NVLINK,
    NVLINK_TRANSFER_LATENCY_S,
    PCIE,
    PoolTimes,
    _decode_guess,
    _pool_option,
    _PoolOption,
    _prefill_share,
    _simulate_role,
    _size_pools,
    combine,
    decode_role_requests,
    deployment_link,
    deployment_nodes,
    fewest_workers,
    kv_transfer,
    plan_disaggregated,
    pool_capacity,
    prefill_role_requests,
    transfer_link,
    transfer_times_s,
)
from app.sizing.serving.plan import (
    DECODE_POOL,
    PREFILL_POOL,
    Configuration,
    HaPolicy,
    Infeasible,
    PlanInputs,
    Slo,
    _Planner,
    configurations,
)
from app.sizing.serving.simulate import SchedulerConfig, simulate
from app.sizing.serving.workload import Fixed, Requests, Workload
from app.sizing.specs import COMPUTE_DTYPES, GpuSpec
from tests.domain.models_for_tests import DEEPSEEK_V3, LLAMA_3_8B, LLAMA_3_70B

# meta-llama/Llama-3.1-70B config.json: the KV geometry of Llama-3-70B (80 layers, 8 KV heads of 128),
# with 131,072 positions.
LLAMA_3_1_70B = dataclasses.replace(LLAMA_3_70B, name="Llama-3.1-70B", slug="llama-3.1-70b",
                                    max_position_embeddings=131_072)
H100 = GpuSpec(name="H100 SXM", slug="h100-sxm", memory_bytes=85_520_809_984, memory_bandwidth_bytes_per_s=3.35e12,
               interconnect_bandwidth_bytes_per_s=450e9, gpus_per_node=8, scale_out_bandwidth_bytes_per_s=50e9,
               bf16_flops_per_s=989.5e12, fp8_flops_per_s=1979e12, price_per_hour_usd=3.0)


def test_nccl_latency_model_of_one_transfer() -> None:
    """NCCL's Simple protocol: base 8.4 us + one hop, 3.4 us over NVLink, 14 us over the network."""
    assert NVLINK_TRANSFER_LATENCY_S == pytest.approx(11.8e-6)
    assert NETWORK_TRANSFER_LATENCY_S == pytest.approx(22.4e-6)


@pytest.mark.parametrize(("link", "bandwidth", "latency", "expected_s"), [
    # 167,772,160 B / 450e9 B/s = 372.827 us, + 11.8 us = 384.627 us
    (NVLINK, 450e9, 11.8e-6, 167_772_160 / 450e9 + 11.8e-6),
    # 167,772,160 B / 50e9 B/s = 3,355.4432 us, + 22.4 us = 3,377.8432 us
    (NETWORK, 50e9, 22.4e-6, 167_772_160 / 50e9 + 22.4e-6),
])
def test_kv_transfer_of_an_8k_prompt_of_llama_3_1_70b_in_fp8(link: str, bandwidth: float, latency: float,
                                                             expected_s: float) -> None:
    """One 8,192-token prompt, fp8 KV, decoded on TP8.

    Per token and layer: K and V x 8 KV heads x 128 dims x 1 byte = 2,048 B; x 80 layers = 163,840 B per
    token; x 8,192 tokens = 1,342,177,280 B for the request. TP8 gives each decode GPU 8 / 8 = 1 KV head:
    1,342,177,280 / 8 = 167,772,160 B per GPU, all GPUs receiving in parallel.
    """
    transfer = kv_transfer(LLAMA_3_1_70B, 8192, "fp8", decode_tensor_parallel=8, decode_pipeline_parallel=1,
                           link=link, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    assert transfer.bytes_per_request == 1_342_177_280
    assert transfer.bytes_per_gpu == 167_772_160
    assert transfer.time_s == pytest.approx(expected_s, rel=1e-12)
    assert expected_s == pytest.approx(384.627e-6 if link == NVLINK else 3_377.843e-6, abs=1e-9)


def test_the_transfer_takes_nvlink_only_inside_one_nvlink_domain() -> None:
    """8 GPUs fit one HGX H100 node (NVLink); a ninth crosses the scale-out network."""
    assert transfer_link(H100, 8) == (NVLINK, 450e9, NVLINK_TRANSFER_LATENCY_S)
    assert transfer_link(H100, 9) == (NETWORK, 50e9, NETWORK_TRANSFER_LATENCY_S)
    nvl72 = dataclasses.replace(H100, gpus_per_node=72)
    assert transfer_link(nvl72, 72)[0] == NVLINK


def test_pcie_cards_move_the_kv_over_pcie_inside_a_node() -> None:
    """gpus.csv `l40s`: "PCIe Gen4 x16 (64 GB/s bidir; no NVLink)", 32e9 B/s a direction. Inside its node the KV
    moves over that link, named pcie (it was named nvlink); a ninth card crosses the network. Llama-3.1-70B fp8,
    8,192 tokens at decode TP4: 80 x 8 x 128 x 2 x 1 B x 8,192 / 4 = 335,544,320 B a GPU, 335,544,320 / 32e9 =
    10.4858 ms + 11.8 us."""
    pcie = dataclasses.replace(H100, name="NVIDIA L40S", slug="l40s", interconnect_bandwidth_bytes_per_s=32e9,
                               pcie_links=True)
    assert transfer_link(pcie, 8) == (PCIE, 32e9, NVLINK_TRANSFER_LATENCY_S)
    assert transfer_link(pcie, 9)[0] == NETWORK
    transfer = kv_transfer(LLAMA_3_1_70B, 8192, "fp8", decode_tensor_parallel=4, decode_pipeline_parallel=1,
                           link=PCIE, bandwidth_bytes_per_s=32e9, latency_s=11.8e-6)
    assert transfer.bytes_per_gpu == 335_544_320
    assert transfer.time_s == pytest.approx(335_544_320 / 32e9 + 11.8e-6, rel=1e-12)


def test_pools_of_one_gpu_type_share_nodes() -> None:
    """8-GPU H100 nodes. A TP4 prefill and a TP4 decode worker: 8 GPUs, one node, as the NVLink transfer between
    them assumes (a review found 2 nodes beside an NVLink transfer: each pool's nodes counted apart). Two TP4
    prefill workers and a TP8 decode worker: 16 GPUs, 2 nodes. A TP2 DP3 prefill worker (6 GPUs) and a TP4
    decode worker: 10 GPUs that no node holds together, 2 nodes. Three TP6 workers: 3 nodes (6 + 6 > 8). A
    DP16 decode worker (TP1, 16 GPUs: two nodes of its own) beside one TP4 prefill worker: 3. On two GPU types
    each pool counts its own: TP4 + TP4 on H100 and H200, 2."""
    def pool(tp: int, workers: int, dp: int = 1, gpu: GpuSpec = H100) -> SimpleNamespace:
        return SimpleNamespace(configuration=Configuration(gpu, tp, 1, "fp8", "fp8", data_parallel=dp),
                               workers=workers)

    h200 = dataclasses.replace(H100, name="H200 SXM", slug="h200-sxm")
    cases = [((pool(4, 1), pool(4, 1)), 1), ((pool(4, 2), pool(8, 1)), 2), ((pool(2, 1, dp=3), pool(4, 1)), 2),
             ((pool(6, 2), pool(6, 1)), 3), ((pool(4, 1), pool(1, 1, dp=16)), 3), ((pool(4, 1), pool(4, 1, gpu=h200)), 2)]
    for (prefill, decode), nodes in cases:
        assert deployment_nodes(prefill, decode) == nodes  # type: ignore[arg-type]
    assert deployment_link(H100, 4, H100, 4)[0] == NVLINK  # the first case: its transfer stays in its one node


def test_sglang_moves_the_kv_over_rdma_inside_a_node_and_over_nvlink_only_across_an_nvl72() -> None:
    """SGLang's default transfer engine is Mooncake over RDMA, with NVLink (MNNVL) only on an NVL72 and only with
    SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True MC_FORCE_MNNVL=True (ENGINES.md section 3). vLLM and TensorRT-LLM move
    it with NIXL, and an engine-neutral estimate takes the GPUs' own link.

    Llama-3.1-70B, 8,192-token prompt, fp8 KV, TP8 decode, 4 + 4 GPUs in one HGX node: 167,772,160 B per decode
    GPU (the test above). Over the node's NIC: 167,772,160 / 50e9 = 3,355.4432 us + 22.4 us = 3,377.8432 us,
    where NVLink would take 372.827 + 11.8 = 384.627 us.
    """
    assert transfer_link(H100, 8, "sglang") == (NETWORK, 50e9, NETWORK_TRANSFER_LATENCY_S)
    for engine in ("vllm", "trtllm", "generic", None):
        assert transfer_link(H100, 8, engine) == (NVLINK, 450e9, NVLINK_TRANSFER_LATENCY_S)
    _, bandwidth, latency = transfer_link(H100, 8, "sglang")
    seconds = transfer_times_s(LLAMA_3_1_70B, np.array([8192]), "fp8", decode_tensor_parallel=8,
                               decode_pipeline_parallel=1, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    assert seconds.tolist() == pytest.approx([3_377.8432e-6], abs=1e-12)
    # An NVL72's domain spans hosts (72 GPUs, more than a baseboard's 8): MNNVL, where the launch sets its variables;
    # a published run that states none ran on the defaults: RDMA.
    nvl72 = dataclasses.replace(H100, gpus_per_node=72)
    assert transfer_link(nvl72, 16, "sglang") == (NVLINK, 450e9, NVLINK_TRANSFER_LATENCY_S)
    assert transfer_link(nvl72, 16, "sglang", as_launched=False) == (NETWORK, 50e9, NETWORK_TRANSFER_LATENCY_S)
    assert transfer_link(nvl72, 16, "vllm", as_launched=False)[0] == NVLINK
    assert transfer_link(nvl72, 73, "sglang")[0] == NETWORK
    assert deployment_link(H100, 4, H100, 4, "sglang")[0] == NETWORK
    assert deployment_link(nvl72, 8, nvl72, 8, "sglang")[0] == NVLINK


def test_transfer_times_per_request_match_the_single_transfer() -> None:
    prompts = np.array([8192, 1024, 8192])
    times = transfer_times_s(LLAMA_3_1_70B, prompts, "fp8", decode_tensor_parallel=8, decode_pipeline_parallel=1,
                             bandwidth_bytes_per_s=50e9, latency_s=22.4e-6)
    # 1,024 tokens: 163,840 x 1,024 / 8 = 20,971,520 B per GPU; / 50e9 = 419.43 us, + 22.4 us
    assert times.tolist() == pytest.approx([3_377.843e-6, 441.8304e-6, 3_377.843e-6], abs=1e-9)


def test_ttft_of_one_request_through_an_idle_prefill_decode_deployment() -> None:
    """One request of 8,192 prompt tokens and 4 output tokens, alone in both pools.

    Step time (seconds) = 5 ms + 50 us per prompt token + 1 ms per decoding sequence.
    - Prefill worker: the whole prompt in one step (chunk 8,192): 5 ms + 8,192 x 50 us = 414.6 ms; its
      first token ends the prefill worker's part.
    - KV transfer over 400 Gb/s (TP8 decode): 3.3778432 ms (test above).
    - Decode worker: the request arrives with 8,191 tokens cached; its first step computes the last prompt
      token (5 ms + 1 x 50 us = 5.05 ms) and streams the first token: TTFT = 414.6 + 3.3778432 + 5.05
      = 423.0278432 ms.
    - Then OSL - 1 = 3 tokens on the decode worker, the first of them from that first step: 2 more decode
      steps of 5 + 1 = 6 ms each: E2E = 423.0278432 + 12 = 435.0278432 ms; TPOT = 12 / (4 - 1) = 4 ms.
    """
    def step_time(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 5e-3 + 50e-6 * np.asarray(prefill_tokens) + 1e-3 * np.asarray(decode_seqs)

    requests = Requests(arrival_s=[0.0], input_tokens=[8192], output_tokens=[4], cached_prefix_tokens=[0])
    scheduler = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192)
    prefill = simulate(step_time, scheduler, prefill_role_requests(requests), warmup_fraction=0)
    decode = simulate(step_time, scheduler, decode_role_requests(requests), warmup_fraction=0)
    assert prefill.ttft_s.tolist() == pytest.approx([0.4146])
    assert decode.ttft_s.tolist() == pytest.approx([0.00505])
    transfer = transfer_times_s(LLAMA_3_1_70B, requests.input_tokens, "fp8", decode_tensor_parallel=8,
                                decode_pipeline_parallel=1, bandwidth_bytes_per_s=50e9, latency_s=22.4e-6)
    combined = combine(PoolTimes(prefill_ttft_s=prefill.ttft_s, transfer_s=transfer, decode_first_s=decode.ttft_s,
                                 decode_rest_s=decode.e2e_s - decode.ttft_s, output_tokens=requests.output_tokens))
    assert combined.ttft_s.tolist() == pytest.approx([0.4230278432], abs=1e-12)
    assert combined.e2e_s.tolist() == pytest.approx([0.4350278432], abs=1e-12)
    assert combined.tpot_s.tolist() == pytest.approx([0.004], abs=1e-12)


def test_a_one_token_answer_has_no_tpot() -> None:
    combined = combine(PoolTimes(prefill_ttft_s=np.array([0.1]), transfer_s=np.array([0.01]),
                                 decode_first_s=np.array([0.005]), decode_rest_s=np.array([0.0]),
                                 output_tokens=np.array([1])))
    assert combined.ttft_s.tolist() == pytest.approx([0.115])
    assert math.isnan(combined.tpot_s[0])


def test_role_requests() -> None:
    """Prefill ends at the first token; decode has all but the last prompt token cached, OSL - 1 tokens left."""
    requests = Requests(arrival_s=[0.0, 1.0], input_tokens=[100, 7], output_tokens=[50, 1],
                        cached_prefix_tokens=[10, 0], shared_prefix_tokens=10)
    prefill = prefill_role_requests(requests)
    assert prefill.output_tokens.tolist() == [1, 1]
    assert prefill.cached_prefix_tokens.tolist() == [10, 0]
    decode = decode_role_requests(requests)
    assert decode.cached_prefix_tokens.tolist() == [99, 6]
    assert decode.output_tokens.tolist() == [49, 1]
    assert decode.shared_prefix_tokens == 0


@pytest.mark.parametrize(("needed", "lowest", "most", "expected"), [
    (1, 1, 100, 1), (5, 1, 100, 5), (37, 3, 100, 37), (100, 1, 100, 100), (101, 1, 100, None), (2, 4, 9, 4)])
def test_fewest_workers(needed: int, lowest: int, most: int, expected: int | None) -> None:
    calls: list[int] = []

    def meets(workers: int) -> bool:
        calls.append(workers)
        return workers >= needed

    assert fewest_workers(meets, lowest, most) == expected
    assert len(calls) <= 2 * math.ceil(math.log2(most)) + 2  # doubling, then bisection


@pytest.mark.parametrize(("needed", "lowest", "guess", "tries", "expected"), [
    # Right: the guess meets and one fewer does not.
    (37, 3, 37, [37, 36], 37),
    # 3 over: 39 meets, 38 meets, 36 misses (steps of 1, 2), bisection between 36 and 38: 37.
    (37, 3, 40, [40, 39, 37, 33, 35, 36], 37),
    # 7 under: 30 misses, then 31, 33, 37 (steps of 1, 2, 4): 37 meets, bisection between 33 and 37: 35, 36.
    (37, 3, 30, [30, 31, 33, 37, 35, 36], 37),
    # Down to the lower bound: 5 meets, 4 and 2 meet (steps 1, 2); 2 - 4 is under `lowest` = 2: the answer is 2.
    (1, 2, 5, [5, 4, 2], 2),
    # A guess at or under the lower bound searches from the bound; one over the most, from the most.
    (10, 8, 6, [8, 16, 12, 10, 9], 10), (100, 1, 500, [100, 99], 100),
    # Nothing up to the most meets.
    (101, 1, 90, [90, 91, 93, 97, 100], None),
])
def test_fewest_workers_from_a_guess(needed: int, lowest: int, guess: int, tries: list[int],
                                     expected: int | None) -> None:
    calls: list[int] = []

    def meets(workers: int) -> bool:
        calls.append(workers)
        return workers >= needed

    assert fewest_workers(meets, lowest, 100, guess) == expected
    assert calls == tries


def test_a_decode_pool_guess_is_the_largest_batch_within_the_tpot_slo() -> None:
    """A step of b sequences takes 10 ms + 0.1 ms x b; 101-token answers take 100 decode steps; each worker has
    2 schedulers; 500 req/s to carry. TPOT SLO 30 ms: 128 sequences step in 22.8 ms (256 take 35.6 ms), so a
    scheduler carries 128 / (0.0228 x 100) = 56.14 req/s and 500 / (2 x 56.14) = 4.45: 5 workers. With at most 64
    sequences: 64 / (0.0164 x 100) = 39.02 req/s, 500 / 78.05 = 6.41: 7. TPOT SLO 5 ms, no batch within it: one
    sequence, 1 / (0.0101 x 100) = 0.990 req/s, 500 / 1.980 = 252.5: 253."""
    def step_time(seqs, context, prefill, prefill_context):
        return 0.010 + 0.0001 * np.asarray(seqs, dtype=float)

    def guess(tpot_s: float, max_num_seqs: int) -> int:
        planner = SimpleNamespace(lengths=SimpleNamespace(input_mean=1000.0, output_mean=101.0), sized_load=500.0,
                                  slo=SimpleNamespace(tpot_s=tpot_s))
        screened = SimpleNamespace(step_time=step_time, schedulers=2,
                                   scheduler=SimpleNamespace(max_num_seqs=max_num_seqs))
        return _decode_guess(planner, screened)

    assert [guess(0.030, 1024), guess(0.030, 64), guess(0.005, 1024)] == [5, 7, 253]


def test_a_search_started_from_another_plans_pools_finds_the_same_plans_sooner() -> None:
    """`workers_per_load` holds each sized pool's workers per req/s of the sized load; a plan at the same rate
    started from them finds the same pools with fewer simulations (Llama-3.1-70B fp8 on H100, 8k / 1k at 20 req/s:
    pools of 4 to 12 workers, which the first plan's searches reach by doubling and bisection)."""
    inputs = PlanInputs(model=LLAMA_3_1_70B, workload=Workload(Fixed(8000), Fixed(1000), requests_per_s=20.0),
                        slo=Slo(ttft_s=2.0, tpot_s=0.04, percentile=95),
                        efficiencies={("h100-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES},
                        simulated_requests=500)
    candidates = configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"], ["fp8"])
    first = plan_disaggregated(inputs, candidates)
    for plan in first.plans:
        for pool in (plan.prefill, plan.decode):
            assert first.workers_per_load[(pool.configuration, pool.role)] == pytest.approx(pool.workers / 20.0)
    again = plan_disaggregated(inputs, candidates, first.workers_per_load)
    assert again.plans == first.plans
    assert again.simulations < first.simulations


def test_a_disaggregated_plan_adds_up_and_meets_the_slo() -> None:
    """Llama-3.1-70B fp8 on H100 at 8k in / 1k out, 2 req/s: each pool's GPUs are workers x TP, the cost
    is GPUs x $3.00/h, and the predicted percentiles meet the SLO."""
    inputs = PlanInputs(model=LLAMA_3_1_70B, workload=Workload(Fixed(8000), Fixed(1000), requests_per_s=2.0),
                        slo=Slo(ttft_s=2.0, tpot_s=0.04, percentile=95),
                        efficiencies={("h100-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES},
                        simulated_requests=500)
    result = plan_disaggregated(inputs, configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"], ["fp8"]))
    assert result.plans
    for plan in result.plans:
        for pool in (plan.prefill, plan.decode):
            assert pool.gpus == pool.workers * pool.configuration.tensor_parallel
            assert pool.cost_per_hour_usd == pytest.approx(pool.gpus * 3.0)
        assert plan.gpus == plan.prefill.gpus + plan.decode.gpus
        assert plan.cost_per_hour_usd == pytest.approx(plan.gpus * 3.0)
        assert plan.predicted.ttft.at_slo_percentile_s <= 2.0
        assert plan.predicted.tpot.at_slo_percentile_s <= 0.04
        assert plan.transfer.prompt_tokens == 8000
        assert plan.transfer.link == (NVLINK if plan.gpus <= 8 else NETWORK)


def _pools(plan) -> tuple:
    return tuple((pool.configuration, pool.workers - pool.extra_workers) for pool in (plan.prefill, plan.decode))


def test_spare_workers_join_each_pool_sized_without_them() -> None:
    """N + 1 per pool (ha_policy.extra_replicas = 1): the same pools as without spares, sized and checked with a
    worker of either pool down, then one more worker in each. Llama-3.1-70B fp8 on H100 at 8k / 1k, 2 req/s: a plan
    of p prefill and d decode TP-t workers gets p + 1 and d + 1, (p + d + 2) x t GPUs at $3.00/h each; its pools'
    share of the sized 2 req/s is 2 / (p + 1) and 2 / (d + 1). The prediction is the pools' without their spares
    (the guarantee with a worker of either pool down) over the whole deployment's link: NVLink up to the 8 GPUs of
    an HGX node, else the network. So the TPOT is the plan's without spares (the decode pool's, not the link's);
    the TTFT too where the spares keep the link, and no lower where they take it to the network."""
    workload = Workload(Fixed(8000), Fixed(1000), requests_per_s=2.0)
    inputs = PlanInputs(model=LLAMA_3_1_70B, workload=workload, slo=Slo(ttft_s=2.0, tpot_s=0.04, percentile=95),
                        efficiencies={("h100-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES},
                        simulated_requests=500)
    candidates = configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"], ["fp8"])
    bare = {_pools(plan): plan for plan in plan_disaggregated(inputs, candidates).plans}
    spared = plan_disaggregated(dataclasses.replace(inputs, policy=HaPolicy(extra_replicas=1)), candidates).plans
    assert bare and {_pools(plan) for plan in spared} == set(bare)
    links = set()
    for plan in spared:
        base = bare[_pools(plan)]
        for pool, before in ((plan.prefill, base.prefill), (plan.decode, base.decode)):
            assert (pool.workers, pool.extra_workers) == (before.workers + 1, 1)
            assert pool.gpus == pool.workers * pool.configuration.tensor_parallel
            assert pool.load_per_worker == pytest.approx(2.0 / pool.workers)
        assert plan.gpus == base.gpus + (plan.prefill.configuration.tensor_parallel
                                         + plan.decode.configuration.tensor_parallel)
        assert plan.cost_per_hour_usd == pytest.approx(plan.gpus * 3.0)
        assert plan.transfer.link == (NVLINK if plan.gpus <= 8 else NETWORK)
        assert plan.meets_slo and plan.predicted.requests_per_s == pytest.approx(2.0)
        assert plan.predicted.ttft.at_slo_percentile_s <= 2.0 and plan.predicted.tpot.at_slo_percentile_s <= 0.04
        assert plan.predicted.tpot == base.predicted.tpot
        if plan.transfer.link == base.transfer.link:
            assert plan.predicted.ttft == base.predicted.ttft
        else:
            assert plan.predicted.ttft.at_slo_percentile_s > base.predicted.ttft.at_slo_percentile_s
        links.add((base.transfer.link, plan.transfer.link))
    assert (NVLINK, NETWORK) in links  # a plan whose spares take it past one node


def test_a_pool_worker_with_attention_dp_ranks_is_its_ranks_side_by_side() -> None:
    """A DeepSeek-V3 worker of 8 H200s as DP8 + EP8 (its weights: 100.8 GB per GPU) runs 8 schedulers, each
    with its own requests. With a step of 5 ms + 50 us per prompt token, a 1,000-token prompt is one chunk of
    5 + 50 = 55 ms, so a rank prefills 1 / 0.055 = 18.18 prompts/s. For 100 req/s the analytic prefill pool
    is ceil(100 / (8 x 18.18)) = ceil(0.6875) = 1 worker of 8 ranks; the same worker taken as one scheduler
    would need ceil(100 / 18.18) = ceil(5.5) = 6. Simulated at 8 req/s per worker, a rank sees 8 / 8 = 1 req/s:
    the very requests, at the very times, of one scheduler at 1 req/s. The worker's KV is its 8 ranks'."""
    h200 = dataclasses.replace(H100, name="H200 SXM", slug="h200-sxm", memory_bytes=150_754_820_096)
    inputs = PlanInputs(model=DEEPSEEK_V3, workload=Workload(Fixed(1000), Fixed(100), requests_per_s=100.0),
                        slo=Slo(ttft_s=2.0, tpot_s=0.1, percentile=95),
                        efficiencies={("h200-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES},
                        simulated_requests=200)
    planner = _Planner(inputs)
    screened = planner.screen(Configuration(h200, 1, 1, "fp8", "bf16", None, None, 8, 8), PREFILL_POOL)
    assert screened.schedulers == 8
    ranks = dataclasses.replace(screened, step_time=_step_time,
                                scheduler=SchedulerConfig(1_000_000, max_num_batched_tokens=8192))
    alone = dataclasses.replace(ranks, schedulers=1)
    assert _pool_option(planner, ranks, PREFILL_POOL).workers == 1
    assert _pool_option(planner, alone, PREFILL_POOL).workers == 6
    requests = planner._unit_requests(200)
    worker = _simulate_role(planner, ranks, PREFILL_POOL, requests, 8.0, 1)
    rank = _simulate_role(planner, alone, PREFILL_POOL, requests, 1.0, 1)
    assert np.array_equal(worker.ttft_s, rank.ttft_s)
    assert screened.kv_tokens_per_replica == 8 * screened.scheduler.kv_capacity_tokens


def test_pool_options_are_sized_while_they_could_still_be_cheaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Options by analytic bound ($/h) 10, 11, 12, 30, 40, each sized (stubbed) to: infeasible, 25 GPUs at $2 =
    $50, 10 at $2 = $20, and the rest $15. The first two are always sized (one fails); the third's bound 12 is
    below the cheapest so far ($50), so it is sized ($20); the fourth's 30 is not below $20: the search stops
    with two pools sized. Had every one of ten such options failed, it would have gone on to the eighth (the most,
    MAX_POOL_CONFIGURATIONS_SIMULATED) and no further."""
    sized_to = {0: None, 1: 25, 2: 10, 3: 7.5, 4: 7.5}
    tried = []

    def size(planner, option, role, requests, behind, guesses):
        tried.append(option.workers)
        gpus = sized_to[option.workers]
        if gpus is None:
            return Infeasible(None, ("misses",))
        return SimpleNamespace(gpus=gpus, price_per_gpu_hour_usd=2.0), None

    monkeypatch.setattr("app.sizing.serving.disaggregation._size_pool", size)
    options = [_PoolOption(None, index, bound) for index, bound in enumerate((10.0, 11.0, 12.0, 30.0, 40.0))]
    refused: list = []
    sized = _size_pools(None, list(reversed(options)), PREFILL_POOL, None, 0.0, refused, {})
    assert tried == [0, 1, 2]
    assert [pool.gpus for pool, _ in sized] == [25, 10] and len(refused) == 1
    sized_to.update({index: None for index in range(10)})
    tried.clear()
    options = [_PoolOption(None, index, 10.0 * (index + 1)) for index in range(10)]
    assert _size_pools(None, options, PREFILL_POOL, None, 0.0, [], {}) == []
    assert tried == [0, 1, 2, 3, 4, 5, 6, 7]


def test_closed_loop_workloads_are_refused() -> None:
    inputs = PlanInputs(model=LLAMA_3_1_70B, workload=Workload(Fixed(100), Fixed(10), concurrent_users=4),
                        slo=Slo(ttft_s=2.0, tpot_s=0.04),
                        efficiencies={("h100-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES})
    with pytest.raises(ValueError, match="open-loop"):
        plan_disaggregated(inputs, configurations(LLAMA_3_1_70B, [H100], [4], [1], ["fp8"], ["fp8"]))


def _step_time(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
    """5 ms + 50 us per prompt token + 1 ms per decoding sequence."""
    return 5e-3 + 50e-6 * np.asarray(prefill_tokens) + 1e-3 * np.asarray(decode_seqs)


def test_one_user_in_a_closed_loop_through_both_pools() -> None:
    """One user, three requests of 1,000 prompt and 201 output tokens in turn; step time as `_step_time`;
    transfer 10 ms.

    - Prefill alone: 5 + 1,000 x 0.05 = 55 ms.
    - Decode: the first step computes the last prompt token (5 + 0.05 = 5.05 ms) and streams the first
      token, then osl - 1 - 1 = 199 steps of one sequence at 6 ms = 1,194 ms.
    - Nothing else runs, so every request alike: TTFT = 55 + 10 + 5.05 = 70.05 ms, TPOT = 1,194 / (201 - 1)
      = 5.97 ms, E2E = 70.05 + 1,194 = 1,264.05 ms.
    """
    scheduler = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192)
    pool = PoolRanks(_step_time, scheduler, ranks=1)
    combined = closed_loop(1, fixed_closed_loop_requests(1, 1000, 201, 3), pool, pool, transfer_s=0.010)
    assert combined.ttft_s.tolist() == pytest.approx([0.07005] * 3, abs=1e-9)
    assert combined.tpot_s.tolist() == pytest.approx([0.00597] * 3, abs=1e-9)
    assert combined.e2e_s.tolist() == pytest.approx([1.26405] * 3, abs=1e-9)


def test_users_starting_together_queue_for_a_one_prompt_prefill_rank() -> None:
    """Two users send their first request at t = 0 to one prefill rank that takes one prompt per step
    (max_num_seqs 1); one round (two requests), 1,000 prompt and 201 output tokens, transfer 10 ms.

    - Prefill: user 0's prompt 0-55 ms, user 1's 55-110 ms (it queued 55 ms).
    - Decode (one rank, roomy): user 0 arrives at 65 ms; its first step (5.05 ms) streams its first token at
      70.05 ms, then its decode steps of one sequence take 6 ms each, from 70.05 ms: the one that starts at
      70.05 + 8 x 6 = 118.05 ms runs to 124.05 ms. User 1 arrives at 120 ms and waits for it, then its
      first step runs beside user 0's decode: 5 + 0.05 + 1 = 6.05 ms, its first token at 130.10 ms.
    - TTFT: user 0 70.05 ms; user 1 130.10 ms (110 on the prefill rank + 10 + 10.10 on the decode rank).
    """
    prefill = PoolRanks(_step_time, SchedulerConfig(kv_capacity_tokens=100_000, max_num_seqs=1,
                                                    max_num_batched_tokens=8192), ranks=1)
    decode = PoolRanks(_step_time, SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192), ranks=1)
    combined = closed_loop(2, fixed_closed_loop_requests(2, 1000, 201, 2), prefill, decode, transfer_s=0.010)
    assert combined.ttft_s.tolist() == pytest.approx([0.07005, 0.13010], abs=1e-9)


def test_more_users_than_decode_slots_queue_for_the_first_step() -> None:
    """Eight users, one decode rank that runs at most two sequences: the other users wait for a slot, so
    the first step comes later than with eight slots, and TPOT is the same (a batch of two either way
    runs in steps of 5 + 2 ms at most)."""
    wide = SchedulerConfig(kv_capacity_tokens=100_000, max_num_seqs=8, max_num_batched_tokens=8192)
    narrow = dataclasses.replace(wide, max_num_seqs=2)
    prefill = PoolRanks(_step_time, wide, ranks=1)
    requests = fixed_closed_loop_requests(8, 1000, 101, 40)
    roomy = closed_loop(8, requests, prefill, PoolRanks(_step_time, wide, ranks=1), transfer_s=0.0)
    tight = closed_loop(8, requests, prefill, PoolRanks(_step_time, narrow, ranks=1), transfer_s=0.0)
    assert tight.ttft_s.mean() > 2 * roomy.ttft_s.mean()
    assert np.nanmax(tight.tpot_s) <= 0.007 + 1e-12


def test_the_users_are_spread_over_the_ranks_of_each_pool() -> None:
    """Four users at t = 0 on two prefill ranks of one prompt per step, one round: each rank takes two users
    (u mod 2), so two prompts finish at 55 ms and two at 110 ms (one rank would finish them at 55, 110,
    165 and 220 ms). Four decode ranks, one user each: every first decode step runs alone, 5.05 ms.
    TTFT: 55 + 10 + 5.05 = 70.05 ms twice and 110 + 10 + 5.05 = 125.05 ms twice."""
    one_prompt = SchedulerConfig(kv_capacity_tokens=100_000, max_num_seqs=1, max_num_batched_tokens=8192)
    roomy = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192)
    combined = closed_loop(4, fixed_closed_loop_requests(4, 1000, 201, 4), PoolRanks(_step_time, one_prompt, ranks=2),
                           PoolRanks(_step_time, roomy, ranks=4), transfer_s=0.010)
    assert sorted(combined.ttft_s.tolist()) == pytest.approx([0.07005, 0.07005, 0.12505, 0.12505], abs=1e-9)



def test_requests_of_their_own_lengths_and_transfers_in_a_closed_loop() -> None:
    """One user, two requests in turn: 1,000 prompt and 201 output tokens with a 10 ms transfer, then 2,000 and
    101 with 20 ms; step time as `_step_time`.

    - First: prefill 5 + 1,000 x 0.05 = 55 ms, transfer 10, first decode step 5 + 0.05 = 5.05: TTFT 70.05 ms;
      then 201 - 2 = 199 steps of 6 ms = 1,194 ms: E2E 1,264.05 ms, TPOT 1,194 / 200 = 5.97 ms.
    - Second, sent as the first ends: prefill 5 + 2,000 x 0.05 = 105 ms, transfer 20, first step 5.05: TTFT
      130.05 ms; then 101 - 2 = 99 steps of 6 ms = 594 ms: E2E 724.05 ms, TPOT 594 / 100 = 5.94 ms.
    """
    scheduler = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192)
    pool = PoolRanks(_step_time, scheduler, ranks=1)
    requests = Requests(np.full(2, np.nan), np.array([1000, 2000]), np.array([201, 101]), np.zeros(2))
    combined = closed_loop(1, requests, pool, pool, transfer_s=np.array([0.010, 0.020]))
    assert combined.ttft_s.tolist() == pytest.approx([0.07005, 0.13005], abs=1e-9)
    assert combined.e2e_s.tolist() == pytest.approx([1.26405, 0.72405], abs=1e-9)
    assert combined.tpot_s.tolist() == pytest.approx([0.00597, 0.00594], abs=1e-9)


def test_a_closed_loop_needs_a_request_per_user() -> None:
    pool = PoolRanks(_step_time, SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192), ranks=1)
    with pytest.raises(ValueError, match="one request per user"):
        closed_loop(3, fixed_closed_loop_requests(2, 1000, 201, 2), pool, pool, transfer_s=0.0)


def test_prefill_share_of_a_request_s_gpu_time() -> None:
    """1,000-token prompts at 2 req/s. A prefill worker of 2 GPUs and one scheduler whose step costs 10 µs per
    prompt token: the mean prompt keeps it busy 1,000 x 10 µs = 0.01 s, 2 x 0.01 = 0.02 GPU-seconds. Decode: 3
    workers of 4 GPUs, one a spare: 2 x 4 = 8 GPUs always stepping for 2 req/s, 4 GPU-seconds per request, when a
    request decodes 5 s (2 req/s x 5 s = 10 requests on 2 workers: always stepping). Prefill's share: 0.02 / (0.02 +
    4) = 0.4975%. A request decoding 0.5 s (1 request on the 2 workers at a time, each idle half the time) keeps one
    worker's 4 GPUs busy 0.5 s: 2 GPU-seconds, and prefill's share is 0.02 / (0.02 + 2)."""
    planner = _Planner(dataclasses.replace(_closed_loop_inputs(1), workload=Workload(Fixed(1000), Fixed(100),
                                                                                   requests_per_s=2.0)))
    prefill = SimpleNamespace(configuration=SimpleNamespace(gpus_per_replica=2), schedulers=1,
                              step_time=lambda seqs, context, tokens, positions: tokens * 1e-5,
                              scheduler=SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192))
    decode = SimpleNamespace(workers=3, extra_workers=1, configuration=SimpleNamespace(gpus_per_replica=4))
    assert _prefill_share(planner, prefill, decode, decoding_s=5.0) == pytest.approx(0.02 / 4.02)
    assert _prefill_share(planner, prefill, decode, decoding_s=0.5) == pytest.approx(0.02 / 2.02)


# Planning a closed loop ---------------------------------------------------------------------------------

def _closed_loop_inputs(users: int) -> PlanInputs:
    return PlanInputs(model=LLAMA_3_1_70B, workload=Workload(Fixed(8000), Fixed(1000), concurrent_users=users),
                      slo=Slo(ttft_s=2.0, tpot_s=0.04, percentile=95),
                      efficiencies={("h100-sxm", dtype): DEFAULT_EFFICIENCY for dtype in COMPUTE_DTYPES},
                      simulated_requests=500)


def test_a_closed_loop_is_planned_as_the_open_loop_of_its_users_rate() -> None:
    """Llama-3.1-70B fp8 on H100, 256 users of 8k in / 1k out, p95 TTFT 2 s and TPOT 40 ms.

    - The first rate tried is what the users send through a plan just meeting the SLO: each request then takes
      2 + 999 x 0.04 = 41.96 s, so 256 / 41.96 = 6.101 req/s; the rate only rises from there, so every plan was
      sized for at least that (its decode workers' share of it, x the workers).
    - Each plan's users send 256 / its mean request time (Little's law), no more than the rate it was sized for
      (2% of simulation noise allowed), and 1,000 output tokens per request; a pool holds 256 / its workers users.
    - Every plan's users send within 2% of that rate here, so each is the open loop's plan at it, pool for pool
      (a plan whose users send more or less gets its own rate: the next test).
    """
    users, inputs = 256, _closed_loop_inputs(256)
    candidates = configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"], ["fp8"])
    result = plan_closed_loop(inputs, candidates)
    assert result.plans
    for plan in result.plans:
        sized = plan.decode.load_per_worker * plan.decode.workers
        assert sized == pytest.approx(plan.prefill.load_per_worker * plan.prefill.workers)
        assert sized >= 256 / 41.96 * (1 - 1e-9)
        sent = plan.predicted.requests_per_s
        assert sent == pytest.approx(users / plan.mean_e2e_s) and sent <= sized * 1.02
        assert plan.output_tokens_per_s == pytest.approx(1000 * sent)
        assert plan.cost_per_million_output_tokens_usd == pytest.approx(plan.cost_per_hour_usd / (3600 * 1000 * sent)
                                                                          * 1e6)
        for pool in (plan.prefill, plan.decode):
            assert pool.users_per_worker == pytest.approx(users / pool.workers)
        assert plan.predicted.ttft.at_slo_percentile_s <= 2.0 and plan.predicted.tpot.at_slo_percentile_s <= 0.04
    cheapest = result.plans[0]
    rate = cheapest.decode.load_per_worker * cheapest.decode.workers
    assert all(rate / 1.02 <= plan.predicted.requests_per_s <= rate * 1.02 for plan in result.plans)
    opened = plan_disaggregated(dataclasses.replace(inputs, workload=Workload(Fixed(8000), Fixed(1000),
                                                                              requests_per_s=rate)), candidates)
    assert [(p.prefill.configuration, p.prefill.workers, p.decode.configuration, p.decode.workers)
            for p in opened.plans] == [(p.prefill.configuration, p.prefill.workers, p.decode.configuration,
                                        p.decode.workers) for p in result.plans]


def test_each_plan_of_a_closed_loop_is_sized_for_its_own_users() -> None:
    """Llama-3-8B fp8 on H100 and H200 (TP1, 2, 4), 256 users of 2,000 in / 20 out, p95 TTFT 1 s, TPOT 30 ms:
    a request is mostly its prefill, so what a plan's users send depends on its prefill pool. Each plan is sized
    for its own users: they send between 1 / 1.02 and 1.02 x the rate it was sized for (sized at the one rate
    the rounds ended on, the cheapest plan's users sent 88% of it: 26 GPUs where 24 carry them, 2026-12-07),
    and the plans are in order of cost."""
    inputs = dataclasses.replace(_closed_loop_inputs(256), model=LLAMA_3_8B,
                                 workload=Workload(Fixed(2000), Fixed(20), concurrent_users=256),
                                 slo=Slo(ttft_s=1.0, tpot_s=0.03, percentile=95),
                                 efficiencies={(gpu, dtype): DEFAULT_EFFICIENCY for gpu in ("h100-sxm", "h200-sxm")
                                               for dtype in COMPUTE_DTYPES})
    plans = plan_closed_loop(inputs, configurations(LLAMA_3_8B, [H100, H200], [1, 2, 4], [1], ["fp8"],
                                                    ["fp8"])).plans
    assert len(plans) >= 2
    for plan in plans:
        sized = plan.decode.load_per_worker * plan.decode.workers
        assert sized / 1.02 <= plan.predicted.requests_per_s <= sized * 1.02
        assert plan.predicted.ttft.at_slo_percentile_s <= 1.0 and plan.predicted.tpot.at_slo_percentile_s <= 0.03
    assert [plan.cost_per_hour_usd for plan in plans] == sorted(plan.cost_per_hour_usd for plan in plans)


def _stubbed_open_loops(monkeypatch: pytest.MonkeyPatch, paired_mean_s: Callable[[float], float]
                        ) -> tuple[PlanInputs, list[float], list[float]]:
    """100 users, 101-token answers, SLO TTFT 1 s and TPOT 10 ms, the open loop stubbed: its cheapest plan's
    requests take 1.0 s on average below 80 req/s and 1.25 s from 80; a second plan's 1.1 s; the second plan's
    pairing alone (`pairing`) takes `paired_mean_s(rate)`. Returns the inputs and the rates of the open loops
    planned over every candidate and over the pairing alone."""
    inputs = dataclasses.replace(_closed_loop_inputs(100), workload=Workload(Fixed(1000), Fixed(101),
                                                                             concurrent_users=100),
                                 slo=Slo(ttft_s=1.0, tpot_s=0.01, percentile=95))
    real = plan_disaggregated(dataclasses.replace(inputs, workload=Workload(Fixed(1000), Fixed(101),
                                                                           requests_per_s=1.0)),
                              configurations(LLAMA_3_1_70B, [H100], [4], [1], ["fp8"], ["fp8"])).plans[0]
    rates: list[float] = []
    paired: list[float] = []

    def stub(opened: PlanInputs, candidates: list, guesses: dict, pairing: tuple | None) -> SimpleNamespace:
        rate = opened.workload.requests_per_s
        if pairing is None:
            rates.append(rate)
            plans = (dataclasses.replace(real, mean_e2e_s=1.0 if rate < 80 else 1.25),
                     dataclasses.replace(real, mean_e2e_s=1.1))
        else:
            paired.append(rate)
            plans = (dataclasses.replace(real, mean_e2e_s=paired_mean_s(rate)),)
        return SimpleNamespace(plans=plans, infeasible=(), simulations=1, simulated_requests=10,
                               workers_per_load={})

    monkeypatch.setattr("app.sizing.serving.disaggregated_loop.plan_disaggregated", stub)
    return inputs, rates, paired


def test_the_rate_a_closed_loop_is_sized_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan just meeting the SLO carries 100 / (1 + 100 x 0.01) = 50 req/s, the first rate. Rounds over every
    candidate: 50 short (100 > 51), raised to 100: enough (80 <= 102); halfway 75: short; 87.5: enough; 81.25:
    enough; 78.125: short; six rounds. Sized at 81.25 req/s the cheapest plan's users send 80 (within 81.25 / 1.02
    = 79.66 and 81.25 x 1.02 = 82.875): kept. The second plan's users send 100 / 1.1 = 90.909, more: its own rate
    is sought from there over its pairing alone (its requests still 1.1 s), 81.25 known too low: 90.909 enough;
    halfway (81.25 + 90.909) / 2 = 86.080: short (90.909 > 87.801); (86.080 + 90.909) / 2 = 88.494: short
    (> 90.264); (88.494 + 90.909) / 2 = 89.702: enough (<= 91.496), within 2% of 88.494 (90.264): four rounds,
    sized at 89.702. Both plans cost the same: they stay in order."""
    inputs, rates, paired = _stubbed_open_loops(monkeypatch, lambda rate: 1.1)
    result = plan_closed_loop(inputs, [])
    assert rates == pytest.approx([50.0, 100.0, 75.0, 87.5, 81.25, 78.125])
    assert paired == pytest.approx([90.909091, 86.079545, 88.494318, 89.701705])
    assert [plan.predicted.requests_per_s for plan in result.plans] == pytest.approx([80.0, 90.909091])
    assert result.plans[0].output_tokens_per_s == pytest.approx(80.0 * 101)
    assert "sized as an open loop of 81.2 req/s" in result.plans[0].binding_detail
    assert "sized as an open loop of 89.7 req/s" in result.plans[1].binding_detail
    assert result.infeasible == ()
    assert (result.simulations, result.simulated_requests) == (10, 100)


def test_users_who_think_send_less_and_a_plan_sought_lower_stops_at_their_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same 100 users thinking 1 s on average between requests: N / (E + Z). A plan just meeting the SLO
    carries 100 / (1 + 100 x 0.01 + 1) = 33.333 req/s, the first rate: short (the cheapest plan's users send
    100 / (1 + 1) = 50 > 34); raised to 50: enough (50 <= 51); halfway down 41.667, 45.833, 47.917, 48.958: each
    short (its users still send 50, more than 1.02 x each); six rounds, sized at 50. The second plan's users send
    100 / (1.1 + 1) = 47.619, less than 50 / 1.02 = 49.02: its own rate is sought from there, none known too low:
    47.619 is enough, and its users send exactly that: the next plan would be this one again, so one round (each
    of the six rounds planned 47.619 again before). Without the think time the same plans carry 80 and 90.9
    req/s (the test above)."""
    inputs, rates, paired = _stubbed_open_loops(monkeypatch, lambda rate: 1.1)
    inputs = dataclasses.replace(inputs, workload=dataclasses.replace(inputs.workload, think_time_s=1.0))
    result = plan_closed_loop(inputs, [])
    assert rates == pytest.approx([33.333333, 50.0, 41.666667, 45.833333, 47.916667, 48.958333])
    assert paired == pytest.approx([47.619048])
    assert [plan.predicted.requests_per_s for plan in result.plans] == pytest.approx([50.0, 47.619048])
    assert result.plans[1].output_tokens_per_s == pytest.approx(47.619048 * 101)
    assert ("sized as an open loop of 47.6 req/s, its 100 users send 47.6 req/s (mean request 1.1 s, mean think "
            "time 1 s)") in result.plans[1].binding_detail


def test_a_plan_whose_users_outrun_every_rate_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second plan's pairing alone takes 100 / (1.1 x rate) s per request: its users always send 1.1x the
    rate it was sized for, more than 1.02x, so no rate is enough: from 90.909 (what they send at 81.25) the rate
    is raised to theirs each round: 90.909, 100, 110, 121, 133.1, 146.41 (six rounds), and the plan is refused
    with the last rate and what its users would send there, 161.05 req/s."""
    inputs, _, paired = _stubbed_open_loops(monkeypatch, lambda rate: 100 / (1.1 * rate))
    result = plan_closed_loop(inputs, [])
    assert paired == pytest.approx([90.909091, 100.0, 110.0, 121.0, 133.1, 146.41])
    assert [plan.predicted.requests_per_s for plan in result.plans] == pytest.approx([80.0])
    assert len(result.infeasible) == 1
    assert ("no deployment sized for up to 146 req/s carries its 100 users (they would send 161 req/s)"
            in result.infeasible[0].reasons[0])


def test_a_closed_loop_spares_workers_beyond_the_pools_its_users_need() -> None:
    """64 users with one spare worker per pool: each plan's requests are timed without the spares (a worker of
    either pool down), so its users' rate (64 / its mean request time) is within the rate its pools were sized
    for; every pool has one worker more, and its users are spread over all its workers. As one decode worker's
    (the API's per-replica prediction), the users, their rate and tokens are over the d - 1 decode workers timed."""
    candidates = configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"], ["fp8"])
    spared = plan_closed_loop(dataclasses.replace(_closed_loop_inputs(64), policy=HaPolicy(extra_replicas=1)),
                              candidates).plans
    assert spared
    for plan in spared:
        sized = plan.decode.load_per_worker * plan.decode.workers
        for pool in (plan.prefill, plan.decode):
            assert pool.extra_workers == 1 and pool.workers >= 2
            assert pool.users_per_worker == pytest.approx(64 / pool.workers)
            assert pool.load_per_worker * pool.workers == pytest.approx(sized)
        assert plan.predicted.requests_per_s == pytest.approx(64 / plan.mean_e2e_s)
        assert plan.predicted.requests_per_s <= sized * 1.02
        # As one decode worker's: the 64 users and their rate over the d - 1 workers timed (one spare down).
        worker, timed = plan.decode_worker_prediction, plan.decode.workers - 1
        assert worker.load == pytest.approx(64 / timed)
        assert worker.requests_per_s == pytest.approx(64 / plan.mean_e2e_s / timed)
        assert worker.output_tokens_per_s == pytest.approx(1000 * 64 / plan.mean_e2e_s / timed)
        assert worker.ttft == plan.predicted.ttft and worker.tpot == plan.predicted.tpot
        assert plan.predicted.ttft.at_slo_percentile_s <= 2.0 and plan.predicted.tpot.at_slo_percentile_s <= 0.04


def test_more_users_never_take_fewer_gpus() -> None:
    gpus = [plan_closed_loop(_closed_loop_inputs(users), configurations(LLAMA_3_1_70B, [H100], [2, 4], [1], ["fp8"],
                                                                        ["fp8"])).plans[0].gpus
            for users in (16, 64, 256, 1024)]
    assert gpus == sorted(gpus) and gpus[0] < gpus[-1]


def test_an_open_loop_is_not_planned_as_a_closed_one() -> None:
    inputs = dataclasses.replace(_closed_loop_inputs(4), workload=Workload(Fixed(100), Fixed(10), requests_per_s=1.0))
    with pytest.raises(ValueError, match="closed loop"):
        plan_closed_loop(inputs, configurations(LLAMA_3_1_70B, [H100], [4], [1], ["fp8"], ["fp8"]))

# One pool's memory (/v1/capacity) --------------------------------------------------------------------

H200 = dataclasses.replace(H100, name="H200 SXM", slug="h200-sxm", memory_bytes=150_754_820_096,
                           scale_out_bandwidth_bytes_per_s=40e9)  # a slower NIC, to see which one is taken
# The generic engine subtracts only what it is given: all 85,520,809,984 B of an H100 (utilization 1.0),
# less 5e9 B kept back, less the weights, is the KV budget. Block of 16 tokens, no max_num_seqs.
GENERIC = EngineConfig(engine="generic", gpu_memory_utilization=1.0, reserved_bytes_per_gpu=5_000_000_000)
POOL_ARGUMENTS = {"input_tokens": 8192, "output_tokens": 1024, "weight_dtype": "fp8", "kv_dtype": "fp8",
                  "compute_dtype": "fp8", "efficiency": DEFAULT_EFFICIENCY}


def test_link_between_pools() -> None:
    """NVLink when both pools are one GPU type and fit one 8-GPU HGX node (TP4 + TP4 = 8 GPUs); the network
    past it (TP4 + TP8 = 12); across GPU types the slower GPU's NIC (min(50, 40) GB/s)."""
    assert deployment_link(H100, 4, H100, 4) == (NVLINK, 450e9, NVLINK_TRANSFER_LATENCY_S)
    assert deployment_link(H100, 4, H100, 8) == (NETWORK, 50e9, NETWORK_TRANSFER_LATENCY_S)
    assert deployment_link(H100, 1, H200, 1) == (NETWORK, 40e9, NETWORK_TRANSFER_LATENCY_S)


def test_pool_capacity_of_each_role() -> None:
    """Llama-3.1-70B, fp8 weights and KV, on H100s: a TP4 prefill pool of two workers, a TP8 decode worker,
    8,192 tokens in and 1,024 out.

    Weights per GPU (fp8 linear layers, bf16 embedding and LM head, config.json shapes): attention per layer
    8192 x (8192 + 1024 + 1024 + 8192) = 150,994,944, x 80 = 12,079,595,520 params; MLP 3 x 8192 x 28672 x 80
    = 56,371,445,760; embedding = LM head = 128,256 x 8,192 = 1,050,673,152 params (2 B each); norms
    161 x 8,192 = 1,318,912 (2 B, on every GPU).
      TP4: 3,019,898,880 + 14,092,861,440 + 2 x 525,336,576 + 2,637,824 = 18,166,071,296 B
      TP8: 1,509,949,440 + 7,046,430,720 + 2 x 262,668,288 + 2,637,824 = 9,084,354,560 B
    KV per token per GPU (fp8, 1 B): 2 x (8 KV heads / tp) x 128 x 80 layers = 40,960 B at TP4, 20,480 at TP8.

    Prefill worker (TP4): budget 85,520,809,984 - 18,166,071,296 - 5e9 = 62,354,738,688 B; blocks of 16 x
    40,960 = 655,360 B: 95,145 blocks = 1,522,320 tokens. A prompt of 8,192 tokens = 512 blocks, held until its
    transfer: 95,145 // 512 = 185 prompts in flight per worker, 370 in the pool of two (8 GPUs).
    Decode worker (TP8): budget 85,520,809,984 - 9,084,354,560 - 5e9 = 71,436,455,424 B; blocks of 327,680 B:
    218,006 blocks = 3,488,096 tokens. A request of 8,192 + 1,024 = 9,216 tokens = 576 blocks:
    218,006 // 576 = 378 concurrent requests.
    """
    prefill = pool_capacity(PREFILL_POOL, LLAMA_3_1_70B, H100, workers=2, layout=Layout(4), engine=GENERIC,
                            **POOL_ARGUMENTS)
    assert prefill.worker.memory.weights_bytes_per_gpu == 18_166_071_296
    assert prefill.worker.memory.kv_budget_bytes_per_gpu == 62_354_738_688
    assert prefill.worker.kv_bytes_per_token_per_gpu == 40_960
    assert (prefill.worker.kv_blocks, prefill.worker.kv_tokens) == (95_145, 1_522_320)
    assert prefill.tokens_per_request == 8192
    assert prefill.requests_per_worker == ConcurrencyView(185, 185, LIMIT_KV_CACHE, 8192.0)
    assert prefill.gpus == 8

    decode = pool_capacity(DECODE_POOL, LLAMA_3_1_70B, H100, workers=1, layout=Layout(8), engine=GENERIC,
                           **POOL_ARGUMENTS)
    assert decode.worker.memory.weights_bytes_per_gpu == 9_084_354_560
    assert decode.worker.memory.kv_budget_bytes_per_gpu == 71_436_455_424
    assert decode.worker.kv_bytes_per_token_per_gpu == 20_480
    assert (decode.worker.kv_blocks, decode.worker.kv_tokens) == (218_006, 3_488_096)
    assert decode.tokens_per_request == 9216
    assert decode.requests_per_worker == ConcurrencyView(378, 378, LIMIT_KV_CACHE, 9216.0)
    assert decode.gpus == 8
    # A decode worker's prompts arrive prefilled: no prefill share in its time per output token.
    point = decode.worker.operating_point
    assert point is not None
    assert (point.ideal_prefill_s, point.expected_prefill_s) == (0.0, 0.0)
    assert point.expected_tpot_s == point.expected_decode_step_s


def test_prefill_prompts_in_flight_are_not_capped_by_max_num_seqs() -> None:
    """A prompt waiting for its transfer has left the running batch but keeps its blocks: max_num_seqs 10
    caps the decode worker (378 -> 10, max_num_seqs binding), not the prefill worker's 185 prompts."""
    capped = dataclasses.replace(GENERIC, max_num_seqs=10)
    prefill = pool_capacity(PREFILL_POOL, LLAMA_3_1_70B, H100, workers=1, layout=Layout(4), engine=capped,
                            **POOL_ARGUMENTS)
    decode = pool_capacity(DECODE_POOL, LLAMA_3_1_70B, H100, workers=1, layout=Layout(8), engine=capped,
                           **POOL_ARGUMENTS)
    assert prefill.requests_per_worker.sequences == 185
    assert decode.requests_per_worker == ConcurrencyView(10, 378, LIMIT_MAX_NUM_SEQS, 9216.0)


@pytest.mark.parametrize(("role", "workers"), [("router", 1), (PREFILL_POOL, 0)])
def test_pool_capacity_refuses_an_unknown_role_or_no_workers(role: str, workers: int) -> None:
    with pytest.raises(ValueError):
        pool_capacity(role, LLAMA_3_1_70B, H100, workers=workers, layout=Layout(8), engine=GENERIC,
                      **POOL_ARGUMENTS)
