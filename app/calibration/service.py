"""Validation and calibration against published measurements: the orchestration behind
`python -m app.validate`, `python -m app.calibrate`, POST /v1/validate and POST /v1/calibrations.

Rows (the schema of `measured-calibration.csv`) -> specs from a catalog -> `predict.prepare` per row
(rows it cannot predict are skipped with the reason) -> predictions under a profile -> errors by
scenario x metric x GPU family. Validation never fits and never reads a measured value while
predicting (the core's `Measurement` does not even carry it). Calibration fits a profile
(`fit.fit_profile`) on the rows whose schedule does not depend on the step time, and reports its error
before and after, and leave-one-source-out.

Longer than 600 lines because validation and calibration share one pipeline (rows read, resolved
against the catalog, predicted, compared): splitting it would pass that pipeline's private state between
modules.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache, partial
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

from app.calibration.crossval import (
    cross_validate_groups,
    cross_validation_document,
    fold_tasks,
    hold_out_folds,
    task_runner,
)
from app.calibration.profiles import (
    BUILTIN_DESCRIPTION,
    BUILTIN_PROFILE,
    RESERVED_PROFILE_NAMES,
    builtin_profile,
    default_profile_name,
    get_profile,
    get_record,
    page_of_records,
    profile_document,
    profile_from_entries,
    store_profile,
)
from app.calibration.rows import ObservedRow, RowsInvalid, observed_rows
from app.calibration.schemas import (
    CalibrationRequest,
    CalibrationResponse,
    ContradictionOut,
    ErrorSummaryOut,
    MeasurementRowIn,
    ProfileEntryOut,
    ProfileList,
    ProfileOut,
    ProfileSummaryOut,
    ProvenanceOut,
    RowResultOut,
    ValidationRequest,
    ValidationResponse,
)
from app.calibration.tables import CalibrationProfileRecord
from app.catalog import service as catalog_service
from app.catalog.reference import (
    gpu_spec_from_record,
    model_spec_from_record,
    reference_gpu_rows,
    reference_model_rows,
)
from app.catalog.tables import ORIGIN_USER
from app.errors import Conflict, NotFound, Unprocessable
from app.estimates.schemas import ComputeCurvePoint
from app.sizing import CALCULATION_VERSION
from app.sizing.calibration.fit import (
    DEFAULT_EVALUATIONS,
    GLOBAL_PARAMETERS,
    MAX_FIT_ROWS_PER_ENTRY,
    MIN_ROWS_PER_ENTRY,
    PRIOR_WEIGHT,
    CalibrationProfile,
    FitTarget,
    ProfileEntry,
    abs_pct_error,
    fit_profile,
    fitted_sources,
    keep_going,
    mark_pinned,
    parameters_at_bounds,
    same_fits,
)
from app.sizing.calibration.predict import (
    BATCH1,
    CLOSED_LOOP,
    ITL_MS,
    LATENCY_METRICS,
    POISSON,
    PUBLISHED_UNIT_PER_SI,
    STATIC_BATCH,
    THROUGHPUT_METRICS,
    TPOT_MS,
    TTFT_MS,
    UNSTATED_STAT,
    Measurement,
    PreparedPrediction,
    Unpredictable,
    needs_simulation,
    prepare,
)
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.layout import LAYOUT_KINDS
from app.sizing.specs import GpuSpec, ModelSpec

# An open-loop run counts as light load while it offers at most half of what the engine serves at most.
LIGHT_LOAD_UTILIZATION = 0.5

THROUGHPUT = "throughput"
LATENCY_LIGHT_LOAD = "latency_light_load"
LATENCY_LOADED = "latency_loaded"
CATEGORIES = (THROUGHPUT, LATENCY_LIGHT_LOAD, LATENCY_LOADED)


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Specs ----------------------------------------------------------------------------------------

class SpecCatalog(Protocol):
    def model(self, slug: str) -> ModelSpec | None: ...

    def gpu(self, slug: str) -> GpuSpec | None: ...


class ReferenceCatalog:
    """The catalog shipped in app/data, without a database (the command-line tools use it)."""

    def model(self, slug: str) -> ModelSpec | None:
        return _reference_specs()[0].get(slug)

    def gpu(self, slug: str) -> GpuSpec | None:
        return _reference_specs()[1].get(slug)


@cache
def _reference_specs() -> tuple[dict[str, ModelSpec], dict[str, GpuSpec]]:
    models = {row["slug"]: model_spec_from_record(SimpleNamespace(**row)) for row in reference_model_rows()}
    gpus = {row["slug"]: gpu_spec_from_record(SimpleNamespace(**row)) for row in reference_gpu_rows()}
    return models, gpus


class DatabaseCatalog:
    """The service's catalog, user rows included (the API uses it)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def model(self, slug: str) -> ModelSpec | None:
        try:
            return catalog_service.get_model_spec(self._session, slug)
        except NotFound:
            return None

    def gpu(self, slug: str) -> GpuSpec | None:
        try:
            return catalog_service.get_gpu_spec(self._session, slug)
        except NotFound:
            return None


