"""POST /v1/slo-plan: the cheapest deployment meeting a latency SLO, over the reference catalog.

Most tests restrict the candidates to keep the suite fast; one plans over the whole catalog."""

import math

import pytest

ISSUE_EXAMPLE = {
    "model": "llama-3.1-70b",
    "workload": {"input_tokens": 1000, "output_tokens": 500, "requests_per_s": 5},
    "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
}
HOPPER = {"gpus": ["h100-sxm", "h200-sxm"]}


def post(client, body):
    return client.post("/v1/slo-plan", json=body)


def problem_pointers(response):
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return [error["pointer"] for error in response.json()["errors"]]


def assert_meets(plan, slo):
    predicted = plan["predicted"]
    assert plan["meets_slo"]
    assert predicted["ttft"]["at_slo_percentile_ms"] <= slo["ttft_ms"]
    assert predicted["tpot"]["at_slo_percentile_ms"] <= slo["tpot_ms"]


def test_the_issue_example_is_feasible_cheapest_first_and_every_plan_meets_its_slo(client):
    response = post(client, {**ISSUE_EXAMPLE, "candidates": HOPPER})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["feasible"] is True
    costs = [plan["cost_per_hour_usd"] for plan in body["plans"]]
    assert costs == sorted(costs) and len(costs) >= 2
    for plan in body["plans"]:
        assert_meets(plan, ISSUE_EXAMPLE["slo"])
        assert plan["gpu"] in HOPPER["gpus"]
        assert plan["launch"]["command"].startswith("vllm serve meta-llama/Meta-Llama-3.1-70B --tensor-parallel-size ")
    assert body["pareto"][0]["rank"] == 1
    assert body["assumptions"]["tpot_definition"].startswith("TPOT = (E2E - TTFT) / (output tokens - 1)")
    assert body["calculation_version"]
    # Llama-3.1-70B in bf16 (141 GB) fits no single 80 GB H100: an infeasible entry with its reason.
    single_h100 = [item for item in body["infeasible"] if item["gpu"] == "h100-sxm" and item["tensor_parallel"] == 1]
    assert single_h100[0]["reasons"][0].startswith("weights need 141.1 GB per GPU")


def test_the_same_request_gives_the_same_answer(client):
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h200-sxm"], "tensor_parallel": [2, 4]}}
    assert post(client, body).json() == post(client, body).json()


def test_the_whole_catalog_is_planned(client):
    """No candidates given: every catalog GPU at every valid TP degree within its node."""
    response = post(client, ISSUE_EXAMPLE)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["feasible"] is True
    search = body["search"]
    assert search["configurations_considered"] == (search["screened_out"] + search["bounded_out"]
                                                    + search["simulated"])
    assert search["simulated"] >= 1 and search["seed"] == 0
    priced = [plan["cost_per_hour_usd"] for plan in body["plans"] if plan["cost_per_hour_usd"] is not None]
    assert priced == sorted(priced)
    for plan in body["plans"]:
        assert_meets(plan, ISSUE_EXAMPLE["slo"])
    assert "gpus = every catalog GPU (34)" in body["assumptions"]["defaults_used"]


def test_more_candidates_never_give_a_dearer_cheapest_plan(client, default_profile_loaded):
    """Long prompts at 20 req/s with a tight TTFT: the whole catalog's cheapest plan must cost no more than the
    cheapest of any subset of its candidates. Under the shipped profile the search used to stop after six
    simulations (two per GPU type), while a configuration whose cost bound was below the cheapest plan found
    (MI325X at TP4) waited unsimulated: the whole catalog's rank 1 cost more than that GPU's own."""
    body = {"model": "llama-3.1-8b", "workload": {"input_tokens": 4000, "output_tokens": 200, "requests_per_s": 20},
            "slo": {"ttft_ms": 300, "tpot_ms": 40, "percentile": 95}}
    whole = post(client, body).json()
    alone = post(client, {**body, "candidates": {"gpus": ["mi325x"], "tensor_parallel": [4]}}).json()
    assert alone["feasible"] and whole["feasible"]
    assert whole["plans"][0]["cost_per_hour_usd"] <= alone["plans"][0]["cost_per_hour_usd"]
    assert not any("its limit" in note for note in whole["assumptions"]["notes"])


def test_an_impossible_slo_is_infeasible_with_reasons(client):
    """TPOT 2 ms for a 70B model: a batch-1 decode step reads ~141 GB of weights, 10+ ms even split
    eight ways over H200s (141 GB / 8 / 4.8 TB/s = 3.7 ms at full bandwidth, before efficiency)."""
    body = {**ISSUE_EXAMPLE, "slo": {"ttft_ms": 1000, "tpot_ms": 2, "percentile": 95}, "candidates": HOPPER}
    response = post(client, body)
    assert response.status_code == 200
    result = response.json()
    assert result["feasible"] is False and result["plans"] == [] and result["pareto"] == []
    reasons = [reason for item in result["infeasible"] for reason in item["reasons"]]
    assert any(reason.startswith("TPOT floor") and reason.endswith(
        "exceeds 2 ms (one decode step attending the median prompt of 1,000 tokens)") for reason in reasons)


