"""Workload: length distributions (fits worked by hand), arrivals, prefix-cache accounting."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.serving.workload import (
    Fixed,
    Histogram,
    LogNormal,
    Requests,
    Workload,
    dealt_out_arrivals,
    sample_requests,
    split_arrival_cv,
    ways_to_poisson_like,
)

Z90 = 1.2815515655446004  # standard normal quantile at 0.90 (tables: 1.2816)
Z99 = 2.3263478740408408  # at 0.99 (tables: 2.3263)


def rng(seed=0):
    return np.random.Generator(np.random.PCG64(seed))


# Length distributions ---------------------------------------------------------------------------


def test_fixed_is_one_length():
    d = Fixed(512)
    assert d.mean == 512
    assert d.quantile(0.99) == 512
    assert np.array_equal(d.sample(rng(), 4), [512, 512, 512, 512])
    with pytest.raises(ValueError):
        Fixed(0)


def test_lognormal_from_median_and_p90():
    """p50 = 1000, p90 = 2000: mu = ln 1000 = 6.907755; sigma = ln 2 / z(0.9) = 0.693147/1.281552
    = 0.540866; mean = 1000·exp(sigma²/2) = 1000·exp(0.146268) = 1157.506."""
    d = LogNormal(p50=1000, p90=2000)
    assert d.mu == pytest.approx(6.907755, abs=1e-6)
    assert d.sigma == pytest.approx(0.540866, abs=1e-6)
    assert d.mean == pytest.approx(1157.506, abs=1e-3)
    assert d.quantile(0.5) == pytest.approx(1000)
    assert d.quantile(0.9) == pytest.approx(2000)


def test_lognormal_from_mean_and_median():
    """mean/median = exp(sigma²/2): mean 1200, p50 1000 -> sigma = sqrt(2·ln 1.2) = sqrt(0.364643)
    = 0.603857; p90 = 1000·exp(1.281552·0.603857) = 1000·exp(0.773874) = 2168.2."""
    d = LogNormal(mean=1200, p50=1000)
    assert d.sigma == pytest.approx(0.603857, abs=1e-6)
    assert d.mean == 1200
    assert d.quantile(0.9) == pytest.approx(2168.2, abs=0.1)


def test_lognormal_from_two_tail_percentiles():
    """p90 2000, p99 4000: sigma = ln 2/(z99 − z90) = 0.693147/1.044796 = 0.663428;
    mu = ln 2000 − z90·sigma = 7.600902 − 0.850217 = 6.750685; median = exp(mu) = 854.64."""
    d = LogNormal(p90=2000, p99=4000)
    assert d.sigma == pytest.approx(0.663428, abs=1e-6)
    assert d.quantile(0.5) == pytest.approx(854.64, abs=0.01)


def test_lognormal_from_mean_and_p99():
    """mean 1000, p99 5000: sigma = z − sqrt(z² − 2·ln 5) = 2.326348 − sqrt(5.411894 − 3.218876)
    = 2.326348 − 1.480885 = 0.845463; mu = ln 1000 − sigma²/2 = 6.907755 − 0.357404 = 6.550351."""
    d = LogNormal(mean=1000, p99=5000)
    assert d.sigma == pytest.approx(0.845463, abs=1e-6)
    assert d.mu == pytest.approx(6.550351, abs=1e-6)
    assert d.quantile(0.99) == pytest.approx(5000)


def test_lognormal_three_percentiles_least_squares():
    """p50 1000, p90 2000, p99 4000: mu = ln 1000; sigma minimises the squared log errors of the
    tails: (z90·ln 2 + z99·ln 4)/(z90² + z99²) = (0.888304 + 3.225003)/(1.642374 + 5.411894)
    = 4.113307/7.054268 = 0.583095. The fit gives p90 = 1000·exp(0.747266) = 2111.2 (5.6% above
    the 2000 given, inside the 10% tolerance)."""
    d = LogNormal(p50=1000, p90=2000, p99=4000)
    assert d.sigma == pytest.approx(0.583095, abs=1e-6)
    assert d.quantile(0.9) == pytest.approx(2111.2, abs=0.1)


@given(st.floats(1, 1e5), st.floats(0.01, 2.5))
def test_lognormal_fits_recover_the_distribution_they_describe(median, sigma):
    """Statistics of a known lognormal (median m, spread sigma) fit back to it, by every rule:
    pq = m·exp(z(q)·sigma) and mean = m·exp(sigma²/2)."""
    p90, p99 = median * math.exp(Z90 * sigma), median * math.exp(Z99 * sigma)
    mean = median * math.exp(sigma * sigma / 2)
    fits = [LogNormal(p50=median, p90=p90), LogNormal(p50=median, p99=p99),
            LogNormal(p50=median, p90=p90, p99=p99), LogNormal(p90=p90, p99=p99),
            LogNormal(mean=mean, p50=median), LogNormal(mean=mean, p50=median, p90=p90, p99=p99)]
    if sigma < Z99:  # mean + tail picks the smaller root z − sqrt(...) = sigma only when sigma < z
        fits.append(LogNormal(mean=mean, p99=p99))
    for d in fits:
        assert d.sigma == pytest.approx(sigma, rel=1e-6, abs=1e-9)
        assert d.quantile(0.5) == pytest.approx(median, rel=1e-6)
        assert d.mean == pytest.approx(mean, rel=1e-6)


@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0.01, 100)), min_size=1, max_size=8),
       st.floats(0, 1), st.floats(0, 1))
def test_histogram_quantiles_are_monotone_bin_lengths(bins, q1, q2):
    d = Histogram(tuple(bins))
    low, high = sorted((q1, q2))
    assert d.quantile(low) <= d.quantile(high)
    assert d.quantile(high) in {t for t, _ in bins}
    lengths = [t for t, _ in bins]
    assert min(lengths) * (1 - 1e-12) <= d.mean <= max(lengths) * (1 + 1e-12)  # a weighted average


def test_lognormal_mean_alone_is_rejected_with_the_reason():
    with pytest.raises(ValueError, match="mean alone"):
        LogNormal(mean=1000)


@pytest.mark.parametrize("kwargs, message", [
    # fit from p50/p90 has mean 1157.5, 45% above the 800 given
    ({"mean": 800, "p50": 1000, "p90": 2000}, "does not fit"),
    ({"mean": 900, "p50": 1000}, "never below its median"),
    ({"p50": 1000, "p90": 900}, "above p50"),
    ({"p90": 2000, "p99": 1500}, "above p90"),
    # p90/mean can be at most exp(z90²/2) = exp(0.821187) = 2.273 for any lognormal
    ({"mean": 1000, "p90": 3000}, "no lognormal"),
    ({"p50": -5, "p90": 10}, "positive"),
])
def test_lognormal_rejects_numbers_no_lognormal_has(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LogNormal(**kwargs)


def test_lognormal_samples_match_the_fit():
    """200,000 draws of p50 1000 / p90 2000 (mean 1157.5, sd = mean·sqrt(exp(sigma²) − 1)
    = 1157.5·0.5822 = 674): the sample mean's standard error is 674/sqrt(200000) = 1.5 tokens,
    so 1% (11.6 tokens) is over 7 standard errors; the sample median's is about 1.3 tokens."""
    d = LogNormal(p50=1000, p90=2000)
    draws = d.sample(rng(7), 200_000)
    assert draws.dtype.kind == "i"
    assert draws.mean() == pytest.approx(1157.5, rel=0.01)
    assert np.median(draws) == pytest.approx(1000, rel=0.01)