# Predicting -----------------------------------------------------------------------------------

# A light load: up to 8 users per scheduler, whose 1k-token prompts (most published closed loops) fit one step
# of the engines' 8,192-token budgets (SIZING.md section 7, ENGINES.md), so a prompt waits at most one
# prefill step for the others' whether the harness keeps its users in step or not.
LIGHT_LOAD_USERS = 8


@dataclass(frozen=True, slots=True, eq=False)
class PreparedRow:
    """A row ready to predict under any efficiency (a `fit.FitTarget`)."""

    row: ObservedRow
    prediction: PreparedPrediction
    family: str
    vendor: str = ""  # the GPU's maker, whose profile entry answers when its family has none

    @property
    def measured(self) -> float:
        return self.row.value

    @property
    def source_id(self) -> str:
        return self.row.source_id

    @property
    def compute_dtype(self) -> str:
        return self.prediction.compute_dtype

    @property
    def pays_host_work(self) -> bool:
        return self.prediction.pays_host_work

    @property
    def pays_overlapped_host_work(self) -> bool:
        return self.prediction.pays_overlapped_host_work

    @property
    def pays_prefill_overhead(self) -> bool:
        return self.prediction.pays_prefill_overhead

    @property
    def pays_pcie_link(self) -> bool:
        return self.prediction.pays_pcie_link

    @property
    def fittable(self) -> bool:
        """A fit reads the row: its schedule does not depend on the step time (not a Poisson run), its
        precision is stated (an efficiency fitted to an assumed precision would turn the guess into a number),
        and it is not the TTFT of a closed loop of more than LIGHT_LOAD_USERS users per scheduler: that is
        mostly queueing behind the other users' prompts, and how much depends on whether the harness keeps its
        users in step (the same lengths for everyone, all sent at once) or lets them drift apart, which no
        closed-loop source states. They are predicted in step; spreading each user's first request over its
        cycle instead moved those rows' median error from 40-44% to 70-92% (TensorRT-LLM, vLLM, SGLang).
        Fitted to them, the efficiencies would absorb the harness. At a light load the others' prompts take
        one prefill step at most, in step or not: the TTFT measures the prompt steps (`measures_steps`), and is
        read only where the row pays the cost of MoE prompt steps, the one efficiency fitted to it. A
        disaggregated run's TPOT is simulated afresh per efficiency, and read for one parameter alone
        (`measures_decode_worker_step`)."""
        return self.unfitted_reason is None

    @property
    def unfitted_reason(self) -> str | None:
        """Why a fit does not read the row, in words (None: it does; `fittable` says why each)."""
        m = self.prediction.measurement
        users = self.prediction.users_per_scheduler
        if not (self.prediction.timing_invariant or self.measures_decode_worker_step):
            return "an open-loop (Poisson) run, whose schedule depends on the step time"
        if m.weight_dtype is None:
            return "its weight dtype is not stated"
        if m.metric == TTFT_MS and users is not None and users > LIGHT_LOAD_USERS:
            return f"the TTFT of a closed loop of more than {LIGHT_LOAD_USERS} users per scheduler"
        if not self.measures_steps and not self.pays_prefill_overhead and not self.measures_decode_worker_step:
            return "a closed loop's TTFT, read only for the cost of an MoE model's prompt steps"
        return None

    @property
    def measures_latency(self) -> bool:
        return self.row.metric in LATENCY_METRICS

    @property
    def measures_steps(self) -> bool:
        """Whether every efficiency is fitted to it: not the TTFT of a closed loop of several users, even at a
        light load, where vLLM's users of dense models come out 2-4x faster than in step and TensorRT-LLM's
        and SGLang's slower (fitted to them, the throughput and E2E errors on the four NVIDIA GPUs of the
        layout rows rose 14.9 -> 17.5% and 24.9 -> 33.9%, 2026-12-04). Such a row measures only the cost of
        an MoE model's prompt steps, fitted with everything else held (`fit.fit_profile`). Nor is a disaggregated
        run's TPOT (`measures_decode_worker_step`)."""
        m = self.prediction.measurement
        return not (m.scenario == CLOSED_LOOP and m.metric == TTFT_MS and (m.concurrency or 1) > 1
                    or self.measures_decode_worker_step)

    @property
    def measures_decode_worker_step(self) -> bool:
        """Whether it is the TPOT (or ITL) of a disaggregated run: what it measures beyond an aggregated run's
        steps is what a decode worker's step costs more (`fit.fit_decode_worker_step`), fitted with everything
        else held; the other efficiencies are read on aggregated runs (a disaggregated run is simulated afresh
        per efficiency, too slow for the search)."""
        m = self.prediction.measurement
        return m.decode is not None and m.metric in (TPOT_MS, ITL_MS)

    def predict(self, efficiency: Efficiency) -> float:
        """The prediction in the metric's published unit (ms for latencies)."""
        return self.prediction.predict(efficiency) * PUBLISHED_UNIT_PER_SI[self.row.metric]

    @property
    def assumption(self) -> str | None:
        """What the prediction assumes that the row does not state."""
        m = self.prediction.measurement
        assumptions = list(self.prediction.assumptions)  # the predictor's (weight-only compute, dataset lengths)
        if m.metric in LATENCY_METRICS and m.stat is None:
            assumptions.insert(0, f"the source does not state the statistic of {m.metric}: predicted as the "
                                  f"{UNSTATED_STAT}")
        return "; ".join(assumptions) or None


