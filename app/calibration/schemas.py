"""Shapes of calibration and validation: published measurement rows (the schema of
`measured-calibration.csv`, as JSON rows or a CSV upload), error reports, and calibration profiles.

Rows are strict JSON when sent as JSON; CSV cells are text and are read leniently (an empty cell is a
missing value, "128" is 128) before the same bounds apply. Either way a name outside what the service knows
(a model or GPU the catalog lacks, a metric, scenario, engine, precision or statistic outside the vocabulary)
keeps its row, which is skipped with the reason (`MeasurementRowUpload`). Percent errors are `abs_pct_error`
(|predicted − measured| / measured × 100).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, Field, model_validator

from app.calibration.crossval import CHOSEN_BY, LEVEL_DESCRIPTIONS, TARGETS
from app.calibration.examples import CALIBRATION_ROWS_EXAMPLE, LATENCY_ROW_EXAMPLE, ROW_EXAMPLE
from app.calibration.held_out_schemas import (
    ERROR_STATS_EXAMPLE,
    HELD_OUT_MEDIANS_EXAMPLE,
    HOLD_OUT_EXAMPLE,
    LAYOUT_KIND_DESCRIPTION,
    ErrorStatsOut,
    HeldOutMedians,
    HoldOutOut,
    LayoutKind,
)
from app.catalog.schemas import INPUT_CONFIG, ModelSlug, UtcDatetime
from app.common import SLUG_PATTERN, Label, LongText, Page, Slug, schema_examples
from app.estimates.schemas import (
    AllreduceLatencyMs,
    BandwidthFractionRatio,
    ComputeCurve,
    ComputeDtype,
    ComputeScaleRatio,
    DecodeWorkerStepOverheadMs,
    KvDtype,
    OverlappedHostPerSequenceMs,
    PcieLinkFractionRatio,
    PerLayerOverheadMs,
    PerSequenceOverheadMs,
    PerStepOverheadMs,
    PrefillMoeLayerOverheadMs,
    SerialStepOverheadMs,
    WeightDtype,
)
from app.sizing.calibration.predict import ENGINES, METRICS, SCENARIOS, STATS

# Uploads: each row can mean a simulation, so a request carries a bounded number of runs, sized to finish inside
# REQUEST_TIMEOUT_S (30 s). On 2 vCPUs the shipped tests/data/measured-calibration.csv (1,263 rows, 573 runs) took 5.9 s
# to validate in a fresh process (2026-12-06); fitting a profile to it 29 s, to a 150-row sample of it 7 s.

MAX_VALIDATE_ROWS = 2000
MAX_VALIDATE_SIMULATED_RUNS = 1000
MAX_CALIBRATE_ROWS = 500
MAX_CALIBRATE_SIMULATED_RUNS = 250
CSV_UPLOAD_DESCRIPTION = (
    "CSV with a header row in the measured-calibration.csv schema (at most {rows:,} rows); required "
    "columns: row_id, model, gpu, num_gpus, engine, scenario, metric, value. Empty cells are "
    "missing values; extra columns are ignored.")


def upload_limits(rows: int, simulated_runs: int) -> str:
    """The limits of one upload, in words (OpenAPI descriptions and the README say the same)."""
    return (f"At most {rows:,} rows and {simulated_runs:,} distinct simulated runs (rows of offline, closed-loop "
            "or Poisson scenarios, one run per model, GPU and load) per request, and a body of at most 1 MiB "
            "(a CSV upload is about 380 bytes a row).")


Engine = Literal[ENGINES]  # type: ignore[valid-type]
Scenario = Literal[SCENARIOS]  # type: ignore[valid-type]
Metric = Literal[METRICS]  # type: ignore[valid-type]
Stat = Literal[STATS]  # type: ignore[valid-type]
ProfileName = Annotated[str, Field(pattern=SLUG_PATTERN, max_length=64,
                                   description="Calibration profile name (lower-case, digits, . _ -)",
                                   examples=["my-vllm-h100"])]
RowText = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
Tokens = Annotated[int, Field(ge=1, le=1_000_000)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]


# A real row of measured-calibration.csv: TensorRT-LLM 0.17, Llama-3.1-8B FP8 on one H100, 128/128.
class MeasurementRowIn(BaseModel):
    """One published measurement, in the columns of measured-calibration.csv."""

    model_config = INPUT_CONFIG | schema_examples(ROW_EXAMPLE, LATENCY_ROW_EXAMPLE)

    row_id: RowText = Field(description="Unique within the upload")
    source_id: RowText = Field("upload", description="Where the number comes from (groups leave-one-out)")
    model: ModelSlug = Field(description="Catalog slug of the model")
    gpu: Slug = Field(description="Catalog slug of the GPU")
    num_gpus: Annotated[int, Field(ge=1, le=100_000)] = Field(description="GPUs behind the number")
    tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        None, description="Tensor parallel; null = not stated (the best layout on num_gpus is compared)")
    pp: Annotated[int, Field(ge=1, le=1000)] | None = Field(None, description="Pipeline parallel; null = 1")
    dp: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        None, description="Attention data-parallel ranks of tp GPUs each; null = 1 (and a CSV cell of 0 or n/a)")
    ep: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        None, description="Expert-parallel ranks of the MoE layers; null = 1 (and a CSV cell of 0 or n/a)")
    deployment: Literal["aggregated", "disaggregated"] | None = Field(
        None, description="disaggregated: separate prefill and decode workers (the prefill_* and decode_* "
                          "columns); null = aggregated")
    prefill_workers: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None, description="disaggregated: prefill workers")
    prefill_tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="disaggregated: each prefill worker's tp")
    prefill_pp: Annotated[int, Field(ge=1, le=1000)] | None = Field(None, description="null = 1")
    prefill_dp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="attention data-parallel ranks; null = 1")
    prefill_ep: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="expert-parallel ranks; null = 1")
    prefill_moe_tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="GPUs per expert, as stated")
    prefill_batch: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="the source's prefill batch per attention data-parallel rank: recorded, not read as a "
                          "limit (prefill ranks batch waiting prompts up to the engine's token budget)")
    decode_workers: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None, description="disaggregated: decode workers")
    decode_tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="disaggregated: each decode worker's tp")
    decode_pp: Annotated[int, Field(ge=1, le=1000)] | None = Field(None, description="null = 1")
    decode_dp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="attention data-parallel ranks; null = 1")
    decode_ep: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="expert-parallel ranks; null = 1")
    decode_moe_tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(None, description="GPUs per expert, as stated")
    decode_batch: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="running sequences per attention data-parallel rank; null = the engine default")
    moe_tp: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        None, description="GPUs each expert is split over, as stated; a row of an MoE model whose tp x dp is not "
                          "ep x moe_tp is skipped with the reason (a dense model's is not read)")
    weight_dtype: WeightDtype | None = Field(
        None, description="null = not stated: predicted at the model's published checkpoint precision (the result "
                          "says so) and not fitted on")
    compute_dtype: ComputeDtype | None = Field(
        None, description="Differs from the weights for weight-only quantization (fp8 weights on A100: fp16)")
    kv_dtype: KvDtype | None = Field(None, description="null = not stated (the engine default, 16-bit)")
    engine: Engine
    engine_version: Label = ""
    scenario: Scenario
    isl: Tokens | None = Field(None, description="Input tokens per request; null = dataset-driven lengths")
    osl: Tokens | None = Field(None, description="Output tokens per request; null = dataset-driven lengths")
    batch: Count | None = Field(None, description="static_batch/batch1: requests run together")
    concurrency: Count | None = Field(None, description="closed_loop: concurrent users")
    num_requests: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    request_rate: Annotated[float, Field(gt=0, le=1e6)] | None = Field(None, description="poisson: requests/s")
    metric: Metric
    stat: Stat | None = Field(None, description="For latencies: mean, median/p50, p90, p99; null = not stated "
                                                "(predicted as the mean, and the result says so)")
    value: Annotated[float, Field(gt=0, le=1e12)] = Field(description="The published number (ms for latencies)")
    notes: LongText = ""


class MeasurementRowUpload(MeasurementRowIn):
    """An uploaded row (JSON or CSV): a name the service does not know, in a column that names a catalog entry or a
    word of the schema's vocabulary, is kept, and the row skipped with the reason rather than the upload refused (a
    file of published measurements names Hugging Face ids, other GPUs, other metrics). Text is stripped, and blank
    text left out, as a CSV cell is. Every other column is as strict as `MeasurementRowIn`'s."""

    @model_validator(mode="before")
    @classmethod
    def _as_csv_cells_are(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        cells = ((key, value.strip() if isinstance(value, str) else value) for key, value in data.items())
        return {key: value for key, value in cells if value != ""}

    num_gpus: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None, description="GPUs behind the number; required, but for a disaggregated run (deployment "
                          "disaggregated), whose pools' workers x tp x pp x dp it is when left out (without its "
                          "worker counts such a row is skipped with the reason)")
    model: RowText = Field(description="Catalog slug of the model (GET /v1/models); another name (a Hugging Face "
                                       "id, a model the catalog lacks) skips the row with the reason")
    gpu: RowText = Field(description="Catalog slug of the GPU (GET /v1/gpus); another name skips the row with "
                                     "the reason")
    weight_dtype: RowText | None = Field(
        None, description=f"One of {', '.join(get_args(WeightDtype))}; null = not stated: predicted at the model's "
                          "published checkpoint precision (the result says so) and not fitted on; another "
                          "precision skips the row")
    compute_dtype: RowText | None = Field(
        None, description=f"One of {', '.join(get_args(ComputeDtype))}; differs from the weights for weight-only "
                          "quantization (fp8 weights on A100: fp16); another precision skips the row")
    kv_dtype: RowText | None = Field(
        None, description=f"One of {', '.join(get_args(KvDtype))}; null = not stated (the engine default, 16-bit); "
                          "another precision skips the row")
    engine: RowText = Field(description=f"One of {', '.join(ENGINES)}; another engine skips the row")
    scenario: RowText = Field(description=f"One of {', '.join(SCENARIOS)}; another scenario skips the row")
    metric: RowText = Field(description=f"One of {', '.join(METRICS)}; another metric skips the row")
    stat: RowText | None = Field(
        None, description=f"For latencies, one of {', '.join(STATS)}; null = not stated (predicted as the mean, "
                          "and the result says so); another statistic skips the row")


