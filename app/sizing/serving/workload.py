"""What the service is asked to serve: prompt/answer length distributions and the arrival process.

A workload is either open loop (`requests_per_s`: a renewal arrival process, Poisson or burstier,
see `arrival_cv`) or closed loop (`concurrent_users`: each user sends the next request `think_time_s` on average
after the previous one finishes, the moment it does by default). `sample_requests` turns it into concrete, seeded
requests for the simulator.

Lengths are token counts. A length distribution is one of three kinds, each with `.mean`,
`.quantile(q)` and `.sample(rng, n)` (integers >= 1):
- `Fixed(tokens)`: every request has exactly this length;
- `LogNormal(mean, p50, p90, p99)`: fitted to whichever statistics are given (see its docstring);
- `Histogram(bins)`: explicit `(tokens, weight)` point masses, e.g. read off a production log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

# Longest length a LogNormal draws unless told otherwise: a lognormal has an unbounded tail and a
# 1-in-10^5 draw of millions of tokens would exceed any KV cache. 131,072 is the context of the
# Llama-3.1 / Qwen2.5 class of models; callers pass the model's max_model_len instead.
DEFAULT_MAX_TOKENS = 131_072

# A fitted lognormal must reproduce every statistic it was given to within this fraction; beyond it
# the numbers do not describe a lognormal and a Histogram is the honest input.
LOGNORMAL_FIT_TOLERANCE = 0.10

# The longest mean think time: a day between a user's requests (Little's law still holds; beyond it a closed
# loop is better described by its users' rate, an open loop).
MAX_THINK_TIME_S = 86_400.0

# Arrival burstiness bounds: CV 10 (Gamma shape 0.01) already puts most arrivals into a few huge
# clumps; CV 0.1 (shape 100) is nearly a metronome. Beyond either, the number means little.
MIN_ARRIVAL_CV = 0.1
MAX_ARRIVAL_CV = 10.0

_STANDARD_NORMAL = NormalDist()


def _z(q: float) -> float:
    """Standard normal quantile: z(0.9) = 1.2816, z(0.99) = 2.3263."""
    return _STANDARD_NORMAL.inv_cdf(q)


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every request has exactly `tokens` tokens."""

    tokens: int

    def __post_init__(self) -> None:
        if int(self.tokens) != self.tokens or self.tokens < 1:
            raise ValueError(f"tokens must be a whole number >= 1, got {self.tokens}")

    @property
    def mean(self) -> float:
        return float(self.tokens)

    def quantile(self, q: float) -> float:
        _check_quantile(q)
        return float(self.tokens)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A lognormal length, ln(tokens) ~ Normal(mu, sigma), fitted to the statistics given.

    Fitting rules (a lognormal has two parameters, so two statistics fix it):
    - p50 with p90 and/or p99: mu = ln(p50); sigma = ln(pq/p50)/z(q), least squares over the tails
      given (z(0.90) = 1.2816, z(0.99) = 2.3263);
    - p90 with p99, no p50: both equations ln(pq) = mu + sigma·z(q), solved exactly;
    - mean with p50: mean/median = exp(sigma²/2), so sigma = sqrt(2·ln(mean/p50));
    - mean with one tail percentile, no p50: mu + sigma²/2 = ln(mean) and mu + sigma·z = ln(pq),
      the smaller root sigma = z − sqrt(z² − 2·ln(pq/mean)) (the less heavy-tailed fit);
    - mean alone: rejected, it says nothing about the spread.
    Every statistic given but not needed for the fit is checked against the fitted distribution
    (within LOGNORMAL_FIT_TOLERANCE); numbers that no lognormal reproduces are rejected, and a
    Histogram is the right input for them.

    `mean` (filled in when not given) is the fitted lognormal's mean, exp(mu + sigma²/2). Samples are
    rounded to whole tokens and clipped to [1, max_tokens]; that truncation lowers the sampled mean
    by the mass beyond max_tokens, which is negligible unless max_tokens sits inside the tail.
    """

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    mu: float = field(init=False)
    sigma: float = field(init=False)

    def __post_init__(self) -> None:
        given = {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}
        for name, value in given.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.p50 is not None:
            for name in ("p90", "p99"):
                if given[name] is not None and given[name] <= self.p50:
                    raise ValueError(f"{name} must be above p50 (the median)")
        if self.p90 is not None and self.p99 is not None and self.p99 <= self.p90:
            raise ValueError("p99 must be above p90")

        mu, sigma = _fit_lognormal(self.mean, self.p50, self.p90, self.p99)
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        fitted_mean = math.exp(mu + sigma * sigma / 2)
        if self.mean is not None and abs(fitted_mean / self.mean - 1) > LOGNORMAL_FIT_TOLERANCE:
            raise ValueError(_misfit("mean", self.mean, fitted_mean))
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            value = given[name]
            fitted = math.exp(mu + sigma * _z(q))
            if value is not None and abs(fitted / value - 1) > LOGNORMAL_FIT_TOLERANCE:
                raise ValueError(_misfit(name, value, fitted))
        if self.mean is None:
            object.__setattr__(self, "mean", fitted_mean)

    def quantile(self, q: float) -> float:
        """Length at quantile q of the fitted lognormal, clipped like the samples."""
        _check_quantile(q)
        if q == 0:
            return 1.0
        if q == 1:
            return float(self.max_tokens)
        return min(max(math.exp(self.mu + self.sigma * _z(q)), 1.0), float(self.max_tokens))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = np.rint(rng.lognormal(self.mu, self.sigma, n))
        return np.clip(draws, 1, self.max_tokens).astype(np.int64)


def _fit_lognormal(mean: float | None, p50: float | None, p90: float | None,
                   p99: float | None) -> tuple[float, float]:
    """(mu, sigma) from the statistics given, by the rules in LogNormal's docstring."""
    tails = [(_z(q), value) for q, value in ((0.9, p90), (0.99, p99)) if value is not None]
    if p50 is not None and tails:
        mu = math.log(p50)
        sigma = sum(z * math.log(v / p50) for z, v in tails) / sum(z * z for z, _ in tails)
        return mu, sigma
    if len(tails) == 2:
        (z90, v90), (z99, v99) = tails
        sigma = math.log(v99 / v90) / (z99 - z90)
        return math.log(v90) - sigma * z90, sigma
    if mean is not None and p50 is not None:
        if mean < p50:
            raise ValueError(f"a lognormal's mean is never below its median (mean {mean} < p50 {p50})")
        return math.log(p50), math.sqrt(2 * math.log(mean / p50))
    if mean is not None and tails:
        (z, value), = tails
        if value <= mean:
            raise ValueError("a tail percentile at or below the mean needs the median (p50) to fit")
        discriminant = z * z - 2 * math.log(value / mean)
        if discriminant < 0:
            raise ValueError(
                f"no lognormal has mean {mean} and that tail: the tail percentile can be at most "
                f"{math.exp(z * z / 2):.3g} x the mean; give p50 too, or a Histogram")
        sigma = z - math.sqrt(discriminant)
        return math.log(mean) - sigma * sigma / 2, sigma
    if mean is not None:
        raise ValueError(
            "a lognormal needs two statistics: the mean alone does not say how spread the lengths "
            "are; add p50 (the median) or a tail percentile (p90/p99), or use Fixed for one length")
    raise ValueError("a lognormal needs two of mean, p50, p90, p99")


