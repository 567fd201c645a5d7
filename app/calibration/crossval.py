"""Cross-validation of a calibration: the error to expect on a GPU, a model family or an engine the fit
has never seen, per metric, and the choice of the shipped profile by that error.

For each way of holding out (`HOLD_OUTS`: a GPU, a model family, an engine) every group is predicted
by a fit on the other groups' rows (`holdout.leave_one_group_out`), at each specificity level of a profile
(`fit.LEVELS`: one global entry; plus an entry per GPU family and one per GPU maker, the fallback of its
GPUs whose family has none; plus one per compute precision within a family). A calibration ships the level
with the lowest held-out error (the mean of the leave-one-GPU-out and leave-one-model-family-out medians; never
the in-sample error), a more specific level only where its lead is more than sampling noise (`level_choice`).
The folds are independent,
so with `jobs` > 1 they run in that many worker processes at once (`task_runner`), every hold-out's folds in
one queue (with the whole fit beside them, `service.calibrate`), to the same numbers.

A model family is the organization that publishes the model's weights on Hugging Face (the prefix of
the catalog's `hf_id`: meta-llama, mistralai, Qwen, deepseek-ai, openai, ...): held out, a family
takes all its generations with it (Llama 2, 3 and 4 together), so nothing of its lineage is seen.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from app.catalog.reference import reference_model_rows
from app.sizing.calibration.fit import (
    DEFAULT_EVALUATIONS,
    FAMILY,
    FAMILY_PRECISION,
    GLOBAL,
    LEVELS,
    MAX_FIT_ROWS_PER_ENTRY,
    CalibrationProfile,
    abs_pct_error,
)
from app.sizing.calibration.holdout import (
    GroupFolds,
    HeldOut,
    TaskRunner,
    group_folds,
    in_order,
    leave_one_group_out,
)
from app.sizing.calibration.predict import E2E_MS, ITL_MS, THROUGHPUT_METRICS, TPOT_MS, TTFT_MS, Measurement
from app.sizing.layout import LAYOUT_KINDS, Layout

# Metric kinds the targets are stated for.
THROUGHPUT, TPOT_ITL, TTFT, E2E = "throughput", "tpot_itl", "ttft", "e2e"
METRIC_KINDS = (THROUGHPUT, TPOT_ITL, TTFT, E2E)
# The error targets per metric kind (median absolute % error, each of leave-one-GPU-out and
# leave-one-model-family-out).
TARGETS = {THROUGHPUT: 12.0, TPOT_ITL: 10.0, TTFT: 20.0, E2E: 12.0}

GPU, MODEL_FAMILY, ENGINE = "gpu", "model_family", "engine"
HOLD_OUTS = (GPU, MODEL_FAMILY, ENGINE)
# The hold-outs the shipped level is chosen by.
CHOOSING_HOLD_OUTS = (GPU, MODEL_FAMILY)
# The interval a held-out median is given with (`median_interval`): its 5th to 95th percentile over this many
# resamples of the rows, drawn with replacement from a fixed seed (the same rows always give the same interval).
MEDIAN_INTERVAL_RESAMPLES = 1000
MEDIAN_INTERVAL_SEED = 0
# A more specific level is shipped only where its score (the mean of the CHOOSING_HOLD_OUTS medians) is lower than
# the level chosen so far in at least this share of paired resamples of the held-out rows (`level_choice`).
CHOICE_CONFIDENCE = 0.95
_RESAMPLES_AT_ONCE = 100  # `better_in`'s draws held in memory at once (100 x the rows)
CHOSEN_BY = ("the lowest mean of the leave-one-GPU-out and leave-one-model-family-out median absolute errors, over "
             "every held-out row, a more specific level shipped only where it is lower than the level chosen so far "
             f"in at least {CHOICE_CONFIDENCE:.0%} of paired resamples of the held-out rows (`choice`)")
LEVEL_DESCRIPTIONS = {GLOBAL: "one global entry", FAMILY: "an entry per GPU family (and per GPU maker)",
                      FAMILY_PRECISION: "an entry per GPU family and compute precision"}


def metric_kind(metric: str) -> str:
    if metric in THROUGHPUT_METRICS:
        return THROUGHPUT
    return {TPOT_MS: TPOT_ITL, ITL_MS: TPOT_ITL, TTFT_MS: TTFT, E2E_MS: E2E}[metric]


@cache
def _model_families() -> dict[str, str]:
    return {row["slug"]: family for row in reference_model_rows()
            if (family := publisher(row.get("hf_id"))) is not None}


def publisher(hf_id: str | None) -> str | None:
    """A model's family (module docstring): the organization of its Hugging Face id; None without one."""
    return hf_id.split("/")[0] if hf_id and "/" in hf_id else None


