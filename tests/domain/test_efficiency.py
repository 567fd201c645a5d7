"""Achieved-efficiency curve and the default calibration profile.

Independent sources: the published A100 fp16 GEMM sweep quoted in SIZING.md section 5 (33% of peak
at M=64, 62% at 128, 78% at 256, 89% at 4096, 93% at 16k), and two published batch-1 decode
measurements on A100-80GB (`measured-calibration.csv`: gpt-fast Llama-3.1-8B 93.89 tok/s, LMDeploy
Llama-2-7B 100.02 tok/s) that the default bandwidth fraction and overheads were chosen from.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.hardware.efficiency import A100_FP16_GEMM_CURVE, DEFAULT_EFFICIENCY, Efficiency
from app.sizing.hardware.roofline import roofline
from app.sizing.model.flops import decode_cost
from tests.domain.models_for_tests import LLAMA_2_7B, LLAMA_3_8B
from tests.domain.test_roofline import A100_80GB_SXM


def efficiency(**changes: object) -> Efficiency:
    return dataclasses.replace(DEFAULT_EFFICIENCY, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("tokens", "fraction"), [(64, 0.33), (128, 0.62), (256, 0.78), (4096, 0.89),
                                                   (16384, 0.93)])
def test_curve_passes_through_the_published_gemm_points(tokens: int, fraction: float) -> None:
    assert DEFAULT_EFFICIENCY.compute_fraction(tokens) == pytest.approx(fraction, rel=1e-12)


def test_below_the_first_point_the_fraction_is_proportional_to_tokens() -> None:
    """A 32-row GEMM is as slow as a 64-row one: 0.33 x 32/64 = 0.165; one row: 0.33/64."""
    assert DEFAULT_EFFICIENCY.compute_fraction(32) == pytest.approx(0.165, rel=1e-12)
    assert DEFAULT_EFFICIENCY.compute_fraction(1) == pytest.approx(0.33 / 64, rel=1e-12)
    assert DEFAULT_EFFICIENCY.compute_fraction(0) == 0.0


def test_above_the_last_point_the_fraction_stays_flat() -> None:
    assert DEFAULT_EFFICIENCY.compute_fraction(65536) == pytest.approx(0.93, rel=1e-12)
    assert DEFAULT_EFFICIENCY.compute_fraction(10**7) == pytest.approx(0.93, rel=1e-12)


def test_interpolation_is_linear_in_log_tokens() -> None:
    """1024 is halfway between 256 and 4096 in log2 (8 -> 10 -> 12): 0.78 + 0.5 x (0.89 - 0.78) = 0.835.
    8192 is halfway between 4096 and 16384: 0.89 + 0.5 x 0.04 = 0.91."""
    assert DEFAULT_EFFICIENCY.compute_fraction(1024) == pytest.approx(0.835, rel=1e-12)
    assert DEFAULT_EFFICIENCY.compute_fraction(8192) == pytest.approx(0.91, rel=1e-12)


def test_log_interpolation_is_capped_so_more_rows_never_take_less_time() -> None:
    """Between 64 and 128 the log interpolation rises faster than proportionally at first:
    M=96: log2(1.5) = 0.5849625 -> 0.33 + 0.29 x 0.5849625 = 0.49964, but proportional growth from the
    left point allows only 0.33 x 96/64 = 0.495, which is used (96/0.495 = 193.9 = 64/0.33).
    M=120: log2(1.875) = 0.9068906 -> 0.33 + 0.29 x 0.9068906 = 0.5929983 < 0.33 x 120/64 = 0.61875."""
    assert DEFAULT_EFFICIENCY.compute_fraction(96) == pytest.approx(0.495, rel=1e-12)
    assert DEFAULT_EFFICIENCY.compute_fraction(120) == pytest.approx(0.5929983, rel=1e-6)


def test_compute_scale_multiplies_the_curve_and_is_clamped_at_one() -> None:
    assert efficiency(compute_scale=0.5).compute_fraction(4096) == pytest.approx(0.445, rel=1e-12)
    assert efficiency(compute_scale=2.0).compute_fraction(4096) == 1.0  # 1.78 -> at most peak


def test_fraction_accepts_arrays() -> None:
    """The hand-derived values above, through the array path (0, 32, 64, 1024; 96 and 120 capped and not)."""
    fractions = DEFAULT_EFFICIENCY.compute_fraction(np.array([[0, 32, 96], [64, 1024, 120]]))
    np.testing.assert_allclose(fractions, [[0.0, 0.165, 0.495], [0.33, 0.835, 0.5929983]], rtol=1e-6)


@given(st.one_of(st.integers(0, 10**6), st.floats(0, 1e7)))
def test_a_number_and_an_array_get_the_same_fraction(tokens: float) -> None:
    """A number takes plain float arithmetic, an array numpy's: the same operations (numpy's log may differ
    from the C library's in the last bit, hence the tolerance of a few ulps)."""
    scaled = efficiency(compute_scale=0.7)
    for curve in (DEFAULT_EFFICIENCY, scaled):
        assert curve.compute_fraction(tokens) == pytest.approx(curve.compute_fraction(np.array([tokens]))[0],
                                                               rel=1e-14, abs=0)


