"""The serving simulator against answers known without it.

Known answers: queueing theory (M/D/1 Pollaczek–Khinchine, the saturation capacity bound, Little's
law), schedules traced step by step by hand, and a naive one-step-at-a-time reference scheduler
written here from the documented rules (no jump-ahead, no lazy bookkeeping) that the fast
simulator must reproduce exactly on random small cases.
"""

import math
from collections import deque
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.sizing.serving import simulate as simulate_module
from app.sizing.serving.simulate import (
    KvCapacityError,
    SchedulerConfig,
    SimulationLimitError,
    micro_batch_config,
    simulate,
    simulate_pipeline,
)
from app.sizing.serving.workload import Fixed, LogNormal, Requests, Workload, sample_requests

TAU = 0.01  # seconds per step in the constant-step cases


def constant_step(seconds):
    """Every engine step takes `seconds`, whatever it carries (array in, array out)."""
    def step_time(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return seconds + 0.0 * np.asarray(decode_seqs, dtype=float)
    return step_time


def roofline_step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
    """A roofline-like step for an 8B model on one H100: 0.3 ms overhead + max(weight and KV reads
    at 2.68 TB/s, matmul and attention FLOPs at 600 TFLOP/s)."""
    memory = (16.06e9 + 131072.0 * decode_context_tokens) / 2.68e12
    flops = 2 * 8.03e9 * (decode_seqs + prefill_tokens) + 524288.0 * (
        decode_context_tokens + prefill_context_tokens)
    return 3e-4 + np.maximum(memory, flops / 6e14)


class RecordingStep:
    """A constant step that records what each step carrying prompt tokens held. (Runs of decode-only
    steps are timed ahead, possibly past the next event, so those calls are not steps taken.)"""

    def __init__(self, seconds=TAU):
        self.seconds = seconds
        self.prefill_steps = []

    def __call__(self, decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        if np.ndim(decode_seqs) == 0 and prefill_tokens > 0:
            self.prefill_steps.append((int(decode_seqs), int(decode_context_tokens), int(prefill_tokens),
                                       int(prefill_context_tokens)))
        return self.seconds + 0.0 * np.asarray(decode_seqs, dtype=float)


def requests(arrival, prompt, output, cached=None, shared=0):
    cached = [0] * len(prompt) if cached is None else cached
    return Requests(np.array(arrival, dtype=float), np.array(prompt), np.array(output),
                    np.array(cached), shared)


# Queueing theory ------------------------------------------------------------------------------


@pytest.mark.parametrize("rho, seed", [(0.3, 1), (0.6, 2)])
def test_md1_mean_wait_is_pollaczek_khinchine(rho, seed):
    """One sequence at a time, one prefill step of exactly S per request (answer of one token):
    an M/D/1 queue with arrival rate rho/S. Pollaczek–Khinchine, deterministic service:
    W = rho·S/(2(1 − rho)): 0.3·S/1.4 = 0.2143·S and 0.6·S/0.8 = 0.75·S.

    Tolerance: the stationary wait has E[W²] = 2W² + lambda·S³/(3(1 − rho)), so sd(W)/W is
    sqrt(0.2347 − 0.0459)/0.2143 = 2.03 at rho 0.3 and sqrt(1.625 − 0.5625)/0.75 = 1.37 at 0.6.
    Successive waits are correlated; 300 independent Lindley-recursion replications (outside this
    suite) put the standard error of the mean at 1.5x resp. 2.9x the independent-sample value.
    Over the 54,000 measured requests: 2.03·1.5/232 = 1.3% and 1.37·2.9/232 = 1.7%. 7% is over
    4 standard errors.

    Besides the mean, each simulated wait must equal the Lindley recursion on the same arrivals
    (w_k = max(0, w_{k−1} + S − gap_k)): the FCFS single server exactly.
    """
    service_s = 0.1
    n = 60_000
    workload = Workload(Fixed(100), Fixed(1), requests_per_s=rho / service_s)
    trace = sample_requests(workload, n, seed)
    config = SchedulerConfig(kv_capacity_tokens=4096, max_num_seqs=1, max_num_batched_tokens=4096)
    result = simulate(constant_step(service_s), config, trace)

    waits = result.ttft_s - service_s
    lindley = np.zeros(n)
    gaps = np.diff(trace.arrival_s)
    for k in range(1, n):
        lindley[k] = max(0.0, lindley[k - 1] + service_s - gaps[k - 1])
    assert np.allclose(waits, lindley, atol=1e-9)

    expected = rho * service_s / (2 * (1 - rho))
    measured = waits[result.warmup_requests:]
    assert len(measured) == 54_000
    assert measured.mean() == pytest.approx(expected, rel=0.07)


def test_throughput_plateaus_at_the_capacity_bound_constant_step():
    """8 sequences, every step 10 ms, prompt 100 (one step), answer 50. Flooded far beyond
    capacity (160 req/s), every step carries 8 sequences each emitting one token (the prefill
    step emits the first), so throughput = 8/0.01 = 800 tokens/s and 800/50 = 16 requests/s.
    Tokens flow evenly, but requests finish in waves (the 8 slots filled within a few steps of
    each other turn over every 50 steps): a ~11 s window holds 22 or 23 waves, so the request rate
    is within 1/22 = 4.5%."""
    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_seqs=8)
    result = simulate(constant_step(TAU), config, workload=Workload(Fixed(100), Fixed(50),
                                                                     requests_per_s=160), seed=4)
    assert result.output_tokens_per_s == pytest.approx(800, rel=1e-6)
    assert result.requests_per_s == pytest.approx(16, rel=0.05)


def test_throughput_plateaus_at_the_capacity_bound_linear_step():
    """Step time a + b·(tokens in the step), a = 5 ms, b = 10 µs; 8 sequences, prompt 100, answer 50.
    At saturation every step emits 8 tokens, so a request costs 50/8 = 6.25 steps of overhead and
    b per token it runs (100 prompt + 49 decode = 149): 6.25·0.005 + 149·1e-5 = 0.03274 s per
    request. Capacity = 30.544 requests/s = 1527.2 tokens/s. Flooded at 10x that. The request rate
    is within a wave of finishes (about 1/22 over the ~6 s window), as above."""
    def linear_step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return 0.005 + 1e-5 * (decode_seqs + prefill_tokens)

    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_seqs=8)
    workload = Workload(Fixed(100), Fixed(50), requests_per_s=305)
    result = simulate(linear_step, config, workload=workload, seed=6)
    assert result.output_tokens_per_s == pytest.approx(1527.2, rel=0.005)
    assert result.requests_per_s == pytest.approx(30.544, rel=0.05)


