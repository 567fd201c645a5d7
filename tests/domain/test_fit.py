"""Fitting calibration profiles: the search, the objective, the profile lookup, and recovery of known
efficiencies from measurements made with them.

Known answers: a toy latency model written out here (time = bytes / (bandwidth x fraction) + overhead),
whose synthetic measurements are worked by hand from chosen parameters, and the product's own
predictions made with a chosen efficiency (the fit must find that efficiency again).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest

from app.sizing.calibration.fit import (
    ANY,
    FAMILY,
    FAMILY_PRECISION,
    FITTED_PARAMETERS,
    GLOBAL,
    MIN_LATENCY_ROWS,
    MIN_ROWS_PER_ENTRY,
    CalibrationProfile,
    ParameterBounds,
    ProfileEntry,
    abs_log_error,
    abs_pct_error,
    fit_efficiency,
    fit_profile,
    fit_prompt_step_overhead,
    fitted_sources,
    mark_pinned,
    mean_abs_log_error,
    parameter_value,
    parameters_at_bounds,
    same_fits,
    single_entry_profile,
    spread,
    with_parameters,
)
from app.sizing.calibration.holdout import leave_one_group_out
from app.sizing.calibration.predict import prepare
from app.sizing.calibration.search import golden_section, nelder_mead
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from tests.domain.models_for_tests import LLAMA_3_8B, QWEN2_5_0_5B
from tests.domain.test_predict import AMPERE, HOPPER, measurement

BANDWIDTH = 3.35e12  # H100 SXM HBM3, bytes/s


@dataclass(frozen=True)
class ToyTarget:
    """A decode step of `weight_bytes` read at bandwidth x fraction, plus the per-step overhead."""

    weight_bytes: float
    measured: float
    source_id: str = "toy"
    family: str = "hopper"
    compute_dtype: str = "bf16"
    vendor: str = ""
    pays_host_work: bool = False
    pays_overlapped_host_work: bool = False
    pays_prefill_overhead: bool = False
    pays_pcie_link: bool = False
    measures_steps: bool = True
    measures_decode_worker_step: bool = False
    measures_latency: bool = True

    def predict(self, efficiency: Efficiency) -> float:
        return self.weight_bytes / (BANDWIDTH * efficiency.bandwidth_fraction) + efficiency.per_step_overhead_s


def toy_targets() -> list[ToyTarget]:
    """Measurements made with bandwidth fraction 0.6 and 0.5 ms per step, worked by hand:
    16.06e9 B: 16.06e9 / (3.35e12 x 0.6) = 7.98905 ms, + 0.5 = 8.48905 ms;
    2.01e9 B: 2.01e9 / 2.01e12 = 1.0 ms, + 0.5 = 1.5 ms;
    140e9 B: 140e9 / 2.01e12 = 69.65174 ms, + 0.5 = 70.15174 ms."""
    return [ToyTarget(16.06e9, 8.48905e-3), ToyTarget(2.01e9, 1.5e-3), ToyTarget(140e9, 70.15174e-3)]


@dataclass(frozen=True)
class MoeTtft(ToyTarget):
    """The TTFT of a light closed loop of an MoE model: the toy's step plus 58 MoE layers' prompt-step cost
    (prefill_moe_layer_overhead_s, as DeepSeek-V3's 58 MoE layers pay it). It measures only that cost."""

    pays_prefill_overhead: bool = True
    measures_steps: bool = False
    measures_decode_worker_step: bool = False

    def predict(self, efficiency: Efficiency) -> float:
        return super().predict(efficiency) + 58 * efficiency.prefill_moe_layer_overhead_s


def moe_ttfts() -> list[MoeTtft]:
    """toy_targets' steps (bandwidth 0.6, 0.5 ms) plus 58 x 2 ms = 116 ms of MoE prompt steps:
    8.48905 + 116 = 124.48905 ms, 1.5 + 116 = 117.5 ms, 70.15174 + 116 = 186.15174 ms."""
    return [MoeTtft(16.06e9, 124.48905e-3), MoeTtft(2.01e9, 117.5e-3), MoeTtft(140e9, 186.15174e-3)]


# Errors -----------------------------------------------------------------------------------------

def test_abs_pct_error_is_relative_to_the_measurement() -> None:
    """110 against 100 is 10%; 90 against 100 is 10%; 50 against 200 is 75%."""
    assert abs_pct_error(110.0, 100.0) == pytest.approx(10.0)
    assert abs_pct_error(90.0, 100.0) == pytest.approx(10.0)
    assert abs_pct_error(50.0, 200.0) == pytest.approx(75.0)


def test_abs_log_error_is_symmetric_and_penalizes_non_answers() -> None:
    """|ln 2| = 0.693147 for twice or half the measurement; a non-positive or infinite prediction costs
    ln 1000 = 6.907755 (a 1000x miss)."""
    assert abs_log_error(200.0, 100.0) == pytest.approx(0.693147, abs=1e-6)
    assert abs_log_error(50.0, 100.0) == pytest.approx(0.693147, abs=1e-6)
    for bad in (0.0, -1.0, math.inf, math.nan):
        assert abs_log_error(bad, 100.0) == pytest.approx(6.907755, abs=1e-6)


# The search -------------------------------------------------------------------------------------

def test_nelder_mead_finds_a_separable_minimum() -> None:
    """f = |x0 − 0.6| + 100·|x1 − 0.002| on [0.3, 0.95] x [0, 0.005]: minimum 0 at (0.6, 0.002)."""
    result = nelder_mead(lambda x: abs(x[0] - 0.6) + 100 * abs(x[1] - 0.002), [0.7, 0.0],
                         [0.3, 0.0], [0.95, 0.005], max_evaluations=300)
    assert result.x[0] == pytest.approx(0.6, abs=0.002)
    assert result.x[1] == pytest.approx(0.002, abs=0.00002)
    assert result.evaluations <= 300


def test_nelder_mead_follows_a_valley_where_parameters_trade_off() -> None:
    """f = |x0 + x1 − 1| + 0.01·|x0 − x1| on [0, 1]²: a narrow valley along x0 + x1 = 1 with its minimum
    at (0.5, 0.5), where a one-coordinate-at-a-time search stalls at the first valley point it meets."""
    result = nelder_mead(lambda x: abs(x[0] + x[1] - 1) + 0.01 * abs(x[0] - x[1]), [0.9, 0.05],
                         [0.0, 0.0], [1.0, 1.0], max_evaluations=400)
    assert result.x[0] == pytest.approx(0.5, abs=0.01)
    assert result.x[1] == pytest.approx(0.5, abs=0.01)


def test_nelder_mead_never_leaves_the_bounds() -> None:
    """The objective wants x = 2 but the box stops at 1: the answer is the bound."""
    result = nelder_mead(lambda x: (x[0] - 2.0) ** 2, [0.5], [0.0], [1.0])
    assert result.x[0] == pytest.approx(1.0)
    assert result.value == pytest.approx(1.0)


def test_nelder_mead_keeps_the_start_on_a_flat_objective() -> None:
    result = nelder_mead(lambda x: 1.0, [0.4, 0.7], [0.0, 0.0], [1.0, 1.0])
    assert list(result.x) == pytest.approx([0.4, 0.7])


# Fitting ----------------------------------------------------------------------------------------

def test_fit_recovers_bandwidth_and_overhead_from_hand_made_measurements() -> None:
    """Three decode steps measured with bandwidth fraction 0.6 and 0.5 ms/step (see toy_targets): the
    fit of those two parameters, starting from the builtin 0.70 and 0.3 ms, finds 0.6 and 0.5 ms again;
    the parameters it was not asked to fit keep their start values."""
    two = [bound for bound in FITTED_PARAMETERS if bound.name in ("bandwidth_fraction", "per_step_overhead_s")]
    fitted, error = fit_efficiency(toy_targets(), DEFAULT_EFFICIENCY, two)
    assert fitted.bandwidth_fraction == pytest.approx(0.6, abs=0.002)
    assert fitted.per_step_overhead_s == pytest.approx(0.5e-3, abs=0.01e-3)
    assert error < 0.002
    for name in ("compute_scale", "per_layer_overhead_s", "allreduce_latency_s", "compute_curve"):
        assert getattr(fitted, name) == getattr(DEFAULT_EFFICIENCY, name)


def test_fitted_parameters_stay_inside_their_bounds() -> None:
    """Measurements 10x slower than any bounded bandwidth explains: the fit stops at the bounds
    (bandwidth 0.42, the low end of its cited range) instead of leaving physics."""
    slow = [dataclasses.replace(target, measured=target.measured * 10) for target in toy_targets()]
    fitted, _ = fit_efficiency(slow, DEFAULT_EFFICIENCY)
    bounds = {bound.name: bound for bound in FITTED_PARAMETERS}
    for name, bound in bounds.items():
        assert bound.low <= parameter_value(fitted, name) <= bound.high
    assert fitted.bandwidth_fraction == pytest.approx(0.42)


def test_an_entry_fits_the_fixed_costs_of_a_step_only_on_enough_latency_rows() -> None:
    """Hopper's 12 rows are latencies made with bandwidth 0.6 and 0.5 ms per step (toy_targets x 4); blackwell's
    12 rows made with bandwidth 0.8 and 2 ms per step, of which only 11 are latencies (MIN_LATENCY_ROWS is 12):
    2.01e9 / (3.35e12 x 0.8) = 0.75 ms + 2 = 2.75 ms; 16.06e9 / 2.68e12 = 5.99254 + 2 = 7.99254 ms;
    140e9 / 2.68e12 = 52.23881 + 2 = 54.23881 ms. Hopper's entry fits its per-step overhead back; blackwell's
    keeps the global entry's exactly (too few latencies to measure it) and fits only its bandwidth."""
    assert MIN_LATENCY_ROWS == MIN_ROWS_PER_ENTRY == 12
    hopper = toy_targets() * 4
    made = [(2.01e9, 2.75e-3), (16.06e9, 7.99254e-3), (140e9, 54.23881e-3)] * 4
    blackwell = [ToyTarget(size, value, family="blackwell", measures_latency=index < 11)
                 for index, (size, value) in enumerate(made)]
    fit = fit_profile(hopper + blackwell, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=True,
                      max_evaluations=300, describe=lambda family, dtype, rows: "fit")
    global_entry = fit.profile.efficiency_for(ANY, ANY)
    hopper_fit, blackwell_fit = (fit.profile.efficiency_for(family, "bf16") for family in ("hopper", "blackwell"))
    assert hopper_fit.per_step_overhead_s == pytest.approx(0.5e-3, rel=0.05)
    assert blackwell_fit.per_step_overhead_s == global_entry.per_step_overhead_s
    assert blackwell_fit.per_layer_overhead_s == global_entry.per_layer_overhead_s
    assert blackwell_fit.bandwidth_fraction != global_entry.bandwidth_fraction


@dataclass(frozen=True, eq=False)
class ProductTarget:
    """A measurement 'measured' by the product itself with a known efficiency."""

    prepared: object
    measured: float
    source_id: str
    family: str
    compute_dtype: str
    vendor: str = ""
    pays_host_work: bool = False  # gpt-fast: no engine host loop between steps
    pays_overlapped_host_work: bool = False
    pays_prefill_overhead: bool = False
    pays_pcie_link: bool = False
    measures_steps: bool = True
    measures_decode_worker_step: bool = False
    measures_latency: bool = True

    def predict(self, efficiency: Efficiency) -> float:
        return self.prepared.predict(efficiency)  # type: ignore[attr-defined]


TRUE_EFFICIENCY = dataclasses.replace(
    DEFAULT_EFFICIENCY, bandwidth_fraction=0.62, compute_scale=0.8, per_step_overhead_s=0.8e-3,
    per_layer_overhead_s=10e-6, source="the truth")


def product_targets(efficiency: Efficiency = TRUE_EFFICIENCY) -> list[ProductTarget]:
    """Decode (memory-bound) and prefill (compute-bound) latencies of two models 16x apart in size (so
    bandwidth and overheads separate) at several lengths on one H100, measured with `efficiency`:
    2 x 4 x 2 = 16 rows, enough for an entry of their own. The engine is vLLM's V0 (0.5.4), which adds its
    per-step overhead to the GPU's time (one that overlaps it would hide it behind the larger model's steps)."""
    targets = []
    for model in (LLAMA_3_8B, QWEN2_5_0_5B):
        for index, isl in enumerate((128, 512, 2048, 4096)):
            for metric, osl in (("tpot_ms", 64), ("ttft_ms", 1)):
                prepared = prepare(measurement(metric=metric, isl=isl, osl=osl, engine="vllm", engine_version="0.5.4"),
                                   model, HOPPER)
                targets.append(ProductTarget(prepared, prepared.predict(efficiency), f"source-{index % 3}",
                                             "hopper", "bf16"))
    return targets


def test_fit_recovers_the_efficiency_the_measurements_were_made_with() -> None:
    """Rows predicted with bandwidth 0.62, compute scale 0.8, 0.8 ms/step and 10 us/layer: starting
    from the builtin constants, the fit predicts them again to within 1% (median), with bandwidth and
    compute scale recovered to within 0.02 and the overhead of a Llama-3-8B step, 0.8 + 32 x 0.01 =
    1.12 ms, to within 10% (per-step and per-layer overheads nearly trade off against each other)."""
    targets = product_targets()
    fitted, _ = fit_efficiency(targets, DEFAULT_EFFICIENCY)
    errors = [abs_pct_error(t.predict(fitted), t.measured) for t in targets]
    assert float(np.median(errors)) < 1.0
    assert fitted.bandwidth_fraction == pytest.approx(0.62, abs=0.02)
    assert fitted.compute_scale == pytest.approx(0.8, abs=0.02)
    per_step = fitted.per_step_overhead_s + 32 * fitted.per_layer_overhead_s
    assert per_step == pytest.approx(1.12e-3, rel=0.1)


def test_fit_profile_fits_each_family_and_precision_with_enough_rows_and_keeps_the_rest() -> None:
    """16 hopper/bf16 rows (>= MIN_ROWS_PER_ENTRY): a hopper family entry, and the hopper/bf16 entry
    with the same fit (the same rows); the base profile's other entries come through unchanged; with
    fit_global the global entry is refitted too."""
    assert len(product_targets()) >= MIN_ROWS_PER_ENTRY
    ampere = ProfileEntry("ampere", ANY, dataclasses.replace(DEFAULT_EFFICIENCY, bandwidth_fraction=0.5))
    base = CalibrationProfile("base", (ProfileEntry(ANY, ANY, DEFAULT_EFFICIENCY), ampere))
    fit = fit_profile(product_targets(), base, name="mine", fit_global=False, max_evaluations=60,
                      describe=lambda family, dtype, rows: f"{family}/{dtype} on {len(rows)} rows")
    profile = fit.profile
    assert profile.name == "mine"
    assert profile.entry_for("ampere", "fp16") == ampere
    assert profile.entry_for("cdna3", "fp8").efficiency == DEFAULT_EFFICIENCY  # global kept
    hopper, family = profile.entry_for("hopper", "bf16"), profile.entry_for("hopper", "fp8")
    assert (hopper.family, hopper.compute_dtype, hopper.rows) == ("hopper", "bf16", 16)
    assert (family.family, family.compute_dtype, family.rows) == ("hopper", ANY, 16)
    assert hopper.efficiency.source == "hopper/bf16 on 16 rows"
    assert dataclasses.replace(hopper.efficiency, source="") == dataclasses.replace(family.efficiency, source="")
    assert [(e.family, e.compute_dtype) for e in fit.entries] == [("hopper", ANY), ("hopper", "bf16")]
    assert fit.entries[0].mean_abs_log_error_after < fit.entries[0].mean_abs_log_error_before

    refitted = fit_profile(product_targets(), base, name="mine", fit_global=True, max_evaluations=60,
                           describe=lambda family, dtype, rows: "fit").profile
    assert refitted.entry_for("cdna3", "fp8").rows == 16


def test_a_makers_entry_is_fitted_on_its_gpus_and_answers_for_a_family_without_an_entry() -> None:
    """16 hopper rows measured at TRUE_EFFICIENCY (bandwidth 0.62) and 16 ampere rows at bandwidth 0.5, all
    NVIDIA's; 16 cdna3 rows, AMD's only family. NVIDIA's entry is fitted on all 32 (its bandwidth between the two
    families'), and answers for an NVIDIA family without an entry (ada); AMD's, on the same rows as cdna3's, is
    cdna3's fit; a GPU of no stated maker gets the global entry. Each family's entry is the same fit as without
    any maker (every family starts from, and is pulled toward, the global entry)."""
    slow = dataclasses.replace(TRUE_EFFICIENCY, bandwidth_fraction=0.5)
    hopper = [dataclasses.replace(t, vendor="NVIDIA") for t in product_targets()]
    ampere = [dataclasses.replace(t, family="ampere", vendor="NVIDIA") for t in product_targets(slow)]
    amd = [dataclasses.replace(t, family="cdna3", vendor="AMD") for t in product_targets()]
    base = single_entry_profile("b", DEFAULT_EFFICIENCY)
    fit = fit_profile(hopper + ampere + amd, base, name="x", fit_global=False, max_evaluations=60,
                      describe=lambda family, dtype, rows: f"{family}/{dtype} on {len(rows)} rows")
    assert [(e.family, e.compute_dtype, e.rows) for e in fit.entries] == [
        ("ampere", ANY, 16), ("cdna3", ANY, 16), ("hopper", ANY, 16), ("vendor:amd", ANY, 16),
        ("vendor:nvidia", ANY, 32), ("ampere", "bf16", 16), ("cdna3", "bf16", 16), ("hopper", "bf16", 16)]
    nvidia = fit.profile.entry_for("ada", "fp8", "NVIDIA")
    assert (nvidia.family, nvidia.rows) == ("vendor:nvidia", 32)
    assert nvidia.efficiency.source == "vendor:nvidia/* on 32 rows"
    families = [fit.profile.efficiency_for(family, "bf16", "NVIDIA").bandwidth_fraction for family in ("ampere", "hopper")]
    assert min(families) < nvidia.efficiency.bandwidth_fraction < max(families)
    amd_entry, cdna3 = fit.profile.entry_for("cdna4", "fp8", "AMD"), fit.profile.entry_for("cdna3", "fp8", "AMD")
    assert amd_entry.key == ("vendor:amd", ANY) and amd_entry.efficiency.source == "vendor:amd/* on 16 rows"
    assert dataclasses.replace(amd_entry.efficiency, source="") == dataclasses.replace(cdna3.efficiency, source="")
    assert fit.profile.entry_for("ada", "fp8").key == (ANY, ANY)
    assert fit.levels[GLOBAL].entry_for("ada", "fp8", "NVIDIA").key == (ANY, ANY)  # a maker's entry is a family's level
    assert fit.levels[FAMILY].entry_for("ada", "fp8", "NVIDIA").key == ("vendor:nvidia", ANY)

    unstated = [dataclasses.replace(t, vendor="") for t in hopper + ampere + amd]
    alone = fit_profile(unstated, base, name="x", fit_global=False, max_evaluations=60,
                        describe=lambda family, dtype, rows: f"{family}/{dtype} on {len(rows)} rows")
    assert [e.family for e in alone.profile.entries if e.family.startswith("vendor:")] == []
    assert {e.key: e for e in alone.profile.entries} == {
        e.key: e for e in fit.profile.entries if not e.family.startswith("vendor:")}


class Stopped(Exception):
    """What the test's check raises (a request's raises RequestAbandoned)."""


def test_the_check_is_called_before_each_entrys_search_and_what_it_raises_stops_the_fit() -> None:
    """24 toy rows (toy_targets x 8), 12 hopper and 12 ampere, all NVIDIA's and bf16, fit_global: the searches, in
    order, are the global entry, hopper's and ampere's family entries, NVIDIA's maker entry (two families: a search
    of its own); each family's only precision takes its family's fit, searching nothing. So 4 checks. A check that
    raises on its third call stops the fit there: the exception comes out, and no entry after the second runs
    (families are fitted in name order: ampere, then hopper)."""
    toys = toy_targets() * 8
    rows = [dataclasses.replace(t, family="hopper" if index < 12 else "ampere", vendor="NVIDIA")
            for index, t in enumerate(toys)]
    base = single_entry_profile("b", DEFAULT_EFFICIENCY)
    calls = []
    fit = fit_profile(rows, base, name="x", fit_global=True, max_evaluations=20,
                      describe=lambda family, dtype, rows: "fit", check=lambda: calls.append(len(calls)))
    assert len(calls) == 4
    assert [(e.family, e.compute_dtype) for e in fit.entries][:4] == [
        (ANY, ANY), ("ampere", ANY), ("hopper", ANY), ("vendor:nvidia", ANY)]
    checks, described = [], []

    def third_stops() -> None:
        if len(checks) == 2:
            raise Stopped
        checks.append(True)

    with pytest.raises(Stopped):
        fit_profile(rows, base, name="x", fit_global=True, max_evaluations=20,
                    describe=lambda family, dtype, rows: described.append(family) or "fit", check=third_stops)
    assert described == [ANY, "ampere"]  # the global entry and ampere's searched; hopper's never starts


def test_fitted_sources_name_each_source_with_its_rows_the_most_first() -> None:
    """Six rows: three of A, two of B, one of C; then a tie, two of D and two of A, goes by name."""
    rows = [dataclasses.replace(product_targets()[0], source_id=source) for source in "ABACBA"]
    assert fitted_sources(rows) == "A 3 rows, B 2 rows, C 1 row"
    tied = [dataclasses.replace(product_targets()[0], source_id=source) for source in "DADA"]
    assert fitted_sources(tied) == "A 2 rows, D 2 rows"


def test_a_family_with_two_precisions_gets_an_entry_for_each() -> None:
    """The rows split over two precisions of one family, 8 + 8: fewer than 10 each, so only the family
    entry; twice as many, 16 + 16: the family entry on all 32 and one entry per precision."""
    targets = product_targets()
    split = [dataclasses.replace(t, compute_dtype="fp8" if i % 2 else "bf16") for i, t in enumerate(targets)]
    fit = fit_profile(split, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=False,
                      max_evaluations=40, describe=lambda family, dtype, rows: "fit")
    assert [(e.family, e.compute_dtype, e.rows) for e in fit.entries] == [("hopper", ANY, 16)]
    more = split + [dataclasses.replace(t, source_id="again") for t in split]
    fit = fit_profile(more, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=False,
                      max_evaluations=40, describe=lambda family, dtype, rows: "fit")
    assert [(e.family, e.compute_dtype, e.rows) for e in fit.entries] == [
        ("hopper", ANY, 32), ("hopper", "bf16", 16), ("hopper", "fp8", 16)]


def test_small_groups_fall_back_instead_of_overfitting() -> None:
    """Fewer rows than MIN_ROWS_PER_ENTRY (10): no entry of their own."""
    few = product_targets()[:MIN_ROWS_PER_ENTRY - 1]
    fit = fit_profile(few, single_entry_profile("base", DEFAULT_EFFICIENCY), name="x", fit_global=False,
                      describe=lambda family, dtype, rows: "fit")
    assert fit.entries == ()
    assert fit.profile.entries == (ProfileEntry(ANY, ANY, DEFAULT_EFFICIENCY),)


def test_leave_one_group_out_predicts_each_group_from_the_others() -> None:
    """Three sources measured with one efficiency: a fit on any two predicts the third within a few %,
    at every level of the profile. Each held-out row is reported once, with its group."""
    targets = product_targets()
    held_out = leave_one_group_out(targets, targets, single_entry_profile("builtin", DEFAULT_EFFICIENCY),
                                   lambda target: target.source_id, fit_global=True, max_evaluations=60)
    assert sorted({item.group for item in held_out}) == ["source-0", "source-1", "source-2"]
    assert len(held_out) == len(targets)
    for level in (GLOBAL, FAMILY, FAMILY_PRECISION):
        errors = [abs_pct_error(item.predicted[level], item.target.measured) for item in held_out]
        assert float(np.median(errors)) < 3.0


def test_fit_profile_keeps_the_profile_of_every_level() -> None:
    """The global level has only the refitted global entry; the family level adds hopper/*; the
    precision level adds hopper/bf16 (the same rows as the family: the same fit)."""
    fit = fit_profile(product_targets(), single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=True,
                      max_evaluations=30, describe=lambda family, dtype, rows: "fit")
    keys = {level: [entry.key for entry in profile.entries] for level, profile in fit.levels.items()}
    assert keys == {GLOBAL: [(ANY, ANY)], FAMILY: [(ANY, ANY), ("hopper", ANY)],
                    FAMILY_PRECISION: [(ANY, ANY), ("hopper", ANY), ("hopper", "bf16")]}
    assert fit.profile == fit.levels[FAMILY_PRECISION]


def test_spread_takes_an_equal_share_of_each_source_evenly_spaced() -> None:
    """One source, 10 rows, at most 4: indices floor(i x 10 / 4) = 0, 2 (2.5), 5, 7 (7.5); at most 10 or
    more: all.

    Three sources, A with 20 rows, B with 6, C with 2, at most 12: the smallest first, C's share is
    12 // 3 = 4 but it has 2 (both); B's is (12 - 2) // 2 = 5 of its 6: floor(i x 6 / 5) = 0, 1 (1.2), 2 (2.4),
    3 (3.6), 4 (4.8); A takes the remaining 5 of its 20: floor(i x 20 / 5) = 0, 4, 8, 12, 16. In proportion
    to rows A would have had 12 x 20 / 28 = 8.6 of the 12. A row added to A moves none of B's or C's picks."""
    one = [ToyTarget(1.0, float(i)) for i in range(10)]
    assert [row.measured for row in spread(one, 4)] == [0, 2, 5, 7]
    assert spread(one, 10) == one and spread(one, None) == one
    a, b, c = ([ToyTarget(1.0, float(i), source_id=source) for i in range(count)]
               for source, count in (("A", 20), ("B", 6), ("C", 2)))
    taken = [(row.source_id, row.measured) for row in spread(a + b + c, 12)]
    assert taken == ([("A", i) for i in (0, 4, 8, 12, 16)] + [("B", i) for i in (0, 1, 2, 3, 4)]
                     + [("C", 0), ("C", 1)])
    grown = spread([ToyTarget(1.0, -1.0, source_id="A")] + a + b + c, 12)
    assert [row for row in grown if row.source_id != "A"] == [row for row in spread(a + b + c, 12)
                                                              if row.source_id != "A"]


def test_a_prior_pulls_a_parameter_the_data_cannot_see_to_its_cited_value() -> None:
    """The toy decode steps do not depend on the all-reduce latency: the only term of the objective
    that does is its prior (7.5 us, the NCCL-sourced builtin), so a fit started at 25 us ends near
    7.5 us."""
    start = dataclasses.replace(DEFAULT_EFFICIENCY, allreduce_latency_s=25e-6)
    alpha = [bound for bound in FITTED_PARAMETERS if bound.name == "allreduce_latency_s"]
    fitted, objective = fit_efficiency(toy_targets(), start, alpha, max_evaluations=100)
    assert fitted.allreduce_latency_s == pytest.approx(7.5e-6, abs=0.1e-6)
    # What is left is the data's own error at the start's bandwidth 0.70 and 0.3 ms (not fitted here).
    assert objective == pytest.approx(mean_abs_log_error(toy_targets(), start), abs=1e-6)


def test_a_parameter_at_a_bound_is_reported_as_a_defect() -> None:
    """Within 1% of the range from a bound: range 0.42-0.90 (0.48 wide) gives a margin of 0.0048, so
    0.4248 and 0.8952 are at a bound, 0.43 is not. Only fitted entries (rows > 0) are inspected; the
    other parameters here sit inside their ranges (compute scale 0.8, flatness 0.5, 0.3 ms, 3 us, 7.5 us,
    0.5 ms of host work per sequence, 0.1 ms of it overlapped, 1 ms per MoE layer of a step with prompt
    tokens, links at 0.84 of their rate, 2 ms per step of a disaggregated decode worker)."""
    bound = ParameterBounds("bandwidth_fraction", 0.42, 0.90, 0.70, "test")
    assert (bound.at_bound(0.4248), bound.at_bound(0.8952), bound.at_bound(0.43)) == ("low", "high", None)
    inside = with_parameters(DEFAULT_EFFICIENCY, {"compute_scale": 0.8, "small_m_flatness": 0.5,
                                                  "per_sequence_overhead_s": 0.5e-3,
                                                  "overlapped_host_per_sequence_s": 0.1e-3,
                                                  "prefill_moe_layer_overhead_s": 1e-3, "pcie_link_fraction": 0.84,
                                                  "decode_worker_step_overhead_s": 2e-3})
    at_floor = dataclasses.replace(inside, bandwidth_fraction=0.42)
    profile = CalibrationProfile("p", (ProfileEntry(ANY, ANY, at_floor), ProfileEntry("cdna3", ANY, at_floor, 50)))
    assert parameters_at_bounds(profile) == [("cdna3", ANY, "bandwidth_fraction", 0.42, "low")]
    with pytest.raises(ValueError, match="prior"):
        ParameterBounds("x", 0.0, 1.0, 2.0, "a prior outside its range")


def test_an_entry_whose_fit_pushed_a_parameter_to_a_bound_says_so_in_its_source() -> None:
    """compute_scale: range 0.30-1.0, margin 0.007, so 0.302 is at the low end, and its cited prior 1.0 at the
    high end: pinned. allreduce_latency_s: range 2-30 us, margin 0.28 us, so 30 us is at the high end, and its
    prior 7.5 us at neither: pinned. overlapped_host_per_sequence_s at 0 sits at its floor where its prior 0
    sits (the rows asked for none of the effect): a result, not pinned. An inherited entry (0 rows) is not
    marked, nor is an entry with nothing at a bound."""
    inside = with_parameters(DEFAULT_EFFICIENCY, {"compute_scale": 0.8, "overlapped_host_per_sequence_s": 0.0})
    pushed = dataclasses.replace(with_parameters(inside, {"compute_scale": 0.302, "allreduce_latency_s": 30e-6}),
                                 source="cdna3's rows")
    profile = mark_pinned(CalibrationProfile("p", (
        ProfileEntry(ANY, ANY, dataclasses.replace(pushed, source="cited")),
        ProfileEntry("cdna3", ANY, pushed, 50),
        ProfileEntry("hopper", ANY, dataclasses.replace(inside, source="hopper's rows"), 50))))
    sources = [entry.efficiency.source for entry in profile.entries]
    assert sources[0] == "cited" and sources[2] == "hopper's rows"
    assert sources[1] == (
        "cdna3's rows. Pinned: compute_scale 0.302 at the low end of its range [0.3, 1] (cited prior 1); "
        "allreduce_latency_s 3e-05 at the high end of its range [2e-06, 3e-05] (cited prior 7.5e-06). A parameter "
        "the fit pushes to a bound stands in for something the model lacks for these rows: this entry's "
        "predictions are less certain than its fit error says")
    assert [dataclasses.replace(entry.efficiency, source="") for entry in profile.entries][1] == dataclasses.replace(
        pushed, source="")  # the values untouched


def test_an_entry_that_carries_another_entrys_fit_is_known_as_its_copy() -> None:
    """`same_fits`: cdna3's fit (bandwidth 0.42), carried by AMD's entry and by cdna3/fp16 under sources of their
    own, makes both copies of cdna3 (the first in the profile's order); hopper at 0.43 differs in one value and is
    nobody's copy; the global entry, inherited (0 rows), is not compared."""
    cdna3 = dataclasses.replace(DEFAULT_EFFICIENCY, bandwidth_fraction=0.42, source="cdna3's rows")
    profile = CalibrationProfile("p", (
        ProfileEntry(ANY, ANY, cdna3),
        ProfileEntry("cdna3", ANY, cdna3, 50),
        ProfileEntry("cdna3", "fp16", dataclasses.replace(cdna3, source="cdna3 fp16's rows"), 50),
        ProfileEntry("hopper", ANY, dataclasses.replace(cdna3, bandwidth_fraction=0.43), 40),
        ProfileEntry("vendor:amd", ANY, dataclasses.replace(cdna3, source="AMD's rows"), 50)))
    assert same_fits(profile) == {("cdna3", "fp16"): ("cdna3", ANY), ("vendor:amd", ANY): ("cdna3", ANY)}


def test_small_m_flatness_adds_a_one_row_point_to_the_compute_curve() -> None:
    """The A100 sweep starts at (64 rows, 0.33). Flatness r puts (1, 0.33 / 64 x 64^r) in front:
    r = 0: 0.33 / 64 = 0.00515625, the proportional floor (a 1-row matmul costs as long as 64 rows);
    r = 0.5: 0.00515625 x 8 = 0.04125; r = 1: 0.33, flat. Reading r back gives r; the builtin curve,
    which has no 1-row point, reads as 0."""
    assert parameter_value(DEFAULT_EFFICIENCY, "small_m_flatness") == 0.0
    for flatness, one_row in ((0.0, 0.00515625), (0.5, 0.04125), (1.0, 0.33)):
        efficiency = with_parameters(DEFAULT_EFFICIENCY, {"small_m_flatness": flatness})
        assert efficiency.compute_curve[0] == (1, pytest.approx(one_row))
        assert efficiency.compute_curve[1:] == DEFAULT_EFFICIENCY.compute_curve
        assert parameter_value(efficiency, "small_m_flatness") == pytest.approx(flatness, abs=1e-12)
        again = with_parameters(efficiency, {"small_m_flatness": 0.25})
        assert len(again.compute_curve) == len(efficiency.compute_curve)  # replaced, not added twice
    flat = with_parameters(DEFAULT_EFFICIENCY, {"small_m_flatness": 1.0})
    assert flat.compute_fraction(1) == pytest.approx(0.33)
    assert DEFAULT_EFFICIENCY.compute_fraction(1) == pytest.approx(0.00515625)


def test_a_flat_small_m_curve_lets_weight_only_int8_decode_read_half_the_bytes() -> None:
    """Llama-3-8B at batch 1 on an A100, int8 weights computing at fp16: with the proportional floor a
    1-row matmul is charged as 64 rows at 33% of 312 TFLOP/s, 2 x 7.5e9 x 64 / (312e12 x 0.33) = 9.3 ms,
    slower than reading the 7.5 GB of int8 weights at 70% of 2.039 TB/s (5.3 ms), so int8 looks barely
    faster than bf16; flat below 64 rows, the step is the weight read again: about half of bf16's."""
    def tpot(weight_dtype: str, efficiency: Efficiency) -> float:
        row = measurement(weight_dtype=weight_dtype, compute_dtype="fp16", isl=1, osl=2)
        return prepare(row, LLAMA_3_8B, AMPERE).predict(efficiency)

    flat = with_parameters(DEFAULT_EFFICIENCY, {"small_m_flatness": 1.0})
    assert tpot("int8", DEFAULT_EFFICIENCY) / tpot("bf16", DEFAULT_EFFICIENCY) > 0.85
    assert tpot("int8", flat) / tpot("bf16", flat) == pytest.approx(0.535, abs=0.02)


# Profiles ---------------------------------------------------------------------------------------

def test_profile_lookup_goes_from_specific_to_global() -> None:
    """(family, precision), then (family, *), then the maker's (vendor:<maker>, *), then (*, precision), then
    (*, *)."""
    def efficiency(fraction: float) -> Efficiency:
        return dataclasses.replace(DEFAULT_EFFICIENCY, bandwidth_fraction=fraction)

    profile = CalibrationProfile("p", (
        ProfileEntry(ANY, ANY, efficiency(0.5)), ProfileEntry("hopper", "fp8", efficiency(0.8)),
        ProfileEntry("hopper", ANY, efficiency(0.7)), ProfileEntry(ANY, "fp8", efficiency(0.6)),
        ProfileEntry("vendor:nvidia", ANY, efficiency(0.65))))
    assert profile.efficiency_for("hopper", "fp8").bandwidth_fraction == 0.8
    assert profile.efficiency_for("hopper", "bf16").bandwidth_fraction == 0.7
    assert profile.efficiency_for("hopper", "bf16", "NVIDIA").bandwidth_fraction == 0.7  # its family's first
    assert profile.efficiency_for("ampere", "fp8").bandwidth_fraction == 0.6
    assert profile.efficiency_for("ampere", "fp16").bandwidth_fraction == 0.5
    # A family without an entry: its maker's entry, before every entry that is not the GPU's own.
    assert profile.efficiency_for("ampere", "fp8", "NVIDIA").bandwidth_fraction == 0.65
    assert profile.efficiency_for("ampere", "fp16", " nvidia ").bandwidth_fraction == 0.65
    assert profile.efficiency_for("cdna3", "fp8", "AMD").bandwidth_fraction == 0.6  # no AMD entry
    assert profile.entry_for("ampere", "fp16", "NVIDIA").key == ("vendor:nvidia", ANY)


def test_a_profile_needs_a_global_entry_and_distinct_keys() -> None:
    with pytest.raises(ValueError, match="global entry"):
        CalibrationProfile("p", (ProfileEntry("hopper", "fp8", DEFAULT_EFFICIENCY),))
    with pytest.raises(ValueError, match="distinct"):
        CalibrationProfile("p", (ProfileEntry(ANY, ANY, DEFAULT_EFFICIENCY), ProfileEntry(ANY, ANY, DEFAULT_EFFICIENCY)))


def test_an_entry_below_the_global_one_is_pulled_toward_the_level_above() -> None:
    """Partial pooling: the toy decode steps cannot see the all-reduce latency. Fitted from a global entry at
    25 us (a base profile, not refitted), a family entry keeps about 25 us (its prior is the level above;
    a six-parameter search moves a direction no row sees by about a microsecond), where the global entry's
    own fit, pulled toward the cited 7.5 us, would move it there (see the test above)."""
    start = dataclasses.replace(DEFAULT_EFFICIENCY, allreduce_latency_s=25e-6)
    rows = toy_targets() * 4  # 12 hopper rows: an entry of their own
    fit = fit_profile(rows, single_entry_profile("base", start), name="x", fit_global=False, max_evaluations=100,
                      describe=lambda family, dtype, rows: "fit")
    assert fit.profile.entry_for("hopper", ANY).rows == 12
    assert fit.profile.efficiency_for("hopper", "bf16").allreduce_latency_s == pytest.approx(25e-6, abs=1.5e-6)


@dataclass(frozen=True)
class _Ring:
    """A TP step: 5 ms of kernels plus 1 MB moved over a 1e9 B/s link at the PCIe fraction (1 ms at the
    full rate) on rows that pay it; 5 ms flat on the others."""

    measured: float
    family: str
    source_id: str = "ring"
    compute_dtype: str = "bf16"
    vendor: str = ""
    pays_host_work: bool = False
    pays_overlapped_host_work: bool = False
    pays_prefill_overhead: bool = False
    pays_pcie_link: bool = True
    measures_steps: bool = True
    measures_decode_worker_step: bool = False
    measures_latency: bool = True

    def predict(self, efficiency) -> float:
        return 5e-3 + (1e-3 / efficiency.pcie_link_fraction if self.pays_pcie_link else 0.0)


def test_only_a_family_entry_fits_its_pcie_links_and_the_global_entry_keeps_the_prior() -> None:
    """Ada's rows were made with its PCIe links at half their rate: 5 + 1 / 0.5 = 7 ms; hopper's rows pay
    nothing (NVLink): 5 ms. Ada's entry fits 0.5 back; the global entry, fitted on both families' rows, does
    not fit the PCIe fraction and keeps the start's cited 0.84, as hopper does (none of its rows pays it)."""
    rows = [_Ring(7e-3, "ada") for _ in range(12)] + [_Ring(5e-3, "hopper", pays_pcie_link=False) for _ in range(12)]
    fit = fit_profile(rows, single_entry_profile("b", DEFAULT_EFFICIENCY), name="x", fit_global=True,
                      max_evaluations=200, describe=lambda family, dtype, rows: "fit")
    fraction = {family: fit.profile.efficiency_for(family, "bf16").pcie_link_fraction for family in ("ada", "hopper")}
    assert fit.profile.efficiency_for(ANY, ANY).pcie_link_fraction == DEFAULT_EFFICIENCY.pcie_link_fraction == 0.84
    assert fraction["ada"] == pytest.approx(0.5, abs=0.01)
    assert fraction["hopper"] == 0.84


# The cost of MoE prompt steps, on the TTFTs that measure only it ----------------------------------------

def test_golden_section_finds_a_one_dimensional_minimum() -> None:
    """|x - 0.3| on [0, 1]: 24 evaluations shrink the bracket to 0.618^21 = 4e-5 of it around 0.3. x^2 has its
    minimum at the low bound, which the bracket only approaches: the bound itself is returned."""
    assert golden_section(lambda x: abs(x - 0.3), 0.0, 1.0) == pytest.approx(0.3, abs=5e-5)
    assert golden_section(lambda x: x * x, 0.0, 1.0) == 0.0
    with pytest.raises(ValueError):
        golden_section(lambda x: x, 1.0, 1.0)


def test_the_prompt_step_cost_is_found_again_with_the_steps_held() -> None:
    """The three MoE TTFTs were made with the steps they are timed at (bandwidth 0.6, 0.5 ms) and 2 ms per MoE
    layer: the refit finds 2 ms (to the search's 5 ms x 0.618^21 = 2e-7 and the 1e-8 s rounding of the
    measurements over 58 layers); the prior (the start's 0, range 5 ms) costs 0.02 x (2 / 5)^2 = 0.0032 there,
    while 0.1 ms less would cost |ln(111.7 / 117.5)| / 3 = 0.017. Nothing else moves."""
    steps = dataclasses.replace(DEFAULT_EFFICIENCY, bandwidth_fraction=0.6, per_step_overhead_s=0.5e-3)
    fitted = fit_prompt_step_overhead(moe_ttfts(), steps)
    assert fitted.prefill_moe_layer_overhead_s == pytest.approx(2e-3, abs=1e-6)
    assert dataclasses.replace(fitted, prefill_moe_layer_overhead_s=0.0) == steps


def test_ttfts_that_measure_only_the_prompt_steps_leave_the_search_alone() -> None:
    """toy_targets measure every efficiency (no MoE prompt steps); moe_ttfts only the MoE prompt steps. Fitted
    together, the global entry's searched values are those of toy_targets alone, exactly, and its prompt-step
    cost is moe_ttfts' 2 ms, to the microsecond the search leaves (its bandwidth and overhead are found again
    only to its tolerance)."""
    def fitted(targets) -> Efficiency:
        return fit_profile(targets, single_entry_profile("base", DEFAULT_EFFICIENCY), name="p", fit_global=True,
                           describe=lambda *args: "toy").levels[GLOBAL].efficiency_for("hopper", "bf16")

    alone, together = fitted(toy_targets()), fitted([*toy_targets(), *moe_ttfts()])
    assert alone.prefill_moe_layer_overhead_s == 0.0  # no row pays it: the start's
    assert together.prefill_moe_layer_overhead_s == pytest.approx(2e-3, abs=2e-5)
    assert dataclasses.replace(together, prefill_moe_layer_overhead_s=0.0) == alone