class ValidationRequest(BaseModel):
    """Measurements to predict against a profile (nothing is stored)."""

    model_config = INPUT_CONFIG | schema_examples({"calibration": "default", "rows": [ROW_EXAMPLE, LATENCY_ROW_EXAMPLE]})

    max_rows: ClassVar[int] = MAX_VALIDATE_ROWS
    max_simulated_runs: ClassVar[int] = MAX_VALIDATE_SIMULATED_RUNS

    calibration: ProfileName | None = Field(None, description="Profile to validate; null = the default profile")
    rows: list[MeasurementRowUpload] = Field(min_length=1, max_length=MAX_VALIDATE_ROWS,
                                         description=upload_limits(MAX_VALIDATE_ROWS, MAX_VALIDATE_SIMULATED_RUNS))


class CalibrationRequest(BaseModel):
    """Measurements of your engine and hardware, to fit a named profile from."""

    max_rows: ClassVar[int] = MAX_CALIBRATE_ROWS
    max_simulated_runs: ClassVar[int] = MAX_CALIBRATE_SIMULATED_RUNS

    model_config = INPUT_CONFIG | schema_examples({
        "name": "my-trtllm-h100", "description": "Our TensorRT-LLM 0.17 runs on the H100 cluster",
        "base_profile": "default", "rows": CALIBRATION_ROWS_EXAMPLE})

    name: ProfileName
    description: LongText = ""
    base_profile: ProfileName | None = Field(
        None, description="Profile the fit starts from and falls back to for what the rows do not cover; "
                          "null = the default profile")
    rows: list[MeasurementRowUpload] = Field(min_length=1, max_length=MAX_CALIBRATE_ROWS,
                                         description=upload_limits(MAX_CALIBRATE_ROWS, MAX_CALIBRATE_SIMULATED_RUNS))


