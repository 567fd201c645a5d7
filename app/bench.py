"""`make bench` (`python -m app.bench`): per-request compute time of each sizing endpoint's core call,
then the service under real HTTP load (app.loadtest: requests/s and p50/p99 per endpoint).

Each row times the pure calculation an endpoint's service makes, with the specs already resolved
from the reference catalog (app/data), so catalog reads, validation and JSON are left out: what is
measured is the arithmetic a request costs. Each call is timed `REPEATS` times, one call per timing
(timeit.repeat with number=1, after a warm-up), on the process's CPU-time clock so that time the
process spends preempted on a busy machine does not count; the table gives the median and p99 in
microseconds. The target is well under 1 ms per call, and a median of at most 100 ms for a whole-catalog
plan (every catalog GPU, the default candidates) of each of a dense 70B, an MoE and a windowed model. Two
disaggregated whole-catalog plans (an open loop and a closed loop of users) are timed beside them, with no
target: they simulate each pool at several worker counts. A benchmark, not a test: nothing here asserts a time.

To add an endpoint (e.g. /v1/capacity or /v1/slo-plan), append one `Case` to `CASES`: the endpoint
path, a short label for the core call, and a zero-argument callable that makes that call, e.g.

    Case("/v1/capacity", "capacity(llama-3-70b, 4 x h100-sxm)",
         lambda: capacity(MODELS["llama-3-70b"], GPUS["h100-sxm"], ...)),
"""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from app.calibration.profiles import profile_from_entries, read_default_profile_document
from app.catalog.reference import (
    gpu_spec_from_record,
    model_spec_from_record,
    reference_gpu_rows,
    reference_model_rows,
)
from app.estimates.service import decode_batch_sweep
from app.loadtest import run_load_tests
from app.sizing.engines import EngineConfig
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.roofline import roofline
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.model.flops import decode_cost, prefill_cost
from app.sizing.model.kv import kv_cache_size
from app.sizing.serving.capacity import capacity
from app.sizing.serving.disaggregated_loop import plan_closed_loop
from app.sizing.serving.disaggregation import plan_disaggregated
from app.sizing.serving.plan import PlanInputs, Slo, configurations, plan
from app.sizing.serving.simulate import SchedulerConfig, simulate
from app.sizing.serving.workload import Fixed, Workload
from app.sizing.specs import COMPUTE_DTYPES

REPEATS = 1000

MODELS = {row["slug"]: model_spec_from_record(SimpleNamespace(**row)) for row in reference_model_rows()}
GPUS = {row["slug"]: gpu_spec_from_record(SimpleNamespace(**row)) for row in reference_gpu_rows()}


@dataclass(frozen=True, slots=True)
class Case:
    endpoint: str
    core_call: str
    call: Callable[[], object]
    repeats: int = REPEATS  # fewer for calls that take a good part of a second


def _sweep(model: str, gpu: str, context_tokens: int, weights: str = "bf16", **layout: int) -> object:
    return decode_batch_sweep(MODELS[model], GPUS[gpu], context_tokens, [2**i for i in range(11)],
                              weight_dtype=weights, kv_dtype="bf16", compute_dtype=weights,
                              activation_dtype="bf16", efficiency=DEFAULT_EFFICIENCY,
                              **{"tensor_parallel": 1, **layout})


def _capacity(model: str, gpu: str, tensor_parallel: int) -> object:
    return capacity(MODELS[model], GPUS[gpu], tensor_parallel=tensor_parallel, pipeline_parallel=1,
                    weight_dtype="bf16", kv_dtype="bf16", compute_dtype="bf16", engine=EngineConfig(engine="vllm"),
                    input_tokens=1000, output_tokens=500, efficiency=DEFAULT_EFFICIENCY)


# /v1/slo-plan: the example of the API's docs (1k in / 500 out, 5 req/s, p95 TTFT 1 s and TPOT 50 ms)
# planned over the whole catalog at its default TP degrees for a dense 70B, an MoE and a windowed model
# (target: median <= 100 ms each), and one simulation of 2,000 requests.
SLO_PLAN_WORKLOAD = Workload(Fixed(1000), Fixed(500), requests_per_s=5.0)
PLAN_MODELS = ("llama-3.1-70b", "mixtral-8x7b", "gemma-2-27b")


# The plans use the shipped calibration profile, as the service does for a request that names none.
SHIPPED_PROFILE = profile_from_entries("default", read_default_profile_document()["entries"])


def _slo_plan_catalog(model: str) -> Callable[[], object]:
    inputs = PlanInputs(
        model=MODELS[model], workload=SLO_PLAN_WORKLOAD, slo=Slo(ttft_s=1.0, tpot_s=0.050, percentile=95),
        efficiencies={(slug, dtype): SHIPPED_PROFILE.efficiency_for(gpu.family, dtype, gpu.vendor)
                      for slug, gpu in GPUS.items() for dtype in COMPUTE_DTYPES})
    candidates = configurations(MODELS[model], list(GPUS.values()), None, [1], ["bf16"], ["bf16"])
    return lambda: plan(inputs, candidates)


# Disaggregated plans (candidates.deployment "disaggregated"): long prompts, where they pay, over the whole catalog
# in fp8, for an open loop and for a closed loop of users (whose rate the planner seeks over several open-loop plans).
DISAGGREGATED_LOADS = {"5 req/s": {"requests_per_s": 5.0}, "256 users": {"concurrent_users": 256}}


