"""The bounded searches a calibration fit minimizes its objective with: Nelder–Mead over an entry's
parameters (`fit.fit_efficiency`), golden-section over one (`fit.fit_prompt_step_overhead`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


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


def golden_section(objective: Callable[[float], float], low: float, high: float, *,
                   evaluations: int = 24) -> float:
    """The x in [low, high] that minimizes a unimodal `objective`, by golden-section search: each step
    keeps the part of the bracket around the lower of two inner points, shrinking it by (sqrt 5 - 1) / 2
    = 0.618 (`evaluations` 24: two inner points, then 21 steps leave 0.618^21 = 4e-5 of it). The bracket's
    midpoint, or `low` where the objective is lower there (a minimum at the bound, which the shrinking
    bracket only approaches)."""
    if not low < high:
        raise ValueError("need low < high")
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(max(evaluations - 3, 0)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = objective(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = objective(d)
    middle = (a + b) / 2
    return low if objective(low) <= objective(middle) else middle
