"""POST /v1/slo-plan with `candidates.deployment`: disaggregated prefill/decode plans beside aggregated ones."""

from types import SimpleNamespace

import pytest

from app.planning.service import _comparison_note

LONG_PROMPTS = {
    "model": "llama-3.1-70b",
    "workload": {"input_tokens": 8000, "output_tokens": 1000, "requests_per_s": 2},
    "slo": {"ttft_ms": 2000, "tpot_ms": 30, "percentile": 95},
    "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [2, 4], "weight_dtypes": ["fp8"], "kv_dtypes": ["fp8"],
                   "deployment": "both"},
    "simulated_requests": 500,
}
CHAT = {
    "model": "llama-3.1-70b",
    "workload": {"input_tokens": 500, "output_tokens": 300, "requests_per_s": 2},
    "slo": {"ttft_ms": 500, "tpot_ms": 50, "percentile": 95},
    "candidates": {"gpus": ["h200-sxm"], "tensor_parallel": [1, 2], "weight_dtypes": ["fp8"], "kv_dtypes": ["fp8"],
                   "deployment": "both"},
    "simulated_requests": 500,
}


def plan(client, body):
    response = client.post("/v1/slo-plan", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_long_prompts_show_a_disaggregated_plan_beside_the_aggregated_one(client):
    body = plan(client, LONG_PROMPTS)
    kinds = {p["deployment"] for p in body["plans"]}
    assert kinds == {"aggregated", "disaggregated"}
    costs = [p["cost_per_hour_usd"] for p in body["plans"]]
    assert costs == sorted(costs)
    disaggregated = next(p for p in body["plans"] if p["deployment"] == "disaggregated")
    pools = disaggregated["disaggregation"]
    prefill, decode = pools["prefill"], pools["decode"]
    # Both pools' GPUs and costs add up to the plan's (the catalog's H100 price per GPU-hour for each).
    for pool in (prefill, decode):
        assert pool["gpus"] == pool["workers"] * pool["tensor_parallel"] * pool["pipeline_parallel"]
        assert pool["cost_per_hour_usd"] == pytest.approx(pool["gpus"] * disaggregated["price_per_gpu_hour_usd"])
    assert disaggregated["gpus"] == prefill["gpus"] + decode["gpus"]
    assert disaggregated["cost_per_hour_usd"] == pytest.approx(prefill["cost_per_hour_usd"] + decode["cost_per_hour_usd"])
    assert disaggregated["replicas"] == prefill["workers"] + decode["workers"]
    # The KV moved for the mean prompt: 8,000 tokens x 163,840 B (fp8: 2 x 8 heads x 128 x 80 layers)
    # = 1,310,720,000 B, a decode TP degree's share per GPU.
    transfer = pools["kv_transfer"]
    assert transfer["bytes_per_request"] == 1_310_720_000
    assert transfer["bytes_per_gpu"] == 1_310_720_000 // decode["tensor_parallel"]
    assert transfer["time_ms"] == pytest.approx(
        transfer["latency_ms"] + transfer["bytes_per_gpu"] / transfer["bandwidth_bytes_per_s"] * 1e3)
    # Each pool's vLLM command joins the NIXL KV connector; the router is named.
    assert "--kv-transfer-config" in prefill["launch"]["command"]
    assert "--kv-transfer-config" in decode["launch"]["command"]
    assert "toy_proxy_server" in pools["router"]
    # Dynamo between Kubernetes pods moves the KV over RDMA only, whatever link the plan took (ENGINES.md section 3).
    assert "between Kubernetes pods it moves the KV over RDMA, never NVLink" in pools["router"]
    # A decode worker's analytic ceiling is its decode steps' alone (test_plan: a decode worker's ceiling), not
    # the load verified; the load verified stays within the 10% the planner lets a simulation beat it by.
    load = disaggregated["load_per_replica"]
    assert load["max_verified"] <= load["analytic_ceiling"] * 1.1
    assert load["analytic_ceiling"] != pytest.approx(load["max_verified"])
    predicted = disaggregated["predicted"]
    assert predicted["ttft"]["at_slo_percentile_ms"] <= 2000
    assert predicted["tpot"]["at_slo_percentile_ms"] <= 30
    # The comparison says which kind wins and why; the frontier knows both kinds.
    assert any(note.startswith(("aggregated wins", "disaggregated wins", "aggregated and disaggregated tie"))
               for note in body["assumptions"]["notes"])
    assert {point["deployment"] for point in body["pareto"]} <= {"aggregated", "disaggregated"}
    assert any("KV transfer" in formula for formula in body["assumptions"]["formulas"])


def test_moe_pools_may_run_attention_dp_and_ep(client):
    """DeepSeek-V3 in fp8 at 8k in / 1k out on H200s under TensorRT-LLM: each pool may run DP8 + EP8 workers (8
    attention ranks of one GPU each, every rank its own requests). A DP8 decode rank holds the whole MLA latent
    of its requests on its one GPU, so the mean prompt's KV moved to it is 8,000 tokens x 61 layers x
    (512 + 64) x 2 B (bf16) = 562,176,000 B, all on one GPU. A pool's GPUs are workers x TP x DP, a DP8 worker
    fills one 8-GPU node (as a TP8 one does), and the decode command turns attention DP on."""
    body = {"model": "deepseek-v3",
            "workload": {"input_tokens": 8000, "output_tokens": 1000, "requests_per_s": 8},
            "slo": {"ttft_ms": 3000, "tpot_ms": 60, "percentile": 95},
            "candidates": {"gpus": ["h200-sxm"], "engine": "trtllm", "deployment": "disaggregated"},
            "simulated_requests": 500}
    result = plan(client, body)
    wide = [p for p in result["plans"] if p["disaggregation"]["decode"]["data_parallel"] == 8]
    assert wide, [p["disaggregation"]["decode"]["layout"] for p in result["plans"]]
    pools = wide[0]["disaggregation"]
    decode = pools["decode"]
    assert decode["layout"] == "TP1 DP8 EP8 PP1"
    for pool in (pools["prefill"], decode):
        assert pool["gpus"] == pool["workers"] * pool["tensor_parallel"] * pool["data_parallel"] == 8 * pool["workers"]
    assert wide[0]["nodes"] == pools["prefill"]["workers"] + decode["workers"]
    assert pools["kv_transfer"]["bytes_per_request"] == pools["kv_transfer"]["bytes_per_gpu"] == 562_176_000
    assert "enable_attention_dp: true" in " ".join(decode["launch"]["notes"])


def test_pools_of_a_model_one_node_cannot_hold_run_pipeline_stages_across_nodes(client):
    """Llama-3.1-405B in bf16 is 101.5 GB per GPU at TP8, more than an H100 holds: each pool's workers are a full
    node's TP in pipeline stages across nodes (TP8 x PP2: 16 GPUs on 2 nodes). The KV of the mean prompt is
    8,000 tokens x 2 (K and V) x 8 KV heads x 128 x 126 layers x 2 B = 4,128,768,000 B; a TP8 x PP2 decode worker
    holds it on 16 GPUs, 63 layers' worth of 1 KV head each: 4,128,768,000 / 16 = 258,048,000 B per GPU."""
    body = {"model": "llama-3.1-405b",
            "workload": {"input_tokens": 8000, "output_tokens": 500, "requests_per_s": 1},
            "slo": {"ttft_ms": 5000, "tpot_ms": 100, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "weight_dtypes": ["bf16"], "deployment": "disaggregated"},
            "simulated_requests": 500}
    result = plan(client, body)
    assert result["plans"], result["infeasible"]
    pools = result["plans"][0]["disaggregation"]
    decode = pools["decode"]
    assert (decode["tensor_parallel"], decode["pipeline_parallel"]) == (8, 2)
    for role, pool in (("prefill", pools["prefill"]), ("decode", decode)):
        assert pool["pipeline_parallel"] > 1
        assert pool["gpus"] == pool["workers"] * pool["tensor_parallel"] * pool["pipeline_parallel"]
        assert any(note.startswith(f"one {role} worker spans {pool['pipeline_parallel']} nodes")
                   for note in pool["launch"]["notes"])
    assert result["plans"][0]["nodes"] == sum(pool["workers"] * pool["pipeline_parallel"]
                                              for pool in (pools["prefill"], decode))
    assert pools["kv_transfer"]["bytes_per_request"] == 4_128_768_000
    assert pools["kv_transfer"]["bytes_per_gpu"] == 258_048_000
    assert "--pipeline-parallel-size 2" in decode["launch"]["command"]


def test_short_chat_prompts_explain_why_aggregated_wins(client):
    body = plan(client, CHAT)
    assert body["plans"][0]["deployment"] == "aggregated"
    note = next(note for note in body["assumptions"]["notes"] if "wins" in note)
    assert note.startswith("aggregated wins")
    assert "prefill is a small share" in note and "KV transfer" in note


def test_gpus_priced_at_nothing_compare_the_two_kinds_without_a_ratio(client):
    """A price of 0 per GPU-hour is allowed (owned hardware): the comparison note has no ratio to give (it divided
    by the aggregated plan's $0/h: a 500)."""
    body = plan(client, {**CHAT, "candidates": {**CHAT["candidates"], "gpu_price_per_hour_usd": {"h200-sxm": 0}}})
    note = next(note for note in body["assumptions"]["notes"] if "tie at" in note)
    first = body["plans"][0]["deployment"]
    assert note.startswith(f"aggregated and disaggregated tie at $0.00/h: the {first} plan ranks first")


def test_sglang_pools_are_launched_in_their_disaggregation_modes(client):
    body = plan(client, {**LONG_PROMPTS, "candidates": {**LONG_PROMPTS["candidates"], "engine": "sglang",
                                                          "deployment": "disaggregated"}})
    assert {p["deployment"] for p in body["plans"]} == {"disaggregated"}
    pools = body["plans"][0]["disaggregation"]
    assert pools["prefill"]["launch"]["command"].endswith("--disaggregation-mode prefill")
    assert pools["decode"]["launch"]["command"].endswith("--disaggregation-mode decode")
    assert "--pd-disaggregation" in pools["router"]
    # SGLang's Mooncake moves the KV over RDMA inside an HGX node too: the network, and no MNNVL variables.
    assert pools["kv_transfer"]["link"] == "network"
    assert all(pools[role]["launch"]["command"].startswith("python -m sglang.launch_server ")
               for role in ("prefill", "decode"))


def test_sglang_pools_across_an_nvl72_switch_on_mnnvl(client):
    """On GB200 NVL72 the plan moves the KV over NVLink, which SGLang does only with MNNVL switched on: both
    workers' commands start with the two variables (ENGINES.md section 3)."""
    body = plan(client, {**LONG_PROMPTS, "candidates": {**LONG_PROMPTS["candidates"], "gpus": ["gb200"],
                                                          "tensor_parallel": [2, 4], "engine": "sglang",
                                                          "deployment": "disaggregated"}})
    pools = body["plans"][0]["disaggregation"]
    assert pools["kv_transfer"]["link"] == "nvlink"
    for role in ("prefill", "decode"):
        assert pools[role]["launch"]["command"].startswith(
            "SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True MC_FORCE_MNNVL=True python -m sglang.launch_server ")


def test_an_aggregated_request_is_unchanged(client):
    body = plan(client, {**CHAT, "candidates": {**CHAT["candidates"], "deployment": "aggregated"}})
    assert {p["deployment"] for p in body["plans"]} == {"aggregated"}
    assert all(p["disaggregation"] is None for p in body["plans"])
    assert not any("wins" in note for note in body["assumptions"]["notes"])


def test_a_closed_loop_gets_disaggregated_plans_sized_for_its_users(client):
    """32 users of 8k in / 1k out: each pool's users are the 32 over its workers, a decode worker's offered load
    is its share of the users, and the rate the users send through the plan is at most the rate its pools were
    sized for (their share of it per worker x the workers, 2% of simulation noise allowed): at least the
    32 / (2 + 999 x 0.03) = 1.0095 req/s of a plan just meeting the SLO."""
    body = plan(client, {**LONG_PROMPTS, "workload": {"input_tokens": 8000, "output_tokens": 1000,
                                                      "concurrent_users": 32},
                         "candidates": {**LONG_PROMPTS["candidates"], "deployment": "disaggregated"}})
    assert body["plans"] and {p["deployment"] for p in body["plans"]} == {"disaggregated"}
    assert "the open loop of the users' rate" in body["assumptions"]["load_model"]
    for item in body["plans"]:
        prefill, decode = item["disaggregation"]["prefill"], item["disaggregation"]["decode"]
        for pool in (prefill, decode):
            assert pool["users_per_worker"] == pytest.approx(32 / pool["workers"])
        sized = decode["load_per_worker_requests_per_s"] * decode["workers"]
        assert sized >= 32 / (2 + 999 * 0.03) * (1 - 1e-9)
        sent = item["predicted"]["requests_per_s"] * decode["workers"]  # per decode worker, as every per-replica field
        assert sent <= sized * 1.02
        assert item["output_tokens_per_s"] == pytest.approx(1000 * sent)
        assert item["predicted"]["output_tokens_per_s"] == pytest.approx(1000 * item["predicted"]["requests_per_s"])
        load = item["load_per_replica"]
        assert load["unit"] == "concurrent_users"
        assert load["offered"] == pytest.approx(32 / decode["workers"])
        assert load["offered"] <= load["analytic_ceiling"]
        assert item["predicted"]["load_per_replica"] == pytest.approx(load["offered"])
        assert item["predicted"]["ttft"]["at_slo_percentile_ms"] <= 2000
        assert item["predicted"]["tpot"]["at_slo_percentile_ms"] <= 30


def test_a_closed_loop_of_users_who_think_is_sized_for_n_over_e_plus_z(client):
    """The 32 users above thinking 100 s between requests: a plan's users send 32 / (E + 100) req/s, E its mean
    request time (at least the 999 x TPOT p50 of its answer: 32 / (100 + 999 x TPOT p50) bounds the rate from
    above), and each plan is sized for no less than a plan just meeting the SLO would carry them at,
    32 / (2 + 999 x 0.03 + 100) = 0.2425 req/s; the binding detail names the think time."""
    body = plan(client, {**LONG_PROMPTS, "workload": {"input_tokens": 8000, "output_tokens": 1000,
                                                      "concurrent_users": 32, "think_time_s": 100},
                         "candidates": {**LONG_PROMPTS["candidates"], "deployment": "disaggregated"}})
    assert body["plans"]
    assert "users / (mean request time + think time)" in body["assumptions"]["load_model"]
    for item in body["plans"]:
        decode = item["disaggregation"]["decode"]
        sized = decode["load_per_worker_requests_per_s"] * decode["workers"]
        assert sized >= 32 / (2 + 999 * 0.03 + 100) * (1 - 1e-9)
        sent = item["predicted"]["requests_per_s"] * decode["workers"]
        assert sent <= sized * 1.02
        assert sent <= 32 / (100 + 999 * item["predicted"]["tpot"]["p50_ms"] / 1000)
        assert "mean think time 100 s" in item["binding_detail"]


def test_both_with_a_closed_loop_ranks_both_kinds_and_says_which_wins(client):
    body = plan(client, {**LONG_PROMPTS, "workload": {"input_tokens": 8000, "output_tokens": 1000,
                                                      "concurrent_users": 32}})
    assert {p["deployment"] for p in body["plans"]} == {"aggregated", "disaggregated"}
    first = body["plans"][0]["deployment"]
    assert any(note.startswith(f"{first} wins: ") or f"tie at ${body['plans'][0]['cost_per_hour_usd']:,.2f}/h: the "
               f"{first} plan ranks first" in note for note in body["assumptions"]["notes"])
    costs = [p["cost_per_hour_usd"] for p in body["plans"]]
    assert costs == sorted(costs)


def test_an_open_loop_pool_states_no_users(client):
    body = plan(client, LONG_PROMPTS)
    pools = [p["disaggregation"] for p in body["plans"] if p["deployment"] == "disaggregated"]
    assert pools and all(pool[role]["users_per_worker"] is None for pool in pools for role in ("prefill", "decode"))


def test_disaggregation_with_speculative_decoding_is_a_422(client):
    body = {**CHAT, "speculative": {"acceptance_rate": 0.7, "draft_tokens": 3}}
    response = client.post("/v1/slo-plan", json=body)
    assert response.status_code == 422
    assert [error["pointer"] for error in response.json()["errors"]] == ["/body/candidates/deployment"]


def test_each_pool_states_its_own_layout(client):
    """DeepSeek-V3 on H200 at 20 req/s (1k in / 1k out): the search tries each pool's DP/EP layouts, and two plans
    may differ in a pool's expert parallelism alone. Each pool states its layout, so they read apart:
    - gpus = workers x tp x pp x dp (each worker is tp x pp x dp GPUs);
    - moe_tensor_parallel = tp x dp / ep (the GPUs each routed expert is split over);
    - the label names TP, then DP and EP where above 1, then PP ("TP8 EP8 PP1");
    - vLLM's command has --data-parallel-size exactly when dp > 1, --enable-expert-parallel exactly when ep > 1."""
    body = plan(client, {"model": "deepseek-v3",
                         "workload": {"input_tokens": 1000, "output_tokens": 1000, "requests_per_s": 20},
                         "slo": {"ttft_ms": 2000, "tpot_ms": 50, "percentile": 95},
                         "candidates": {"gpus": ["h200-sxm"], "deployment": "disaggregated"}})
    descriptions = []
    for disaggregated in body["plans"]:
        pools = disaggregated["disaggregation"]
        for pool in (pools["prefill"], pools["decode"]):
            tp, pp, dp, ep = (pool[name] for name in ("tensor_parallel", "pipeline_parallel", "data_parallel",
                                                      "expert_parallel"))
            assert pool["gpus"] == pool["workers"] * tp * pp * dp
            assert pool["moe_tensor_parallel"] == tp * dp // ep
            assert pool["layout"] == " ".join([f"TP{tp}", *([f"DP{dp}"] if dp > 1 else []),
                                               *([f"EP{ep}"] if ep > 1 else []), f"PP{pp}"])
            command = pool["launch"]["command"]
            assert (f"--data-parallel-size {dp}" in command) == (dp > 1)
            assert ("--enable-expert-parallel" in command) == (ep > 1)
        descriptions.append(tuple(sorted((role, key, str(value)) for role in ("prefill", "decode")
                                         for key, value in pools[role].items() if key != "launch")))
    assert len(body["plans"]) >= 2
    # Plans that differ only in a pool's layout no longer read the same without their commands.
    assert len(set(descriptions)) == len(descriptions)
    assert any(pools["disaggregation"][role]["expert_parallel"] > 1 for pools in body["plans"]
               for role in ("prefill", "decode"))


def test_a_peak_sizes_the_pools_and_the_fleets_tokens_stay_at_the_mean_rate(client):
    """2 req/s of 1,000-token answers with a peak-to-mean ratio of 1.5: the pools are sized for 3 req/s, so the
    prediction carries 3 req/s and 3 x 1,000 = 3,000 tokens/s over the decode workers (was: 2,000, the mean rate's,
    beside the peak's requests), while the plan's output_tokens_per_s, the cost per token's basis, stays the mean
    rate's 2 x 1,000 = 2,000 tokens/s."""
    body = plan(client, {**LONG_PROMPTS, "workload": {**LONG_PROMPTS["workload"], "peak_to_mean_ratio": 1.5}})
    disaggregated = next(p for p in body["plans"] if p["deployment"] == "disaggregated")
    workers, predicted = disaggregated["disaggregation"]["decode"]["workers"], disaggregated["predicted"]
    assert predicted["requests_per_s"] == pytest.approx(3 / workers)
    assert predicted["output_tokens_per_s"] == pytest.approx(3000 / workers)
    assert disaggregated["output_tokens_per_s"] == pytest.approx(2000)


def test_extra_replicas_spare_workers_in_each_pool(client):
    """N + 1: an aggregated plan gets one replica more, a disaggregated one a worker more in each pool (two
    replicas more in all), counted in its GPUs and cost."""
    body = plan(client, {**LONG_PROMPTS, "ha_policy": {"extra_replicas": 1}})
    kinds = {p["deployment"]: p for p in body["plans"]}
    assert kinds["aggregated"]["extra_replicas"] == 1
    disaggregated = kinds["disaggregated"]
    pools = disaggregated["disaggregation"]
    assert [pools[role]["extra_workers"] for role in ("prefill", "decode")] == [1, 1]
    assert disaggregated["extra_replicas"] == 2
    assert disaggregated["replicas"] == pools["prefill"]["workers"] + pools["decode"]["workers"]
    assert disaggregated["gpus"] == pools["prefill"]["gpus"] + pools["decode"]["gpus"]
    assert disaggregated["cost_per_hour_usd"] == pytest.approx(
        disaggregated["gpus"] * disaggregated["price_per_gpu_hour_usd"])
    assert not any("extra_replicas" in note for note in body["assumptions"]["notes"])
    # The per-replica fields are a decode worker's: offered with every worker up, verified and predicted with the
    # spare down (d - 1 workers timed), so the utilization is (d - 1) / d, as an aggregated N + 1 fleet's is below 1.
    workers, load, predicted = pools["decode"]["workers"], disaggregated["load_per_replica"], disaggregated["predicted"]
    assert load["offered"] == pytest.approx(2 / workers)
    assert load["max_verified"] == pytest.approx(2 / (workers - 1)) == pytest.approx(predicted["requests_per_s"])
    assert disaggregated["utilization_ratio"] == pytest.approx((workers - 1) / workers)
    assert predicted["output_tokens_per_s"] == pytest.approx(1000 * predicted["requests_per_s"])
    bare = plan(client, LONG_PROMPTS)
    assert all(p["disaggregation"][role]["extra_workers"] == 0 for p in bare["plans"]
               if p["deployment"] == "disaggregated" for role in ("prefill", "decode"))


def _priced(cost: float, gpus: int, e2e_s: float, label: str) -> SimpleNamespace:
    return SimpleNamespace(cost_per_hour_usd=cost, gpus=gpus, e2e_at_slo_percentile_s=e2e_s, label=label,
                           transfer=SimpleNamespace(time_s=0.01, link="nvlink", prompt_tokens=4000))


@pytest.mark.parametrize(("share", "why"), [
    (0.2, ("prefill is a small share of the work (20% of the GPU time a request takes in the disaggregated plan), "
           "so mixing it into decode steps costs little TPOT")),
    (0.5, ("prefill is much of the work (50% of the GPU time a request takes in the disaggregated plan), and prompt "
           "chunks slow the decode steps less than the split costs")),
    (0.9, ("prefill is most of the work (90% of the GPU time a request takes in the disaggregated plan), so few "
           "decode steps are left for prompt chunks to slow")),
])
def test_why_aggregated_wins_follows_the_share_of_the_work_prefill_is(share, why):
    """$50/h aggregated against $60/h disaggregated: 60 / 50 - 1 = 20% more. Prefill's share of a request's GPU
    time (`prefill_share`): 20% (a third or less: small), 50%, 90% (two thirds or more: most). The transfer: 0.01 s
    = 10 ms of a 4,000-token mean prompt over NVLink (`_priced`)."""
    aggregated = SimpleNamespace(plans=[_priced(50.0, 8, 10.0, "a")])
    disaggregated = _priced(60.0, 10, 12.0, "d")
    disaggregated.prefill_share = share
    note = _comparison_note(aggregated, SimpleNamespace(plans=[disaggregated]))
    assert note == ("aggregated wins: $50.00/h against $60.00/h disaggregated (20% more): with prompts of 4,000 tokens "
                    f"on average, {why}, while separate pools each round up to whole workers, cannot lend idle "
                    "capacity to each other and add a KV transfer (10 ms per mean prompt over nvlink) to every TTFT")


def test_the_comparison_note_follows_the_ranking_on_a_cost_tie_and_says_when_neither_kind_plans():
    """$53.92/h both: the disaggregated plan of 8 GPUs ranks before the aggregated one of 16 (fewer GPUs), and
    the note says so instead of calling either cheaper."""
    aggregated = SimpleNamespace(plans=[_priced(53.92, 16, 10.0, "a")])
    disaggregated = SimpleNamespace(plans=[_priced(53.92, 8, 12.0, "d")])
    note = _comparison_note(aggregated, disaggregated)
    assert note.startswith("aggregated and disaggregated tie at $53.92/h: the disaggregated plan ranks first")
    empty = SimpleNamespace(plans=[])
    assert _comparison_note(empty, empty) == "aggregated vs disaggregated: no plan of either kind meets the SLO"
    assert _comparison_note(empty, disaggregated).endswith("no aggregated plan meets the SLO")


@pytest.mark.parametrize("users", [8, 40])
def test_every_closed_loop_plan_carries_its_users_rate(client, users):
    """Three-token answers of 1k prompts on three GPU types: the users' rate hangs mostly on TTFT, which each
    plan's pools set, so plans of one rate differ most in what their users send. Each plan is sized at its own
    users' rate and carries them (a decode worker's share of their rate within 2% of its share of the rate it was
    sized for); one whose rate is not found is listed infeasible."""
    body = plan(client, {"model": "qwen3-8b", "workload": {"input_tokens": 1000, "output_tokens": 3,
                                                           "concurrent_users": users},
                         "slo": {"ttft_ms": 5000, "tpot_ms": 40, "percentile": 95},
                         "candidates": {"gpus": ["h100-sxm", "l4", "h20"], "deployment": "both"}})
    plans = [item for item in body["plans"] if item["deployment"] == "disaggregated"]
    assert plans
    for item in plans:
        decode = item["disaggregation"]["decode"]
        assert item["predicted"]["requests_per_s"] <= decode["load_per_worker_requests_per_s"] * 1.02


def test_one_token_answers_plan_a_decode_pool_of_one_step_a_request(client):
    """A one-token answer still takes one decode-worker step (the one that streams the prefill worker's token):
    the decode pool's ceiling divided by zero decode steps and the request was a 500."""
    body = plan(client, {**CHAT, "workload": {"input_tokens": 2000, "output_tokens": 1, "requests_per_s": 2}})
    assert {p["deployment"] for p in body["plans"]} == {"aggregated", "disaggregated"}
    disaggregated = next(p for p in body["plans"] if p["deployment"] == "disaggregated")
    assert disaggregated["disaggregation"]["decode"]["workers"] >= 1


def test_more_gpu_types_never_give_a_dearer_cheapest_disaggregated_plan(client, default_profile_loaded):
    """Llama-3.1-70B in fp8, 8k in / 1k out at 3 req/s, p95 TTFT 2 s: the prefill pools were sized for the four
    options of lowest analytic bound (one GPU or two each: back-to-back prefills of the mean prompt), whose TTFTs
    under load then needed many workers, while B200 at TP4 (bound about $27/h) was never sized: over H100, H200 and
    B200 the cheapest plan cost $49.88/h where B200 alone gave $40.44/h. More candidates must never cost more."""
    body = {"model": "llama-3.1-70b", "workload": {"input_tokens": 8000, "output_tokens": 1000, "requests_per_s": 3},
            "slo": {"ttft_ms": 2000, "tpot_ms": 30, "percentile": 95},
            "candidates": {"weight_dtypes": ["fp8"], "kv_dtypes": ["fp8"], "deployment": "disaggregated"}}
    alone = plan(client, {**body, "candidates": {**body["candidates"], "gpus": ["b200"]}})
    three = plan(client, {**body, "candidates": {**body["candidates"], "gpus": ["h100-sxm", "h200-sxm", "b200"]}})
    assert three["plans"][0]["cost_per_hour_usd"] <= alone["plans"][0]["cost_per_hour_usd"]