# Error reports -------------------------------------------------------------------------------

GROUP_ERROR_EXAMPLE = {"scenario": "offline", "metric": "output_tokens_per_s", "gpu_family": "hopper",
                       "rows": 1, "median_abs_pct_error": 3.4, "p90_abs_pct_error": 3.4}
ROW_RESULT_EXAMPLE = {
    "row_id": "TRTLLM_PERF_V017-2", "source_id": "TRTLLM_PERF_V017", "model": "llama-3.1-8b", "gpu": "h100-sxm",
    "scenario": "offline", "metric": "output_tokens_per_s", "stat": None, "measured": 28836.77,
    "predicted": 27860.1, "abs_pct_error": 3.39, "skipped_reason": None, "assumption": None,
}


class GroupErrorOut(ErrorStatsOut):
    model_config = schema_examples(GROUP_ERROR_EXAMPLE)

    scenario: str
    metric: str
    gpu_family: str


class LayoutErrorOut(ErrorStatsOut):
    layout_kind: LayoutKind = Field(description=LAYOUT_KIND_DESCRIPTION)
    metric: str


class RowResultOut(BaseModel):
    model_config = schema_examples(ROW_RESULT_EXAMPLE, {
        "row_id": "LAMBDA_VLLM_054-1399", "source_id": "LAMBDA_VLLM_054", "model": "llama-3.1-8b",
        "gpu": "a100-80gb-sxm", "scenario": "offline", "metric": "output_tokens_per_s", "stat": None,
        "measured": 1517.54, "predicted": None, "abs_pct_error": None,
        "skipped_reason": "dataset-driven lengths: the row gives no fixed input/output tokens (isl/osl)"})

    row_id: str
    source_id: str
    model: str
    gpu: str
    scenario: str
    metric: str
    stat: str | None
    measured: float
    predicted: float | None = Field(description="In the metric's unit (ms for latencies); null when skipped")
    abs_pct_error: float | None
    skipped_reason: str | None = Field(description="Why the row was not predicted (never guessed)")
    assumption: str | None = Field(
        None, description="What the prediction assumed that the row does not state (e.g. an unstated latency "
                          "statistic is predicted as the mean)")