def test_littles_law_on_the_simulated_trace():
    """Time-average number in the system = completion rate x mean time in the system (L = λW),
    over the measurement window, with a realistic step time and variable lengths. Requests
    straddling the window edges are a few in 10^3 of the window's request-seconds."""
    workload = Workload(LogNormal(p50=800, p90=2000, max_tokens=8000),
                        LogNormal(p50=150, p90=400, max_tokens=2000), requests_per_s=8)
    config = SchedulerConfig(kv_capacity_tokens=300_000, max_num_seqs=128)
    result = simulate(roofline_step, config, workload=workload, num_requests=3000, seed=3)
    mean_e2e = result.e2e_s[result.warmup_requests:].mean()
    assert result.mean_concurrency > 5  # a loaded system, not a trivially empty one
    assert result.mean_concurrency == pytest.approx(result.requests_per_s * mean_e2e, rel=0.02)


def test_closed_loop_keeps_exactly_the_users_in_the_system():
    """16 users, zero think time: every user always has one request in the system, so the time
    average over the window is 16. Users start together at t = 0, and request 16 + k is sent the
    instant the k-th request finishes."""
    workload = Workload(LogNormal(p50=500, p90=1500, max_tokens=8000), Fixed(64), concurrent_users=16)
    config = SchedulerConfig(kv_capacity_tokens=200_000, max_num_seqs=64)
    result = simulate(roofline_step, config, workload=workload, num_requests=800, seed=2)
    assert result.mean_concurrency == pytest.approx(16, rel=1e-9)
    assert np.array_equal(result.arrival_s[:16], np.zeros(16))
    assert np.array_equal(result.arrival_s[16:], np.sort(result.finish_s)[:800 - 16])


def test_closed_loop_with_one_user_runs_requests_back_to_back():
    """One user, prompt 10 (one step), answer 3 (two more steps), 10 ms steps: each request takes
    3 steps = 30 ms and the next starts when it ends."""
    result = simulate(constant_step(TAU), SchedulerConfig(kv_capacity_tokens=1024),
                      requests([math.nan] * 4, [10] * 4, [3] * 4), closed_loop_users=1)
    assert np.allclose(result.arrival_s, [0, 0.03, 0.06, 0.09])
    assert np.allclose(result.e2e_s, 0.03)


def test_users_thinking_send_each_request_a_think_time_after_their_last_answer():
    """Two users, prompt 10 (one step), answer 3 (two more steps), 10 ms steps, think draws 0.3, 0.2, 0, 0.1 s,
    the k-th send made taking the k-th. Both users think from t = 0; the sooner of two exponential pauses of mean Z is
    one of mean Z / 2, so the first user is heard from after 0.3 / 2 = 0.15 s (send 1), and the other, thinking
    on, after a further 0.2 / 1 (send 2): at 0.35. The first user's request ends at 0.18; it sends again after 0 s
    (send 3): 0.18, ending 0.21; again after 0.1 s (send 4, the last): 0.31, ending 0.34. The second user's
    request arrives at 0.35 and ends at 0.38. Requests arrive in the order their sends fall due, each alone: 30 ms
    apiece."""
    closed = Requests(np.full(4, math.nan), np.array([10] * 4), np.array([3] * 4), np.zeros(4),
                      think_s=np.array([0.3, 0.2, 0.0, 0.1]))
    result = simulate(constant_step(TAU), SchedulerConfig(kv_capacity_tokens=1024), closed, closed_loop_users=2,
                      warmup_fraction=0.0)
    assert result.arrival_s == pytest.approx([0.15, 0.18, 0.31, 0.35])
    assert result.e2e_s == pytest.approx([0.03] * 4)


def test_users_outnumbering_the_requests_send_at_their_own_pace():
    """6,000 users thinking 10 s between requests of 1 in / 50 out, 5,000 requests, 10 ms steps: every user sends
    about once in the run, yet the users send N / (E + Z) = 6,000 / 10.5 = 571 req/s from the start (the users
    thinking send at 1 / Z each, whether they are yet to send or have been answered): the 5,000 requests arrive
    within about 8.8 s. (Drawing the 6,000 users' first requests up front would spend every request on the first
    5,000 of them, at a rate falling from 600 to 100 req/s as the users yet to send run out.)"""
    workload = Workload(Fixed(1), Fixed(50), concurrent_users=6000, think_time_s=10.0)
    result = simulate(constant_step(TAU), SchedulerConfig(kv_capacity_tokens=10_000_000, max_num_seqs=1024),
                      workload=workload, num_requests=5000, seed=0)
    mean_e2e = float(result.e2e_s[result.warmup_requests:].mean())
    assert 0.5 <= mean_e2e <= 0.51  # 50 steps of 10 ms, and a wait of up to a step for the one under way
    assert result.requests_per_s == pytest.approx(6000 / (mean_e2e + 10.0), rel=0.05)
    assert result.arrival_s[-1] == pytest.approx(5000 / (6000 / (mean_e2e + 10.0)), rel=0.05)
    assert result.mean_concurrency == pytest.approx(result.requests_per_s * mean_e2e, rel=0.02)