def prepare_rows(rows: Sequence[ObservedRow], catalog: SpecCatalog,
                 check: Callable[[], None] = keep_going) -> tuple[list[PreparedRow], dict[str, str]]:
    """Prepared rows, and the reason for every row that cannot be predicted (by row id). A model or GPU the
    catalog lacks is the reason first, whatever else the row leaves out: no prediction could be made for it
    even with every other cell stated. `check` is called before each row (whatever it raises stops the work:
    a request past its deadline)."""
    prepared, skipped = [], {}
    for row in rows:
        check()
        model, gpu = catalog.model(row.model), catalog.gpu(row.gpu)
        if model is None:
            skipped[row.row_id] = _named_reason(row, f"unknown model slug {row.model!r}")
        elif gpu is None:
            skipped[row.row_id] = _named_reason(row, f"unknown GPU slug {row.gpu!r}")
        elif row.measurement is None:
            skipped[row.row_id] = row.skipped_reason or "not predictable"
        else:
            try:
                prepared.append(PreparedRow(row, prepare(row.measurement, model, gpu), gpu.family, gpu.vendor))
            except Unpredictable as exc:
                skipped[row.row_id] = str(exc)
    return prepared, skipped


@dataclass(frozen=True, slots=True)
class RowOutcome:
    row: ObservedRow
    family: str  # "" when the GPU is unknown
    predicted: float | None
    skipped_reason: str | None
    category: str | None
    assumption: str | None = None  # what the prediction assumed that the row does not state

    @property
    def abs_pct_error(self) -> float | None:
        return None if self.predicted is None else abs_pct_error(self.predicted, self.row.value)


@dataclass(frozen=True, slots=True)
class ErrorStats:
    rows: int
    median_abs_pct_error: float | None
    p90_abs_pct_error: float | None

    @classmethod
    def of(cls, errors: Sequence[float]) -> ErrorStats:
        if not errors:
            return cls(0, None, None)
        return cls(len(errors), float(np.median(errors)), float(np.percentile(errors, 90)))


@dataclass(frozen=True, slots=True)
class Summary:
    rows_total: int
    rows_predicted: int
    overall: ErrorStats
    categories: dict[str, ErrorStats]
    by_group: tuple[tuple[tuple[str, str, str], ErrorStats], ...]  # ((scenario, metric, family), stats)
    by_layout: tuple[tuple[tuple[str, str], ErrorStats], ...]  # ((layout kind, metric), stats)
    skipped_reasons: dict[str, int]

    @property
    def predicted_ratio(self) -> float:
        return self.rows_predicted / self.rows_total if self.rows_total else 0.0


# Predicted rows that state the same configuration (one prediction serves them all) contradict each other when
# their measured values differ by at least this factor: something the rows do not record differs (an engine
# setting such as speculative decoding, the harness, the run). AIC_SILICON_SAMPLE-5816 and -6360 state DeepSeek-R1
# fp8 on 8 B200 (TP8, TensorRT-LLM 1.2.0, 4 users, 1k/1k) alike and measure a TPOT of 10.30 and 5.38 ms. At x1.3
# one of two such rows is off by at least 0.3 / 2.3 = 13% whatever the prediction (`least_worst_error_pct`), the
# size of the 10-20% median errors the cross-validation is held to.
# That pair is one of 30 configurations of DeepSeek on B200 that aiconfigurator's file states alike under the images
# TensorRT-LLM 1.2.0rc6.post2 and .post3 (2026-12-08): .post3's TPOT is x0.62 of .post2's at the median (its TTFT
# x1.12), a step as short as speculative decoding (DeepSeek's MTP) would make it; the file records no such setting.
# Held out by GPU, B200's DeepSeek TPOT is predicted at x1.01 on .post2 (TP only, 50 rows) and x0.97 (DP+EP, 6 rows),
# at x1.54 on .post3 (42 rows) and x1.38 (DP+EP: 12 of the 145 DP+EP TPOT rows, at a median error of 37.6% where all
# 145 are at 10.4%). Leaving every row of such a group out of the fit (52 of the rows it reads) took the DP+EP TPOT
# error to 13.3% and all four GPUs' rows 18.5% -> 18.9%: the fit reads them still.
CONTRADICTION_RATIO = 1.3