def model_family(slug: str) -> str:
    """The publisher of the model's weights (module docstring); the slug itself outside the catalog."""
    return _model_families().get(slug, slug)


def group_key(hold_out: str) -> Callable[[Any], str]:
    """The group of a prepared row (`service.PreparedRow`) under a way of holding out."""
    return {GPU: lambda item: item.row.gpu, MODEL_FAMILY: lambda item: model_family(item.row.model),
            ENGINE: lambda item: item.row.engine}[hold_out]


# The tasks the worker processes of `task_runner` run: set before they are forked, so they inherit them (the rows
# and their prepared predictions included) instead of receiving them pickled; only task indices go to them and
# results (predictions, a fitted profile) come back.
_FORKED_TASKS: Sequence[Callable[[], Any]] = ()


def _forked_task(index: int) -> Any:
    return _FORKED_TASKS[index]()


def task_runner(jobs: int) -> TaskRunner:
    """Runs a calibration's independent work (`holdout.TaskRunner`: each fold's fit and predictions, the whole
    fit) one task after another (`jobs` 1), or `jobs` at a time in forked worker processes (the command-line
    tools: a fit takes minutes), each worker taking the next task as it finishes one. A task reads only its
    own rows, so either way gives the same numbers."""
    if jobs <= 1:
        return in_order

    def in_processes(tasks: Sequence[Callable[[], Any]]) -> list[Any]:
        if len(tasks) < 2:
            return in_order(tasks)
        global _FORKED_TASKS
        _FORKED_TASKS = tasks
        try:
            with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)),
                                     mp_context=multiprocessing.get_context("fork")) as pool:
                return list(pool.map(_forked_task, range(len(tasks))))
        finally:
            _FORKED_TASKS = ()

    return in_processes


def hold_out_folds(training: Sequence[Any], evaluation: Sequence[Any], base: CalibrationProfile, *,
                   fit_global: bool, max_evaluations: int = DEFAULT_EVALUATIONS,
                   max_rows_per_entry: int | None = MAX_FIT_ROWS_PER_ENTRY,
                   progress: Callable[[str], None] | None = None) -> dict[str, GroupFolds]:
    """The folds of a cross-validation, per hold-out (`HOLD_OUTS`), ready to run: `cross_validation_document`
    reads their results."""
    return {hold_out: group_folds(training, evaluation, base, group_key(hold_out), fit_global=fit_global,
                                  max_evaluations=max_evaluations, max_rows_per_entry=max_rows_per_entry,
                                  progress=progress)
            for hold_out in HOLD_OUTS}


def fold_tasks(folds: dict[str, GroupFolds]) -> list[Callable[[], Any]]:
    """Every hold-out's folds as one list of tasks, in the order `cross_validation_document` reads results."""
    return [task for item in folds.values() for task in item.tasks]


def cross_validation_document(folds: dict[str, GroupFolds], results: Sequence[Any]) -> dict[str, Any]:
    """The cross-validation document of a calibration (stored in its provenance), from the results of
    `fold_tasks(folds)` in their order: per hold-out, per level, the held-out errors overall, per metric kind
    and per group; and the chosen level."""
    ran = iter(results)
    held_outs = {hold_out: item.held_out([next(ran) for _ in item.names]) for hold_out, item in folds.items()}
    candidates = {level: {hold_out: _median(_errors(_kept(held, level), level))
                          for hold_out, held in held_outs.items()}
                  for level in LEVELS}
    chosen, choice = level_choice(held_outs, candidates)
    return {
        "chosen_level": chosen,
        "chosen_by": CHOSEN_BY,
        "levels": {level: LEVEL_DESCRIPTIONS[level] for level in LEVELS},
        "candidates": candidates,
        "choice": choice,
        "targets": TARGETS,
        "hold_outs": [_hold_out_document(hold_out, held, chosen) for hold_out, held in held_outs.items()],
    }