def test_users_who_think_send_n_over_e_plus_z():
    """200 users thinking 2 s on average (exponential) between requests of 100 in / 50 out, 10 ms steps: each
    user cycles through one request (E) and one pause (Z), so they send N / (E + Z) requests/s (Little's law over
    the users), and the requests in the system number the rate x E (over the requests). The users keep their
    pace to the last of the 10,000 arrivals (sends counted as they were made, not as they arrived, left
    about Z·ln(200) = 10.6 s of thinning arrivals at the end, which read the rate 5% low). 9,000 measured
    requests put about 1% of sampling noise on the rate."""
    workload = Workload(Fixed(100), Fixed(50), concurrent_users=200, think_time_s=2.0)
    result = simulate(constant_step(TAU), SchedulerConfig(kv_capacity_tokens=1_000_000), workload=workload,
                      num_requests=10_000, seed=0)
    mean_e2e = float(result.e2e_s[result.warmup_requests:].mean())
    assert 0.5 <= mean_e2e <= 0.51  # 50 steps of 10 ms, and a wait of up to a step for the one under way
    assert result.requests_per_s == pytest.approx(200 / (mean_e2e + 2.0), rel=0.03)
    assert result.mean_concurrency == pytest.approx(result.requests_per_s * mean_e2e, rel=0.01)


def test_bursty_arrivals_raise_waiting_and_p95_ttft_as_kingman_predicts():
    """One sequence at a time (max_num_seqs 1), a one-token answer and 0.1 s steps make every
    request a deterministic 0.1 s job: the engine is a single-server queue with deterministic service
    S = 0.1 s, and TTFT = wait + S. At 9 req/s the load is rho = 9 x 0.1 = 0.9.

    Poisson arrivals (M/D/1), Pollaczek-Khinchine (exact):
        Wq = rho S / (2 (1 - rho)) = 0.9 x 0.1 / 0.2 = 0.45 s.
    Gamma arrivals with CV 2 (c_a² = 4), deterministic service (c_s² = 0), Kingman / Allen-Cuneen:
        Wq ~ (c_a² + c_s²) / 2 x rho / (1 - rho) x S = 2 x 9 x 0.1 = 1.8 s, i.e. 4x the Poisson wait
        ((c_a² + c_s²) / (1 + c_s²) = 4 at any load). The approximation is exact as rho -> 1
        (heavy traffic); at rho 0.9 the G/D/1 error is a few per cent, which is why this case is at
        0.9 and not at a lighter load, where it underestimates bursty queues by 10 % and more.
    p95 TTFT, from the heavy-traffic law that the wait is exponential:
        M/D/1: P(W > 0) = rho (PASTA), and given a wait its mean is Wq / rho = 0.5 s, so
        P(W > t) = 0.9 exp(-t / 0.5) = 0.05 at t = 0.5 ln 18 = 1.445 s: p95 TTFT = 1.545 s.
        CV 2: P(W > 0) ~ 1 in heavy traffic, P(W > t) = exp(-t / 1.8) = 0.05 at t = 1.8 ln 20
        = 5.392 s: p95 TTFT = 5.492 s.
        Bursty arrivals raise p95 TTFT by 5.492 - 1.545 = 3.947 s at the same mean rate.
    Tolerances: 10 % on the exact M/D/1 mean and 15 % on the approximations. The queue's relaxation
    time is about (c_a² + c_s²) / (2 (1 - rho)²) x S = 20 s (180 arrivals), so 360,000 measured
    requests are ~2,000 independent stretches: the sample mean and p95 wobble by about 5 % from seed
    to seed, on top of the heavy-traffic approximations' few per cent.
    """
    config = SchedulerConfig(kv_capacity_tokens=4096, max_num_seqs=1)
    mean_wait, p95_ttft = {}, {}
    for cv in (1.0, 2.0):
        workload = Workload(Fixed(100), Fixed(1), requests_per_s=9.0, arrival_cv=cv)
        result = simulate(constant_step(0.1), config, workload=workload, num_requests=400_000, seed=1)
        measured = result.ttft_s[result.warmup_requests:]
        mean_wait[cv] = float(measured.mean()) - 0.1
        p95_ttft[cv] = float(np.percentile(measured, 95))
    assert mean_wait[1.0] == pytest.approx(0.45, rel=0.10)
    assert mean_wait[2.0] == pytest.approx(1.8, rel=0.15)
    assert mean_wait[2.0] / mean_wait[1.0] == pytest.approx(4.0, rel=0.15)
    assert p95_ttft[1.0] == pytest.approx(1.545, rel=0.15)
    assert p95_ttft[2.0] - p95_ttft[1.0] == pytest.approx(3.947, rel=0.15)


def test_the_single_server_case_is_exactly_lindleys_recursion():
    """With one sequence at a time and one-step jobs of S = 0.1 s, each request waits
    W(n+1) = max(0, W(n) + S - gap(n+1)) (Lindley), whatever the arrival process: the simulator
    must reproduce the recursion request by request on the same Gamma (CV 2) arrivals."""
    workload = Workload(Fixed(100), Fixed(1), requests_per_s=9.0, arrival_cv=2.0)
    drawn = sample_requests(workload, 5000, seed=3)
    result = simulate(constant_step(0.1), SchedulerConfig(kv_capacity_tokens=4096, max_num_seqs=1), drawn)
    gaps = np.diff(drawn.arrival_s)
    waits = [0.0]
    for gap in gaps:
        waits.append(max(0.0, waits[-1] + 0.1 - gap))
    assert result.ttft_s - 0.1 == pytest.approx(np.array(waits), abs=1e-7)


# Schedules traced by hand -----------------------------------------------------------------------


def test_tpot_is_the_gap_after_the_first_token():
    """Prompt 10, answer 5, 10 ms steps, alone: step 1 prefills and emits token 1 (TTFT 10 ms),
    steps 2–5 emit tokens 2–5 (E2E 50 ms); TPOT = (50 − 10)/(5 − 1) = 10 ms. A one-token answer
    has no TPOT."""
    result = simulate(constant_step(TAU), SchedulerConfig(kv_capacity_tokens=1024),
                      requests([0.0, 1.0], [10, 10], [5, 1]))
    assert result.ttft_s == pytest.approx([0.01, 0.01])
    assert result.e2e_s == pytest.approx([0.05, 0.01])
    assert result.tpot_s[0] == pytest.approx(0.01)
    assert math.isnan(result.tpot_s[1])