@dataclass(frozen=True, slots=True)
class Contradiction:
    """Predicted rows stating one configuration (model, GPU and every column a prediction reads) whose measured
    values differ by at least CONTRADICTION_RATIO (`contradictions`)."""

    outcomes: tuple[RowOutcome, ...]  # in input order

    @property
    def low(self) -> float:
        return min(outcome.row.value for outcome in self.outcomes)

    @property
    def high(self) -> float:
        return max(outcome.row.value for outcome in self.outcomes)

    @property
    def ratio(self) -> float:
        return self.high / self.low

    @property
    def least_worst_error_pct(self) -> float:
        """The least error the worst-predicted row can have, whatever the one prediction p: its error on the
        lowest value, p / low - 1, grows with p and its error on the highest, 1 - p / high, falls, so the larger
        of the two is least where they meet, at p = 2 low high / (low + high): 100 (high - low) / (high + low)."""
        return 100 * (self.high - self.low) / (self.high + self.low)


@dataclass(frozen=True, slots=True)
class Report:
    profile: str
    outcomes: tuple[RowOutcome, ...]
    summary: Summary
    contradictions: tuple[Contradiction, ...]  # `contradictions(outcomes)`, widest first

    def worst(self, count: int) -> list[RowOutcome]:
        predicted = [outcome for outcome in self.outcomes if outcome.predicted is not None]
        return sorted(predicted, key=lambda outcome: -(outcome.abs_pct_error or 0.0))[:count]


def contradictions(outcomes: Sequence[RowOutcome]) -> tuple[Contradiction, ...]:
    """Groups of predicted rows the stated columns cannot tell apart (the same model, GPU and `Measurement`, so
    the same prediction) whose measured values differ by at least CONTRADICTION_RATIO, widest first. No model of
    those columns can be close to every row of such a group."""
    groups: dict[tuple[str, str, Measurement], list[RowOutcome]] = {}
    for outcome in outcomes:
        if outcome.predicted is not None:
            row = outcome.row
            groups.setdefault((row.model, row.gpu, row.measurement), []).append(outcome)
    found = [Contradiction(tuple(group)) for group in groups.values() if len(group) > 1]
    return tuple(sorted((group for group in found if group.ratio >= CONTRADICTION_RATIO),
                        key=lambda group: -group.ratio))


def category(prepared: PreparedRow, efficiency: Efficiency) -> str:
    """Throughput; latency at light load (one stream, a static batch of one, an open loop at most half
    loaded); or latency under load (everything else)."""
    m = prepared.row.measurement
    if m.metric in THROUGHPUT_METRICS:
        return THROUGHPUT
    if m.scenario == BATCH1 or (m.scenario == STATIC_BATCH and m.batch == 1) or (
            m.scenario == CLOSED_LOOP and m.concurrency == 1):
        return LATENCY_LIGHT_LOAD
    if m.scenario == POISSON:
        utilization = prepared.prediction.utilization(efficiency)
        if utilization is not None and utilization <= LIGHT_LOAD_UTILIZATION:
            return LATENCY_LIGHT_LOAD
    return LATENCY_LOADED


def evaluate(rows: Sequence[ObservedRow], prepared: Sequence[PreparedRow], skipped: dict[str, str],
             profile: CalibrationProfile, check: Callable[[], None] = keep_going) -> Report:
    """Predict every prepared row under `profile` and summarize the errors (rows in input order); `check` is
    called before each row, as in `prepare_rows`."""
    by_id = {item.row.row_id: item for item in prepared}
    outcomes = []
    for row in rows:
        check()
        item = by_id.get(row.row_id)
        if item is None:
            outcomes.append(RowOutcome(row, "", None, skipped[row.row_id], None))
            continue
        efficiency = profile.efficiency_for(item.family, item.compute_dtype, item.vendor)
        try:
            predicted = item.predict(efficiency)
        except Unpredictable as exc:  # a run simulated afresh per efficiency (Poisson) may find it cannot be
            outcomes.append(RowOutcome(row, item.family, None, str(exc), None))
            continue
        if not (math.isfinite(predicted) and predicted > 0):  # never expected; never reported as a number
            outcomes.append(RowOutcome(row, item.family, None, f"no finite prediction ({predicted})", None))
            continue
        outcomes.append(RowOutcome(row, item.family, predicted, None, category(item, efficiency), item.assumption))
    return Report(profile.name, tuple(outcomes), summarize(outcomes), contradictions(outcomes))


def summarize(outcomes: Sequence[RowOutcome]) -> Summary:
    predicted = [outcome for outcome in outcomes if outcome.predicted is not None]
    groups: dict[tuple[str, str, str], list[float]] = {}
    kinds: dict[tuple[str, str], list[float]] = {}
    for outcome in predicted:
        m = outcome.row.measurement  # predicted rows always have one
        groups.setdefault((outcome.row.scenario, outcome.row.metric, outcome.family), []).append(
            outcome.abs_pct_error)
        kinds.setdefault((m.layout_kind, m.metric), []).append(outcome.abs_pct_error)
    return Summary(
        rows_total=len(outcomes),
        rows_predicted=len(predicted),
        overall=ErrorStats.of([outcome.abs_pct_error for outcome in predicted]),
        categories={name: ErrorStats.of([outcome.abs_pct_error for outcome in predicted if outcome.category == name])
                    for name in CATEGORIES},
        by_group=tuple((key, ErrorStats.of(errors)) for key, errors in sorted(groups.items())),
        by_layout=tuple((key, ErrorStats.of(errors))
                        for key, errors in sorted(kinds.items(), key=lambda item: (LAYOUT_KINDS.index(item[0][0]),
                                                                                   item[0][1]))),
        skipped_reasons=dict(Counter(_reason_kind(outcome.skipped_reason) for outcome in outcomes
                                     if outcome.skipped_reason is not None).most_common()),
    )