def _misfit(name: str, given: float, fitted: float) -> str:
    return (f"{name} {given:g} does not fit a lognormal with the other statistics (the fit gives "
            f"{fitted:.4g}); give fewer statistics, or the lengths as a Histogram")


@dataclass(frozen=True, slots=True)
class Histogram:
    """Explicit lengths: `bins` are `(tokens, weight)` point masses; weights need not sum to 1."""

    bins: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.bins:
            raise ValueError("a histogram needs at least one bin")
        for tokens, weight in self.bins:
            if int(tokens) != tokens or tokens < 1:
                raise ValueError(f"bin tokens must be whole numbers >= 1, got {tokens}")
            if not (math.isfinite(weight) and weight >= 0):
                raise ValueError(f"bin weights must be >= 0, got {weight}")
        if sum(weight for _, weight in self.bins) <= 0:
            raise ValueError("histogram weights must not all be zero")
        object.__setattr__(self, "bins", tuple(sorted((int(t), float(w)) for t, w in self.bins)))

    @property
    def mean(self) -> float:
        total = sum(weight for _, weight in self.bins)
        return sum(tokens * weight for tokens, weight in self.bins) / total

    def quantile(self, q: float) -> float:
        """Smallest bin length whose cumulative weight reaches q of the total."""
        _check_quantile(q)
        total = sum(weight for _, weight in self.bins)
        cumulative = 0.0
        for tokens, weight in self.bins:
            cumulative += weight
            if cumulative >= q * total and weight > 0:
                return float(tokens)
        return float(self.bins[-1][0])

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        tokens = np.array([t for t, _ in self.bins], dtype=np.int64)
        weights = np.array([w for _, w in self.bins])
        return rng.choice(tokens, size=n, p=weights / weights.sum())


