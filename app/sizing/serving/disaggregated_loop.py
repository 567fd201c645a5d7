"""Disaggregated deployments under a closed loop: users each sending their next request the moment their
last one ends (a benchmark's fixed concurrency; the load of every published disaggregated run in the reference
data), through a prefill pool, the KV transfer and a decode pool (`disaggregation.py`: the roles, the transfer
and how a request's times combine).

- **The estimate** (`closed_loop`): every user's requests through both pools, the passes repeated until the
  arrivals they imply settle. The validator predicts measured runs with it (`predict.py`), the planner below
  sizes deployments with it.
- **The planner** (`plan_closed_loop`, /v1/slo-plan with `concurrent_users` and a disaggregated deployment):
  the users it sizes for are the given ones over the utilization cap (as an aggregated closed loop's). Decode
  pools first: the fewest workers whose schedulers, each holding its share of the users in a loop of decode
  alone (each user's next request arriving the moment the last one ends, so at least as many sequences
  running as in the whole loop, where a user also spends its prefill and transfer away: TPOT no lower), meet
  the TPOT SLO and leave the TTFT SLO room for the fastest prefill and the transfer
  (`disaggregation.first_step_budget_s`). Then, behind the cheapest decode pool, the fewest prefill workers
  whose whole loop (`closed_loop`: both pools and each request's transfer over the link the deployment has)
  meets the TTFT (and E2E) SLO. The deployment is run at the offered users last and must meet every SLO; its
  throughput is the users over the mean request's time (Little's law, no time between a user's requests).
  Pools with pipeline stages are not sized here (the estimate runs one scheduler per rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.sizing.serving.disaggregation import (
    MAX_POOL_WORKERS,
    TTFT_RETRIES,
    Combined,
    DisaggregatedPlan,
    DisaggregatedResult,
    Pool,
    PoolOption,
    PoolTimes,
    combine,
    combined_checks,
    combined_percentiles,
    cost_key,
    cost_units,
    decode_meets,
    decode_role_requests,
    fewest_workers,
    first_step_budget_s,
    kv_transfer,
    meets_all,
    pool_link,
    prefill_floor_s,
    prefill_role_requests,
    result,
    screen_pools,
    size_pools,
    transfer_times_s,
    worker_pool,
)
from app.sizing.serving.plan import (
    BINDING_TPOT,
    CLOSED_LOOP_REQUESTS_PER_USER,
    DECODE_POOL,
    MAX_CLOSED_LOOP_REQUESTS,
    PREFILL_POOL,
    Configuration,
    Infeasible,
    PlanInputs,
    Prediction,
    _describe,
    _Planner,
    _Screened,
    cached_prompt_tokens,
    cost_per_million_tokens,
)
from app.sizing.serving.simulate import (
    DEFAULT_WARMUP_FRACTION,
    KvCapacityError,
    SchedulerConfig,
    SimulationLimitError,
    SimulationResult,
    StepTimeFn,
    simulate,
)
from app.sizing.serving.workload import Fixed, Requests, Workload, sample_requests

CONVERGED_FRACTION = 0.01  # the closed loop's passes stop once arrivals move by this x an idle cycle on average


@dataclass(frozen=True, slots=True)
class PoolRanks:
    """One pool as the closed-loop estimate sees it: `ranks` identical schedulers side by side (workers x
    attention data-parallel ranks), each with this step time and these limits."""

    step_time: StepTimeFn
    scheduler: SchedulerConfig
    ranks: int


def fixed_closed_loop_requests(users: int, input_tokens: int, output_tokens: int, requests: int) -> Requests:
    """What `closed_loop` serves for a run at fixed lengths (a measured run's): max(`users`, `requests`)
    requests of `input_tokens` and `output_tokens`."""
    if users < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("users, input_tokens and output_tokens must be >= 1")
    return sample_requests(Workload(Fixed(input_tokens), Fixed(output_tokens), concurrent_users=users),
                           max(users, requests), 0)


def closed_loop(users: int, requests: Requests, prefill: PoolRanks, decode: PoolRanks,
                transfer_s: float | np.ndarray) -> Combined:
    """Per-request latencies of `requests` (`closed_loop_requests`; their arrival times are ignored) from
    `users` users, each sending its next request the moment the last one ends, through a disaggregated
    deployment; all users send their first at t = 0 (as the aggregated closed loop is simulated,
    `predict.py`: a harness starting its users together). `transfer_s`: one KV transfer's time, or each
    request's.

    Request j is user j mod `users`'s (j div `users`)-th; every request goes through prefill, the KV transfer
    and decode. The router spreads the users evenly: user u is served by prefill rank u mod (prefill ranks)
    and decode rank u mod (decode ranks), at most `users` ranks of a pool busy. Each rank is simulated with
    its users' requests at their arrival times there; a request reaches its decode rank when its first
    token leaves the prefill rank plus the transfer, and the user's next request arrives when it finishes.
    Arrivals and results depend on each other, so the passes repeat from a first guess (every user's
    requests one idle cycle apart: a request of the mean lengths through both pools alone): pass k takes
    round k + 1's arrivals from round k's finishes and guesses each later round one cycle after the user's
    previous, at the cycle of the user's last known round. They stop when the arrivals move by less than
    CONVERGED_FRACTION of an idle cycle on average, or after len(requests) / users + 1 passes; once users
    fall out of step a pass also moves earlier rounds a little, so the result is a fixed point only to
    within that (the mean TTFT of the last passes agrees to a few percent). Ranks given the same requests
    at the same arrivals are simulated once. TTFT = prefill queueing and prefill + transfer + the wait for
    the first decode step.
    """
    total = len(requests)
    if users < 1 or total < users:
        raise ValueError("need users >= 1 and at least one request per user")
    transfer = np.broadcast_to(np.asarray(transfer_s, dtype=float), (total,))
    mean = _mean_request(requests)
    mean_transfer = float(np.mean(transfer))
    idle_cycle_s = (simulate(prefill.step_time, prefill.scheduler, prefill_role_requests(mean),
                             warmup_fraction=0).ttft_s[0] + mean_transfer
                    + simulate(decode.step_time, decode.scheduler, decode_role_requests(mean),
                               warmup_fraction=0).e2e_s[0])
    user = np.arange(total) % users
    arrivals = np.arange(total) // users * idle_cycle_s
    prefill_requests, decode_requests = prefill_role_requests(requests), decode_role_requests(requests)
    _, kinds = np.unique(np.stack([requests.input_tokens, requests.output_tokens, requests.cached_prefix_tokens]),
                         axis=1, return_inverse=True)  # requests of the same lengths are one kind
    for settled_rounds in range(2, -(-total // users) + 3):
        prefill_times = _ranks(prefill, prefill_requests, kinds, user, arrivals)
        decode_times = _ranks(decode, decode_requests, kinds, user, prefill_times[0] + transfer)
        moved = np.concatenate([arrivals[:users], decode_times[2][:total - users]])
        # The first `settled_rounds` rounds of arrivals are now known; each later one is guessed a cycle after
        # the user's previous, at the cycle the user's last known round took.
        known = settled_rounds * users
        if known < total:
            cycle = moved[known - users:known] - moved[known - 2 * users:known - users]
            later = np.arange(known, total)
            rounds_ahead = later // users - settled_rounds + 1
            moved[later] = moved[known - users + later % users] + rounds_ahead * cycle[later % users]
        settled = float(np.mean(np.abs(moved - arrivals))) <= CONVERGED_FRACTION * idle_cycle_s
        arrivals = moved
        if settled:
            break
    combined = combine(PoolTimes(prefill_ttft_s=prefill_times[1], transfer_s=np.array(transfer),
                                 decode_first_s=decode_times[1], decode_rest_s=decode_times[2] - decode_times[0],
                                 output_tokens=requests.output_tokens))
    return replace(combined, preemptions=prefill_times[3] + decode_times[3])


def _mean_request(requests: Requests) -> Requests:
    """One request of the mean prompt, cached prefix and answer of `requests` (rounded; at least one token
    computed): the same request when their lengths are fixed."""
    prompt = max(1, round(float(np.mean(requests.input_tokens))))
    cached = min(prompt - 1, round(float(np.mean(requests.cached_prefix_tokens))))
    return Requests(np.zeros(1), np.array([prompt]), np.array([max(1, round(float(np.mean(requests.output_tokens))))]),
                    np.array([cached]), min(requests.shared_prefix_tokens, prompt - 1))


def _ranks(pool: PoolRanks, requests: Requests, kinds: np.ndarray, user: np.ndarray, arrivals: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Each request's first-token time, time from arrival to first token, and finish time on its rank of
    `pool` (user u on rank u mod ranks), every rank simulated with its requests (as the pool's role serves
    them) in arrival order, once for ranks given requests of the same `kinds` (lengths) at the same times;
    and the ranks' preemptions."""
    ranks = min(pool.ranks, int(user.max()) + 1)
    first, waited, finish = (np.empty(len(user)) for _ in range(3))
    done: dict[bytes, SimulationResult] = {}
    preemptions = 0
    order = np.lexsort((arrivals, user % ranks))  # by rank, then by arrival
    ends = np.cumsum(np.bincount(user % ranks, minlength=ranks)).tolist()
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        picked = order[start:end]
        times = arrivals[picked]
        key = times.tobytes() + kinds[picked].tobytes()
        result = done.get(key)
        if result is None:
            result = simulate(pool.step_time, pool.scheduler, requests.subset(picked, times), warmup_fraction=0)
            done[key] = result
        first[picked], waited[picked], finish[picked] = result.first_token_s, result.ttft_s, result.finish_s
        preemptions += result.preemptions
    return first, waited, finish, preemptions


# Planning ---------------------------------------------------------------------------------------------

# Each step of the search runs every user's requests, two rounds at least: the users one search may run, as many as
# an aggregated replica's closed loop runs requests at most.
MAX_LOOP_USERS = MAX_CLOSED_LOOP_REQUESTS


def plan_closed_loop(inputs: PlanInputs, candidates: Sequence[Configuration]) -> DisaggregatedResult:
    """The cheapest disaggregated deployments over `candidates` for a closed loop's users (module docstring)."""
    if not inputs.workload.is_closed_loop:
        raise ValueError("plan_closed_loop sizes a closed loop (concurrent_users); an open loop's: "
                         "disaggregation.plan_disaggregated")
    if sized_users(inputs) > MAX_LOOP_USERS:
        raise ValueError(f"a closed loop of more than {MAX_LOOP_USERS:,} users (over the utilization cap) is not "
                         "simulated through disaggregated pools")
    planner = _Planner(inputs)
    options, infeasible = screen_pools(planner, candidates, _option, _refused)
    plans: list[DisaggregatedPlan] = []
    prefill_floor = min((prefill_floor_s(planner, option.screened) for option in options[PREFILL_POOL]),
                        default=math.inf)
    decodes = size_pools(options[DECODE_POOL], lambda option: _size_decode(planner, option, prefill_floor),
                         infeasible)
    if decodes:  # the prefill pools are sized behind the cheapest decode pool
        decode_pool, (decode_screened, decode_alone) = min(decodes, key=lambda sized: cost_key(sized[0]))
        decode = _Sized(decode_pool, decode_screened)
        prefills = size_pools(options[PREFILL_POOL],
                              lambda option: _size_prefill(planner, option, decode, decode_alone), infeasible)
        for prefill_pool, prefill_screened in prefills:
            built = _deployment(planner, _Sized(prefill_pool, prefill_screened), decode)
            (infeasible if isinstance(built, Infeasible) else plans).append(built)
    return result(planner, plans, infeasible)


@dataclass(frozen=True, slots=True)
class _Sized:
    pool: Pool
    screened: _Screened

    def ranks(self) -> PoolRanks:
        return PoolRanks(self.screened.step_time, self.screened.scheduler, self.pool.workers * self.screened.schedulers)


def _refused(configuration: Configuration) -> str | None:
    if configuration.pipeline_parallel > 1:
        return (f"{configuration.layout.label}: pipeline stages are not sized for a closed loop of users "
                "through disaggregated pools")
    return None


def _option(planner: _Planner, screened: _Screened, role: str) -> PoolOption:
    """Where a pool's search starts and what that costs, a lower bound: decode workers whose schedulers each
    run as many of the users as they can hold at once (max_num_seqs, and the KV cache at the mean request's
    prompt and answer); one prefill worker (its need follows from the cycle the decode pool sets:
    `_size_prefill`)."""
    workers = 1
    if role == DECODE_POOL:
        scheduler, lengths = screened.scheduler, planner.lengths
        held = max(1, round(lengths.input_mean + lengths.output_mean))
        each = max(1, min(scheduler.max_num_seqs, scheduler.kv_capacity_tokens // held))
        workers = math.ceil(_sized_users(planner) / (each * screened.schedulers))
    return PoolOption(screened, workers, cost_units(workers * screened.configuration.gpus_per_replica, screened.price))


def sized_users(inputs: PlanInputs) -> int:
    """The users a closed loop's pools are sized for: the given ones over the utilization cap, whole."""
    return _sized_users(_Planner(inputs))


def _sized_users(planner: _Planner) -> int:
    return max(1, math.ceil(planner.sized_load * (1 - 1e-9)))


def _request_count(planner: _Planner, users: int) -> int:
    """Requests a loop of `users` runs: the plan's count, and at least CLOSED_LOOP_REQUESTS_PER_USER per user up
    to MAX_CLOSED_LOOP_REQUESTS (as an aggregated replica's closed loop), and at least two rounds (the first is
    left out of the percentiles, `_warmup`)."""
    return max(2 * users, planner.inputs.simulated_requests,
               min(CLOSED_LOOP_REQUESTS_PER_USER * users, MAX_CLOSED_LOOP_REQUESTS))


def _most_workers(users: int, screened: _Screened) -> int:
    """More workers than give every scheduler one user would idle."""
    return max(1, min(MAX_POOL_WORKERS, math.ceil(users / screened.schedulers)))


def _size_decode(planner: _Planner, option: PoolOption, prefill_floor: float
                 ) -> tuple[Pool, tuple[_Screened, SimulationResult]] | Infeasible:
    """The fewest decode workers whose schedulers, each with its share of the users in a loop of decode
    alone, meet the TPOT SLO and the first-step budget (module docstring)."""
    screened, slo = option.screened, planner.slo
    users = _sized_users(planner)
    budget = first_step_budget_s(planner, screened, prefill_floor)
    runs: dict[int, SimulationResult] = {}

    def run(workers: int) -> SimulationResult:
        each = math.ceil(users / (workers * screened.schedulers))
        if each not in runs:
            count = _request_count(planner, each)
            planner.simulations += 1
            planner.simulated_requests += count
            runs[each] = simulate(screened.step_time, screened.scheduler,
                                  decode_role_requests(planner._unit_requests(count)), closed_loop_users=each)
        return runs[each]

    def meets(workers: int) -> bool:
        try:
            return decode_meets(run(workers), slo, budget)
        except (KvCapacityError, SimulationLimitError, ValueError):
            return False

    most = _most_workers(users, screened)
    workers = fewest_workers(meets, min(option.workers, most), most)
    if workers is None:
        return Infeasible(screened.configuration, (
            (f"decode pool: misses the TPOT SLO (or its share of the TTFT) for {users:,} users at every worker "
            f"count up to {most:,}, one user per scheduler"),))
    return _pool(planner, screened, DECODE_POOL, workers, users), (screened, run(workers))


def _size_prefill(planner: _Planner, option: PoolOption, decode: _Sized, decode_alone: SimulationResult
                  ) -> tuple[Pool, _Screened] | Infeasible:
    """The fewest prefill workers whose whole loop with the sized decode pool meets the TTFT (and E2E and
    goodput) SLO. The search starts at the workers that keep up with the users cycling at most once per TTFT
    SLO and decode alone, each prefilling mean prompts in full steps (max_num_batched_tokens) back to back,
    its fastest: fewer would queue the prompts without end."""
    screened = option.screened
    users = _sized_users(planner)
    requests = planner._unit_requests(_request_count(planner, users))
    prompt = max(1, round(planner.lengths.input_mean))
    new = max(1, prompt - cached_prompt_tokens(planner.workload, prompt))
    chunk = screened.scheduler.max_num_batched_tokens
    prompts = max(1, chunk // new)  # whole prompts in a full step, or one prompt in chunks
    tokens = min(prompts * new, chunk)
    per_token = float(screened.step_time(0, 0, tokens, prompts * new * (new + 1) / 2 if new <= chunk
                                         else tokens * (tokens + 1) / 2)) / tokens
    rate = users / (planner.slo.ttft_s + float(np.mean(decode_alone.e2e_s)))
    most = _most_workers(users, screened)
    start = min(most, max(1, math.floor(rate * new * per_token / screened.schedulers)))

    def meets(workers: int) -> bool:
        try:
            combined = _loop(planner, _Sized(_pool(planner, screened, PREFILL_POOL, workers, users), screened),
                             decode, users, requests)
        except (KvCapacityError, SimulationLimitError, ValueError):
            return False
        return all(ratio <= 1 for name, _, _, ratio in combined_checks(combined, planner.slo, _warmup(requests, users))
                   if name != BINDING_TPOT)

    workers = fewest_workers(meets, start, most)
    if workers is None:
        return Infeasible(screened.configuration, (
            (f"prefill pool: misses the TTFT SLO for {users:,} users at every worker count up to {most:,}, one "
            "user per scheduler"),))
    return _pool(planner, screened, PREFILL_POOL, workers, users), screened


def _pool(planner: _Planner, screened: _Screened, role: str, workers: int, users: int) -> Pool:
    return replace(worker_pool(planner, screened, role, workers), users_per_worker=users / workers)


def _warmup(requests: Requests, users: int) -> int:
    """The loop's first requests left out of its percentiles: its first round at least (every user's first
    request sent at t = 0 is a start-up burst a serving deployment does not see again; requests are numbered
    round by round), and as many as a simulation's warm-up leaves out."""
    return max(users, int(DEFAULT_WARMUP_FRACTION * len(requests)))


def _loop(planner: _Planner, prefill: _Sized, decode: _Sized, users: int, requests: Requests) -> Combined:
    """`users` users through both pools, each request's KV over the link the deployment has."""
    _, bandwidth, latency = pool_link(prefill.pool, decode.pool)
    configuration = decode.pool.configuration
    transfer = transfer_times_s(planner.inputs.model, requests.input_tokens, configuration.kv_dtype,
                                decode_tensor_parallel=configuration.tensor_parallel,
                                decode_pipeline_parallel=configuration.pipeline_parallel,
                                bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    planner.simulations += 1
    planner.simulated_requests += len(requests)
    return closed_loop(users, requests, prefill.ranks(), decode.ranks(), transfer)


def _deployment(planner: _Planner, prefill: _Sized, decode: _Sized) -> DisaggregatedPlan | Infeasible:
    """Both pools at the offered users (a prefill worker more when the TTFT misses, up to TTFT_RETRIES)."""
    slo, inputs = planner.slo, planner.inputs
    users = max(1, round(planner.peak_load))
    requests = planner._unit_requests(_request_count(planner, users))
    skip = _warmup(requests, users)
    for _ in range(TTFT_RETRIES + 1):
        combined = _loop(planner, prefill, decode, users, requests)
        checks = combined_checks(combined, slo, skip)
        if all(ratio <= 1 for *_, ratio in checks):
            break
        prefill = _Sized(_pool(planner, prefill.screened, PREFILL_POOL, prefill.pool.workers + 1, users),
                         prefill.screened)
    else:
        worst = max(checks, key=lambda check: check[3])
        return Infeasible(decode.pool.configuration, (
            f"disaggregated with {prefill.pool.configuration.label} prefill, {users:,} users: "
            + _describe(worst, slo.percentile),))
    measured = Combined(combined.ttft_s[skip:], combined.tpot_s[skip:], combined.e2e_s[skip:])
    requests_per_s = users / float(np.mean(measured.e2e_s))  # Little's law: no time between a user's requests
    tokens_per_s = requests_per_s * float(np.mean(requests.output_tokens[skip:]))
    pools = [replace(sized.pool, users_per_worker=users / sized.pool.workers,
                     load_per_worker=requests_per_s / sized.pool.workers) for sized in (prefill, decode)]
    prefill_pool, decode_pool = pools
    priced = prefill_pool.cost_per_hour_usd is not None and decode_pool.cost_per_hour_usd is not None
    cost = prefill_pool.cost_per_hour_usd + decode_pool.cost_per_hour_usd if priced else None  # type: ignore[operator]
    link = pool_link(prefill_pool, decode_pool)
    configuration = decode_pool.configuration
    transfer = kv_transfer(inputs.model, max(1, round(planner.lengths.input_mean)), configuration.kv_dtype,
                           decode_tensor_parallel=configuration.tensor_parallel,
                           decode_pipeline_parallel=configuration.pipeline_parallel,
                           link=link[0], bandwidth_bytes_per_s=link[1], latency_s=link[2])
    prediction = Prediction(
        load=float(users),
        ttft=combined_percentiles(measured, "ttft", slo.percentile),
        tpot=combined_percentiles(measured, "tpot", slo.percentile),
        e2e=combined_percentiles(measured, "e2e", slo.percentile),
        goodput_ratio=float(meets_all(measured, slo).mean()),
        requests_per_s=requests_per_s, output_tokens_per_s=tokens_per_s, preemptions=combined.preemptions)
    worst = max(checks, key=lambda check: check[3])
    return DisaggregatedPlan(
        prefill=prefill_pool, decode=decode_pool, transfer=transfer, gpus=prefill_pool.gpus + decode_pool.gpus,
        cost_per_hour_usd=cost,
        cost_per_million_output_tokens_usd=None if cost is None else cost_per_million_tokens(cost, tokens_per_s),
        output_tokens_per_s=tokens_per_s, predicted=prediction, meets_slo=True, binding_constraint=worst[0],
        binding_detail=(f"closest to its limit: {_describe(worst, slo.percentile)} ({prefill_pool.workers} "
                        f"prefill and {decode_pool.workers} decode workers, {users:,} users)"))