def _named_reason(row: ObservedRow, reason: str) -> str:
    """`reason`, or the row's own reason for skipping where it says the same and more (a Hugging Face id's
    catalog slug, `rows._vocabulary_reason`)."""
    return row.skipped_reason if row.skipped_reason and row.skipped_reason.startswith(reason) else reason


def _reason_kind(reason: str) -> str:
    """The reason without its row-specific details (for counting): up to its first colon or quoted value, e.g.
    'unknown model slug' of "unknown model slug 'foo'"; an apostrophe inside a word ("the run's id") stays."""
    return reason.split(":")[0].split(" '")[0].strip()


def validate(rows: Sequence[ObservedRow], catalog: SpecCatalog, profile: CalibrationProfile,
             check: Callable[[], None] = keep_going) -> Report:
    prepared, skipped = prepare_rows(rows, catalog, check)
    return evaluate(rows, prepared, skipped, profile, check)


def row_document(outcome: RowOutcome) -> dict[str, Any]:
    """One row of a report as JSON (the API's RowResultOut and the validator's --json rows)."""
    row = outcome.row
    return {"row_id": row.row_id, "source_id": row.source_id, "model": row.model, "gpu": row.gpu,
            "scenario": row.scenario, "metric": row.metric, "stat": row.stat, "measured": row.value,
            "predicted": outcome.predicted, "abs_pct_error": outcome.abs_pct_error,
            "skipped_reason": outcome.skipped_reason, "assumption": outcome.assumption}


def contradiction_document(group: Contradiction) -> dict[str, Any]:
    """A group of rows the stated columns cannot tell apart as JSON (the API's ContradictionOut and the
    validator's --json contradictions)."""
    return {"row_ids": [outcome.row.row_id for outcome in group.outcomes], "metric": group.outcomes[0].row.metric,
            "low": group.low, "high": group.high, "ratio": group.ratio,
            "least_worst_error_pct": group.least_worst_error_pct}


def summary_document(summary: Summary) -> dict[str, Any]:
    """A summary as JSON (the API's ErrorSummaryOut and the validator's --json summary)."""
    return {
        "rows_total": summary.rows_total,
        "rows_predicted": summary.rows_predicted,
        "rows_skipped": summary.rows_total - summary.rows_predicted,
        "predicted_ratio": summary.predicted_ratio,
        "overall": _stats_document(summary.overall),
        **{name: _stats_document(stats) for name, stats in summary.categories.items()},
        "by_group": [{"scenario": scenario, "metric": metric, "gpu_family": family, **_stats_document(stats)}
                     for (scenario, metric, family), stats in summary.by_group],
        "by_layout": [{"layout_kind": kind, "metric": metric, **_stats_document(stats)}
                      for (kind, metric), stats in summary.by_layout],
        "skipped_reasons": summary.skipped_reasons,
    }


# Calibrating ----------------------------------------------------------------------------------

class NothingToFit(ValueError):
    """None of the rows can be used by a fit."""


@dataclass(frozen=True, slots=True)
class Calibration:
    profile: CalibrationProfile
    document: dict[str, Any]  # the stored form (profiles.profile_document)
    before: Report
    after: Report


