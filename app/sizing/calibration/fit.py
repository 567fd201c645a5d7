"""Calibration profiles and fitting them to published measurements (SIZING.md section 5).

A calibration profile assigns an `Efficiency` to each (GPU family, compute precision) it has evidence
for, with a global entry (`*`, `*`) as the fallback for everything else. Lookup goes from the most to
the least specific entry: (family, precision), then (family, `*`), then (`*`, precision), then
(`*`, `*`).

Fitting adjusts six physically meaningful parameters per entry, each inside sane bounds
(`FITTED_PARAMETERS`): the achieved fraction of HBM bandwidth, the scale of the tokens-per-step compute
curve (the published GEMM sweep) and how flat that curve is below its first point, the per-step and
per-layer overheads, and the all-reduce latency. The objective is the mean absolute log error over the measurements of the entry,
|ln(predicted / measured)|: symmetric in over- and under-prediction, scale-free (tokens/s and
milliseconds weigh alike), and robust to a few outliers compared with squared errors. It is minimized by
a bounded Nelder–Mead search (below); nothing is ever tuned per measurement.

`FitTarget` is what a fit needs of a measurement: the measured value, where it came from, its group,
and a function from an `Efficiency` to the predicted value. The validator's prepared predictions
(`predict.py`) are such targets, so a fit optimizes exactly what validation reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from app.sizing.hardware.efficiency import Efficiency

ANY = "*"  # matches every GPU family or every compute precision


@dataclass(frozen=True, slots=True)
class ParameterBounds:
    name: str  # an `Efficiency` field
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"{self.name}: low must be below high")


# Sane physical ranges. Bandwidth: decode kernels reach 52-80% of HBM bandwidth (SIZING.md section 5);
# 0.30-0.95 leaves room on both sides without allowing the absurd. Compute: the published GEMM curve tops
# out at 0.93 of peak; scaling it by 0.3-1.0 spans a poorly tuned kernel to the published sweep.
# Overheads: "order 0.1-1 ms per step, plus a few us per layer" (section 5), bounded at 5 ms and 50 us.
# All-reduce alpha: "roughly 5-10 us" on NVLink (section 6); up to 100 us covers PCIe and slow fabrics.
# Small matmuls: the published GEMM sweep starts at M = 64 rows (33% of peak) and below its first point
# the curve is proportional to M, i.e. a matmul of 1 row costs as long as one of 64. That sweep's small-M
# points are themselves weight-read-bound, which the roofline already charges as memory time, so for
# weight-only quantization (8- or 4-bit weights computing at 16 bits) the floor hides the smaller reads.
# `small_m_flatness` r adds a point at M = 1 with fraction f0 / M0 x M0^r: r = 0 is the proportional
# floor, r = 1 a flat curve below M0 (a 1-row matmul at the first point's fraction).
SMALL_M_FLATNESS = "small_m_flatness"
FITTED_PARAMETERS: tuple[ParameterBounds, ...] = (
    ParameterBounds("bandwidth_fraction", 0.30, 0.95),
    ParameterBounds("compute_scale", 0.30, 1.0),
    ParameterBounds("per_step_overhead_s", 0.0, 5e-3),
    ParameterBounds("per_layer_overhead_s", 0.0, 50e-6),
    ParameterBounds("allreduce_latency_s", 0.0, 100e-6),
    ParameterBounds(SMALL_M_FLATNESS, 0.0, 1.0),
)

# An entry of its own needs at least this many measurements (twice the fitted parameters); groups with
# fewer use the next less specific entry.
MIN_ROWS_PER_ENTRY = 2 * len(FITTED_PARAMETERS)

# Objective evaluations per fitted entry: on the published data Nelder–Mead over five parameters is within
# 0.1% of its final objective after about 80; a sixth adds a few dozen.
DEFAULT_EVALUATIONS = 120

# Penalty for a prediction that is not a positive finite number (|ln| of a 1000x miss).
_MISS_PENALTY = math.log(1000.0)


def parameter_value(efficiency: Efficiency, name: str) -> float:
    """A fitted parameter's value in an efficiency (SMALL_M_FLATNESS is read off its compute curve)."""
    if name != SMALL_M_FLATNESS:
        return float(getattr(efficiency, name))
    curve = efficiency.compute_curve
    if len(curve) < 2 or curve[0][0] != 1:
        return 0.0  # proportional below the first point
    (_, one_row), (first_rows, first_fraction) = curve[0], curve[1]
    return math.log(one_row * first_rows / first_fraction) / math.log(first_rows)


