"""Disaggregated deployments under a closed loop: users each sending their next request the moment their
last one ends (a benchmark's fixed concurrency; the load of every published disaggregated run in the reference
data), through a prefill pool, the KV transfer and a decode pool (`disaggregation.py`: the roles, the transfer,
how a request's times combine and the open loop's planner).

- **The estimate** (`closed_loop`): every user's requests through both pools, all users starting together, the
  passes repeated until the arrivals they imply settle. The validator predicts measured runs with it
  (`predict.py`): a benchmark's users start together and its lengths are fixed, so they may stay in step.
- **The planner** (`plan_closed_loop`, /v1/slo-plan with `concurrent_users` and a disaggregated deployment) plans
  the open loop of the users' rate instead: many users whose lengths and steps vary do not stay in step, and their
  requests together arrive as a Poisson stream (a superposition of independent streams), where the deterministic
  loop keeps users of fixed lengths in step or in perfect turns and sizes the prefill pool by those (2026-12-06: 8
  prefill workers at 20% busy for 16 users; fewer workers for 2,048 users than for 1,024). N users whose requests
  each take E on average and who think Z between them (the workload's `think_time_s`, 0 by default) send
  N / (E + Z) requests/s (Little's law). The first rate tried is the one a plan just meeting the SLO would carry,
  N / (TTFT SLO + (mean answer - 1) x TPOT SLO + Z); the cheapest plan's own mean E then says what its users would send.
  While no rate has been enough for them (they send more, by RATE_TOLERANCE), the rate is raised to theirs; once
  one is, the lowest enough rate is sought down toward the highest too low one (halving the gap, or first down to
  what the enough plan's users send), MAX_RATE_ROUNDS open-loop plans at most (`_seek`): the lowest rate found that
  carries the cheapest plan's users. Every plan of that open loop whose users send more or less than it, by
  RATE_TOLERANCE, gets its own rate sought the same way, from what its users send there, with its pools'
  configurations alone (`plan_disaggregated`'s `pairing`): else a plan whose users send less is larger than it need
  be, which misranks plans where the prefill pool decides a request's time (2026-12-07: Qwen3-8B, 2,000 in / 20
  out, 1,024 users, whole catalog: a plan's users sent 77% of the rate it was sized for, and sized at their own it
  was the cheapest), and one whose users send more would be refused. Plans are ranked by cost at their own rates;
  one whose rate is not found is refused with what its users would send. Percentiles are the open loop's at the
  rate sized for: at or above the users' own. With spare workers (`ha_policy.extra_replicas`, k per pool), each
  plan's requests are timed without them (`disaggregation`: what the plan guarantees with k workers of either pool
  down), and so is its users' rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.sizing.serving.disaggregation import (
    Combined,
    DisaggregatedPlan,
    DisaggregatedResult,
    PoolTimes,
    combine,
    decode_role_requests,
    plan_disaggregated,
    plan_order,
    prefill_role_requests,
)
from app.sizing.serving.plan import Configuration, Infeasible, PlanInputs, _Planner, cost_per_million_tokens
from app.sizing.serving.simulate import SchedulerConfig, SimulationResult, StepTimeFn, simulate
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
    """Per-request latencies of `requests` (at least one per user, e.g. `fixed_closed_loop_requests`; their
    arrival times are ignored) from `users` users, each sending its next request the moment the last one ends,
    through a disaggregated deployment; all users send their first at t = 0 (as the aggregated closed loop is
    simulated, `predict.py`: a harness starting its users together). `transfer_s`: one KV transfer's time, or
    each request's.

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
    if requests.think_s is not None:
        raise ValueError("closed_loop estimates a benchmark's users, who do not think between requests")
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
    return combine(PoolTimes(prefill_ttft_s=prefill_times[1], transfer_s=np.array(transfer),
                             decode_first_s=decode_times[1], decode_rest_s=decode_times[2] - decode_times[0],
                             output_tokens=requests.output_tokens))