def calibrate(rows: Sequence[ObservedRow], catalog: SpecCatalog, *, name: str, description: str,
              base: CalibrationProfile, fit_global: bool, cross_validation: bool, source_file: str,
              source_sha256: str, now: datetime | None = None, max_evaluations: int = DEFAULT_EVALUATIONS,
              progress: Callable[[str], None] | None = None, jobs: int = 1,
              check: Callable[[], None] = keep_going) -> Calibration:
    """Fit a profile to the rows, starting from `base` (see fit.fit_profile), with its provenance.

    Only rows whose schedule does not depend on the step time take part in the fit (all but Poisson
    runs, which would need a fresh simulation for every trial efficiency), and only rows that state their
    weight dtype (`PreparedRow.fittable`); every predicted row is reported before and after. With
    `cross_validation`, the profile's specificity level is the one with the lowest held-out error, a more
    specific one only where its lead is more than sampling noise (`crossval.level_choice`); without it, the
    most specific level. `jobs` > 1 runs the whole fit and the cross-validation's folds in that many worker
    processes at once (`crossval.task_runner`): the same numbers, sooner. `check` is called before each row
    prepared or predicted and each entry fitted (whatever it raises stops the work: a request past its
    deadline); the cross-validation's folds do not call it.
    """
    now = now or datetime.now(UTC)
    say = progress or (lambda message: None)
    prepared, skipped = prepare_rows(rows, catalog, check)
    training = [item for item in prepared if item.fittable]
    if not training:
        unfitted = Counter(item.unfitted_reason for item in prepared)
        reasons = [f"{count} predicted row{'s' if count > 1 else ''}: {reason}" for reason, count in unfitted.items()]
        reasons += [f"{count} skipped: {kind}" for kind, count in Counter(map(_reason_kind, skipped.values())).items()]
        raise NothingToFit("no row can be used by a fit: " + "; ".join(reasons[:6]))
    say(f"{len(prepared)} of {len(rows)} rows predicted, {len(training)} used by the fit")
    before = evaluate(rows, prepared, skipped, base, check)
    fitted_on = now.date().isoformat()

    def describe(family: str, compute_dtype: str, fitted: Sequence[FitTarget]) -> str:
        return (f"calibration profile {name!r}, entry {family}/{compute_dtype}: fitted on {fitted_on} to "
                f"{len(fitted)} measurements of {source_file} (sha256 {source_sha256[:12]}; "
                f"{fitted_sources(fitted)}), starting from {base.name!r}")

    fit_all = partial(fit_profile, training, base, name=name, fit_global=fit_global, describe=describe,
                      max_evaluations=max_evaluations, check=check)
    validation = None
    if cross_validation:  # the whole fit beside every fold, in one run: a worker takes the next when it is done
        folds = hold_out_folds(training, prepared, base, fit_global=fit_global, max_evaluations=max_evaluations,
                               progress=say)
        tasks = fold_tasks(folds)
        say(f"fitting on every row, and cross-validating ({len(tasks)} held-out fits)")
        fit, *results = task_runner(jobs)([fit_all, *tasks])
        validation = cross_validation_document(folds, results)
    else:
        fit = fit_all()
    if not fit.entries:
        raise NothingToFit(f"no GPU family and compute precision has the {MIN_ROWS_PER_ENTRY} predictable rows "
                           f"(Poisson rows aside) an entry of its own needs; the rows have "
                           + ", ".join(f"{count} of {family}/{dtype}" for (family, dtype), count in
                                       sorted(Counter((t.family, t.compute_dtype) for t in training).items())))
    after = evaluate(rows, prepared, skipped, fit.profile, check)
    say(f"fit: median error {_pct(before.summary.overall.median_abs_pct_error)} -> "
        f"{_pct(after.summary.overall.median_abs_pct_error)}")
    profile = fit.profile
    if validation is not None:
        profile = fit.levels[validation["chosen_level"]]
        after = evaluate(rows, prepared, skipped, profile, check)
        say(f"cross-validation chose {validation['chosen_level']}: median error on the data "
            f"{_pct(after.summary.overall.median_abs_pct_error)}")
    profile = mark_pinned(profile)
    copies = same_fits(profile)
    provenance = {
        "source_file": source_file,
        "source_sha256": source_sha256,
        "rows_total": len(rows),
        "rows_predicted": len(prepared),
        "rows_used": len(training),
        "fitted_on": fitted_on,
        "base_profile": base.name,
        "method": (f"bounded Nelder-Mead search (at most {max_evaluations} evaluations per entry, at most "
                   f"{MAX_FIT_ROWS_PER_ENTRY} rows per entry, an equal share from each source); global entry "
                   f"{'refitted' if fit_global else 'kept from the base profile'}; then an entry per GPU family and "
                   f"one per compute precision within it, each with at least {MIN_ROWS_PER_ENTRY} rows; "
                   + ("the level shipped chosen by cross-validated error" if cross_validation
                      else "the most specific level shipped")),
        "objective": (f"mean |ln(predicted / measured)| over the entry's rows + {PRIOR_WEIGHT} x mean over "
                      "parameters of ((value - prior) / range)^2; priors: the cited values below in the global "
                      "entry, the values of the level above in a family's or a precision's entry"),
        "parameter_bounds": {bound.name: [bound.low, bound.high] for bound in GLOBAL_PARAMETERS},
        "parameter_priors": {bound.name: {"prior": bound.prior, "source": bound.source}
                             for bound in GLOBAL_PARAMETERS},
        "parameters_at_bounds": [
            {"gpu_family": family, "compute_dtype": dtype, "parameter": parameter, "value": value, "bound": side,
             "same_fit_as": "/".join(copies[family, dtype]) if (family, dtype) in copies else None}
            for family, dtype, parameter, value, side in parameters_at_bounds(profile)],
        "fit_error": {"before": _stats_document(before.summary.overall),
                      "after": _stats_document(after.summary.overall)},
        "entries_fitted": [
            {"gpu_family": entry.family, "compute_dtype": entry.compute_dtype, "rows": entry.rows,
             "mean_abs_log_error_before": entry.mean_abs_log_error_before,
             "mean_abs_log_error_after": entry.mean_abs_log_error_after}
            for entry in fit.entries],
        "cross_validation": validation,
        "calculation_version": CALCULATION_VERSION,
    }
    document = profile_document(profile, description=description, provenance=provenance, created_at=now)
    return Calibration(profile, document, before, after)