LengthDistribution = Fixed | LogNormal | Histogram


@dataclass(frozen=True, slots=True)
class PairedLengths:
    """Prompt and output lengths drawn together, as a benchmark dataset pairs them: `pairs` are
    `(input_tokens, output_tokens, weight)` point masses of a joint histogram (weights need not sum to 1).
    Drawing the two lengths apart would lose their correlation and the dataset's bounds on their sum
    (vLLM's ShareGPT sampling keeps prompt + output <= 2,048 tokens). `name` says which dataset."""

    pairs: tuple[tuple[int, int, float], ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("paired lengths need at least one pair")
        for input_tokens, output_tokens, weight in self.pairs:
            if min(input_tokens, output_tokens) < 1 or int(input_tokens) != input_tokens \
                    or int(output_tokens) != output_tokens:
                raise ValueError("pair lengths must be whole numbers >= 1")
            if not (math.isfinite(weight) and weight >= 0):
                raise ValueError(f"pair weights must be >= 0, got {weight}")
        if sum(weight for _, _, weight in self.pairs) <= 0:
            raise ValueError("pair weights must not all be zero")

    @property
    def mean_input(self) -> float:
        return sum(i * w for i, _, w in self.pairs) / sum(w for _, _, w in self.pairs)

    @property
    def mean_output(self) -> float:
        return sum(o * w for _, o, w in self.pairs) / sum(w for _, _, w in self.pairs)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`n` (input, output) pairs drawn with replacement, by weight."""
        table = np.array([(i, o) for i, o, _ in self.pairs], dtype=np.int64)
        weights = np.array([w for _, _, w in self.pairs])
        drawn = table[rng.choice(len(table), size=n, p=weights / weights.sum())]
        return drawn[:, 0], drawn[:, 1]


def _check_quantile(q: float) -> None:
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")


@dataclass(frozen=True, slots=True)
class Workload:
    """Lengths plus load. Exactly one of `requests_per_s` (open loop) and `concurrent_users`.

    - `arrival_cv` c > 0 is the coefficient of variation (sd / mean) of the gaps between arrivals,
      which are drawn from a Gamma of shape 1/c² and mean 1/rate: c = 1 is Poisson (exponential
      gaps); c > 1 clumps arrivals at the same average rate, c < 1 spaces them more evenly (vLLM's
      benchmark `--burstiness` is the shape, 1/c²). It says how arrivals bunch at a given rate, not
      how far the rate peaks above its mean (that is the planner's `peak_to_mean_ratio`).
      Open loop only: in a closed loop the users' own finishing times pace the arrivals.
    - `prefix_cache_hit_rate` r: the share of each prompt's tokens found in the prefix cache
      (vLLM reports the same token-level rate); those tokens skip prefill compute.
    - `shared_prefix_tokens` P: a prefix every prompt starts with (system prompt, few-shot block),
      always a cache hit once warm and stored once in the KV cache, not per request.
    - `think_time_s` Z: closed loop only, the mean time a user takes between receiving an answer's last token
      and sending the next request (reading, typing). Each pause is drawn from an exponential of mean Z, the
      memoryless pause of the interactive-system model, so the users' sends do not fall into step; each user's
      first request comes after one such pause too (the exponential's residual is itself, so the users start
      as a loop already running would find them). N users whose requests take E on average send N / (E + Z)
      requests/s (Little's law); 0, the default, is a benchmark's users, sending the next request the moment
      the last one ends, all starting at t = 0.
    Per request of n prompt tokens: shared = min(P, n − 1) and cached = max(shared,
    min(n − 1, round(r·n))); at least the last prompt token is always computed, as engines do to
    produce the first output token's logits.
    """

    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    requests_per_s: float | None = None
    concurrent_users: int | None = None
    arrival_cv: float = 1.0
    prefix_cache_hit_rate: float = 0.0
    shared_prefix_tokens: int = 0
    think_time_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.requests_per_s is None) == (self.concurrent_users is None):
            raise ValueError("give exactly one of requests_per_s (open loop) and concurrent_users "
                             "(closed loop)")
        if self.requests_per_s is not None and not (math.isfinite(self.requests_per_s)
                                                    and self.requests_per_s > 0):
            raise ValueError("requests_per_s must be positive")
        if self.concurrent_users is not None and self.concurrent_users < 1:
            raise ValueError("concurrent_users must be >= 1")
        if not (math.isfinite(self.arrival_cv) and MIN_ARRIVAL_CV <= self.arrival_cv <= MAX_ARRIVAL_CV):
            raise ValueError(f"arrival_cv must be in [{MIN_ARRIVAL_CV:g}, {MAX_ARRIVAL_CV:g}] (1 = Poisson arrivals)")
        if self.concurrent_users is not None and self.arrival_cv != 1:
            raise ValueError("arrival_cv applies to open-loop arrivals (requests_per_s) only")
        if not 0 <= self.prefix_cache_hit_rate <= 1:
            raise ValueError("prefix_cache_hit_rate must be in [0, 1]")
        if self.shared_prefix_tokens < 0:
            raise ValueError("shared_prefix_tokens must be >= 0")
        if not (math.isfinite(self.think_time_s) and 0 <= self.think_time_s <= MAX_THINK_TIME_S):
            raise ValueError(f"think_time_s must be in [0, {MAX_THINK_TIME_S:g}] seconds")
        if self.think_time_s and self.concurrent_users is None:
            raise ValueError("think_time_s applies to a closed loop's users (concurrent_users) only")

    @property
    def is_closed_loop(self) -> bool:
        return self.concurrent_users is not None


@dataclass(frozen=True, slots=True)
class Requests:
    """Concrete requests in arrival order (read-only arrays of equal length).

    `arrival_s` is NaN for a closed-loop workload: the simulator issues those requests itself. `think_s`, a
    closed loop's think times (None: none, every user starts at t = 0 and sends the next request the moment the
    last one ends), one pause in seconds per send in the order sends are made, at least one per request: users may
    send again before the last request arrives, and `sample_requests` draws one per request and one per user
    (the simulator makes no send past the draws, `scheduler.py`).
    `shared_prefix_tokens` is the one prefix stored once in the KV cache; a request's share of it is
    min(shared_prefix_tokens, cached_prefix_tokens).
    """

    arrival_s: np.ndarray  # float64, non-decreasing
    input_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    cached_prefix_tokens: np.ndarray  # int64, 0 <= cached < input
    shared_prefix_tokens: int = 0
    think_s: np.ndarray | None = None  # float64, >= 0, closed loop only, at least one per request

    def __post_init__(self) -> None:
        arrays = {}
        names = (("arrival_s", np.float64), ("input_tokens", np.int64), ("output_tokens", np.int64),
                 ("cached_prefix_tokens", np.int64)) + ((("think_s", np.float64),) if self.think_s is not None else ())
        for name, dtype in names:
            array = np.array(getattr(self, name), dtype=dtype)  # a private copy, then frozen
            if array.ndim != 1:
                raise ValueError(f"{name} must be one-dimensional")
            array.setflags(write=False)
            object.__setattr__(self, name, array)
            arrays[name] = array
        n = len(self.arrival_s)
        if any(len(a) != n for name, a in arrays.items() if name != "think_s"):
            raise ValueError("all request arrays must have the same length")
        if n and (self.input_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("input_tokens and output_tokens must be >= 1")
        if n and (self.cached_prefix_tokens.min() < 0
                  or np.any(self.cached_prefix_tokens >= self.input_tokens)):
            raise ValueError("cached_prefix_tokens must be in [0, input_tokens − 1]")
        timed = self.arrival_s[~np.isnan(self.arrival_s)]
        if len(timed) not in (0, n):
            raise ValueError("arrival_s must be all set (open loop) or all NaN (closed loop)")
        if len(timed) and (timed[0] < 0 or np.any(np.diff(timed) < 0)):
            raise ValueError("arrival_s must be non-negative and non-decreasing")
        if self.shared_prefix_tokens < 0:
            raise ValueError("shared_prefix_tokens must be >= 0")
        if self.think_s is not None and (len(timed) or len(self.think_s) < n
                                         or not np.all(np.isfinite(self.think_s) & (self.think_s >= 0))):
            raise ValueError("think_s must be finite and >= 0, at least one per request, and only for a closed loop "
                             "(no arrival_s)")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def subset(self, indices: np.ndarray, arrival_s: np.ndarray) -> Requests:
        """The requests at `indices`, in that order, arriving at `arrival_s` (one per index, non-negative and
        non-decreasing), with no think times (arrivals are set). Their lengths were checked when these were made,
        so only the arrivals are checked: a closed loop's rank takes its users' requests this way many times over
        (`disaggregated_loop._ranks`)."""
        arrival_s = np.array(arrival_s, dtype=np.float64)
        if arrival_s.shape != np.shape(indices) or np.any(~(arrival_s >= 0)) or np.any(arrival_s[1:] < arrival_s[:-1]):
            raise ValueError("arrival_s must be non-negative and non-decreasing, one per request")
        picked = object.__new__(Requests)
        for name, array in (("arrival_s", arrival_s), ("input_tokens", self.input_tokens[indices]),
                            ("output_tokens", self.output_tokens[indices]),
                            ("cached_prefix_tokens", self.cached_prefix_tokens[indices])):
            array.setflags(write=False)
            object.__setattr__(picked, name, array)
        object.__setattr__(picked, "shared_prefix_tokens", self.shared_prefix_tokens)
        object.__setattr__(picked, "think_s", None)
        return picked


def split_arrival_cv(arrival_cv: float, ways: int) -> float:
    """The coefficient of variation of the gaps each of `ways` schedulers sees when a stream whose gaps have
    CV c is dealt out to them at random (a balancer that keeps no state): each takes a request with p = 1/ways,
    so its gap is a geometric sum of the stream's gaps, of CV² = 1 + p(c² − 1) (the compound's variance:
    E[N]·Var(gap) + Var(N)·E[gap]², N ~ Geometric(p)). Bunching thins toward Poisson (c = 1 stays 1): CV 4 over
    28 schedulers is sqrt(1 + 15/28) = 1.24. A round-robin balancer would leave less (c²/ways, a sum of `ways`
    gaps): the random deal is the more bunched of the two."""
    if ways < 1:
        raise ValueError("ways must be >= 1")
    return math.sqrt(1 + (arrival_cv ** 2 - 1) / ways)


def ways_to_poisson_like(arrival_cv: float, tolerance: float) -> int:
    """The fewest schedulers a stream of gaps of CV c must be dealt out to for each one's share to be nearly
    Poisson, its CV² within `tolerance` of 1: `split_arrival_cv` solved for the ways, 1 + (c² − 1)/ways <= 1 +
    tolerance, so ceil((c² − 1) / tolerance) (CV 4 within 0.1: 150). A stream no more bunched than Poisson needs 1."""
    if tolerance <= 0:
        raise ValueError("tolerance must be > 0")
    return max(1, math.ceil((arrival_cv ** 2 - 1) / tolerance))


# A non-Poisson stream's gaps come from a generator of their own (seeded by the plan's seed and this): the main
# generator still draws the Poisson gaps it would, so the lengths after them are those of any CV (common random
# numbers across the shares of a stream a plan's replica counts see, `dealt_out_arrivals`).
GAMMA_GAPS_STREAM = 1


def dealt_out_arrivals(workload: Workload, ways: int, n: int, seed: int) -> np.ndarray:
    """Unit-rate arrival times of `n` requests at one of `ways` schedulers the workload's stream is dealt out to
    at random (`split_arrival_cv`), drawn exactly: a gap is the sum of K of the stream's Gamma(1/c², c²) gaps,
    K ~ Geometric(1/ways), i.e. Gamma(K/c², c²), over `ways` to keep the mean 1. Poisson thinned stays Poisson: the
    draws of `sample_requests`. (Moment matching, a Gamma of the thinned CV, put p95 TTFT 10-15% low: CV 4 over 3
    and 6 replicas of Llama-3.1-8B on H100 at 40 req/s, 174 and 88 ms against 192 and 103 ms thinned exactly.)"""
    if ways < 1:
        raise ValueError("ways must be >= 1")
    if workload.arrival_cv == 1:
        return sample_requests(replace(workload, requests_per_s=1.0), n, seed).arrival_s
    cv_squared = workload.arrival_cv ** 2
    rng = np.random.Generator(np.random.PCG64([seed, GAMMA_GAPS_STREAM]))
    stream_gaps = rng.geometric(1 / ways, n) if ways > 1 else np.ones(n)
    return np.cumsum(rng.gamma(stream_gaps / cv_squared, cv_squared) / ways)


def sample_requests(workload: Workload, n: int, seed: int, rate_scale: float = 1.0) -> Requests:
    """`n` requests drawn from the workload with a PCG64 generator seeded by `seed`.

    Draw order is fixed (arrival gaps, then input lengths, then output lengths, then a closed loop's think
    times when it has any; a non-Poisson stream's gaps from a generator of their own, `GAMMA_GAPS_STREAM`, so
    every arrival CV draws the same lengths), and a gap is a unit draw divided by the rate, so the same seed at another
    `rate_scale` gives the same lengths and arrivals scaled in time: load sweeps compare like with like (common
    random numbers); a closed loop draws the same lengths with any think time, and without one the draws it
    always drew.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ValueError("rate_scale must be positive")
    rng = np.random.Generator(np.random.PCG64(seed))
    if workload.requests_per_s is None:
        if rate_scale != 1:
            raise ValueError("rate_scale applies to open-loop workloads only")
        arrival_s = np.full(n, np.nan)
    else:
        rate = workload.requests_per_s * rate_scale
        cv_squared = workload.arrival_cv ** 2
        # Gamma(shape 1/c², scale c²) has mean 1 and variance c²; shape 1 is the exponential, drawn
        # as such so Poisson arrivals keep the same draws as before this option existed.
        unit_gaps = rng.standard_exponential(n)
        if cv_squared != 1:
            gaps_rng = np.random.Generator(np.random.PCG64([seed, GAMMA_GAPS_STREAM]))
            unit_gaps = gaps_rng.gamma(1 / cv_squared, cv_squared, n)
        arrival_s = np.cumsum(unit_gaps / rate)
    input_tokens = workload.input_tokens.sample(rng, n)
    output_tokens = workload.output_tokens.sample(rng, n)
    shared = np.minimum(workload.shared_prefix_tokens, input_tokens - 1)
    by_rate = np.minimum(input_tokens - 1, np.rint(workload.prefix_cache_hit_rate * input_tokens))
    cached = np.maximum(shared, by_rate).astype(np.int64)
    think_s = None
    if workload.think_time_s:  # a closed loop's: one per request and one per user (`Requests`)
        think_s = rng.standard_exponential(n + (workload.concurrent_users or 0)) * workload.think_time_s
    return Requests(arrival_s, input_tokens, output_tokens, cached, workload.shared_prefix_tokens, think_s)