def test_chunked_prefill_of_a_long_prompt():
    """A 20,000-token prompt with max_num_batched_tokens 8192 is prefilled in chunks of 8192, 8192
    and 3616 tokens: the first token comes out of step 3. Attention spans (sum of positions):
    chunk 1: 8192·8193/2 = 33,558,528; chunk 2 (after 8192): 8192·8192 + 33,558,528 = 100,667,392;
    chunk 3 (after 16,384): 3616·16384 + 3616·3617/2 = 59,244,544 + 6,539,536 = 65,784,080.
    Then two decode steps over 20,000 and 20,001 cached tokens: with a step of 10 ms + 1 µs per
    cached token they take 30 and 30.001 ms, so E2E = 30 + 30 + 30.001 = 90.001 ms."""
    step = RecordingStep()
    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192)
    result = simulate(step, config, requests([0.0], [20_000], [3]))
    assert result.ttft_s[0] == pytest.approx(3 * TAU)
    assert step.prefill_steps == [(0, 0, 8192, 33_558_528), (0, 0, 8192, 100_667_392),
                                  (0, 0, 3616, 65_784_080)]

    def context_step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
        return TAU + 1e-6 * np.asarray(decode_context_tokens, dtype=float)

    result = simulate(context_step, config, requests([0.0], [20_000], [3]))
    assert result.e2e_s[0] == pytest.approx(0.090001, rel=1e-12)


def test_chunked_prefill_shares_steps_with_decodes():
    """A decodes (prompt 10, answer 4); B (prompt 5000) arrives during A's second step. Budget 4096:
    step 3 carries A's decode (1 token, 11 cached) + 4095 of B's prompt; step 4 A's last decode
    (12 cached) + B's last 905.
    A's tokens at 10, 20, 30, 40 ms; B's first token at 40 ms (arrived 15 ms)."""
    step = RecordingStep()
    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=4096)
    result = simulate(step, config, requests([0.0, 0.015], [10, 5000], [4, 2]))
    assert [call[:3] for call in step.prefill_steps] == [(0, 0, 10), (1, 11, 4095), (1, 12, 905)]
    assert result.finish_s[0] == pytest.approx(0.04)
    assert result.ttft_s[1] == pytest.approx(0.04 - 0.015)


def test_without_mixed_steps_decodes_pause_for_a_prefill():
    """Same A and B (B's prompt 1000) without mixing (vLLM V0: whole prompts): step 3 prefills B alone
    and A waits, so A's tokens come at 10, 20, 40, 50 ms; mixed in, A is never paused (done at 40 ms)."""
    trace = requests([0.0, 0.015], [10, 1000], [4, 2])
    paused = simulate(constant_step(TAU), SchedulerConfig(100_000, chunked_prefill=False, mixed_prefill=False),
                      trace)
    mixed = simulate(constant_step(TAU), SchedulerConfig(100_000), trace)
    assert paused.finish_s[0] == pytest.approx(0.05)
    assert paused.ttft_s[1] == pytest.approx(0.03 - 0.015)
    assert mixed.finish_s[0] == pytest.approx(0.04)


def test_prefill_first_chunks_pause_the_decodes():
    """SGLang's schedule (chunked, not mixed): A decodes (prompt 10, answer 4); B (prompt 5000) arrives
    during A's second step. Budget 4096: step 3 carries 4096 of B's prompt alone and step 4 B's last 904,
    A waiting in both; step 5 decodes A and B, step 6 A alone.
    A's tokens at 10, 20, 50, 60 ms; B's first token at 40 ms (arrived 15 ms: TTFT 25 ms), its second at
    50 ms. Mixed in (the test above) A was done at 40 ms and B's chunks were 4095 and 905."""
    step = RecordingStep()
    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=4096, mixed_prefill=False)
    result = simulate(step, config, requests([0.0, 0.015], [10, 5000], [4, 2]))
    assert [call[:3] for call in step.prefill_steps] == [(0, 0, 10), (0, 0, 4096), (0, 0, 904)]
    assert result.finish_s == pytest.approx([0.06, 0.05])
    assert result.ttft_s[1] == pytest.approx(0.04 - 0.015)


def test_prefill_first_keeps_a_fixed_length_closed_loop_in_step():
    """Two users, prompts of 8192 = the budget, answers of 3, 10 ms steps. Prefill first: step 1 A's
    prompt (first token 10 ms), step 2 B's (20 ms), steps 3-4 decode both: both done at 40 ms, so both
    users send again at once and the second pair repeats the first: TTFTs 10, 20, 10, 20 ms, done at
    40, 40, 80, 80 ms.
    Mixed in, the users drift apart: step 2 carries A's decode and 8191 of B's prompt, step 3 A's last
    token (A done at 30 ms) and B's last prompt token (B's first token at 30 ms); steps 4-5 B's decodes
    with the next user's prompt beside them: B done at 50 ms."""
    trace = requests([0.0] * 4, [8192] * 4, [3] * 4)
    config = SchedulerConfig(kv_capacity_tokens=100_000, max_num_batched_tokens=8192, mixed_prefill=False)
    in_step = simulate(constant_step(TAU), config, trace, closed_loop_users=2, warmup_fraction=0.0)
    assert in_step.ttft_s == pytest.approx([0.01, 0.02, 0.01, 0.02])
    assert in_step.finish_s == pytest.approx([0.04, 0.04, 0.08, 0.08])
    mixed = simulate(constant_step(TAU), replace(config, mixed_prefill=True), trace, closed_loop_users=2,
                     warmup_fraction=0.0)
    assert mixed.finish_s[:2] == pytest.approx([0.03, 0.05])
    assert mixed.ttft_s[1] == pytest.approx(0.03)