def test_lognormal_samples_are_clipped_to_whole_tokens_in_range():
    d = LogNormal(p50=5, p90=1000, max_tokens=50)  # sigma = ln 200/1.2816 = 4.13: wild both ways
    draws = d.sample(rng(1), 10_000)
    assert draws.min() == 1 and draws.max() == 50
    assert d.quantile(0.999) == 50


def test_histogram_mean_quantiles_and_frequencies():
    """Bins 100 (weight 1) and 200 (weight 3): mean = (100 + 600)/4 = 175; quantile 0.25 is 100 and
    anything above is 200. In 40,000 draws the share of 200 has sd sqrt(0.75·0.25/40000) = 0.0022."""
    d = Histogram(((200, 3), (100, 1)))
    assert d.mean == 175
    assert d.quantile(0.25) == 100
    assert d.quantile(0.26) == 200
    draws = d.sample(rng(3), 40_000)
    assert set(np.unique(draws)) == {100, 200}
    assert np.mean(draws == 200) == pytest.approx(0.75, abs=0.01)


@pytest.mark.parametrize("bins", [(), ((0, 1.0),), ((10, -1.0),), ((10, 0.0),)])
def test_histogram_rejects_bad_bins(bins):
    with pytest.raises(ValueError):
        Histogram(bins)


# Workload ---------------------------------------------------------------------------------------