def held_out_groups(rows: Sequence[ObservedRow], catalog: SpecCatalog, *, base: CalibrationProfile, hold_out: str,
                    groups: Sequence[str], max_evaluations: int = DEFAULT_EVALUATIONS,
                    progress: Callable[[str], None] | None = None,
                    jobs: int = 1) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The held-out errors of only `groups` of one hold-out, and its rows (`crossval.cross_validate_groups`),
    fitted as `calibrate` fits (the rows a fit reads, from `base`, the global entry refitted); nothing is
    written."""
    prepared, _ = prepare_rows(rows, catalog)
    training = [item for item in prepared if item.fittable]
    document, held = cross_validate_groups(training, prepared, base, hold_out, groups, fit_global=True,
                                           max_evaluations=max_evaluations, progress=progress, jobs=jobs)
    if not document["groups"]:
        raise NothingToFit(f"no predicted row in {', '.join(groups)} (held out by {hold_out})")
    return document, held


def _stats_document(stats: ErrorStats) -> dict[str, Any]:
    return {"rows": stats.rows, "median_abs_pct_error": stats.median_abs_pct_error,
            "p90_abs_pct_error": stats.p90_abs_pct_error}


def _pct(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}%"


# The API --------------------------------------------------------------------------------------

# Fit effort for uploads (the command-line fit allows fit.DEFAULT_EVALUATIONS per entry).
UPLOAD_FIT_EVALUATIONS = 80


def check_upload_work(rows: Sequence[ObservedRow], limit: int, offline_command: str, catalog: SpecCatalog) -> None:
    """422 when the rows would need more distinct simulated runs than one request may run (a Poisson
    run is simulated for each profile it is predicted under); a row of a model or GPU the catalog lacks is
    skipped, never simulated."""
    known: dict[tuple[str, str], bool] = {}

    def in_catalog(row: ObservedRow) -> bool:
        key = (row.model, row.gpu)
        if key not in known:
            known[key] = catalog.model(row.model) is not None and catalog.gpu(row.gpu) is not None
        return known[key]

    runs = {(row.model, row.gpu, replace(row.measurement, metric=THROUGHPUT_METRICS[0], stat=None))
            for row in rows if row.measurement is not None and needs_simulation(row.measurement) and in_catalog(row)}
    if len(runs) > limit:
        raise Unprocessable(
            f"the rows need {len(runs)} distinct simulated runs (offline, closed-loop, Poisson); one request "
            f"may run at most {limit}: split the upload, or run `{offline_command}` on the file",
            errors=[("/body/rows", f"at most {limit} distinct simulated configurations")])


def report_schemas(report: Report) -> tuple[list[RowResultOut], ErrorSummaryOut]:
    return ([RowResultOut.model_validate(row_document(outcome)) for outcome in report.outcomes],
            ErrorSummaryOut.model_validate(summary_document(report.summary)))


def contradictions_out(report: Report) -> list[ContradictionOut]:
    return [ContradictionOut.model_validate(contradiction_document(group)) for group in report.contradictions]


def validate_upload(session: Session, request: ValidationRequest,
                    check: Callable[[], None] = keep_going) -> ValidationResponse:
    """POST /v1/validate: the error report of the rows under a profile; nothing is stored. `check`: called
    between rows (`validate`)."""
    rows = _observed_or_422(request.rows)
    check_upload_work(rows, request.max_simulated_runs, "python -m app.validate FILE.csv", DatabaseCatalog(session))
    profile = get_profile(session, request.calibration)
    report = validate(rows, DatabaseCatalog(session), profile, check)
    rows_out, summary = report_schemas(report)
    return ValidationResponse(calibration_profile=profile.name, rows=rows_out, summary=summary,
                              contradictions=contradictions_out(report),
                              calculation_version=CALCULATION_VERSION)


def create_calibration(session: Session, request: CalibrationRequest, *, written_by: str,
                       check: Callable[[], None] = keep_going) -> CalibrationResponse:
    """POST /v1/calibrations: fit a named profile to the rows, store it (on behalf of the key named
    `written_by`), report before and after. `check`: called between rows and fitted entries (`calibrate`)."""
    if request.name in RESERVED_PROFILE_NAMES:
        raise Unprocessable(f"the profile name {request.name!r} is reserved",
                            errors=[("/body/name", f"reserved: {', '.join(sorted(RESERVED_PROFILE_NAMES))}")])
    if session.get(CalibrationProfileRecord, request.name) is not None:
        raise Conflict(f"a calibration profile named {request.name!r} already exists; choose another name")
    rows = _observed_or_422(request.rows)
    check_upload_work(rows, request.max_simulated_runs, "python -m app.calibrate FILE.csv --name NAME --write-db",
                      DatabaseCatalog(session))
    base = get_profile(session, request.base_profile, pointer="/body/base_profile")
    canonical = json.dumps([row.model_dump(mode="json") for row in request.rows], sort_keys=True,
                           separators=(",", ":")).encode()
    try:
        result = calibrate(rows, DatabaseCatalog(session), name=request.name, description=request.description,
                           base=base, fit_global=False, cross_validation=False, source_file="upload",
                           source_sha256=file_sha256(canonical), max_evaluations=UPLOAD_FIT_EVALUATIONS,
                           check=check)
    except NothingToFit as exc:
        raise Unprocessable(str(exc), errors=[("/body/rows", str(exc))]) from None
    record = store_profile(session, result.document, origin=ORIGIN_USER, written_by=written_by)
    _, before = report_schemas(result.before)
    after_rows, after = report_schemas(result.after)
    return CalibrationResponse(profile=profile_out(record), base_profile=base.name, before=before, after=after,
                               rows=after_rows, contradictions=contradictions_out(result.after),
                               calculation_version=CALCULATION_VERSION)


def _observed_or_422(rows: Sequence[MeasurementRowIn]) -> list[ObservedRow]:
    try:
        return observed_rows(rows)
    except RowsInvalid as exc:
        raise Unprocessable(str(exc), errors=exc.errors) from None


def list_profiles(session: Session, limit: int, offset: int) -> ProfileList:
    """`builtin` first (always there), then the stored profiles by name; one page of them. A summary reads the
    record's own columns: no entry is parsed to list it."""
    records, stored = page_of_records(session, limit=max(limit - (offset == 0), 0), offset=max(offset - 1, 0))
    items = ([ProfileSummaryOut(**_BUILTIN_SUMMARY)] if offset == 0 else []) + [
        ProfileSummaryOut(**_summary_fields(record)) for record in records]
    return ProfileList(default_profile=default_profile_name(session), items=items, total=stored + 1, limit=limit,
                       offset=offset)