def test_without_chunked_prefill_a_prompt_above_the_budget_is_rejected():
    with pytest.raises(ValueError, match="chunked prefill"):
        simulate(constant_step(TAU), SchedulerConfig(100_000, chunked_prefill=False, mixed_prefill=False),
                 requests([0.0], [20_000], [3]))


def test_preemption_traced_by_hand():
    """KV 64 tokens = 4 blocks of 16; A and B (prompt 16, answer 40) both arrive at 0.
    On demand: step 1 admits both (1 block each) and emits their first tokens. Decode step 2
    writes token index 16 of each: a new block each (free 2 -> 0). Step 18 needs block 3 for
    both, none free: B (newest) is preempted (its 2 blocks freed, 17 tokens generated), A takes
    one. B's recompute prompt is 16 + 17 = 33 tokens = 3 blocks; only 1 free until A ends: A's
    last token (40th) comes from step 40. Step 41 prefills B's 33 tokens and emits its 18th token;
    its 40th comes 22 steps later, from step 63.
    Full reservation: A reserves ceil((16 + 40)/16) = 4 blocks, so B waits for A: B's first token
    from step 41 and its last from step 80; nothing is ever preempted."""
    trace = requests([0.0, 0.0], [16, 16], [40, 40])
    on_demand = simulate(constant_step(TAU), SchedulerConfig(64, block_size=16), trace)
    assert on_demand.preemptions == 1
    assert on_demand.first_token_s == pytest.approx([1 * TAU, 1 * TAU])
    assert on_demand.finish_s == pytest.approx([40 * TAU, 63 * TAU])
    assert on_demand.steps == 63

    full = simulate(constant_step(TAU), SchedulerConfig(
        64, block_size=16, kv_tokens_reserved_per_request="full"), trace)
    assert full.preemptions == 0
    assert full.first_token_s == pytest.approx([1 * TAU, 41 * TAU])
    assert full.finish_s == pytest.approx([40 * TAU, 80 * TAU])


def test_tiny_kv_preempts_yet_everything_finishes():
    workload = Workload(Fixed(200), Fixed(300), requests_per_s=50)
    config = SchedulerConfig(kv_capacity_tokens=4096, max_num_seqs=32)
    on_demand = simulate(roofline_step, config, workload=workload, num_requests=300, seed=1)
    assert on_demand.preemptions > 0
    assert np.isfinite(on_demand.finish_s).all()
    full = simulate(roofline_step, SchedulerConfig(4096, max_num_seqs=32,
                                                   kv_tokens_reserved_per_request="full"),
                    workload=workload, num_requests=300, seed=1)
    assert full.preemptions == 0
    assert np.isfinite(full.finish_s).all()


def test_max_num_seqs_bounds_the_batch():
    """10 requests at t = 0, one-token answers, 2 sequences at a time, 10 ms steps: requests finish
    in pairs at 10, 20, ..., 50 ms."""
    result = simulate(constant_step(TAU), SchedulerConfig(4096, max_num_seqs=2),
                      requests([0.0] * 10, [10] * 10, [1] * 10))
    assert result.finish_s == pytest.approx(np.repeat([1, 2, 3, 4, 5], 2) * TAU)


def test_prefix_cache_skips_compute_but_not_attention():
    """Prompt 1000 with 600 cached: the prefill computes 400 tokens (positions 601..1000), whose
    attention spans 601 + ... + 1000 = 400·(601 + 1000)/2 = 320,200 positions."""
    step = RecordingStep()
    simulate(step, SchedulerConfig(100_000), requests([0.0], [1000], [1], cached=[600], shared=600))
    assert step.prefill_steps == [(0, 0, 400, 320_200)]


def test_shared_prefix_is_stored_once():
    """KV 160 tokens = 10 blocks of 16. Three requests of prompt 80 (first 64 a shared prefix) and
    answer 16, full reservation. Shared: the prefix pins 4 blocks; each request reserves its own
    80 + 16 − 64 = 32 tokens = 2 blocks, so all three fit in the other 6 and run together (16
    steps: done at 160 ms). Not shared: each reserves 96 tokens = 6 blocks, so they run one after
    another: 160, 320, 480 ms."""
    config = SchedulerConfig(160, block_size=16, kv_tokens_reserved_per_request="full")
    shared = simulate(constant_step(TAU), config, requests([0.0] * 3, [80] * 3, [16] * 3,
                                                           cached=[64] * 3, shared=64))
    private = simulate(constant_step(TAU), config, requests([0.0] * 3, [80] * 3, [16] * 3))
    assert shared.finish_s == pytest.approx([0.16] * 3)
    assert private.finish_s == pytest.approx([0.16, 0.32, 0.48])


def test_a_request_larger_than_the_kv_cache_is_rejected_up_front():
    with pytest.raises(KvCapacityError, match="could never finish"):
        simulate(constant_step(TAU), SchedulerConfig(128, block_size=16),
                 requests([0.0, 0.1], [50, 100], [10, 100]))
    with pytest.raises(KvCapacityError, match="shared prefix"):
        simulate(constant_step(TAU), SchedulerConfig(64, block_size=16),
                 requests([0.0], [100], [10], cached=[70], shared=70))


def test_work_is_capped(monkeypatch):
    monkeypatch.setattr(simulate_module, "MAX_STEPS", 100)
    with pytest.raises(SimulationLimitError, match="steps"):
        simulate(constant_step(TAU), SchedulerConfig(4096), requests([0.0], [10], [500]))
    monkeypatch.setattr(simulate_module, "MAX_REQUESTS", 5)
    with pytest.raises(SimulationLimitError, match="requests"):
        simulate(constant_step(TAU), SchedulerConfig(4096), requests([0.0] * 6, [10] * 6, [2] * 6))


def test_step_time_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        simulate(constant_step(0.0), SchedulerConfig(4096), requests([0.0], [10], [2]))