def test_workload_needs_exactly_one_load_kind():
    with pytest.raises(ValueError, match="exactly one"):
        Workload(Fixed(100), Fixed(10))
    with pytest.raises(ValueError, match="exactly one"):
        Workload(Fixed(100), Fixed(10), requests_per_s=1, concurrent_users=4)
    with pytest.raises(ValueError, match="open-loop"):
        Workload(Fixed(100), Fixed(10), concurrent_users=4, arrival_cv=2)
    with pytest.raises(ValueError, match="arrival_cv"):
        Workload(Fixed(100), Fixed(10), requests_per_s=1, arrival_cv=0)
    with pytest.raises(ValueError):
        Workload(Fixed(100), Fixed(10), requests_per_s=1, prefix_cache_hit_rate=1.5)
    assert Workload(Fixed(100), Fixed(10), concurrent_users=4).is_closed_loop


def test_poisson_arrivals_have_the_requested_rate():
    """Rate 4/s: gaps are exponential with mean 0.25 s and sd 0.25 s; over 20,000 gaps the mean has
    standard error 0.25/sqrt(20000) = 0.0018 s (0.7%), so 3% is over 4 standard errors.
    Exponential gaps have squared coefficient of variation 1."""
    requests = sample_requests(Workload(Fixed(100), Fixed(10), requests_per_s=4), 20_000, seed=11)
    gaps = np.diff(requests.arrival_s, prepend=0.0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1.0, rel=0.05)


def test_arrival_cv_keeps_the_rate_and_clumps_arrivals():
    """arrival_cv 2: Gamma gaps of shape 1/2² = 1/4 and mean 1/rate, so the squared coefficient of
    variation is 1/shape = 4. Gamma(1/4) has excess kurtosis 6·4 = 24, so over 100,000 gaps the
    sample variance has relative sd sqrt(26/100000) = 1.6%: 8% is 5 standard deviations."""
    w = Workload(Fixed(100), Fixed(10), requests_per_s=4, arrival_cv=2)
    gaps = np.diff(sample_requests(w, 100_000, seed=5).arrival_s, prepend=0.0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(4.0, rel=0.08)


def test_the_ways_a_stream_needs_to_be_nearly_poisson_invert_the_split():
    """CV² of a share is 1 + (c² - 1)/N <= 1 + t once N >= (c² - 1)/t: CV 4 within 0.1, (16 - 1)/0.1 = 150
    schedulers, where the share's CV² is 1 + 15/150 = 1.1 and at 149 1 + 15/149 = 1.1007; CV 2 within 0.1:
    3/0.1 = 30; a stream no more bunched than Poisson needs one."""
    assert ways_to_poisson_like(4.0, 0.1) == 150
    assert split_arrival_cv(4.0, 150) ** 2 == pytest.approx(1.1, rel=1e-12)
    assert split_arrival_cv(4.0, 149) ** 2 > 1.1
    assert ways_to_poisson_like(2.0, 0.1) == 30
    assert ways_to_poisson_like(1.0, 0.1) == ways_to_poisson_like(0.5, 0.1) == 1
    with pytest.raises(ValueError, match="tolerance"):
        ways_to_poisson_like(2.0, 0.0)


def test_a_stream_dealt_out_at_random_thins_toward_poisson():
    """Each of N schedulers takes a request with p = 1/N: its gap is a Geometric(p) sum of the stream's gaps,
    of mean 1/p and variance (1/p)·c² + (1 - p)/p² (gaps of mean 1), so CV² = p·c² + 1 - p = 1 + (c² - 1)/N.
    CV 4 over 28: 1 + 15/28 = 1.5357, CV 1.2392; over 1, 4 itself; Poisson stays Poisson; CV 0.5 over 4:
    1 - 0.75/4 = 0.8125, CV 0.9014. Checked against a thinned stream: 200,000 gaps of CV 2 dealt out over 4
    at random leave about 50,000 of CV² 1 + 3/4 = 1.75 (within 5%)."""
    assert split_arrival_cv(4.0, 28) == pytest.approx(math.sqrt(1 + 15 / 28), rel=1e-12)
    assert split_arrival_cv(4.0, 28) == pytest.approx(1.2392, abs=1e-4)
    assert split_arrival_cv(4.0, 1) == pytest.approx(4.0, rel=1e-12)
    assert split_arrival_cv(1.0, 50) == 1.0
    assert split_arrival_cv(0.5, 4) == pytest.approx(math.sqrt(0.8125), rel=1e-12)
    with pytest.raises(ValueError, match="ways"):
        split_arrival_cv(2.0, 0)
    stream = sample_requests(Workload(Fixed(100), Fixed(10), requests_per_s=1, arrival_cv=2), 200_000, seed=3)
    taken = stream.arrival_s[np.random.default_rng(4).integers(0, 4, stream.arrival_s.size) == 0]
    gaps = np.diff(taken)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1.75, rel=0.05)