SUMMARY_EXAMPLE: dict[str, Any] = {
    "rows_total": 2, "rows_predicted": 2, "rows_skipped": 0, "predicted_ratio": 1.0,
    "overall": ERROR_STATS_EXAMPLE,
    "throughput": {"rows": 1, "median_abs_pct_error": 3.4, "p90_abs_pct_error": 3.4},
    "latency_light_load": {"rows": 1, "median_abs_pct_error": 12.4, "p90_abs_pct_error": 12.4},
    "latency_loaded": {"rows": 0, "median_abs_pct_error": None, "p90_abs_pct_error": None},
    "by_group": [GROUP_ERROR_EXAMPLE],
    "by_layout": [{"layout_kind": "tp", "metric": "output_tokens_per_s", "rows": 1, "median_abs_pct_error": 3.4,
                   "p90_abs_pct_error": 3.4}],
    "skipped_reasons": {},
}


class ErrorSummaryOut(BaseModel):
    """Errors over the predicted rows, overall, by headline category, and by scenario x metric x GPU family.

    Categories: `throughput` (every throughput metric); `latency_light_load` (latencies of a single
    stream, of a static batch of one, and of open-loop or closed-loop runs the predicted engine keeps up
    with); `latency_loaded` (the rest: queueing behind an all-at-once batch or an overloaded engine).
    """

    model_config = schema_examples(SUMMARY_EXAMPLE)

    rows_total: int
    rows_predicted: int
    rows_skipped: int
    predicted_ratio: float = Field(description="rows_predicted / rows_total")
    overall: ErrorStatsOut
    throughput: ErrorStatsOut
    latency_light_load: ErrorStatsOut
    latency_loaded: ErrorStatsOut
    by_group: list[GroupErrorOut]
    by_layout: list[LayoutErrorOut] = Field(description="Errors by layout kind and metric")
    skipped_reasons: dict[str, int] = Field(description="Rows skipped, by reason")