def with_parameters(efficiency: Efficiency, values: dict[str, float]) -> Efficiency:
    """The efficiency with the given fitted parameters set (the others unchanged)."""
    fields = {name: float(value) for name, value in values.items() if name != SMALL_M_FLATNESS}
    if SMALL_M_FLATNESS in values:
        curve = tuple(point for point in efficiency.compute_curve if point[0] > 1)
        first_rows, first_fraction = curve[0]
        one_row = first_fraction / first_rows * first_rows ** float(values[SMALL_M_FLATNESS])
        fields["compute_curve"] = ((1, min(one_row, first_fraction)), *curve)
    return replace(efficiency, **fields)


# Profiles ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ProfileEntry:
    family: str  # GpuSpec.family, or ANY
    compute_dtype: str  # or ANY
    efficiency: Efficiency
    rows: int = 0  # measurements this entry was fitted on; 0 = inherited, not fitted here

    @property
    def key(self) -> tuple[str, str]:
        return self.family, self.compute_dtype


@dataclass(frozen=True, slots=True)
class CalibrationProfile:
    """Efficiencies by (GPU family, compute precision); the (`*`, `*`) entry is required."""

    name: str
    entries: tuple[ProfileEntry, ...]

    def __post_init__(self) -> None:
        keys = [entry.key for entry in self.entries]
        if len(set(keys)) != len(keys):
            raise ValueError("profile entries must have distinct (family, compute_dtype) keys")
        if (ANY, ANY) not in keys:
            raise ValueError("a profile needs a global entry (family '*', compute_dtype '*')")

    def entry_for(self, family: str, compute_dtype: str) -> ProfileEntry:
        by_key = {entry.key: entry for entry in self.entries}
        for key in ((family, compute_dtype), (family, ANY), (ANY, compute_dtype), (ANY, ANY)):
            if key in by_key:
                return by_key[key]
        raise AssertionError("unreachable: the global entry always matches")

    def efficiency_for(self, family: str, compute_dtype: str) -> Efficiency:
        return self.entry_for(family, compute_dtype).efficiency


def single_entry_profile(name: str, efficiency: Efficiency) -> CalibrationProfile:
    """A profile that applies one efficiency everywhere."""
    return CalibrationProfile(name, (ProfileEntry(ANY, ANY, efficiency),))


# Errors -----------------------------------------------------------------------------------------

def abs_pct_error(predicted: float, measured: float) -> float:
    """|predicted − measured| / measured, in percent."""
    return abs(predicted / measured - 1.0) * 100.0


def abs_log_error(predicted: float, measured: float) -> float:
    """|ln(predicted / measured)|, with a fixed penalty for a prediction that is not positive and finite."""
    if not (math.isfinite(predicted) and predicted > 0):
        return _MISS_PENALTY
    return abs(math.log(predicted / measured))


# The search -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SearchResult:
    x: np.ndarray
    value: float
    evaluations: int