def read_profile(session: Session, name: str) -> ProfileOut:
    return _builtin_out() if name == BUILTIN_PROFILE else profile_out(get_record(session, name))


_BUILTIN_SUMMARY: dict[str, Any] = {
    "name": BUILTIN_PROFILE, "description": BUILTIN_DESCRIPTION, "origin": "builtin", "created_at": None,
    "rows_used": 0, "source_sha256": None, "fit_median_abs_pct_error": None, "written_by": None}


def _summary_fields(record: CalibrationProfileRecord) -> dict[str, Any]:
    """The `ProfileSummaryOut` fields of a stored profile."""
    return {"name": record.name, "description": record.description, "origin": record.origin,
            "created_at": record.created_at, "rows_used": record.rows_used, "source_sha256": record.source_sha256,
            "fit_median_abs_pct_error": record.fit_median_abs_pct_error, "written_by": record.written_by,
            "held_out_median_abs_pct_error": _held_out_medians(record.provenance)}


def _held_out_medians(provenance: dict[str, Any] | None) -> dict[str, float | None] | None:
    """The overall held-out medians of a cross-validated profile, by what each fold left out."""
    validation = (provenance or {}).get("cross_validation")
    if not validation:
        return None
    medians = {item["held_out"]: item["overall"]["median_abs_pct_error"] for item in validation["hold_outs"]}
    return {held_out: medians.get(held_out) for held_out in ("gpu", "model_family", "engine")}


def profile_out(record: CalibrationProfileRecord) -> ProfileOut:
    return ProfileOut(
        **_summary_fields(record),
        entries=[_entry_out(entry) for entry in profile_from_entries(record.name, record.entries).entries],
        provenance=ProvenanceOut.model_validate(record.provenance),
    )


def _builtin_out() -> ProfileOut:
    return ProfileOut(**_BUILTIN_SUMMARY, entries=[_entry_out(entry) for entry in builtin_profile().entries],
                      provenance=None)


def _entry_out(entry: ProfileEntry) -> ProfileEntryOut:
    """An entry as the API shows it (a parameter a stored entry predates reads as `Efficiency`'s default)."""
    efficiency = entry.efficiency
    return ProfileEntryOut(
        gpu_family=entry.family, compute_dtype=entry.compute_dtype, rows=entry.rows,
        bandwidth_fraction_ratio=efficiency.bandwidth_fraction, compute_scale_ratio=efficiency.compute_scale,
        compute_curve=[ComputeCurvePoint(tokens=tokens, compute_fraction_ratio=fraction)
                       for tokens, fraction in efficiency.compute_curve],
        per_step_overhead_ms=efficiency.per_step_overhead_s * 1e3,
        per_layer_overhead_ms=efficiency.per_layer_overhead_s * 1e3,
        allreduce_latency_ms=efficiency.allreduce_latency_s * 1e3,
        pcie_link_fraction_ratio=efficiency.pcie_link_fraction,
        per_sequence_overhead_ms=efficiency.per_sequence_overhead_s * 1e3,
        serial_step_overhead_ms=efficiency.serial_step_s * 1e3,
        overlapped_host_per_sequence_ms=efficiency.overlapped_host_per_sequence_s * 1e3,
        prefill_moe_layer_overhead_ms=efficiency.prefill_moe_layer_overhead_s * 1e3,
        decode_worker_step_overhead_ms=efficiency.decode_worker_step_overhead_s * 1e3,
        source=efficiency.source,
    )