CONTRADICTION_EXAMPLE = {"row_ids": ["AIC_SILICON_SAMPLE-5816", "AIC_SILICON_SAMPLE-6360"], "metric": "tpot_ms",
                         "low": 5.38, "high": 10.302, "ratio": 1.915, "least_worst_error_pct": 31.4}


class ContradictionOut(BaseModel):
    """Predicted rows that state one configuration (model, GPU and every column a prediction reads, so one
    prediction serves them all) whose measured values differ by x1.3 or more: something the rows do not record
    differs (an engine setting such as speculative decoding, the harness, the run)."""

    model_config = schema_examples(CONTRADICTION_EXAMPLE)

    row_ids: list[str] = Field(description="The rows, in upload order")
    metric: str
    low: float = Field(description="The lowest measured value, in the metric's published unit")
    high: float = Field(description="The highest measured value, in the metric's published unit")
    ratio: float = Field(description="high / low")
    least_worst_error_pct: float = Field(
        description="The least absolute % error the worst-predicted of these rows can have, whatever the one "
                    "prediction: 100 (high - low) / (high + low)")


class ValidationResponse(BaseModel):
    model_config = schema_examples({"calibration_profile": "default", "rows": [ROW_RESULT_EXAMPLE],
                              "summary": SUMMARY_EXAMPLE, "contradictions": [CONTRADICTION_EXAMPLE],
                              "calculation_version": "2026.12.03.4"})

    calibration_profile: str = Field(description="The profile whose efficiencies produced the predictions")
    rows: list[RowResultOut]
    summary: ErrorSummaryOut
    contradictions: list[ContradictionOut] = Field(
        description="Rows the stated columns cannot tell apart (one prediction) measured x1.3 or more apart, "
                    "widest first: no model of those columns can be close to all of them")
    calculation_version: str


# Profiles ------------------------------------------------------------------------------------

PROFILE_ENTRY_EXAMPLE = {
    "gpu_family": "hopper", "compute_dtype": "fp8", "rows": 317, "bandwidth_fraction_ratio": 0.95,
    "compute_scale_ratio": 0.627,
    "compute_curve": [{"tokens": 1, "compute_fraction_ratio": 0.1343}, {"tokens": 64, "compute_fraction_ratio": 0.33},
                      {"tokens": 128, "compute_fraction_ratio": 0.62}, {"tokens": 256, "compute_fraction_ratio": 0.78},
                      {"tokens": 4096, "compute_fraction_ratio": 0.89},
                      {"tokens": 16384, "compute_fraction_ratio": 0.93}],
    "per_step_overhead_ms": 3.414, "per_layer_overhead_ms": 0.0, "allreduce_latency_ms": 0.0777,
    "pcie_link_fraction_ratio": 1.0, "per_sequence_overhead_ms": 0.0, "serial_step_overhead_ms": 3.414,
    "overlapped_host_per_sequence_ms": 0.0, "prefill_moe_layer_overhead_ms": 0.0,
    "decode_worker_step_overhead_ms": 0.0,
    "source": "calibration profile 'default', entry hopper/fp8: fitted on 2026-11-29 to 317 measurements of "
              "measured-calibration.csv (sha256 bddc14f88d4f), starting from 'builtin'",
}
ENTRY_FIT_EXAMPLE = {"gpu_family": "hopper", "compute_dtype": "fp8", "rows": 317,
                     "mean_abs_log_error_before": 0.167, "mean_abs_log_error_after": 0.138}