def test_a_share_of_a_stream_is_drawn_as_the_stream_thinned():
    """`dealt_out_arrivals`: a gap is a Geometric(1/ways) number of the stream's Gamma gaps, summed, over `ways`
    (unit rate). Against a CV 2 stream of 200,000 gaps thinned over 4 at random by hand: the same mean gap (1 at
    unit rate, within 2%), CV^2 1 + 3/4 = 1.75 (within 5%), and the same tail (the 99th percentile gap within 5%:
    a Gamma of CV^2 1.75, moment matching, has another shape). Poisson gives sample_requests' arrivals."""
    bursty = Workload(Fixed(100), Fixed(10), requests_per_s=1, arrival_cv=2)
    stream = sample_requests(bursty, 200_000, seed=3).arrival_s
    by_hand = np.diff(stream[np.random.default_rng(4).integers(0, 4, stream.size) == 0]) / 4
    drawn = np.diff(dealt_out_arrivals(bursty, 4, 50_000, seed=5))
    assert drawn.mean() == pytest.approx(1.0, rel=0.02)
    assert drawn.var() / drawn.mean() ** 2 == pytest.approx(1.75, rel=0.05)
    assert np.percentile(drawn, 99) == pytest.approx(np.percentile(by_hand, 99), rel=0.05)
    poisson = dataclasses.replace(bursty, arrival_cv=1.0)
    assert np.array_equal(dealt_out_arrivals(poisson, 4, 100, seed=5), sample_requests(poisson, 100, seed=5).arrival_s)
    with pytest.raises(ValueError, match="ways"):
        dealt_out_arrivals(bursty, 0, 10, seed=5)


def test_every_arrival_cv_draws_the_same_lengths():
    """A non-Poisson stream's gaps come from a generator of their own: the lengths are those of the Poisson draw
    of the same seed, so a plan's runs at different CVs (replica counts) compare like with like."""
    lengths = Workload(LogNormal(p50=500, p90=1500), LogNormal(p50=100, p90=300), requests_per_s=2)
    poisson = sample_requests(lengths, 400, seed=9)
    for cv in (0.5, 2.0, 4.0):
        bursty = sample_requests(dataclasses.replace(lengths, arrival_cv=cv), 400, seed=9)
        assert np.array_equal(bursty.input_tokens, poisson.input_tokens)
        assert np.array_equal(bursty.output_tokens, poisson.output_tokens)
        assert not np.array_equal(bursty.arrival_s, poisson.arrival_s)


def test_rate_scale_scales_arrivals_and_keeps_lengths():
    w = Workload(LogNormal(p50=500, p90=1500), LogNormal(p50=100, p90=300), requests_per_s=2)
    base = sample_requests(w, 500, seed=9)
    faster = sample_requests(w, 500, seed=9, rate_scale=2.0)
    assert np.allclose(faster.arrival_s, base.arrival_s / 2, rtol=1e-12)
    assert np.array_equal(faster.input_tokens, base.input_tokens)
    assert np.array_equal(faster.output_tokens, base.output_tokens)


def test_same_seed_same_requests_other_seed_other_requests():
    w = Workload(LogNormal(p50=500, p90=1500), Histogram(((50, 1), (400, 1))), requests_per_s=3)
    a, b, c = (sample_requests(w, 300, seed=s) for s in (1, 1, 2))
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.input_tokens, c.input_tokens)


def test_closed_loop_requests_have_no_arrival_times():
    requests = sample_requests(Workload(Fixed(100), Fixed(10), concurrent_users=8), 20, seed=0)
    assert np.isnan(requests.arrival_s).all()
    with pytest.raises(ValueError, match="open-loop"):
        sample_requests(Workload(Fixed(100), Fixed(10), concurrent_users=8), 20, seed=0, rate_scale=2)