def _disaggregated_catalog(load: str) -> Callable[[], object]:
    model = MODELS["llama-3.1-70b"]
    inputs = PlanInputs(
        model=model, workload=Workload(Fixed(8000), Fixed(1000), **DISAGGREGATED_LOADS[load]),
        slo=Slo(ttft_s=3.0, tpot_s=0.040, percentile=95),
        efficiencies={(slug, dtype): SHIPPED_PROFILE.efficiency_for(gpu.family, dtype, gpu.vendor)
                      for slug, gpu in GPUS.items() for dtype in COMPUTE_DTYPES})
    candidates = configurations(model, list(GPUS.values()), None, [1], ["fp8"], ["fp8"])
    planner = plan_closed_loop if inputs.workload.is_closed_loop else plan_disaggregated
    return lambda: planner(inputs, candidates)


def _simulation_2000() -> Callable[[], object]:
    """One replica of the example's cheapest H100 plan (TP4) at 5 req/s, its KV capacity from vLLM's rules."""
    model, gpu = MODELS["llama-3.1-70b"], GPUS["h100-sxm"]
    sized = capacity(model, gpu, tensor_parallel=4, pipeline_parallel=1, weight_dtype="bf16", kv_dtype="bf16",
                     compute_dtype="bf16", engine=EngineConfig(engine="vllm", max_model_len=1500), input_tokens=1000,
                     output_tokens=500, efficiency=DEFAULT_EFFICIENCY)
    config = SchedulerConfig(kv_capacity_tokens=sized.kv_tokens, max_num_seqs=1024, max_num_batched_tokens=8192)

    def run() -> object:
        steps = build_step_time_model(model, gpu, tensor_parallel=4, weight_dtype="bf16",
                                      kv_dtype="bf16", efficiency=DEFAULT_EFFICIENCY)  # as the planner passes it
        return simulate(steps, config, workload=SLO_PLAN_WORKLOAD, num_requests=2000, seed=0)

    return run


CASES: list[Case] = [
    Case("/v1/kv-cache", "kv_cache_size(llama-3-70b, 8k, tp8)",
         lambda: kv_cache_size(MODELS["llama-3-70b"], 8192, "bf16", 8)),
    Case("/v1/kv-cache", "kv_cache_size(gemma-2-9b, 8k, block 16)",
         lambda: kv_cache_size(MODELS["gemma-2-9b"], 8192, "bf16", 1, 1, 16)),
    Case("/v1/roofline", "roofline(decode_cost(llama-3-8b, 1k))",
         lambda: roofline(decode_cost(MODELS["llama-3-8b"], 1024), GPUS["h100-sxm"], "bf16")),
    Case("/v1/roofline", "roofline(prefill_cost(llama-3-70b, 2k, tp4))",
         lambda: roofline(prefill_cost(MODELS["llama-3-70b"], 2048, tensor_parallel=4), GPUS["h100-sxm"],
                          "bf16")),
    Case("/v1/roofline", "roofline(decode_cost(deepseek-v3, 4k, batch 64, tp8))",
         lambda: roofline(decode_cost(MODELS["deepseek-v3"], 4096, 64, "fp8", tensor_parallel=8),
                          GPUS["h200-sxm"], "fp8")),
    Case("/v1/roofline/batch-sweep", "decode_batch_sweep(llama-3-8b, 11 batches)",
         lambda: _sweep("llama-3-8b", "h100-sxm", 1024)),
    Case("/v1/roofline/batch-sweep", "decode_batch_sweep(mixtral-8x7b, 11 batches)",
         lambda: _sweep("mixtral-8x7b", "h100-sxm", 1024)),
    Case("/v1/roofline/batch-sweep", "decode_batch_sweep(deepseek-v3 fp8, DP8 EP8, 11 batches: knee searched)",
         lambda: _sweep("deepseek-v3", "h200-sxm", 1024, "fp8", data_parallel=8, expert_parallel=8)),
    Case("/v1/capacity", "capacity(llama-3-70b, 4 x h100-sxm, vllm)",
         lambda: _capacity("llama-3-70b", "h100-sxm", 4)),
    Case("/v1/capacity", "capacity(llama-3.1-405b, 1 x h100-sxm: no fit, suggestion search)",
         lambda: _capacity("llama-3.1-405b", "h100-sxm", 1)),
    *(Case("/v1/slo-plan", f"plan({model}, 5 req/s, p95 TTFT 1 s / TPOT 50 ms, whole catalog)",
           _slo_plan_catalog(model), repeats=5) for model in PLAN_MODELS),
    Case("/v1/slo-plan", "simulate(llama-3.1-70b, h100-sxm TP4, 2,000 requests at 5 req/s)",
         _simulation_2000(), repeats=20),
    *(Case("/v1/slo-plan", f"disaggregated(llama-3.1-70b fp8, 8k/1k, {load}, p95 TTFT 3 s / TPOT 40 ms, whole "
                           "catalog)", _disaggregated_catalog(load), repeats=3) for load in DISAGGREGATED_LOADS),
]


def time_call(call: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float]:
    """(median, p99) seconds per call."""
    call()  # warm-up: fills the per-model caches a long-running service keeps warm
    per_call = timeit.repeat(call, repeat=repeats, number=1, timer=time.process_time)
    return statistics.median(per_call), statistics.quantiles(per_call, n=100)[98]


def main() -> None:
    rows = [(case.endpoint, case.core_call, *time_call(case.call, case.repeats)) for case in CASES]
    endpoint_width = max(len("endpoint"), *(len(row[0]) for row in rows))
    call_width = max(len("core call"), *(len(row[1]) for row in rows))
    print(f"{'endpoint':<{endpoint_width}}  {'core call':<{call_width}}  {'median µs':>10}  {'p99 µs':>10}")
    for endpoint, core_call, median, p99 in rows:
        print(f"{endpoint:<{endpoint_width}}  {core_call:<{call_width}}  {median * 1e6:>10.1f}  {p99 * 1e6:>10.1f}")
    print()
    print(run_load_tests(), flush=True)


if __name__ == "__main__":
    main()