def cross_validate_groups(training: Sequence[Any], evaluation: Sequence[Any], base: CalibrationProfile,
                          hold_out: str, groups: Sequence[str], *, fit_global: bool,
                          max_evaluations: int = DEFAULT_EVALUATIONS,
                          progress: Callable[[str], None] | None = None,
                          jobs: int = 1) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Only the named `groups` of one hold-out, each predicted by a fit on every other group's rows (as
    a whole cross-validation predicts them): their held-out document at each level, and the rows behind it
    (`held_out_rows`). A quick look at a change on the groups it is about (four GPUs take about a quarter of
    a whole cross-validation's fits); never a choice of level, which takes every group."""
    key = group_key(hold_out)
    held = leave_one_group_out(training, [target for target in evaluation if key(target) in set(groups)], base, key,
                               fit_global=fit_global, max_evaluations=max_evaluations, progress=progress,
                               run_folds=task_runner(jobs))
    document = {"held_out": hold_out, "groups": sorted({item.group for item in held}),
                "levels": {level: _hold_out_document(hold_out, held, level) for level in LEVELS}}
    return document, held_out_rows(held)


# The columns of `held_out_rows`, in order (the CSV `python -m app.calibrate --hold-out ... --rows FILE` writes).
HELD_OUT_ROW_FIELDS = ("row_id", "source_id", "held_out_group", "model", "gpu", "engine", "engine_version",
                       "metric", "stat", "layout_kind", "layout", "isl", "osl", "concurrency", "batch", "measured",
                       *(f"{column}_{level}" for level in LEVELS for column in ("predicted", "abs_pct_error")))


def held_out_rows(held: Sequence[HeldOut]) -> list[dict[str, Any]]:
    """One record per held-out row (HELD_OUT_ROW_FIELDS): what it measured, and what a fit that never saw its
    group predicts at each level with its absolute % error (both None where the prediction is not a positive
    number: the summaries leave such rows out too). Where a median hides which rows a change moved, these
    show them; the run's stated version, layout (`stated_layout`), lengths and load let them be grouped
    without going back to the measurements file."""
    records = []
    for item in held:
        row = item.target.row
        m = row.measurement
        record = {"row_id": row.row_id, "source_id": row.source_id, "held_out_group": item.group,
                  "model": row.model, "gpu": row.gpu, "engine": row.engine, "engine_version": m.engine_version,
                  "metric": row.metric, "stat": row.stat, "layout_kind": _layout_kind(item),
                  "layout": stated_layout(m), "isl": m.isl, "osl": m.osl, "concurrency": m.concurrency,
                  "batch": m.batch, "measured": item.target.measured}
        for level in LEVELS:
            valid = _scored(item, level)
            record[f"predicted_{level}"] = float(item.predicted[level]) if valid else None
            record[f"abs_pct_error_{level}"] = abs_pct_error(item.predicted[level], item.target.measured) if valid else None
        records.append(record)
    return records


def level_choice(held_outs: dict[str, Sequence[HeldOut]],
                 candidates: dict[str, dict[str, float | None]]) -> tuple[str, list[dict[str, Any]]]:
    """The level a calibration ships, and each step of the choice. The levels are tried from the general to
    the specific (LEVELS): a level replaces the one chosen so far only when its score (`_choice_score` of
    `candidates`: the mean of the CHOOSING_HOLD_OUTS medians) is lower in at least CHOICE_CONFIDENCE of the
    paired resamples of the held-out rows (`better_in`). A level with no score is never chosen.

    Why not the lowest score alone: a more specific level has more entries, each fitted on fewer rows, and
    its score differs from the simpler level's by what these rows happened to show as well as by what it
    models better. The 2026-12-05 refit scored "an entry per GPU family" 20.66 and "family and precision"
    20.67; the refit before it had them the other way round, and the shipped layout figures flipped with
    them (DP+EP TTFT 23.0 <-> 30.5%). The simpler level ships unless the data show the other better beyond
    that noise."""
    chosen, steps = LEVELS[0], []
    for level in LEVELS[1:]:
        score, against = _choice_score(candidates[level]), _choice_score(candidates[chosen])
        better = better_in(held_outs, chosen, level) if np.isfinite(score) else 0.0
        step = {"level": level, "against": chosen, "score": score if np.isfinite(score) else None,
                "against_score": against if np.isfinite(against) else None, "better_in": better,
                "chosen": bool(better >= CHOICE_CONFIDENCE)}
        steps.append(step)
        if step["chosen"]:
            chosen = level
    return chosen, steps


def better_in(held_outs: dict[str, Sequence[HeldOut]], simpler: str, specific: str) -> float:
    """The share of paired resamples in which `specific`'s score is lower than `simpler`'s: each of the
    CHOOSING_HOLD_OUTS' rows scored at both levels are drawn with replacement (MEDIAN_INTERVAL_RESAMPLES draws
    of as many rows, from MEDIAN_INTERVAL_SEED), the same draws for both levels, and each draw's score is the
    mean over the hold-outs of the median error. Rows of one source err together, which single-row draws do
    not see: the share overstates the confidence, so the rule errs toward the more specific level."""
    rng = np.random.default_rng(MEDIAN_INTERVAL_SEED)
    difference = np.zeros(MEDIAN_INTERVAL_RESAMPLES)
    for hold_out in CHOOSING_HOLD_OUTS:
        both = [item for item in held_outs[hold_out] if _scored(item, simpler) and _scored(item, specific)]
        if not both:
            return 0.0
        errors = {level: np.asarray(_errors(both, level)) for level in (simpler, specific)}
        for start in range(0, MEDIAN_INTERVAL_RESAMPLES, _RESAMPLES_AT_ONCE):
            count = min(_RESAMPLES_AT_ONCE, MEDIAN_INTERVAL_RESAMPLES - start)
            draws = rng.integers(0, len(both), (count, len(both)))
            difference[start:start + count] += (np.median(errors[specific][draws], axis=1)
                                                - np.median(errors[simpler][draws], axis=1))
    return float(np.mean(difference < 0))


def _choice_score(medians: dict[str, float | None]) -> float:
    values = [medians[hold_out] for hold_out in CHOOSING_HOLD_OUTS]
    return float("inf") if any(value is None for value in values) else float(np.mean(values))


def _scored(item: HeldOut, level: str) -> bool:
    """Whether the held-out prediction at `level` is a positive finite number (an error can be scored)."""
    return bool(np.isfinite(item.predicted[level]) and item.predicted[level] > 0)


def _kept(held: Sequence[HeldOut], level: str, keep: Callable[[HeldOut], bool] = lambda item: True) -> list[HeldOut]:
    return [item for item in held if keep(item) and _scored(item, level)]


def _errors(items: Sequence[HeldOut], level: str) -> list[float]:
    return [abs_pct_error(item.predicted[level], item.target.measured) for item in items]


def _hold_out_document(hold_out: str, held: Sequence[HeldOut], level: str) -> dict[str, Any]:
    def stats(keep: Callable[[HeldOut], bool] = lambda item: True) -> dict[str, Any]:
        return _stats(_kept(held, level, keep), level)

    return {
        "held_out": hold_out,
        "overall": stats(),
        "by_metric": {kind: stats(lambda item, kind=kind: metric_kind(item.target.row.metric) == kind)
                      for kind in METRIC_KINDS},
        "by_group": [{"group": name, **stats(lambda item, name=name: item.group == name)}
                     for name in sorted({item.group for item in held})],
        "by_layout": [{"layout_kind": kind,
                       "by_metric": {metric: stats(lambda item, kind=kind, metric=metric: _layout_kind(item) == kind
                                                   and metric_kind(item.target.row.metric) == metric)
                                     for metric in METRIC_KINDS}}
                      for kind in LAYOUT_KINDS if any(_layout_kind(item) == kind for item in held)],
    }


def stated_layout(m: Measurement) -> str:
    """The layout a run states, as a plan labels it (`Layout.label`: `TP8 EP8 PP1`), and a disaggregated run's
    pools as `P 1x TP1 DP8 EP8 PP1 b1 | D 3x TP8 EP8 PP1 b2` (workers x each worker's layout, b: its stated batch
    per rank); empty where the source states no tensor parallel degree."""
    if m.disaggregated and m.prefill is not None and m.decode is not None:
        return " | ".join(f"{role} {pool.workers}x {Layout(pool.tp, pool.pp, pool.dp, pool.ep).label}"
                          + ("" if pool.batch is None else f" b{pool.batch}")
                          for role, pool in (("P", m.prefill), ("D", m.decode)))
    return "" if m.tp is None else Layout(m.tp, m.pp or 1, m.dp or 1, m.ep or 1).label


def _layout_kind(item: HeldOut) -> str:
    """The layout family of a held-out row's run (TP only, attention DP / EP, pipeline, disaggregated)."""
    return item.target.row.measurement.layout_kind


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def median_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 90% bootstrap interval of the median of `values`: the 5th and 95th percentiles of the medians of
    MEDIAN_INTERVAL_RESAMPLES resamples of them (each as many values, drawn with replacement, from the fixed
    MEDIAN_INTERVAL_SEED); None for no values. It says how far the median could move had other rows of the
    same kind been measured. Rows of one source or run err together (they share what the model lacks of
    them), which resampling single rows does not see: the true spread is likely wider."""
    if not values:
        return None
    data = np.asarray(values, dtype=float)
    draws = np.random.default_rng(MEDIAN_INTERVAL_SEED).integers(0, len(data), (MEDIAN_INTERVAL_RESAMPLES, len(data)))
    low, high = np.percentile(np.median(data[draws], axis=1), [5, 95])
    return float(low), float(high)


def _stats(items: list[HeldOut], level: str) -> dict[str, Any]:
    """The rows' count, median absolute % error with its 90% interval (`median_interval`), 90th percentile
    absolute % error, and median predicted / measured (the direction: below 1 the predictions ran low)."""
    errors = _errors(items, level)
    interval = median_interval(errors)
    return {"rows": len(items), "median_abs_pct_error": _median(errors),
            "median_abs_pct_error_low": interval[0] if interval else None,
            "median_abs_pct_error_high": interval[1] if interval else None,
            "p90_abs_pct_error": float(np.percentile(errors, 90)) if errors else None,
            "median_ratio": _median([float(item.predicted[level]) / item.target.measured for item in items])}


def held_out_error(validation: dict[str, Any] | None, *, layout_kind: str, gpus: Sequence[str],
                   model_family: str | None, engine: str | None) -> dict[str, Any] | None:
    """What a profile's cross-validation (its provenance's `cross_validation`, as `_hold_out_document` wrote
    it) says of one kind of prediction: the leave-one-GPU-out errors of every held-out row of `layout_kind`,
    by metric kind (a metric kind with no such rows is left out: its error is unmeasured), and the held-out
    error of each of `gpus`, of `model_family` and of `engine` that the profile's data has rows of (each
    group's rows predicted by a fit that never saw the group; no engine's for `engine` None). None for a profile
    without cross-validation."""
    if not validation:
        return None
    hold_outs = {item["held_out"]: item for item in validation.get("hold_outs", [])}

    def group(hold_out: str, name: str | None) -> dict[str, Any] | None:
        groups = hold_outs[hold_out]["by_group"] if hold_out in hold_outs else []
        return next((item for item in groups if item["group"] == name), None)

    layouts = hold_outs[GPU].get("by_layout", []) if GPU in hold_outs else []
    by_metric = next((item["by_metric"] for item in layouts if item["layout_kind"] == layout_kind), {})
    return {
        "held_out": GPU,
        "layout_kind": layout_kind,
        "by_metric": {kind: stats for kind, stats in by_metric.items() if stats["rows"]},
        "gpus": [found for found in (group(GPU, slug) for slug in dict.fromkeys(gpus)) if found is not None],
        "model_family": group(MODEL_FAMILY, model_family),
        "engine": group(ENGINE, engine),
        "targets": dict(validation.get("targets", {})),
    }