def _mean_request(requests: Requests) -> Requests:
    """One request of the mean prompt, cached prefix and answer of `requests` (rounded; at least one token
    computed): the same request when their lengths are fixed."""
    prompt = max(1, round(float(np.mean(requests.input_tokens))))
    cached = min(prompt - 1, round(float(np.mean(requests.cached_prefix_tokens))))
    return Requests(np.zeros(1), np.array([prompt]), np.array([max(1, round(float(np.mean(requests.output_tokens))))]),
                    np.array([cached]), min(requests.shared_prefix_tokens, prompt - 1))


def _ranks(pool: PoolRanks, requests: Requests, kinds: np.ndarray, user: np.ndarray, arrivals: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's first-token time, time from arrival to first token, and finish time on its rank of
    `pool` (user u on rank u mod ranks), every rank simulated with its requests (as the pool's role serves
    them) in arrival order, once for ranks given requests of the same `kinds` (lengths) at the same times."""
    ranks = min(pool.ranks, int(user.max()) + 1)
    first, waited, finish = (np.empty(len(user)) for _ in range(3))
    done: dict[bytes, SimulationResult] = {}
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
    return first, waited, finish


# Planning: a closed loop as the open loop of its users' rate ------------------------------------------

MAX_RATE_ROUNDS = 6  # open-loop plans at most (a rate raised to the users', then halved toward the one too low)
RATE_TOLERANCE = 1.02  # a plan's users may send this much more than the rate it was sized for (simulation noise)


def plan_closed_loop(inputs: PlanInputs, candidates: Sequence[Configuration]) -> DisaggregatedResult:
    """The cheapest disaggregated deployments over `candidates` for a closed loop's users (module docstring)."""
    workload, slo = inputs.workload, inputs.slo
    if workload.concurrent_users is None:
        raise ValueError("plan_closed_loop sizes a closed loop (concurrent_users); an open loop's: "
                         "disaggregation.plan_disaggregated")
    users, think = workload.concurrent_users, workload.think_time_s
    answer = _Planner(inputs).lengths.output_mean
    counts = [0, 0]  # simulations, simulated requests
    guesses: dict[tuple[Configuration, str], float] = {}  # each plan's pools start the next one's searches

    def at(rate: float, pairing: tuple[Configuration, Configuration] | None = None) -> _Sized:
        opened = replace(inputs, workload=replace(workload, requests_per_s=rate, concurrent_users=None,
                                                  think_time_s=0.0))
        result = plan_disaggregated(opened, candidates, guesses, pairing)
        guesses.update(result.workers_per_load)
        counts[0] += result.simulations
        counts[1] += result.simulated_requests
        return _Sized(rate, result.plans[0] if result.plans else None, result)

    cheapest = _seek(users, think, users / (slo.ttft_s + max(answer - 1, 0.0) * slo.tpot_s + think), at)
    sized, infeasible = [], list(cheapest.result.infeasible)
    for plan in cheapest.result.plans:
        own = _Sized(cheapest.rate, plan, cheapest.result)
        sent = users_rate(users, think, plan)
        if not cheapest.rate / RATE_TOLERANCE <= sent <= cheapest.rate * RATE_TOLERANCE:
            pairing = (plan.prefill.configuration, plan.decode.configuration)  # sought at its own users' rate
            own = _seek(users, think, sent, lambda rate, pairing=pairing: at(rate, pairing),
                        short=cheapest.rate if sent > cheapest.rate else 0.0,
                        enough=None if sent > cheapest.rate else own)
        if own.plan is not None and users_rate(users, think, own.plan) <= own.rate * RATE_TOLERANCE:
            sized.append(_of_users(own.plan, users, think, own.rate, answer))
        else:
            reason = (f"disaggregated with {plan.prefill.configuration.label} prefill: no deployment sized for up "
                      f"to {own.rate:.3g} req/s carries its {users:,} users (they would send "
                      + (f"{users_rate(users, think, own.plan):.3g} req/s)" if own.plan
                         else "more: none met the SLO)"))
            infeasible.append(Infeasible(plan.decode.configuration, (reason,)))
    sized.sort(key=plan_order)
    return DisaggregatedResult(tuple(sized), tuple(infeasible), *counts)


@dataclass(frozen=True, slots=True)
class _Sized:
    """An open-loop plan at `rate` req/s: the deployment sought (None: none met the SLO) and the whole result."""

    rate: float
    plan: DisaggregatedPlan | None
    result: DisaggregatedResult


def users_rate(users: int, think_s: float, plan: DisaggregatedPlan) -> float:
    """Requests/s that `users` users send through `plan`, each thinking `think_s` on average between its requests:
    N / (E + Z), E the plan's mean request time (Little's law)."""
    return users / (plan.mean_e2e_s + think_s)


def _seek(users: int, think_s: float, rate: float, at: Callable[[float], _Sized], short: float = 0.0,
          enough: _Sized | None = None) -> _Sized:
    """The lowest rate (of at most MAX_RATE_ROUNDS tried, from `rate`) whose plan `at` sizes carries `users`: its
    users (`users_rate`, thinking `think_s`) send no more than it (by RATE_TOLERANCE). While none is known (`enough`),
    the rate is raised to what its users send; then it is sought down toward the highest rate known too low
    (`short`): halfway, or first down to what the enough plan's users send, until the enough rate is within
    RATE_TOLERANCE of the one too low, or what its users send is no lower than it (the next plan would be this one
    again: a plan sought from what its users send, none known too low, sized the same rate each round to the last).
    Without any enough rate: the last one."""
    last = enough
    for _ in range(MAX_RATE_ROUNDS):
        last = at(rate)
        sent = users_rate(users, think_s, last.plan) if last.plan else math.inf
        if sent <= rate * RATE_TOLERANCE:
            enough = last
        else:
            short = max(short, rate)
        if enough is None:
            if last.plan is None:
                break
            rate = sent
        elif enough.rate <= short * RATE_TOLERANCE:
            break
        elif short:
            rate = (short + enough.rate) / 2
        else:
            assert enough.plan is not None
            rate = users_rate(users, think_s, enough.plan)
            if rate >= enough.rate:
                break
    result = enough or last
    assert result is not None
    return result


def _of_users(plan: DisaggregatedPlan, users: int, think_s: float, rate: float, answer: float) -> DisaggregatedPlan:
    """The open loop's plan as the closed loop's: the users per worker (each worker's share of the rate it was
    sized for stays), the users' rate through it (`users_rate`), and the tokens and cost per token at that rate. A
    decode worker's ceiling in users is its rate's at the plan's mean request time and think time (Little's law:
    N = rate x (E + Z))."""
    sent = users_rate(users, think_s, plan)
    tokens_per_s = sent * answer
    cycle_s = plan.mean_e2e_s + think_s
    pools = [replace(pool, users_per_worker=users / pool.workers, ceiling_per_worker=pool.ceiling_per_worker * cycle_s)
             for pool in (plan.prefill, plan.decode)]
    return replace(
        plan, prefill=pools[0], decode=pools[1], output_tokens_per_s=tokens_per_s,
        cost_per_million_output_tokens_usd=(None if plan.cost_per_hour_usd is None
                                            else cost_per_million_tokens(plan.cost_per_hour_usd, tokens_per_s)),
        predicted=replace(plan.predicted, load=float(users), requests_per_s=sent, output_tokens_per_s=tokens_per_s),
        binding_detail=(f"{plan.binding_detail}; sized as an open loop of {rate:.3g} req/s, its {users:,} users "
                        f"send {sent:.3g} req/s (mean request {plan.mean_e2e_s:.3g} s"
                        + (f", mean think time {think_s:.3g} s)" if think_s else ")")))