def test_a_closed_loop_s_think_times_are_exponential_and_leave_the_lengths_alone():
    """Think time 5 s: exponential pauses of mean 5 s and sd 5 s; over 20,000 the mean has standard error
    5 / sqrt(20000) = 0.035 s (0.7%), so 3% is over 4 standard errors, and an exponential's squared coefficient
    of variation is 1. One per request and one per user (users may send again before the last request arrives);
    drawn after the lengths, so the lengths are those of the same users without think time, who draw no pauses
    at all."""
    thinking = sample_requests(Workload(LogNormal(p50=500, p90=1500), Fixed(10), concurrent_users=8,
                                        think_time_s=5.0), 20_000, seed=4)
    at_once = sample_requests(Workload(LogNormal(p50=500, p90=1500), Fixed(10), concurrent_users=8), 20_000, seed=4)
    assert thinking.think_s.mean() == pytest.approx(5.0, rel=0.03)
    assert thinking.think_s.var() / thinking.think_s.mean() ** 2 == pytest.approx(1.0, rel=0.08)
    assert np.array_equal(thinking.input_tokens, at_once.input_tokens)
    assert len(thinking.think_s) == 20_000 + 8
    assert at_once.think_s is None and np.isnan(thinking.arrival_s).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"requests_per_s": 1.0, "think_time_s": 1.0}, "closed loop"),
    ({"concurrent_users": 4, "think_time_s": -1.0}, "think_time_s"),
    ({"concurrent_users": 4, "think_time_s": math.inf}, "think_time_s"),
    ({"concurrent_users": 4, "think_time_s": 86_401.0}, "think_time_s"),
])
def test_think_time_is_a_closed_loop_s_finite_pause(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Workload(Fixed(100), Fixed(10), **kwargs)


def test_think_times_belong_to_a_closed_loop_s_requests():
    with pytest.raises(ValueError, match="think_s"):
        Requests([0.0], [10], [5], [0], think_s=[1.0])  # arrivals are set: an open loop
    with pytest.raises(ValueError, match="think_s"):
        Requests([np.nan], [10], [5], [0], think_s=[-1.0])
    with pytest.raises(ValueError, match="at least one per request"):
        Requests([np.nan] * 2, [10] * 2, [5] * 2, [0] * 2, think_s=[1.0])
    closed = Requests([np.nan] * 4, [10] * 4, [5] * 4, [0] * 4, think_s=[1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        closed.think_s[0] = 0.0  # read-only
    assert closed.subset(np.array([2, 3]), np.array([0.5, 0.7])).think_s is None  # arrivals set: no pauses


@pytest.mark.parametrize("hit_rate, shared, prompt, cached", [
    (0.5, 0, 1000, 500),  # half of each prompt found in the cache
    (0.5, 300, 1000, 500),  # the shared prefix is inside the 50%: max(300, 500)
    (0.2, 300, 1000, 300),  # the shared prefix is always a hit: max(300, 200)
    (0.0, 300, 100, 99),  # prompt shorter than the prefix: all but the last token
    (1.0, 0, 1000, 999),  # the last prompt token is always computed
])
def test_cached_prefix_tokens_per_request(hit_rate, shared, prompt, cached):
    w = Workload(Fixed(prompt), Fixed(10), requests_per_s=1, prefix_cache_hit_rate=hit_rate,
                 shared_prefix_tokens=shared)
    requests = sample_requests(w, 3, seed=0)
    assert np.array_equal(requests.cached_prefix_tokens, [cached] * 3)
    assert requests.shared_prefix_tokens == shared


def test_requests_are_validated_and_read_only():
    with pytest.raises(ValueError, match="cached_prefix_tokens"):
        Requests([0.0], [10], [5], [10])
    with pytest.raises(ValueError, match="non-decreasing"):
        Requests([1.0, 0.5], [10, 10], [5, 5], [0, 0])
    with pytest.raises(ValueError, match="same length"):
        Requests([0.0, 1.0], [10], [5], [0])
    requests = Requests([0.0], [10], [5], [0])
    with pytest.raises(ValueError):
        requests.input_tokens[0] = 3
    assert len(requests) == 1
    assert math.isclose(requests.arrival_s[0], 0.0)


def test_a_subset_of_requests_takes_their_lengths_at_new_arrivals():
    requests = Requests([np.nan] * 3, [10, 20, 30], [5, 6, 7], [0, 4, 9], shared_prefix_tokens=4)
    subset = requests.subset(np.array([2, 0]), np.array([1.5, 2.5]))
    assert subset.arrival_s.tolist() == [1.5, 2.5]
    assert subset.input_tokens.tolist() == [30, 10] and subset.output_tokens.tolist() == [7, 5]
    assert subset.cached_prefix_tokens.tolist() == [9, 0] and subset.shared_prefix_tokens == 4
    with pytest.raises(ValueError):
        subset.input_tokens[0] = 3
    for arrivals in ([2.5, 1.5], [-1.0, 0.0], [np.nan, 1.0], [1.0, np.nan], [1.0]):
        with pytest.raises(ValueError, match="non-decreasing"):
            requests.subset(np.array([2, 0]), np.array(arrivals))