def test_fleet_arithmetic_of_a_plan_by_hand(client):
    """Price override $2.00 per H200-hour, 5 req/s x peak-to-mean ratio 1.5 = 7.5 req/s, each replica loaded at
    most 0.8 of its verified maximum, one spare:
        replicas = ceil(7.5 / (max_verified x 0.8)) + 1, GPUs = replicas x TP, cost = GPUs x $2.00,
        output tokens/s at the peak = 5 x 500 = 2,500, $ per million = cost / (2,500 x 3,600) x 1e6,
        offered = 7.5 / replicas, utilization = offered / max_verified, nodes = ceil(replicas / (8 // TP))."""
    body = {**ISSUE_EXAMPLE,
            "workload": {**ISSUE_EXAMPLE["workload"], "peak_to_mean_ratio": 1.5},
            "candidates": {"gpus": ["h200-sxm"], "tensor_parallel": [2, 4], "gpu_price_per_hour_usd": {"h200-sxm": 2.0}},
            "ha_policy": {"extra_replicas": 1, "max_utilization_ratio": 0.8}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    for plan in response.json()["plans"]:
        load = plan["load_per_replica"]
        assert load["unit"] == "requests_per_s"
        assert plan["replicas"] == math.ceil(7.5 / (load["max_verified"] * 0.8) - 1e-9) + 1
        assert plan["extra_replicas"] == 1
        assert plan["gpus"] == plan["replicas"] * plan["tensor_parallel"]
        assert plan["nodes"] == math.ceil(plan["replicas"] / (8 // plan["tensor_parallel"]))
        assert plan["price_per_gpu_hour_usd"] == 2.0 and plan["price_source"] == "request"
        assert plan["cost_per_hour_usd"] == pytest.approx(plan["gpus"] * 2.0)
        assert plan["output_tokens_per_s"] == pytest.approx(2500.0)
        assert plan["output_tokens_per_s_per_gpu"] == pytest.approx(2500.0 / plan["gpus"])
        assert plan["cost_per_million_output_tokens_usd"] == pytest.approx(plan["gpus"] * 2.0 / (2500 * 3600) * 1e6)
        assert load["offered"] == pytest.approx(7.5 / plan["replicas"])
        assert plan["utilization_ratio"] == pytest.approx(load["offered"] / load["max_verified"])
        assert load["max_verified"] <= load["analytic_ceiling"] * 1.1
        assert_meets(plan, ISSUE_EXAMPLE["slo"])


def test_distributions_speculation_and_percentiles(client):
    """Lognormal prompts, a histogram of answers, p99 targets, n-gram speculation (k = 3, a = 0.6:
    E = (1 - 0.6^4) / 0.4 = 2.176 tokens per pass)."""
    body = {
        "model": "llama-3.1-8b",
        "workload": {"input_tokens": {"kind": "lognormal", "mean": 1000, "p50": 800},
                     "output_tokens": {"kind": "histogram", "bins": [[100, 0.5], [300, 0.5]]},
                     "requests_per_s": 10},
        "slo": {"ttft_ms": 1500, "tpot_ms": 40, "percentile": 99, "goodput_ratio": 0.95},
        "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
        "speculative": {"acceptance_rate": 0.6, "draft_tokens": 3},
    }
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["feasible"] is True
    (plan,) = result["plans"]
    assert plan["assumptions"]["tokens_per_pass"] == pytest.approx(2.176)
    assert plan["predicted"]["goodput_ratio"] >= 0.95
    assert plan["predicted"]["ttft"]["at_slo_percentile_ms"] == plan["predicted"]["ttft"]["p99_ms"]
    assert '"method":"ngram"' in plan["launch"]["command"]
    assert any("lognormal" in note for note in result["assumptions"]["notes"])


def test_closed_loop_plans_users(client):
    body = {"model": "llama-3.1-8b",
            "workload": {"input_tokens": 1000, "output_tokens": 200, "concurrent_users": 40},
            "slo": {"ttft_ms": 1000, "tpot_ms": 30}, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    (plan,) = response.json()["plans"]
    load = plan["load_per_replica"]
    assert load["unit"] == "concurrent_users"
    assert plan["replicas"] == math.ceil(40 / load["max_verified"] - 1e-9)
    assert load["offered"] == math.ceil(40 / plan["replicas"])
    # Users of fixed lengths fall into regular turns in the simulation: the note says so, and how to get tails.
    turns = [note for note in response.json()["assumptions"]["notes"] if "regular turns" in note]
    assert len(turns) == 1 and "output_tokens as a distribution" in turns[0] and "think_time_s" in turns[0]


def test_users_who_think_between_requests_need_fewer_replicas(client):
    """400 users of 1,000 in / 200 out on H100 TP1 with a 30 ms TPOT SLO. Thinking 60 s between requests, each
    holds a sequence slot a few seconds of every 60 or so: a replica's users send about N / (60 + E) req/s, and
    fewer replicas carry them than the same users sending at once. Their pauses are exponential, so they fall
    into no regular turns (no note on turns), and the load model says how long they think."""
    base = {"model": "llama-3.1-8b", "slo": {"ttft_ms": 1000, "tpot_ms": 30},
            "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]}}
    workload = {"input_tokens": 1000, "output_tokens": 200, "concurrent_users": 400}
    at_once = post(client, {**base, "workload": workload})
    thinking = post(client, {**base, "workload": {**workload, "think_time_s": 60}})
    assert at_once.status_code == thinking.status_code == 200, thinking.text
    (hurried,), (calm,) = at_once.json()["plans"], thinking.json()["plans"]
    assert calm["replicas"] < hurried["replicas"]
    assert calm["replicas"] == math.ceil(400 / calm["load_per_replica"]["max_verified"] - 1e-9)
    users = calm["load_per_replica"]["offered"]
    assert users / (60 + 10) <= calm["predicted"]["requests_per_s"] * 1.08 and (
        calm["predicted"]["requests_per_s"] <= users / 60 * 1.08)
    assumptions = thinking.json()["assumptions"]
    assert "each sending the next request 60 s on average after the last one finishes" in assumptions["load_model"]
    assert not any("regular turns" in note for note in assumptions["notes"])
    # Their answers are all 200 tokens: the groups that finish together, and what a short pause does to them.
    bursts = [note for note in assumptions["notes"] if "come back in bursts" in note]
    assert len(bursts) == 1 and "output_tokens as a distribution" in bursts[0]


def test_think_time_belongs_to_a_closed_loop_and_is_never_negative(client):
    open_loop = {**ISSUE_EXAMPLE, "workload": {**ISSUE_EXAMPLE["workload"], "think_time_s": 5}}
    negative = {**ISSUE_EXAMPLE, "workload": {"input_tokens": 1000, "output_tokens": 200, "concurrent_users": 4,
                                              "think_time_s": -1}}
    response = post(client, open_loop)
    assert problem_pointers(response) == ["/body/workload/think_time_s"] and "closed loop" in response.text
    assert problem_pointers(post(client, negative)) == ["/body/workload/think_time_s"]


@pytest.mark.parametrize(("field", "value", "load"), [
    ("think_time_s", 5, {"requests_per_s": 2}), ("peak_to_mean_ratio", 1.5, {"concurrent_users": 4}),
    ("burst_factor", 1.5, {"concurrent_users": 4}), ("arrival_cv", 2, {"concurrent_users": 4}),
])
def test_a_field_of_the_other_loop_is_a_422_at_that_field(client, field, value, load):
    """A closed loop's think time in an open loop, or an open loop's rate shaping in a closed one: the 422 points
    at the field itself (and says which loop it belongs to), not at the whole workload."""
    body = {**ISSUE_EXAMPLE, "workload": {"input_tokens": 1000, "output_tokens": 200, **load, field: value}}
    response = post(client, body)
    assert problem_pointers(response) == [f"/body/workload/{field}"] and "only" in response.text


def test_a_closed_loop_of_varied_answers_or_an_open_loop_gets_no_note_on_turns(client):
    """Requests decoding together finish together only when their answers have one length: prompts of varied
    lengths with answers of one length still get the note; answers of varied lengths, or an open loop, do not."""
    base = {"slo": {"ttft_ms": 1000, "tpot_ms": 30}, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
            "model": "llama-3.1-8b"}
    varied = {"kind": "lognormal", "mean": 200, "p50": 160}
    for workload, noted in (({"input_tokens": {"kind": "lognormal", "mean": 1000, "p50": 800}, "output_tokens": 200,
                              "concurrent_users": 40}, True),
                            ({"input_tokens": 1000, "output_tokens": varied, "concurrent_users": 40}, False),
                            ({"input_tokens": 1000, "output_tokens": 200, "requests_per_s": 5}, False)):
        response = post(client, {**base, "workload": workload})
        assert response.status_code == 200, response.text
        assert any("regular turns" in note for note in response.json()["assumptions"]["notes"]) is noted


def test_a_gpu_without_a_price_is_ranked_by_gpu_count_and_said_so(client):
    """gb200 has no catalog price: its plans come after priced ones, with a note."""
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["gb200", "h200-sxm"], "tensor_parallel": [2, 4]}}
    result = post(client, body).json()
    prices = [plan["cost_per_hour_usd"] for plan in result["plans"]]
    unpriced = [index for index, price in enumerate(prices) if price is None]
    assert unpriced and all(index > priced for index in unpriced
                            for priced, price in enumerate(prices) if price is not None)
    assert any("no price" in note for note in result["assumptions"]["notes"])


# Bad input -----------------------------------------------------------------------------------------

def test_both_a_rate_and_users_is_422(client):
    body = {**ISSUE_EXAMPLE, "workload": {**ISSUE_EXAMPLE["workload"], "concurrent_users": 10}}
    assert problem_pointers(post(client, body)) == ["/body/workload"]


def test_percentile_100_is_422(client):
    body = {**ISSUE_EXAMPLE, "slo": {**ISSUE_EXAMPLE["slo"], "percentile": 100}}
    assert problem_pointers(post(client, body)) == ["/body/slo/percentile"]


def test_negative_tokens_are_422(client):
    body = {**ISSUE_EXAMPLE, "workload": {**ISSUE_EXAMPLE["workload"], "input_tokens": -5}}
    pointers = problem_pointers(post(client, body))
    assert pointers and all(pointer.startswith("/body/workload/input_tokens") for pointer in pointers)


def test_an_empty_candidate_list_is_422(client):
    assert problem_pointers(post(client, {**ISSUE_EXAMPLE, "candidates": {"gpus": []}})) == ["/body/candidates/gpus"]


def test_an_unknown_gpu_is_404(client):
    response = post(client, {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm", "no-such-gpu"]}})
    assert response.status_code == 404
    assert "no-such-gpu" in response.json()["detail"]


@pytest.mark.parametrize(("draft", "noted"), [("qwen2.5-7b", True), ("llama-3.2-1b", False)])
def test_a_draft_model_of_another_vocabulary_is_noted(client, draft, noted):
    """The target verifies the token ids its draft proposes, so both need one tokenizer. Qwen2.5-7B's vocabulary
    (152,064) is not Llama-3.1-8B's (128,256): the plan says so (a note, not a refusal: checkpoints of one
    tokenizer may pad their tables differently); Llama-3.2-1B shares the 128,256."""
    body = {**ISSUE_EXAMPLE, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
            "speculative": {"draft_model": draft, "acceptance_rate": 0.7, "draft_tokens": 4}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    notes = [note for note in response.json()["assumptions"]["notes"] if "vocabulary" in note]
    assert notes == ([("the draft model's vocabulary (152,064 tokens) is not the target's (128,256): a draft must "
                      "share the target's tokenizer, whose token ids the target verifies; check that it does (a "
                      "padded embedding table also changes the size)")] if noted else [])


def test_an_unknown_draft_model_is_404(client):
    body = {**ISSUE_EXAMPLE, "candidates": HOPPER,
            "speculative": {"draft_model": "no-such-model", "acceptance_rate": 0.7, "draft_tokens": 4}}
    assert post(client, body).status_code == 404


def test_an_unknown_calibration_profile_is_404_naming_the_field(client):
    response = post(client, {**ISSUE_EXAMPLE, "candidates": HOPPER, "calibration": "nope"})
    assert response.status_code == 404, response.text
    assert [error["pointer"] for error in response.json()["errors"]] == ["/body/calibration"]


def test_tensor_parallel_must_divide_the_heads(client):
    """Llama-3.1-70B has 64 heads, 8 KV heads and an MLP of 28,672: 3 divides none of them (three rules)."""
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [2, 3]}}
    assert problem_pointers(post(client, body)) == ["/body/candidates/tensor_parallel/1"] * 3


@pytest.mark.parametrize(("model", "candidates", "rule"), [
    # Llama-3.1-70B has no experts to deal out.
    ("llama-3.1-70b", {"tensor_parallel": [1, 2], "expert_parallel": [1, 3]}, "needs an MoE model"),
    # Mixtral-8x7B: 3 divides neither tp x dp = 1 x 1 nor 2 x 1, so no layout has 3 EP ranks.
    ("mixtral-8x7b", {"tensor_parallel": [1, 2], "expert_parallel": [3]}, "divides no tensor_parallel x data_parallel"),
    # DeepSeek-V3 (128 heads) on H100 with the default TP degrees 1, 2, 4, 8 and DP 2: tp x dp in 2..16, never 7.
    ("deepseek-v3", {"data_parallel": [2], "expert_parallel": [7]}, "([1, 2, 4, 8] x [2])"),
])
def test_an_expert_parallel_degree_that_makes_no_layout_is_422(client, model, candidates, rule):
    """Such a degree was dropped from the search without a word: an answer with no plan and no reason, or, for
    DeepSeek-V3, plans of other layouts only."""
    body = {**ISSUE_EXAMPLE, "model": model, "candidates": {"gpus": ["h100-sxm"], **candidates}}
    response = post(client, body)
    index = len(candidates["expert_parallel"]) - 1
    assert problem_pointers(response) == [f"/body/candidates/expert_parallel/{index}"]
    assert rule in response.json()["detail"]


def test_a_rate_below_one_request_a_day_is_422(client):
    """1e-14 requests/s spread 2,000 simulated arrivals over 2e17 s, where a float time resolves only ~30 s: the
    plan answered TTFT and TPOT of 0 ms (5e-324: a NaN in its reason). The floor is 1e-05 (0.864 a day), whose
    20,000 arrivals span 2e9 s, resolved to 0.5 us; there the plan is an idle replica's: a TTFT above 0."""
    body = {**ISSUE_EXAMPLE, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]}}
    for rate in (1e-14, 5e-324, 9.9e-6):
        low = {**body, "workload": {**ISSUE_EXAMPLE["workload"], "requests_per_s": rate}}
        assert problem_pointers(post(client, low)) == ["/body/workload/requests_per_s"]
    lowest = post(client, {**body, "workload": {**ISSUE_EXAMPLE["workload"], "requests_per_s": 1e-5}})
    assert lowest.status_code == 200, lowest.text
    plan = lowest.json()["plans"][0]
    assert plan["replicas"] == 1 and plan["predicted"]["ttft"]["p50_ms"] > 0


def test_a_shared_prefix_longer_than_the_prompt_is_422(client):
    """Every 1,000-token prompt starts with the shared prefix, so it has at most 1,000 tokens; 5,000 was read as the
    whole prompt without a word. Equal to the prompt it plans."""
    for prefix, status in ((1001, 422), (1000, 200)):
        body = {**ISSUE_EXAMPLE, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
                "workload": {**ISSUE_EXAMPLE["workload"], "shared_prefix_tokens": prefix}}
        response = post(client, body)
        if status == 422:
            assert problem_pointers(response) == ["/body/workload/shared_prefix_tokens"]
        else:
            assert response.status_code == 200, response.text


def test_a_search_space_above_the_limit_is_422(client):
    """34 catalog GPUs x 6 weight dtypes x 4 KV dtypes x up to 4 TP degrees is far above 512."""
    body = {**ISSUE_EXAMPLE, "candidates": {"weight_dtypes": ["bf16", "fp16", "fp8", "int8", "int4", "fp4"],
                                            "kv_dtypes": ["bf16", "fp16", "fp8", "int8"]}}
    response = post(client, body)
    assert problem_pointers(response) == ["/body/candidates"]
    assert "limit of 512" in response.json()["detail"]


def test_a_price_for_a_gpu_not_searched_is_422(client):
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm"], "gpu_price_per_hour_usd": {"h200-sxm": 3.0}}}
    assert problem_pointers(post(client, body)) == ["/body/candidates/gpu_price_per_hour_usd/h200-sxm"]


def test_a_request_longer_than_the_model_is_422(client):
    """Llama-3.1-70B has 131,072 positions."""
    body = {**ISSUE_EXAMPLE, "workload": {"input_tokens": 130_000, "output_tokens": 5000, "requests_per_s": 1}}
    assert problem_pointers(post(client, body)) == ["/body/workload"]


def test_a_lognormal_no_distribution_fits_is_422(client):
    body = {**ISSUE_EXAMPLE, "workload": {**ISSUE_EXAMPLE["workload"],
                                          "input_tokens": {"kind": "lognormal", "mean": 1000}}}
    assert problem_pointers(post(client, body)) == ["/body/workload/input_tokens"]


def test_model_and_model_spec_together_are_422(client):
    from app.catalog.schemas import MODEL_ARCHITECTURE_EXAMPLE
    response = post(client, {**ISSUE_EXAMPLE, "model_spec": MODEL_ARCHITECTURE_EXAMPLE})
    assert problem_pointers(response) == ["/body/model_spec"]


def test_an_inline_model_is_planned(client):
    from app.catalog.schemas import MODEL_ARCHITECTURE_EXAMPLE
    body = {key: value for key, value in ISSUE_EXAMPLE.items() if key != "model"}
    body.update(model_spec=MODEL_ARCHITECTURE_EXAMPLE, candidates={"gpus": ["h200-sxm"], "tensor_parallel": [4]})
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["model"] == "model_spec (inline)"
    assert result["plans"][0]["launch"]["command"].startswith("vllm serve /path/to/model ")


BURST_CASE = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h200-sxm"], "tensor_parallel": [4]}}


def test_burst_factor_is_the_deprecated_name_of_peak_to_mean_ratio(client):
    """The old field keeps its old meaning (it scales the rate the fleet is sized for), and both
    spellings give the same answer; giving both with different values is a 422."""
    old = post(client, {**BURST_CASE, "workload": {**ISSUE_EXAMPLE["workload"], "burst_factor": 1.5}})
    new = post(client, {**BURST_CASE, "workload": {**ISSUE_EXAMPLE["workload"], "peak_to_mean_ratio": 1.5}})
    assert old.status_code == new.status_code == 200, old.text
    assert old.json() == new.json()
    assert "x peak-to-mean ratio 1.5" in new.json()["assumptions"]["load_model"]
    both = post(client, {**BURST_CASE, "workload": {**ISSUE_EXAMPLE["workload"], "burst_factor": 1.5,
                                                     "peak_to_mean_ratio": 2}})
    assert problem_pointers(both) == ["/body/workload"]


def test_bursty_arrivals_lower_what_a_replica_can_carry(client):
    """Same mean rate (40 req/s), gaps with CV 8 instead of Poisson. The balancer deals the stream out at random
    over the fleet's replicas, so each of N sees CV sqrt(1 + 63 / N): sqrt(10) = 3.2 over 7 replicas, 2.3 over 15.
    Queues are longer at every load (Kingman: the wait grows with CV^2 + the service
    times' CV^2), so the highest verified load per replica is lower, more replicas are needed, and the load model
    names the Gamma stream and its split. Closed loops have no arrival process to shape (422)."""
    busy = {**ISSUE_EXAMPLE["workload"], "requests_per_s": 40}
    poisson = post(client, {**BURST_CASE, "workload": busy})
    bursty = post(client, {**BURST_CASE, "workload": {**busy, "arrival_cv": 8}})
    assert poisson.status_code == bursty.status_code == 200, bursty.text
    calm, clumped = poisson.json()["plans"][0], bursty.json()["plans"][0]
    assert clumped["load_per_replica"]["max_verified"] < calm["load_per_replica"]["max_verified"]
    assert clumped["replicas"] > calm["replicas"]
    load_model = bursty.json()["assumptions"]["load_model"]
    assert "Gamma renewal stream (gaps with coefficient of variation 8) dealt out at random" in load_model
    assert "sqrt(1 + (8^2 - 1) / N)" in load_model
    closed = post(client, {**BURST_CASE, "workload": {"input_tokens": 1000, "output_tokens": 500,
                                                       "concurrent_users": 8, "arrival_cv": 2}})
    assert problem_pointers(closed) == ["/body/workload/arrival_cv"]


def test_a_bunched_stream_that_misses_at_a_small_fleets_light_load_is_planned_on_a_larger_one(client):
    """CV 4 at 5 req/s, p99 TTFT 150 ms: each of N replicas sees CV sqrt(1 + 15 / N), 1.63 at the 9 replicas where
    a replica's load is its light-load share (it was given up there: "misses the SLO even at light load"), 1.12 at
    60. The search now goes on until the shares are nearly Poisson (CV^2 within 0.1 of 1: 150 replicas) before it
    gives up: the plan meets the SLO, on more replicas than the same rate's Poisson stream needs."""
    body = {"model": "llama-3.1-8b", "workload": {"input_tokens": 2000, "output_tokens": 200, "requests_per_s": 5},
            "slo": {"ttft_ms": 150, "tpot_ms": 50, "percentile": 99},
            "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]}}
    poisson = post(client, body).json()
    bunched = post(client, {**body, "workload": {**body["workload"], "arrival_cv": 4}}).json()
    assert poisson["feasible"] and bunched["feasible"], bunched["infeasible"]
    plan = bunched["plans"][0]
    assert_meets(plan, body["slo"])
    assert plan["replicas"] > poisson["plans"][0]["replicas"]


# Inline GPUs ---------------------------------------------------------------------------------

def inline_h100(client, **changes):
    """The catalog's H100 SXM spec as an inline GPU (no catalog bookkeeping), at a negotiated price."""
    row = client.get("/v1/gpus/h100-sxm").json()
    spec = {name: row[name] for name in ("family", "memory_bytes", "memory_bandwidth_bytes_per_s",
                                         "interconnect_bandwidth_bytes_per_s", "gpus_per_node",
                                         "scale_out_bandwidth_bytes_per_s", "fp32_tflops", "tf32_tflops",
                                         "bf16_tflops", "fp16_tflops", "fp8_tflops", "int8_tops", "fp4_tflops",
                                         "tdp_w")}
    return {**spec, "slug": "h100-negotiated", "name": "H100 SXM at a negotiated price", "price_per_hour_usd": 2.1,
            **changes}


def test_an_inline_gpu_is_ranked_among_catalog_gpus_and_never_stored(client):
    """The inline GPU is an H100 SXM at $2.10 instead of the catalog's $3.64 per GPU-hour: the same spec
    simulates the same (same seed, same efficiency: family hopper), so it needs exactly the catalog
    H100's replicas and GPUs, and costs 2.10 / 3.64 = 57.7 % as much: the cheapest plan, with its price
    reported as given in the request. The catalog is the same before and after."""
    before = client.get("/v1/gpus", params={"limit": 200}).json()
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm", "h200-sxm"], "tensor_parallel": [4],
                                            "gpu_specs": [inline_h100(client)]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    plans = {plan["gpu"]: plan for plan in response.json()["plans"]}
    assert response.json()["plans"][0]["gpu"] == "h100-negotiated"
    inline, catalog = plans["h100-negotiated"], plans["h100-sxm"]
    assert (inline["replicas"], inline["gpus"]) == (catalog["replicas"], catalog["gpus"])
    assert inline["price_per_gpu_hour_usd"] == 2.1 and inline["price_source"] == "request"
    assert catalog["price_per_gpu_hour_usd"] == 3.64 and catalog["price_source"] == "catalog"
    assert inline["cost_per_hour_usd"] == pytest.approx(catalog["cost_per_hour_usd"] * 2.1 / 3.64)
    assert inline["gpu_name"] == "H100 SXM at a negotiated price"
    assert client.get("/v1/gpus", params={"limit": 200}).json() == before
    assert client.get("/v1/gpus/h100-negotiated").status_code == 404


def test_only_inline_gpus(client):
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": [], "tensor_parallel": [4], "gpu_specs": [inline_h100(client)]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    assert {plan["gpu"] for plan in response.json()["plans"]} == {"h100-negotiated"}
    assert problem_pointers(post(client, {**ISSUE_EXAMPLE, "candidates": {"gpus": []}})) == ["/body/candidates/gpus"]


@pytest.mark.parametrize(("changes", "pointer"), [
    ({"price_per_hour_usd": None}, "/body/candidates/gpu_specs/0/price_per_hour_usd"),
    ({"slug": "h100-sxm"}, "/body/candidates/gpu_specs/0/slug"),  # a candidate catalog GPU's slug
    ({"memory_bytes": 0}, "/body/candidates/gpu_specs/0/memory_bytes"),
    ({"vendor": "N" * 65}, "/body/candidates/gpu_specs/0/vendor"),  # the catalog column holds 64
    ({"form_factor": "SXM5"}, "/body/candidates/gpu_specs/0/form_factor"),  # not a spec field
])
def test_inline_gpus_are_validated_like_catalog_rows(client, changes, pointer):
    spec = {key: value for key, value in inline_h100(client, **changes).items() if value is not None}
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [4], "gpu_specs": [spec]}}
    assert pointer in problem_pointers(post(client, body))


def test_an_inline_gpu_takes_no_price_override(client):
    body = {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [4],
                                            "gpu_specs": [inline_h100(client)],
                                            "gpu_price_per_hour_usd": {"h100-negotiated": 1.0}}}
    assert problem_pointers(post(client, body)) == ["/body/candidates/gpu_price_per_hour_usd/h100-negotiated"]