def nelder_mead(objective: Callable[[np.ndarray], float], start: Sequence[float], lower: Sequence[float],
                upper: Sequence[float], *, max_evaluations: int = 200, initial_step: float = 0.2,
                tolerance: float = 1e-4) -> SearchResult:
    """Minimize `objective` inside the box [lower, upper] with the Nelder–Mead simplex method.

    Derivative-free (the objective is a mean of absolute errors of piecewise-linear step times: not
    smooth), and, unlike a search one coordinate at a time, it walks along valleys where parameters
    trade off (bandwidth against per-step overhead). Works in box coordinates scaled to [0, 1]: the
    first simplex steps `initial_step` of each range from the start, and every trial point is clipped
    to the box, so the answer never leaves the bounds. Reflection 1, expansion 2, contraction 1/2,
    shrink 1/2 (the standard coefficients); stops when the simplex is smaller than `tolerance` of every
    range, or after `max_evaluations`. Deterministic; ties keep the earlier vertex, so a flat objective
    returns the start.
    """
    low = np.asarray(lower, dtype=float)
    span = np.asarray(upper, dtype=float) - low
    if np.any(span <= 0):
        raise ValueError("every upper bound must exceed its lower bound")
    evaluations = 0

    def value_at(unit: np.ndarray) -> float:
        nonlocal evaluations
        evaluations += 1
        return float(objective(low + unit * span))

    first = np.clip((np.asarray(start, dtype=float) - low) / span, 0.0, 1.0)
    simplex = [first]
    for i in range(len(first)):
        vertex = first.copy()
        vertex[i] += initial_step if vertex[i] + initial_step <= 1 else -initial_step
        simplex.append(vertex)
    values = [value_at(vertex) for vertex in simplex]
    while evaluations < max_evaluations:
        order = sorted(range(len(simplex)), key=values.__getitem__)  # stable: ties keep their order
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if max(float(np.max(np.abs(vertex - simplex[0]))) for vertex in simplex[1:]) < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = np.clip(2 * centroid - worst, 0.0, 1.0)
        reflected_value = value_at(reflected)
        if reflected_value < values[0]:
            expanded = np.clip(3 * centroid - 2 * worst, 0.0, 1.0)
            expanded_value = value_at(expanded)
            simplex[-1], values[-1] = ((expanded, expanded_value) if expanded_value < reflected_value
                                       else (reflected, reflected_value))
        elif reflected_value < values[-2]:
            simplex[-1], values[-1] = reflected, reflected_value
        else:
            toward = reflected if reflected_value < values[-1] else worst
            contracted = centroid + 0.5 * (toward - centroid)
            contracted_value = value_at(contracted)
            if contracted_value < min(reflected_value, values[-1]):
                simplex[-1], values[-1] = contracted, contracted_value
            else:  # shrink every vertex halfway to the best
                for i in range(1, len(simplex)):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = value_at(simplex[i])
    best = min(range(len(simplex)), key=values.__getitem__)
    return SearchResult(x=low + simplex[best] * span, value=values[best], evaluations=evaluations)


# Fitting ----------------------------------------------------------------------------------------