def test_scheduler_config_is_validated():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(4096, max_num_seqs=512, max_num_batched_tokens=256)
    with pytest.raises(ValueError, match="kv_tokens_reserved_per_request"):
        SchedulerConfig(4096, kv_tokens_reserved_per_request="lazy")
    with pytest.raises(ValueError, match="one block"):
        SchedulerConfig(8, block_size=16)


# Result metrics ---------------------------------------------------------------------------------


def test_percentiles_leave_out_the_warmup_requests():
    """Ten one-token requests at t = 0, one at a time, 10 ms steps: TTFT of request k is
    10·(k + 1) ms. The first 10% (request 0) is warm-up; the rest are 20..100 ms: p0 20 ms,
    p50 60 ms, p100 100 ms."""
    result = simulate(constant_step(TAU), SchedulerConfig(4096, max_num_seqs=1),
                      requests([0.0] * 10, [10] * 10, [1] * 10))
    assert result.warmup_requests == 1
    assert result.percentile("ttft", 0) == pytest.approx(0.02)
    assert result.percentile("ttft", 50) == pytest.approx(0.06)
    assert result.percentile("ttft", 100) == pytest.approx(0.10)
    assert math.isnan(result.percentile("tpot", 50))  # one-token answers have no TPOT
    with pytest.raises(ValueError):
        result.percentile("latency", 50)


def test_goodput_counts_requests_meeting_every_slo():
    """The preemption trace above: TTFT 10 ms for both; TPOT (400 − 10)/39 = 10 ms for A and
    (630 − 10)/39 = 15.9 ms for B. With a TPOT SLO of 12 ms only A passes: fraction 1/2. Both
    arrive at 0, so the window is [0, 630 ms]: 2 requests/0.63 s and 80 tokens/0.63 s; goodput is
    half of each (A has 40 of the 80 tokens)."""
    result = simulate(constant_step(TAU), SchedulerConfig(64, block_size=16),
                      requests([0.0, 0.0], [16, 16], [40, 40]), warmup_fraction=0.0)
    assert result.measurement_window_s == pytest.approx((0.0, 0.63))
    good = result.goodput(ttft_s=0.0101, tpot_s=0.012)
    assert good.fraction == 0.5
    assert good.requests_per_s == pytest.approx(1 / 0.63)
    assert good.output_tokens_per_s == pytest.approx(40 / 0.63)
    assert result.goodput(ttft_s=0.0101, tpot_s=0.02).fraction == 1.0
    assert result.goodput(ttft_s=0.0101, tpot_s=0.02, e2e_s=0.5).fraction == 0.5


def test_same_seed_same_result_other_seed_other_result():
    workload = Workload(LogNormal(p50=500, p90=1500, max_tokens=8000),
                        LogNormal(p50=100, p90=300, max_tokens=2000), requests_per_s=10)
    config = SchedulerConfig(kv_capacity_tokens=50_000, max_num_seqs=64)
    a, b, c = (simulate(roofline_step, config, workload=workload, num_requests=500, seed=s)
               for s in (5, 5, 6))
    assert np.array_equal(a.finish_s, b.finish_s) and np.array_equal(a.ttft_s, b.ttft_s)
    assert a.preemptions == b.preemptions and a.steps == b.steps
    assert not np.array_equal(a.finish_s, c.finish_s)


# The fast scheduler equals a naive one ------------------------------------------------------------