def test_a_model_one_node_cannot_hold_is_planned_in_pipeline_stages_across_nodes(client):
    """Llama-3.1-405B in bf16 is about 811.7 GB of weights: 101.5 GB per GPU at TP8, above 90% of an H100's
    85.5 GB, so one 8-GPU node cannot hold it and every single-node layout is infeasible. The default search
    adds TP8 x PP2 (16 GPUs on 2 nodes, 50.7 GB of weights each) and TP8 x PP4; the cheapest plan is TP8 x PP2,
    launched with vLLM's --pipeline-parallel-size, and the defaults say why stages were searched."""
    body = {"model": "llama-3.1-405b",
            "workload": {"input_tokens": 1000, "output_tokens": 200, "requests_per_s": 1},
            "slo": {"ttft_ms": 3000, "tpot_ms": 100, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "weight_dtypes": ["bf16"]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["feasible"] is True
    best = result["plans"][0]
    assert (best["tensor_parallel"], best["pipeline_parallel"], best["gpus"] // best["replicas"]) == (8, 2, 16)
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in best["launch"]["command"]
    assert {item["pipeline_parallel"] for item in result["infeasible"]} == {1}
    assert any(text.startswith("pipeline_parallel = 1, and where one node") for text in
               result["assumptions"]["defaults_used"])
    # Asked for one stage only, the same request has no plan.
    only_one = post(client, {**body, "candidates": {**body["candidates"], "pipeline_parallel": [1]}}).json()
    assert only_one["feasible"] is False


def test_an_moe_model_one_node_cannot_hold_is_also_planned_in_attention_dp_and_ep_across_nodes(client):
    """DeepSeek-V3 in fp8 is 85.1 GB per GPU at TP8, above 90% of an H100's 85.5 GB: one node cannot hold it.
    Beside the pipelines, the default search tries DEP16 over two nodes (59.9 GB of weights per GPU, worked in
    tests/domain/test_plan.py) and DEP32. Under TensorRT-LLM the DEP16 plan is one replica of 16 GPUs on 2 nodes,
    launched with --tp_size 16 --ep_size 16 and attention DP in its YAML; the defaults say why it was searched,
    and a request that lists its TP degrees gets no such layout."""
    body = {"model": "deepseek-v3",
            "workload": {"input_tokens": 1000, "output_tokens": 1000, "requests_per_s": 5},
            "slo": {"ttft_ms": 3000, "tpot_ms": 80, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "engine": "trtllm"}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    wide = [plan for plan in result["plans"] if plan["data_parallel"] == 16]
    assert wide, [plan["layout"] for plan in result["plans"]]
    plan = wide[0]
    assert (plan["layout"], plan["gpus_per_replica"], plan["nodes"]) == ("TP1 DP16 EP16 PP1", 16, 2 * plan["replicas"])
    assert "--tp_size 16 --pp_size 1 --ep_size 16 " in plan["launch"]["command"]
    assert "enable_attention_dp: true" in " ".join(plan["launch"]["notes"])
    assert any(note.startswith("one replica spans 2 nodes (16 GPUs") for note in plan["launch"]["notes"])
    assert any(text.startswith("where one node of a GPU cannot hold an MoE model's weights, also attention DP + EP")
               for text in result["assumptions"]["defaults_used"])
    listed = post(client, {**body, "candidates": {**body["candidates"], "tensor_parallel": [8]}}).json()
    considered = listed["plans"] + listed["infeasible"]
    assert considered and all(item["data_parallel"] == 1 for item in considered)


def test_tensorrt_llm_is_planned_on_nvidia_gpus_only(client):
    """Asked for TensorRT-LLM on an MI300X and an H100, the plans are all on the H100; every MI300X layout is
    infeasible for its maker (the same request under vLLM may plan either)."""
    body = {"model": "llama-3.1-8b", "workload": {"input_tokens": 1000, "output_tokens": 200, "requests_per_s": 1},
            "slo": {"ttft_ms": 3000, "tpot_ms": 100, "percentile": 95},
            "candidates": {"gpus": ["mi300x", "h100-sxm"], "engine": "trtllm", "tensor_parallel": [1]},
            "simulated_requests": 500}
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["plans"] and {plan["gpu"] for plan in result["plans"]} == {"h100-sxm"}
    refused = [item for item in result["infeasible"] if item["gpu"] == "mi300x"]
    assert refused and all(item["reasons"] == ["trtllm runs on NVIDIA GPUs only, and AMD Instinct MI300X is AMD's"]
                           for item in refused)


def test_gpt_oss_fp4_is_planned_as_its_published_mxfp4_checkpoint(client):
    """gpt-oss ships in fp4 only as OpenAI's checkpoint: MXFP4 experts, bf16 attention (recipe gpt_oss_mxfp4; its
    weights are worked in tests/api/test_capacity.py). The plan's KV pool is /v1/capacity's for that recipe on the
    same GPU and layout, and the plan says which checkpoint it sized."""
    body = {"model": "gpt-oss-120b", "workload": {"input_tokens": 1000, "output_tokens": 500, "requests_per_s": 1},
            "slo": {"ttft_ms": 5000, "tpot_ms": 200, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1], "data_parallel": [1],
                           "expert_parallel": [1]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["plans"], answer["infeasible"]
    sizing = {"model": "gpt-oss-120b", "gpu": "h100-sxm", "input_tokens": 1000, "output_tokens": 500,
              "weight_recipe": "gpt_oss_mxfp4"}
    assert answer["plans"][0]["kv_tokens_per_replica"] == client.post("/v1/capacity", json=sizing).json()["kv_tokens"]
    assert any(line.startswith("weight_recipe = gpt_oss_mxfp4 (the model's one published fp4 checkpoint")
               for line in answer["assumptions"]["defaults_used"])


def test_a_pipeline_plan_holds_the_fewest_blocks_any_stage_fits(client):
    """DeepSeek-V3 fp8 at TP8 x PP4 under TensorRT-LLM on H100: the first stage (16 layers, 19,411,648,768 B of
    weights in DeepSeek's block-scaled fp8 checkpoint) fits 87,890 blocks of 32 tokens, the fewest of the four
    (tests/api/test_capacity.py works them out), so the plan's replica holds 87,890 x 32 = 2,812,480 tokens,
    /v1/capacity's figure, not the heaviest stage's budget over the most layers."""
    body = {"model": "deepseek-v3", "workload": {"input_tokens": 1000, "output_tokens": 1000, "requests_per_s": 5},
            "slo": {"ttft_ms": 2000, "tpot_ms": 200, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "engine": "trtllm", "weight_dtypes": ["fp8"], "tensor_parallel": [8],
                           "pipeline_parallel": [4]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    assert plans and plans[0]["layout"] == "TP8 PP4"
    assert plans[0]["kv_tokens_per_replica"] == 87_890 * 32 == 2_812_480
