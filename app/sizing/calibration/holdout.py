"""Leave-one-group-out cross-validation of a fit (`crossval.py` holds GPUs, model families and engines out
with it): each group of measurements predicted by a profile fitted without any of them, at every level of
the profile (`fit.LEVELS`). A fold (one group) reads only its own rows, so folds run in any order, in any
process (`TaskRunner`), to the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from app.sizing.calibration.fit import (
    DEFAULT_EVALUATIONS,
    LEVELS,
    MAX_FIT_ROWS_PER_ENTRY,
    CalibrationProfile,
    FitTarget,
    fit_profile,
    group_by,
)


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One held-out row and what a fit that never saw its group predicts, at each level."""

    group: str
    target: FitTarget
    predicted: dict[str, float]  # by level


# A leave-one-group-out's fold: a group's name -> its rows' predictions (each by level) by a fit without them.
Fold = Callable[[str], list[dict[str, float]]]
# Runs independent pieces of work (a fold for one group, a whole fit): their results in the tasks' order.
TaskRunner = Callable[[Sequence[Callable[[], Any]]], Sequence[Any]]


def in_order(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
    """The tasks one after another, in this process."""
    return [task() for task in tasks]


@dataclass(frozen=True, slots=True)
class GroupFolds:
    """A leave-one-group-out before it runs (`group_folds`): the fold that predicts one group by a fit without
    it, and each group's rows; `tasks` runs the fold once per group in the names' (sorted) order, `held_out`
    assembles their results."""

    fold: Fold
    members: dict[str, list[FitTarget]]  # each group's evaluation targets, in evaluation order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.members))

    @property
    def tasks(self) -> list[Callable[[], list[dict[str, float]]]]:
        """One task per group, in the names' order."""
        return [partial(self.fold, name) for name in self.names]

    def held_out(self, results: Sequence[list[dict[str, float]]]) -> tuple[HeldOut, ...]:
        """The held-out rows, given each group's fold results in the names' order."""
        return tuple(HeldOut(name, t, predicted)
                     for name, predictions in zip(self.names, results, strict=True)
                     for t, predicted in zip(self.members[name], predictions, strict=True))


def group_folds(training: Sequence[FitTarget], evaluation: Sequence[FitTarget], base: CalibrationProfile,
                group: Callable[[FitTarget], str], *, fit_global: bool, max_evaluations: int = DEFAULT_EVALUATIONS,
                max_rows_per_entry: int | None = MAX_FIT_ROWS_PER_ENTRY,
                progress: Callable[[str], None] | None = None) -> GroupFolds:
    """The folds of `leave_one_group_out`, one per group of `evaluation`, for a caller that runs the folds of
    several leave-one-group-outs together."""
    members = group_by(evaluation, group)

    def fold(name: str) -> list[dict[str, float]]:
        others = [t for t in training if group(t) != name]
        if progress:
            progress(f"  held out {name}: fit on {len(others)} rows")
        levels = {level: base for level in LEVELS}
        if others:
            levels = fit_profile(others, base, name="held-out", fit_global=fit_global,
                                 describe=lambda family, dtype, rows: "held-out fit", max_evaluations=max_evaluations,
                                 max_rows_per_entry=max_rows_per_entry).levels
        return [{level: t.predict(profile.efficiency_for(t.family, t.compute_dtype, t.vendor)) for level, profile in levels.items()}
                for t in members[name]]

    return GroupFolds(fold, members)


def leave_one_group_out(training: Sequence[FitTarget], evaluation: Sequence[FitTarget],
                        base: CalibrationProfile, group: Callable[[FitTarget], str], *, fit_global: bool,
                        max_evaluations: int = DEFAULT_EVALUATIONS,
                        max_rows_per_entry: int | None = MAX_FIT_ROWS_PER_ENTRY,
                        progress: Callable[[str], None] | None = None,
                        run_folds: TaskRunner = in_order) -> tuple[HeldOut, ...]:
    """For each group G of `evaluation` (a GPU, a model family, an engine): fit on the `training`
    targets outside G, then predict G's `evaluation` targets under the profile of every level. This is
    the error to expect on a GPU, model family or engine the fit has never seen. `run_folds` runs the
    folds (one per group): nothing a fold computes depends on another, so how they run changes no number."""
    folds = group_folds(training, evaluation, base, group, fit_global=fit_global, max_evaluations=max_evaluations,
                        max_rows_per_entry=max_rows_per_entry, progress=progress)
    return folds.held_out(run_folds(folds.tasks))