@given(st.integers(1, 10**6), st.integers(1, 10**6))
def test_matmul_time_never_falls_as_rows_are_added(smaller: int, larger: int) -> None:
    """Time of an M-row matmul is proportional to M / fraction(M): non-decreasing in M."""
    smaller, larger = sorted((smaller, larger))
    assert (smaller / DEFAULT_EFFICIENCY.compute_fraction(smaller)
            <= larger / DEFAULT_EFFICIENCY.compute_fraction(larger) * (1 + 1e-12))


@given(st.floats(0, 1e7))
def test_fraction_stays_within_zero_and_one(tokens: float) -> None:
    assert 0 <= DEFAULT_EFFICIENCY.compute_fraction(tokens) <= 1


def test_overhead_is_per_step_plus_per_layer_and_nothing_for_an_empty_step() -> None:
    """0.3 ms + 32 layers x 3 us = 0.396 ms."""
    assert DEFAULT_EFFICIENCY.overhead_time_s(8, 32) == pytest.approx(0.396e-3, rel=1e-12)
    assert DEFAULT_EFFICIENCY.overhead_time_s(0, 32) == 0.0
    np.testing.assert_allclose(DEFAULT_EFFICIENCY.overhead_time_s(np.array([0, 1]), 32), [0, 0.396e-3])


def test_defaults_are_the_cited_constants() -> None:
    """SIZING.md: decode bandwidth 52-80% of HBM; per-step 0.1-1 ms + a few us per layer; alpha 5-10 us."""
    assert DEFAULT_EFFICIENCY.compute_curve == A100_FP16_GEMM_CURVE
    assert 0.52 <= DEFAULT_EFFICIENCY.bandwidth_fraction <= 0.80
    assert 0.1e-3 <= DEFAULT_EFFICIENCY.per_step_overhead_s <= 1e-3
    assert 1e-6 <= DEFAULT_EFFICIENCY.per_layer_overhead_s <= 10e-6
    assert 5e-6 <= DEFAULT_EFFICIENCY.allreduce_latency_s <= 10e-6
    assert "A100 fp16 GEMM" in DEFAULT_EFFICIENCY.source and "gpt-fast" in DEFAULT_EFFICIENCY.source


def test_defaults_reproduce_gpt_fast_batch_1_decode_on_a100() -> None:
    """gpt-fast, Llama-3.1-8B bf16 (same shapes as Llama-3-8B), A100-80GB, batch 1: 93.89 tok/s, i.e.
    10.65 ms per token. By hand at ~55 cached tokens (5-token prompt, 100 generated): every matmul is
    memory-bound at 0.70 x 2.039e12 = 1.4273e12 B/s: qkv 1.6113e9 B -> 1.129 ms, out 1.0743e9 -> 0.753,
    MLP 11.2766e9 -> 7.901, LM head 1.0509e9 -> 0.736, attention's KV 8.0e6 -> 0.006 (its 29.4e6 FLOPs at
    0.6 x 312e12 take 0.0002 ms); + 0.396 ms overhead = 10.92 ms (-2.5%)."""
    predicted = roofline(decode_cost(LLAMA_3_8B, 55), A100_80GB_SXM, "bf16").expected_time_s
    assert predicted == pytest.approx(10.92e-3, rel=0.005)
    assert predicted == pytest.approx(1 / 93.89, rel=0.10)


def test_defaults_reproduce_lmdeploy_batch_1_decode_on_a100() -> None:
    """LMDeploy TurboMind, Llama-2-7B fp16, A100-80GB, batch 1, 1-token prompt, 128 generated:
    100.02 tok/s = 10.0 ms per token. Weights read per token: 2 x (6,738,415,616 - 32000 x 4096 embedding)
    = 13.2147e9 B; KV (MHA, 2 x 32 x 128 x 2 x 32 = 524,288 B/token) over ~65 positions = 0.034e9 B;
    13.249e9 / 1.4273e12 = 9.28 ms + 0.396 ms = 9.68 ms (-3.3% vs 10.0 ms)."""
    predicted = roofline(decode_cost(LLAMA_2_7B, 64, weight_dtype="fp16", kv_dtype="fp16",
                                     activation_dtype="fp16"), A100_80GB_SXM, "fp16").expected_time_s
    assert predicted == pytest.approx(1 / 100.02, rel=0.10)


@pytest.mark.parametrize("changes", [
    {"bandwidth_fraction": 0.0}, {"bandwidth_fraction": 1.2}, {"compute_curve": ()},
    {"compute_curve": ((128, 0.5), (64, 0.3))}, {"compute_curve": ((64, 1.5),)},
    {"compute_curve": ((64, 0.1), (128, 0.5))},  # fraction/M rises: 128 rows would run faster than 64
    {"compute_scale": 0.0}, {"per_step_overhead_s": -1e-3}, {"allreduce_latency_s": -1.0},
])
def test_invalid_profiles_are_rejected(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        efficiency(**changes)


def test_profile_is_a_value() -> None:
    assert efficiency() == DEFAULT_EFFICIENCY
    assert hash(efficiency()) == hash(DEFAULT_EFFICIENCY)
