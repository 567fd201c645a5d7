"""The step-time model's scalar path: one step, or a run of decode-only steps, in plain float arithmetic.

`step_time.StepTimeModel` prepares its linear forms once per deployment (see its module docstring) and
hands them here as tuples of floats; the simulator then times each step that carries prompt tokens with
`ScalarStepTime.step_time_s` and each run of decode-only steps with `decode_run`, a few tens of thousands
of calls per plan. Compiled with mypyc when the package is installed (setup.py; the README's
"Performance"), so the annotations are exact and no numpy is used here: values a table does not hold
(fractional or very large row counts) come from the callables the model passes in. Plain Python where no
compiled build is installed; the same operations in the same order either way, so the same floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

# Matmul row counts tabulated (step_time._TABLE_ROWS): every batch size and chunked-prefill budget in practice.
TABLE_ROWS: Final = 16_384
PREFILL_SEQS_ERROR: Final = "prefill_seqs must be between 1 and prefill_tokens when tokens are prefilled"
# Batch sizes whose decode forms a model keeps (then it starts over): a simulation meets a few hundred.
_DECODE_FORMS: Final = 4096

# A sparse linear form: ((feature, seconds per unit), ...).
Terms = tuple[tuple[int, float], ...]
# A context-dependent operator of a decode form: (compute, its slopes, memory, its slopes).
DecodeOperator = tuple[float, tuple[float, ...], float, tuple[float, ...]]


class DecodeForm:
    """Decode-only steps of one batch size: constant + sum of slopes x d_w + per context-dependent
    operator max(compute + its slopes x d, memory + its slopes x d), d_w the positions attended in
    window w (min with `caps[w]`, the batch size times the window; None: a global layer); a step lasts at
    least `host_floor` (the overlapped host work of the step and of its sequences)."""

    __slots__ = ("caps", "constant", "first_cap", "host_floor", "open_operators", "open_slope", "operators", "slopes")

    def __init__(self, constant: float, slopes: tuple[float, ...], operators: tuple[DecodeOperator, ...],
                 caps: tuple[float | None, ...], host_floor: float = 0.0) -> None:
        self.constant = constant
        self.host_floor = host_floor  # the least a step lasts (overlapped host work; 0: none)
        self.slopes = slopes
        self.operators = operators
        self.caps = caps
        # Below the smallest cap every window attends the same positions: the slopes summed over windows.
        self.first_cap: float = min((cap for cap in caps if cap is not None), default=math.inf)
        self.open_slope = math.fsum(slopes)
        self.open_operators: tuple[tuple[float, float, float, float], ...] = tuple(
            (compute, math.fsum(compute_slopes), memory, math.fsum(memory_slopes))
            for compute, compute_slopes, memory, memory_slopes in operators)


class ScalarStepTime:
    """A `StepTimeModel`'s forms, evaluated one step at a time (see `step_time._Forms` for the features)."""

    __slots__ = ("decode_forms", "distinct_experts", "distinct_experts_table", "expert_slowdown",
                 "expert_slowdown_table", "host_constant", "host_floor", "ideal_compute", "ideal_memory", "linear",
                 "moe", "operators", "prefill_overhead", "routed_tokens", "routed_tokens_table", "slowdown",
                 "slowdown_table", "slowed", "windows")

    def __init__(self, *, windows: tuple[int | None, ...], slowed: tuple[tuple[int, int], ...],
                 operators: tuple[tuple[Terms, Terms], ...], linear: Terms, ideal_compute: Terms,
                 ideal_memory: Terms, slowdown_table: Sequence[float], slowdown: Callable[[float], float],
                 moe: bool, distinct_experts_table: Sequence[float], routed_tokens_table: Sequence[float],
                 expert_slowdown_table: Sequence[float], distinct_experts: Callable[[float], float],
                 routed_tokens: Callable[[float], float], expert_slowdown: Callable[[float], float],
                 prefill_overhead: float = 0.0, host_floor: float = 0.0, host_constant: float = 0.0) -> None:
        self.windows = windows
        self.slowed = slowed
        self.operators = operators
        self.linear = linear
        self.ideal_compute = ideal_compute
        self.ideal_memory = ideal_memory
        # Tabulated at 0..TABLE_ROWS rows; the callables for other counts.
        self.slowdown_table = slowdown_table
        self.slowdown = slowdown
        self.moe = moe
        self.distinct_experts_table = distinct_experts_table
        self.routed_tokens_table = routed_tokens_table
        self.expert_slowdown_table = expert_slowdown_table
        self.distinct_experts = distinct_experts
        self.routed_tokens = routed_tokens
        self.expert_slowdown = expert_slowdown
        # Expected seconds a step pays once when it carries prompt tokens (`_Forms.prefill_overhead`).
        self.prefill_overhead = prefill_overhead
        # Seconds of overlapped host work per sampled sequence: the least a step lasts (`_Forms.host_floor`).
        self.host_floor = host_floor
        # Seconds of overlapped host work per step that has any (`_Forms.host_constant`), on top of host_floor's.
        self.host_constant = host_constant
        self.decode_forms: dict[float, DecodeForm] = {}

    def step_time_s(self, decode_seqs: float, decode_context_tokens: float, prefill_tokens: float,
                    prefill_context_tokens: float) -> float:
        """Expected seconds of one step given as Python numbers (`StepTimeModel.step_time_s` without
        `prefill_seqs`): decode-only steps of a tabulated batch size by their decode form."""
        if (prefill_tokens == 0 and prefill_context_tokens == 0 and 0 < decode_seqs <= TABLE_ROWS
                and decode_seqs == int(decode_seqs)):
            return self.decode_step(decode_seqs, decode_context_tokens)
        return self.scalar_step(decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens,
                                None, True)

    def scalar_step(self, seqs: float, context: float, new: float, positions: float, prefilling: float | None,
                    expected: bool) -> float:
        """One step, in plain float arithmetic (expected seconds, or the ideal ones)."""
        if prefilling is None:
            prefilling = 1.0 if new > 0 else 0.0
        if seqs < 0 or context < 0 or new < 0 or positions < 0 or prefilling < 0:
            raise ValueError("step sizes must be >= 0")
        if prefilling > new or (new > 0 and prefilling == 0):
            raise ValueError(PREFILL_SEQS_ERROR)
        tokens, sampled = seqs + new, seqs + prefilling
        # `StepTimeModel._window_parts` on plain floats, written out.
        decode_positions = context + seqs
        chunk = new / max(prefilling, 1.0)
        prefix = max(positions / max(new, 1.0) - (chunk + 1) / 2, 0.0)
        prefill_read = new + prefilling * prefix
        windows: list[tuple[float, float, float]] = []
        for window in self.windows:
            if window is None:
                windows.append((positions, decode_positions + prefill_read, decode_positions))
            else:
                decode = min(decode_positions, seqs * window)
                windows.append((min(positions, new * window),
                                decode + min(prefill_read, new + prefilling * (window - 1)), decode))
        features = self.features(tokens, sampled, windows, expected)
        compute: float
        memory: float
        if not expected:
            compute = memory = 0.0
            for feature, seconds in self.ideal_compute:
                compute += seconds * features[feature]
            for feature, seconds in self.ideal_memory:
                memory += seconds * features[feature]
            return memory if memory > compute else compute  # noqa: FURB136 (max(), as a call, costs more)
        total = self.prefill_overhead if new > 0 else 0.0
        for feature, seconds in self.linear:
            total += seconds * features[feature]
        for compute_terms, memory_terms in self.operators:
            compute = memory = 0.0
            for feature, seconds in compute_terms:
                compute += seconds * features[feature]
            for feature, seconds in memory_terms:
                memory += seconds * features[feature]
            total += memory if memory > compute else compute  # noqa: FURB136 (the hot loop)
        floor = self.host_floor * sampled + self.host_constant if sampled > 0 else 0.0
        return floor if floor > total else total  # noqa: FURB136

    def features(self, tokens: float, sampled: float, windows: list[tuple[float, float, float]],
                 slowed: bool) -> list[float]:
        """The evaluation features of one step: row counts, "any", per window the positions prompt tokens
        attend, KV tokens read and positions decoding tokens attend, distinct experts and routed tokens;
        then, when `slowed`, the slowed features (see `step_time._Forms`)."""
        features = [tokens, sampled, 1.0 if tokens > 0 else 0.0, 1.0 if sampled > 0 else 0.0]
        for attended, read, decode in windows:
            features.append(attended)
            features.append(read)
            features.append(decode)
        tokens_row = int(tokens) if tokens <= TABLE_ROWS else -1  # (False for NaN: int() sees small numbers)
        on_table = tokens_row == tokens
        if self.moe:
            if on_table:
                features.append(self.distinct_experts_table[tokens_row])
                features.append(self.routed_tokens_table[tokens_row])
            else:
                features.append(self.distinct_experts(tokens))
                features.append(self.routed_tokens(tokens))
        if not slowed:
            return features
        sampled_row = int(sampled) if sampled <= TABLE_ROWS else -1
        by_tokens = self.slowdown_table[tokens_row] if on_table else self.slowdown(tokens)
        by_sampled = self.slowdown_table[sampled_row] if sampled_row == sampled else self.slowdown(sampled)
        by_experts = 0.0
        if self.moe:
            by_experts = self.expert_slowdown_table[tokens_row] if on_table else self.expert_slowdown(tokens)
        features.append(tokens * by_tokens)  # step_time._SLOWED_ROWS
        features.append(sampled * by_sampled)
        for feature, by_rows in self.slowed:
            features.append(features[feature] * (by_tokens if by_rows == 0 else by_sampled if by_rows == 1
                                                 else by_experts))
        return features

    def decode_form(self, seqs: float) -> DecodeForm:
        """Decode-only steps of `seqs` sequences as a function of their context c alone.

        Every feature is then affine in the windows' positions d_w = c + seqs (min(c + seqs, seqs·w) in a
        window of w): the row counts, experts and slowdowns depend on seqs only, and a slowed window
        feature is d_w times a slowdown of seqs. So each linear form is a constant plus a coefficient per
        window, read off the features at d = 0 and at each unit d, and the operators whose forms do not
        depend on d add max(compute, memory) to the constant once.
        """
        form = self.decode_forms.get(seqs)
        if form is not None:
            return form
        count = len(self.windows)
        base = self.features(seqs, seqs, [(0.0, 0.0, 0.0)] * count, True)
        units: list[list[float]] = []
        for w in range(count):
            unit = self.features(seqs, seqs, [(0.0, 1.0, 1.0) if v == w else (0.0, 0.0, 0.0) for v in range(count)],
                                 True)
            units.append([at_unit - at_zero for at_unit, at_zero in zip(unit, base, strict=True)])
        constant, per_window = _affine(self.linear, base, units)
        dependent: list[DecodeOperator] = []
        for compute_terms, memory_terms in self.operators:
            compute, compute_slopes = _affine(compute_terms, base, units)
            memory, memory_slopes = _affine(memory_terms, base, units)
            if any(compute_slopes) or any(memory_slopes):
                dependent.append((compute, compute_slopes, memory, memory_slopes))
            else:
                constant += memory if memory > compute else compute  # noqa: FURB136
        form = DecodeForm(constant, per_window, tuple(dependent),
                          tuple([None if window is None else seqs * window for window in self.windows]),
                          self.host_floor * seqs + self.host_constant)
        if len(self.decode_forms) >= _DECODE_FORMS:
            self.decode_forms.clear()
        self.decode_forms[seqs] = form
        return form

    def decode_step(self, seqs: float, context: float) -> float:
        """One decode-only step (`decode_form`), in plain float arithmetic."""
        return self.decode_point(self.decode_form(seqs), seqs, context)[0]

    def decode_point(self, form: DecodeForm, seqs: float, context: float) -> tuple[float, int]:
        """A decode-only step's time, and which side of each kink it is on, as bits: per window whether
        the positions attended reach its cap, per context-dependent operator whether memory binds, last
        whether the host's floor does."""
        if context < 0:
            raise ValueError("step sizes must be >= 0")
        attended = context + seqs
        sides = 0
        total: float
        compute: float
        memory: float
        if attended < form.first_cap:  # no window full yet (the common case): one position count for all
            total = form.constant + form.open_slope * attended
            for compute, compute_slope, memory, memory_slope in form.open_operators:
                compute += compute_slope * attended
                memory += memory_slope * attended
                if memory > compute:
                    total += memory
                    sides = sides * 2 + 1
                else:
                    total += compute
                    sides *= 2
            if form.host_floor > total:
                return form.host_floor, sides * 2 + 1
            return total, sides * 2
        positions: list[float] = []
        for cap in form.caps:
            if cap is not None and attended >= cap:
                sides = sides * 2 + 1
                positions.append(cap)
            else:
                sides *= 2
                positions.append(attended)
        total = form.constant
        for slope, d in zip(form.slopes, positions, strict=True):
            total += slope * d
        for compute, compute_slopes, memory, memory_slopes in form.operators:
            for slope, d in zip(compute_slopes, positions, strict=True):
                compute += slope * d
            for slope, d in zip(memory_slopes, positions, strict=True):
                memory += slope * d
            sides = sides * 2 + (1 if memory > compute else 0)
            total += memory if memory > compute else compute  # noqa: FURB136
        if form.host_floor > total:
            return form.host_floor, sides * 2 + 1
        return total, sides * 2

    def decode_run(self, seqs: float, context: float, steps: int, budget_s: float) -> tuple[int, float, float] | None:
        """`StepTimeModel.decode_run`: up to `steps` decode-only steps of `seqs` sequences, their contexts
        summing to `context` and growing by `seqs` a step, stopped after the first step whose end reaches
        `budget_s` seconds: (steps run, their seconds, the last one's seconds); None when the shortcut does
        not apply (a kink inside the run)."""
        if not (0 < seqs <= TABLE_ROWS and seqs == int(seqs) and steps >= 1):
            return None
        form = self.decode_forms.get(seqs) or self.decode_form(seqs)
        first, first_sides = self.decode_point(form, seqs, context)
        last, last_sides = (first, first_sides) if steps == 1 else self.decode_point(
            form, seqs, context + seqs * (steps - 1))
        if first_sides != last_sides or not (0 < first < math.inf and 0 < last < math.inf):
            return None
        slope = (last - first) / (steps - 1) if steps > 1 else 0.0
        elapsed = series_s(steps, first, slope)
        if elapsed < budget_s:
            return steps, elapsed, last
        # The smallest run with elapsed(run) >= budget: the root of slope/2 r² + (first - slope/2) r = budget,
        # then a step either way for rounding.
        a, b = slope / 2, first - slope / 2
        root = budget_s / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * budget_s)) / (2 * a)
        run = min(max(1, math.ceil(root)), steps)
        while run > 1 and series_s(run - 1, first, slope) >= budget_s:
            run -= 1
        while run < steps and series_s(run, first, slope) < budget_s:
            run += 1
        return run, series_s(run, first, slope), first + slope * (run - 1)


def _affine(terms: Terms, base: list[float], units: list[list[float]]) -> tuple[float, tuple[float, ...]]:
    """A linear form at d = 0, and its coefficient per window (`ScalarStepTime.decode_form`)."""
    at_zero = sum([seconds * base[feature] for feature, seconds in terms])
    return at_zero, tuple([sum([seconds * unit[feature] for feature, seconds in terms]) for unit in units])


def series_s(run: int, first: float, slope: float) -> float:
    """Seconds of the first `run` steps of a decode run whose step times start at `first` and grow by
    `slope` a step (`ScalarStepTime.decode_run`): an arithmetic series."""
    return run * first + slope * run * (run - 1) / 2