CROSS_VALIDATION_EXAMPLE = {
    "chosen_level": "family", "chosen_by": CHOSEN_BY, "levels": LEVEL_DESCRIPTIONS,
    "candidates": {"family": {"gpu": 24.1, "model_family": 20.3, "engine": 25.0}},
    "choice": [{"level": "family", "against": "global", "score": 22.2, "against_score": 25.1, "better_in": 1.0,
                "chosen": True}],
    "targets": TARGETS, "hold_outs": [HOLD_OUT_EXAMPLE]}
BOUND_EXAMPLE = {"gpu_family": "cdna3", "compute_dtype": "*", "parameter": "compute_scale", "value": 0.3,
                 "bound": "low"}
FIT_ERROR_EXAMPLE = {"before": {"rows": 1056, "median_abs_pct_error": 36.2, "p90_abs_pct_error": 79.0},
                     "after": {"rows": 1056, "median_abs_pct_error": 8.5, "p90_abs_pct_error": 38.4}}
PROVENANCE_EXAMPLE: dict[str, Any] = {
    "source_file": "measured-calibration.csv",
    "source_sha256": "bddc14f88d4fac48da6c43af63cb604a08ef1f76e5755a7b26f421cfa090be8b", "rows_total": 1263, "rows_predicted": 1056, "rows_used": 756, "fitted_on": "2026-11-29", "base_profile": "builtin",
    "method": "bounded Nelder-Mead search (at most 120 evaluations per entry); global entry refitted; then an "
              "entry per GPU family and one per compute precision within it, each with at least 12 rows",
    "objective": "mean |ln(predicted / measured)| over the entry's rows",
    "parameter_bounds": {"bandwidth_fraction": [0.3, 0.95], "compute_scale": [0.3, 1.0],
                         "per_step_overhead_s": [0.0, 0.005], "per_layer_overhead_s": [0.0, 5e-05],
                         "allreduce_latency_s": [0.0, 0.0001], "small_m_flatness": [0.0, 1.0]},
    "fit_error": FIT_ERROR_EXAMPLE, "entries_fitted": [ENTRY_FIT_EXAMPLE],
    "parameter_priors": {"allreduce_latency_s": {"prior": 1e-05, "source": "NCCL tuner: 7.8-15.0 us in a node"}},
    "parameters_at_bounds": [BOUND_EXAMPLE],
    "cross_validation": CROSS_VALIDATION_EXAMPLE, "calculation_version": "2026.12.03.4",
}


class ProfileEntryOut(BaseModel):
    """The efficiencies of one GPU family at one compute precision (`*` = any)."""

    model_config = schema_examples(PROFILE_ENTRY_EXAMPLE)

    gpu_family: str = Field(description=(
        "A GPU family (hopper), `*` for any, or a GPU maker's entry (`vendor:nvidia`): the one a GPU whose family "
        "has no entry takes, before the global one"))
    compute_dtype: str
    rows: int = Field(description="Measurements this entry was fitted on (0 = inherited, not fitted here)")
    bandwidth_fraction_ratio: BandwidthFractionRatio
    compute_scale_ratio: ComputeScaleRatio
    compute_curve: ComputeCurve
    per_step_overhead_ms: PerStepOverheadMs
    per_layer_overhead_ms: PerLayerOverheadMs
    allreduce_latency_ms: AllreduceLatencyMs
    pcie_link_fraction_ratio: PcieLinkFractionRatio = 1.0
    per_sequence_overhead_ms: PerSequenceOverheadMs = 0.0
    serial_step_overhead_ms: SerialStepOverheadMs
    overlapped_host_per_sequence_ms: OverlappedHostPerSequenceMs = 0.0
    prefill_moe_layer_overhead_ms: PrefillMoeLayerOverheadMs = 0.0
    decode_worker_step_overhead_ms: DecodeWorkerStepOverheadMs = 0.0
    source: str