class FitTarget(Protocol):
    """What a fit needs of one measurement."""

    @property
    def measured(self) -> float: ...

    @property
    def source_id(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def compute_dtype(self) -> str: ...

    def predict(self, efficiency: Efficiency) -> float: ...


def mean_abs_log_error(targets: Sequence[FitTarget], efficiency: Efficiency) -> float:
    return float(np.mean([abs_log_error(t.predict(efficiency), t.measured) for t in targets]))


def fit_efficiency(targets: Sequence[FitTarget], start: Efficiency,
                   bounds: Sequence[ParameterBounds] = FITTED_PARAMETERS, *,
                   max_evaluations: int = DEFAULT_EVALUATIONS,
                   source: str | None = None) -> tuple[Efficiency, float]:
    """The efficiency (starting from `start`, changing only the bounded parameters) that minimizes the
    mean absolute log error over `targets`; returns it with that error."""
    if not targets:
        raise ValueError("nothing to fit: no measurements")
    names = [bound.name for bound in bounds]

    def with_values(values: np.ndarray) -> Efficiency:
        return with_parameters(start, dict(zip(names, values, strict=True)))

    result = nelder_mead(
        lambda values: mean_abs_log_error(targets, with_values(values)),
        [parameter_value(start, name) for name in names],
        [bound.low for bound in bounds], [bound.high for bound in bounds],
        max_evaluations=max_evaluations)
    fitted = with_values(result.x)
    if source is not None:
        fitted = replace(fitted, source=source)
    return fitted, result.value


@dataclass(frozen=True, slots=True)
class EntryFit:
    family: str
    compute_dtype: str
    rows: int
    mean_abs_log_error_before: float
    mean_abs_log_error_after: float


@dataclass(frozen=True, slots=True)
class ProfileFit:
    profile: CalibrationProfile
    entries: tuple[EntryFit, ...]


def fit_profile(targets: Sequence[FitTarget], base: CalibrationProfile, *, name: str, fit_global: bool,
                describe: Callable[[str, str, int], str],
                max_evaluations: int = DEFAULT_EVALUATIONS) -> ProfileFit:
    """Fit a profile from the general to the specific, each entry starting where the previous level left
    it: the global entry on every target (when `fit_global`); then, for each GPU family with at least
    MIN_ROWS_PER_ENTRY targets, a family entry (family, `*`) on all of them, the fallback for its
    precisions without an entry; then each (family, compute precision) group with at least
    MIN_ROWS_PER_ENTRY targets (a family with one precision gives that group the family's fit: the same
    rows). Everything the targets do not cover keeps `base`'s entries. `describe(family, dtype, rows)`
    writes each fitted entry's `source`.
    """
    if not targets:
        raise ValueError("nothing to fit: no measurements")
    entries = {entry.key: entry for entry in base.entries}
    fits: list[EntryFit] = []

    def fit(key: tuple[str, str], rows: Sequence[FitTarget]) -> Efficiency:
        start = CalibrationProfile(name, tuple(entries.values())).efficiency_for(*key)
        before = mean_abs_log_error(rows, start)
        fitted, after = fit_efficiency(rows, start, max_evaluations=max_evaluations,
                                       source=describe(*key, len(rows)))
        entries[key] = ProfileEntry(*key, fitted, len(rows))
        fits.append(EntryFit(*key, len(rows), before, after))
        return fitted

    if fit_global:
        fit((ANY, ANY), targets)
    for family, family_rows in sorted(_group_by(targets, lambda t: t.family).items()):
        if len(family_rows) < MIN_ROWS_PER_ENTRY:
            continue
        family_fit = fit((family, ANY), family_rows)
        for dtype, rows in sorted(_group_by(family_rows, lambda t: t.compute_dtype).items()):
            if len(rows) < MIN_ROWS_PER_ENTRY:
                continue
            if len(rows) < len(family_rows):
                fit((family, dtype), rows)
            else:  # the family's only precision: the same rows, the same fit
                entries[(family, dtype)] = ProfileEntry(
                    family, dtype, replace(family_fit, source=describe(family, dtype, len(rows))), len(rows))
                fits.append(EntryFit(family, dtype, len(rows), fits[-1].mean_abs_log_error_before,
                                     fits[-1].mean_abs_log_error_after))
    return ProfileFit(CalibrationProfile(name, tuple(entries.values())), tuple(fits))


def _group_by(targets: Iterable[FitTarget], key: Callable[[FitTarget], str]) -> dict[str, list[FitTarget]]:
    groups: dict[str, list[FitTarget]] = {}
    for target in targets:
        groups.setdefault(key(target), []).append(target)
    return groups


@dataclass(frozen=True, slots=True)
class HeldOutSource:
    source_id: str
    rows: int
    abs_pct_errors: tuple[float, ...]  # of this source's targets, predicted by a fit without them

    @property
    def median_abs_pct_error(self) -> float:
        return float(np.median(self.abs_pct_errors))


def leave_one_source_out(training: Sequence[FitTarget], evaluation: Sequence[FitTarget],
                         base: CalibrationProfile, *, fit_global: bool,
                         max_evaluations: int = DEFAULT_EVALUATIONS) -> tuple[HeldOutSource, ...]:
    """For each source S of `evaluation`: fit on the `training` targets of every other source, then
    predict S's `evaluation` targets. This is the error to expect on an engine version, harness or lab
    the fit has never seen."""
    held_out = []
    for source in sorted({target.source_id for target in evaluation}):
        others = [t for t in training if t.source_id != source]
        profile = base
        if others:
            profile = fit_profile(others, base, name="held-out", fit_global=fit_global,
                                  describe=lambda family, dtype, rows: "held-out fit",
                                  max_evaluations=max_evaluations).profile
        errors = tuple(abs_pct_error(t.predict(profile.efficiency_for(t.family, t.compute_dtype)), t.measured)
                       for t in evaluation if t.source_id == source)
        held_out.append(HeldOutSource(source, len(errors), errors))
    return tuple(held_out)