def reference_simulate(step_time, config, trace):
    """One loop turn per engine step, explicit per-request token and block counts; the documented
    rules and nothing else. Returns (first_token_s, finish_s, preemptions, steps)."""
    n, bs = len(trace), config.block_size
    prompt_len = trace.input_tokens.tolist()
    answer = trace.output_tokens.tolist()
    cached = trace.cached_prefix_tokens.tolist()
    shared = [min(trace.shared_prefix_tokens, c) for c in cached]
    pinned = -(-trace.shared_prefix_tokens // bs) if any(shared) else 0
    free = config.kv_capacity_tokens // bs - pinned
    on_demand = config.kv_tokens_reserved_per_request == "on_demand"
    budget_per_step = config.max_num_batched_tokens

    in_kv = list(cached)  # tokens whose KV exists (prompt part counted once computed)
    target = list(prompt_len)  # tokens to prefill before the next token comes out
    generated = [0] * n
    blocks = [0] * n
    phase = ["pending"] * n
    first, finish = [math.nan] * n, [math.nan] * n
    running, waiting = [], deque()
    t, steps, preemptions, next_arrival, done = 0.0, 0, 0, 0, 0

    def admission_blocks(i):
        own = (target[i] if on_demand else prompt_len[i] + answer[i]) - shared[i]
        return -(-own // bs)

    while done < n:
        while next_arrival < n and trace.arrival_s[next_arrival] <= t:
            waiting.append(next_arrival)
            next_arrival += 1
        if not running and not waiting:
            t = float(trace.arrival_s[next_arrival])
            continue
        prefill_only = False
        if not config.mixed_prefill:  # prompt work first, the decodes wait for it
            head = waiting[0] if waiting else None
            prefill_only = (any(phase[i] == "prefill" for i in running)
                            or (head is not None and len(running) < config.max_num_seqs
                                and admission_blocks(head) <= free))
        decoders = [] if prefill_only else [i for i in running if phase[i] == "decode"]
        preempted = False
        if on_demand:
            while True:
                needing = [i for i in decoders if (in_kv[i] - shared[i]) % bs == 0]
                if len(needing) <= free:
                    break
                victim = running.pop()
                free += blocks[victim]
                blocks[victim] = 0
                if victim in decoders:
                    decoders.remove(victim)
                phase[victim] = "waiting"
                in_kv[victim] = cached[victim]
                target[victim] = prompt_len[victim] + generated[victim]
                waiting.appendleft(victim)
                preemptions += 1
                preempted = True
            for i in needing:
                blocks[i] += 1
                free -= 1
        budget = budget_per_step - len(decoders)
        chunks = {}  # request -> prompt tokens prefilled this step
        for i in running:
            if phase[i] == "prefill" and budget > 0:
                chunks[i] = min(target[i] - in_kv[i], budget)
                budget -= chunks[i]
        if not preempted and (config.mixed_prefill or prefill_only):
            while waiting and budget > 0 and len(running) < config.max_num_seqs:
                i = waiting[0]
                need = admission_blocks(i)
                if need > free or (not config.chunked_prefill and target[i] - in_kv[i] > budget):
                    break
                waiting.popleft()
                running.append(i)
                blocks[i] = need
                free -= need
                phase[i] = "prefill"
                chunks[i] = min(target[i] - in_kv[i], budget)
                budget -= chunks[i]
        prefill_tokens = sum(chunks.values())
        prefill_context = sum(sum(range(in_kv[i] + 1, in_kv[i] + c + 1)) for i, c in chunks.items())
        completing = []
        for i, chunk in chunks.items():
            in_kv[i] += chunk
            if in_kv[i] == target[i]:
                completing.append(i)
        context = sum(in_kv[i] for i in decoders)
        t += float(step_time(len(decoders), context, prefill_tokens, prefill_context))
        steps += 1
        for i in decoders + completing:
            if i in decoders:
                in_kv[i] += 1
            generated[i] += 1
            if math.isnan(first[i]):
                first[i] = t
            phase[i] = "decode"
            if generated[i] == answer[i]:
                phase[i] = "done"
                finish[i] = t
                running.remove(i)
                free += blocks[i]
                done += 1
    return np.array(first), np.array(finish), preemptions, steps


@st.composite
def small_cases(draw):
    n = draw(st.integers(1, 7))
    block_size = draw(st.sampled_from([1, 4, 16]))
    prompt = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    answer = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    shared_prefix = draw(st.integers(0, 20))
    cached = [draw(st.integers(0, p - 1)) for p in prompt]
    gaps = draw(st.lists(st.floats(0.0, 0.2), min_size=n, max_size=n))
    trace = Requests(np.cumsum(gaps), np.array(prompt), np.array(answer), np.array(cached),
                     shared_prefix)
    shared = [min(shared_prefix, c) for c in cached]
    pinned = -(-shared_prefix // block_size) if any(shared) else 0
    largest = max(-(-(p + a - s) // block_size) for p, a, s in zip(prompt, answer, shared, strict=True))
    blocks = pinned + largest + draw(st.integers(0, 12))
    chunked, mixed = draw(st.booleans()), draw(st.booleans())
    reservation = draw(st.sampled_from(["on_demand", "full"]))
    max_num_seqs = draw(st.integers(1, 4))
    if chunked:
        budget = draw(st.integers(max(max_num_seqs, 2), 64))
    else:
        budget = max(max_num_seqs, max(p + a for p, a in zip(prompt, answer, strict=True)))
    config = SchedulerConfig(blocks * block_size, block_size, max_num_seqs, budget, chunked,
                             reservation, mixed_prefill=mixed)
    return trace, config


def affine_step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens):
    """Step time depending on everything, so any bookkeeping slip shows in the timings."""
    return (0.004 + 0.0003 * decode_seqs + 1.7e-6 * decode_context_tokens + 2.1e-5 * prefill_tokens
            + 3e-8 * prefill_context_tokens)


@pytest.mark.parametrize("vector_min_steps", [1, 8, 10**9])  # all vectorized / default / all scalar
def test_matches_the_naive_reference_scheduler(vector_min_steps):
    @settings(max_examples=150, deadline=None)
    @given(small_cases())
    def check(case):
        trace, config = case
        first, finish, preemptions, steps = reference_simulate(affine_step, config, trace)
        result = simulate(affine_step, config, trace)
        assert result.first_token_s == pytest.approx(first, rel=1e-9, abs=1e-12)
        assert result.finish_s == pytest.approx(finish, rel=1e-9, abs=1e-12)
        assert result.preemptions == preemptions
        assert result.steps == steps

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulate_module, "_VECTOR_MIN_STEPS", vector_min_steps)
        check()


def test_the_reference_scheduler_preempts_in_the_traced_case():
    """The naive scheduler reproduces the hand trace too (so it is a fair referee)."""
    _, finish, preemptions, steps = reference_simulate(
        constant_step(TAU), SchedulerConfig(64, block_size=16), requests([0.0, 0.0], [16, 16], [40, 40]))
    assert preemptions == 1 and steps == 63
    assert finish == pytest.approx([40 * TAU, 63 * TAU])


# Pipeline stages: micro-batches in flight ------------------------------------------------------------------

def test_a_pp4_pipeline_against_a_hand_built_schedule():
    """8 requests at t = 0, prompts of 16 tokens, answers of 4, blocks of 16, KV reserved for prompt + answer
    (20 tokens = 2 blocks per request). One stage's GPU holds 4 blocks of the whole model's KV.

    PP1, one GPU: 4 blocks = 2 requests at a time; a step (the whole model) takes 4 x 10 ms = 40 ms.
      Wave 1: prefill step ends at 40 ms (first tokens), 3 decode steps, done at 160 ms; waves 2, 3, 4 start
      at 160, 320, 480: TTFT 40, 200, 360, 520 ms (mean 280), last finish 640 ms: 8 x 4 = 32 tokens in
      0.640 s = 50 tokens/s.
    PP4, four GPUs: each holds a quarter of the layers, so 4 x 4 = 16 blocks; 4 micro-batches of 4 blocks
    each take 2 requests (requests 0, 4 / 1, 5 / 2, 6 / 3, 7). A micro-batch's trip is 4 stages x 10 ms +
    3 hand-offs x 1 ms = 43 ms, and the four trips overlap (each stage serves the micro-batches in turn).
      Every request: TTFT 43 ms (every stage and hand-off), TPOT 43 ms, done at 4 x 43 = 172 ms: 32 tokens
      in 0.172 s = 186.05 tokens/s, 3.72 times PP1."""
    batch = requests([0.0] * 8, [16] * 8, [4] * 8)
    pp1 = SchedulerConfig(kv_capacity_tokens=64, block_size=16, max_num_seqs=8, max_num_batched_tokens=8192,
                          kv_tokens_reserved_per_request="full")
    one = simulate_pipeline(constant_step(0.040), pp1, batch, 1)
    assert sorted(one.ttft_s) == pytest.approx([0.040] * 2 + [0.200] * 2 + [0.360] * 2 + [0.520] * 2)
    assert one.finish_s.max() == pytest.approx(0.640)
    assert one.output_tokens_per_s == pytest.approx(50.0)

    pp4 = SchedulerConfig(kv_capacity_tokens=256, block_size=16, max_num_seqs=8, max_num_batched_tokens=8192,
                          kv_tokens_reserved_per_request="full")
    assert micro_batch_config(pp4, 4).kv_capacity_tokens == 64 and micro_batch_config(pp4, 4).max_num_seqs == 2
    four = simulate_pipeline(constant_step(4 * 0.010 + 3 * 0.001), pp4, batch, 4)
    assert list(four.ttft_s) == pytest.approx([0.043] * 8)
    assert list(four.tpot_s) == pytest.approx([0.043] * 8)
    assert list(four.finish_s) == pytest.approx([0.172] * 8)
    assert four.output_tokens_per_s == pytest.approx(32 / 0.172)
    assert four.output_tokens_per_s / one.output_tokens_per_s == pytest.approx(3.72, abs=0.005)


def test_closed_loop_users_are_dealt_to_the_micro_batches():
    """5 users over 2 micro-batches: 3 and 2. With a constant 10 ms step, 1-token prompts and 2-token answers,
    every request takes 2 steps (20 ms) whatever its micro-batch: 30 requests all have E2E 20 ms."""
    config = SchedulerConfig(kv_capacity_tokens=1024, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    closed = requests([math.nan] * 30, [1] * 30, [2] * 30)
    result = simulate_pipeline(constant_step(0.010), config, closed, 2, closed_loop_users=5)
    assert len(result.e2e_s) == 30
    assert list(result.e2e_s) == pytest.approx([0.020] * 30)



def test_thinking_users_are_dealt_to_the_micro_batches_with_their_pauses():
    """2 users over 2 micro-batches, one each, with think times 0.1, 0.2, 0.3, 0.4 s: requests 0 and 2 (pauses
    0.1 and 0.3) go to the first, 1 and 3 (0.2 and 0.4) to the second. 1-token prompts, 2-token answers, 10 ms
    steps: 20 ms a request. First: arrivals 0.1 and 0.1 + 0.02 + 0.3 = 0.42; second: 0.2 and 0.2 + 0.02 + 0.4 =
    0.62; merged in arrival order."""
    config = SchedulerConfig(kv_capacity_tokens=1024, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    closed = Requests(np.full(4, math.nan), np.ones(4, dtype=int), np.full(4, 2), np.zeros(4, dtype=int),
                      think_s=np.array([0.1, 0.2, 0.3, 0.4]))
    result = simulate_pipeline(constant_step(0.010), config, closed, 2, closed_loop_users=2, warmup_fraction=0.0)
    assert result.arrival_s == pytest.approx([0.1, 0.2, 0.42, 0.62])
    assert result.e2e_s == pytest.approx([0.02] * 4)


# Window layers ------------------------------------------------------------------------------------

def test_window_layers_hold_their_window_only_and_the_pool_counts_the_full_layers():
    """Half the layers full, half a 128-token window (144 slots: 9 blocks of 16 straddled), as gpt-oss:
    1,300 equivalent blocks (a block of tokens in every layer) are 1,300 x 2 / 1 = 2,600 blocks of the
    full layers. A request of 9,216 tokens holds min(576, 9) = 9 window blocks per window layer, 1 x 9 / 1
    = 9 full-layer blocks; one of 100 tokens min(7, 9) = 7. Without window layers nothing changes."""
    config = SchedulerConfig(1300 * 16, full_layers=1, window_layers=((1, 144),))
    assert config.pool_blocks == 2600
    assert config.window_blocks(np.array([9216, 100])).tolist() == [9, 7]
    plain = SchedulerConfig(1300 * 16)
    assert plain.pool_blocks == 1300 and plain.window_blocks(np.array([9216])).tolist() == [0]
    gemma = SchedulerConfig(1300 * 16, full_layers=23, window_layers=((23, 4112),))
    assert gemma.pool_blocks == 2600  # 1,300 x 46 / 23
    # 1,500 tokens: ceil(1500 / 16) = 94 blocks, under the window's 4,112 slots = 257 blocks; 9,000: 257
    assert gemma.window_blocks(np.array([1500, 9000])).tolist() == [94, 257]


def test_window_layers_let_more_requests_run_at_once():
    """Reserved in full (TensorRT-LLM's admission), 40 requests of 1,024 + 1,024 tokens = 128 blocks each
    at t = 0, 10 ms steps: counting every layer as full, 1,300 // 128 = 10 start in the first step (10 x 128
    = 1,280 <= 1,300 < 1,408); with half the layers a 128-token window, each takes 128 + 9 = 137 of 2,600
    full-layer blocks: 18 start (18 x 137 = 2,466 <= 2,600 < 2,603). Each of those gets its first token
    when the first step ends, at 10 ms."""
    reqs = requests([0.0] * 40, [1024] * 40, [1024] * 40)
    shape = {"max_num_seqs": 256, "max_num_batched_tokens": 32768, "kv_tokens_reserved_per_request": "full"}
    full = simulate(constant_step(TAU), SchedulerConfig(1300 * 16, **shape), reqs)
    windowed = simulate(constant_step(TAU), SchedulerConfig(1300 * 16, full_layers=1, window_layers=((1, 144),),
                                                            **shape), reqs)
    assert int(np.sum(np.isclose(full.first_token_s, TAU))) == 10
    assert int(np.sum(np.isclose(windowed.first_token_s, TAU))) == 18