class EntryFitOut(BaseModel):
    model_config = schema_examples(ENTRY_FIT_EXAMPLE)

    gpu_family: str
    compute_dtype: str
    rows: int
    mean_abs_log_error_before: float = Field(description="Mean |ln(predicted / measured)| with the start values")
    mean_abs_log_error_after: float


class LevelStepOut(BaseModel):
    """One step of the choice of a profile's level: a more specific level against the one chosen so far."""

    model_config = schema_examples(CROSS_VALIDATION_EXAMPLE["choice"][0])

    level: str
    against: str = Field(description="The level chosen so far")
    score: float | None = Field(description="The level's mean of the GPU and model-family held-out medians")
    against_score: float | None
    better_in: float = Field(description="Share of paired resamples of the held-out rows in which the level's "
                                         "score is the lower one")
    chosen: bool


class CrossValidationOut(BaseModel):
    """Leave-one-GPU-out, leave-one-model-family-out and leave-one-engine-out errors; the profile's level
    (how specific its entries are) is the one with the lowest held-out error, a more specific one only where
    its lead is more than sampling noise (`choice`)."""

    model_config = schema_examples(CROSS_VALIDATION_EXAMPLE)

    chosen_level: str
    chosen_by: str
    levels: dict[str, str]
    candidates: dict[str, dict[str, float | None]] = Field(
        description="Median held-out absolute % error of each level, per hold-out")
    choice: list[LevelStepOut] = Field(
        default_factory=list,
        description="Each more specific level against the level chosen before it (empty in profiles fitted "
                    "before this rule)")
    targets: dict[str, float] = Field(description="Target median held-out absolute % error per metric kind")
    hold_outs: list[HoldOutOut]


class ParameterPriorOut(BaseModel):
    model_config = schema_examples({"prior": 7.5e-06, "source": "NCCL tuner: one-node ring LL all-reduce 7.8-15.0 us"})

    prior: float
    source: str


class ParameterAtBoundOut(BaseModel):
    """A fitted parameter at a bound of its physical range: a defect of the model, not a result."""

    model_config = schema_examples(BOUND_EXAMPLE)

    gpu_family: str
    compute_dtype: str
    parameter: str
    value: float
    bound: Literal["low", "high"]
    same_fit_as: str | None = Field(
        None, description="'family/precision' of the entry whose fit this entry carries (a maker whose rows are "
                          "all one family's, a family's only precision): the same defect, listed under both")


class FitErrorOut(BaseModel):
    model_config = schema_examples(FIT_ERROR_EXAMPLE)

    before: ErrorStatsOut = Field(description="The base profile on every predicted row")
    after: ErrorStatsOut = Field(description="The fitted profile on the same rows")


class ProvenanceOut(BaseModel):
    model_config = schema_examples(PROVENANCE_EXAMPLE)

    source_file: str
    source_sha256: str = Field(description="SHA-256 of the measurements the fit read")
    rows_total: int
    rows_predicted: int
    rows_used: int = Field(description="Rows the fit used (predicted rows whose schedule does not depend on "
                                       "the step time: every scenario but Poisson)")
    fitted_on: str = Field(description="Date of the fit (UTC)")
    base_profile: str
    method: str
    objective: str
    parameter_bounds: dict[str, list[float]]
    fit_error: FitErrorOut
    entries_fitted: list[EntryFitOut]
    parameter_priors: dict[str, ParameterPriorOut] = Field(default_factory=dict)
    parameters_at_bounds: list[ParameterAtBoundOut] = Field(default_factory=list)
    cross_validation: CrossValidationOut | None = Field(
        None, description="Held-out errors (null when the fit was not cross-validated: API uploads)")
    calculation_version: str


PROFILE_SUMMARY_EXAMPLE = {
    "name": "default", "description": "Fitted to 1,263 published measurements", "origin": "reference",
    "created_at": "2026-11-29T12:00:00Z", "rows_used": 756,
    "source_sha256": "bddc14f88d4fac48da6c43af63cb604a08ef1f76e5755a7b26f421cfa090be8b",
    "fit_median_abs_pct_error": 8.5,
    "held_out_median_abs_pct_error": HELD_OUT_MEDIANS_EXAMPLE,
}


class ProfileSummaryOut(BaseModel):
    model_config = schema_examples(PROFILE_SUMMARY_EXAMPLE)

    name: str
    description: str
    origin: Literal["builtin", "reference", "user"] = Field(
        description="builtin: cited constants; reference: shipped with the service; user: fitted through the API")
    created_at: UtcDatetime | None = Field(description="When it was fitted (null for builtin)")
    rows_used: int
    source_sha256: str | None
    fit_median_abs_pct_error: float | None = Field(description=(
        "In-sample: the median absolute % error over the measurements the fit was drawn from, after the fit "
        "(provenance.fit_error.after). Not an accuracy figure: see held_out_median_abs_pct_error"))
    held_out_median_abs_pct_error: HeldOutMedians | None = Field(None, description=(
        "The accuracy figure: median absolute % error over every held-out row, each predicted by a fit that left "
        "its whole GPU, model family or engine out (provenance.cross_validation.hold_outs); null when the fit was "
        "not cross-validated (API uploads) and for builtin"))
    written_by: str | None = Field(None, description="Name of the API key that stored it (never the secret); null "
                                                     "for builtin and the shipped default")


class ProfileOut(ProfileSummaryOut):
    model_config = schema_examples({**PROFILE_SUMMARY_EXAMPLE, "entries": [PROFILE_ENTRY_EXAMPLE],
                              "provenance": PROVENANCE_EXAMPLE})

    entries: list[ProfileEntryOut]
    provenance: ProvenanceOut | None = Field(description="How it was fitted (null for builtin)")


class ProfileList(Page[ProfileSummaryOut]):
    """`builtin` first, then the stored profiles by name."""

    model_config = schema_examples({"default_profile": "default", "items": [PROFILE_SUMMARY_EXAMPLE], "total": 1,
                              "limit": 50, "offset": 0})

    default_profile: str = Field(description="The profile requests use when they name none")


class CalibrationResponse(BaseModel):
    """The stored profile, and how it predicts the uploaded rows compared with the profile it started from."""

    model_config = schema_examples({
        "profile": {**PROFILE_SUMMARY_EXAMPLE, "name": "my-trtllm-h100", "origin": "user",
                    "entries": [PROFILE_ENTRY_EXAMPLE], "provenance": PROVENANCE_EXAMPLE},
        "base_profile": "default", "before": SUMMARY_EXAMPLE, "after": SUMMARY_EXAMPLE,
        "rows": [ROW_RESULT_EXAMPLE], "contradictions": [CONTRADICTION_EXAMPLE], "calculation_version": "2026.12.03.4"})

    profile: ProfileOut
    base_profile: str
    before: ErrorSummaryOut = Field(description="The base profile's errors on the uploaded rows")
    after: ErrorSummaryOut = Field(description="The new profile's errors on the same rows")
    rows: list[RowResultOut] = Field(description="Each row under the new profile")
    contradictions: list[ContradictionOut] = Field(
        description="Uploaded rows the stated columns cannot tell apart (one prediction) measured x1.3 or more "
                    "apart, widest first: no fit of those columns can be close to all of them")
    calculation_version: str
