"""The held-out error shapes that sizing answers share (/v1/capacity, /v1/roofline and its batch sweep,
/v1/slo-plan) and the calibration reports build on: how far predictions were from published measurements
their fit never saw (`crossval.held_out_error`). Apart from app/calibration/schemas.py so that the sizing
endpoints' schemas can use them without importing the calibration endpoints' (which import theirs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.calibration.crossval import MEDIAN_INTERVAL_RESAMPLES
from app.common import schema_examples

# The layout family of a measured run (`app.sizing.layout.LAYOUT_KINDS`).
LayoutKind = Literal["tp", "dp_ep", "pp", "disaggregated"]
LAYOUT_KIND_DESCRIPTION = ("tp: tensor parallel only; dp_ep: attention data and/or expert parallelism; pp: pipeline "
                           "stages; disaggregated: separate prefill and decode pools")

ERROR_STATS_EXAMPLE = {"rows": 2, "median_abs_pct_error": 7.9, "p90_abs_pct_error": 12.4}
HELD_OUT_STATS_EXAMPLE = {"rows": 1355, "median_abs_pct_error": 24.1, "median_abs_pct_error_low": 22.9, "median_abs_pct_error_high": 25.4, "p90_abs_pct_error": 61.0, "median_ratio": 0.93}


class ErrorStatsOut(BaseModel):
    model_config = schema_examples(ERROR_STATS_EXAMPLE)

    rows: int = Field(description="Predicted rows in this group")
    median_abs_pct_error: float | None = Field(description="Median |predicted − measured| / measured, percent")
    p90_abs_pct_error: float | None = Field(description="90th percentile of the same")


class HeldOutStatsOut(ErrorStatsOut):
    model_config = schema_examples(HELD_OUT_STATS_EXAMPLE)

    median_abs_pct_error_low: float | None = Field(None, description=(
        f"5th percentile of the medians of {MEDIAN_INTERVAL_RESAMPLES:,} resamples of these rows (fixed seed): with _high, the median's 90% interval (one source's rows err together: the true spread is wider)"))
    median_abs_pct_error_high: float | None = Field(None, description="95th percentile of the same medians")
    median_ratio: float | None = Field(None, description=(
        "Median predicted / measured of the same rows: which way the held-out predictions erred (below 1 they ran "
        "low: latencies shorter, throughput lower than measured). Null without rows, and in profiles "
        "cross-validated before this figure existed"))


class HeldOutGroupOut(HeldOutStatsOut):
    group: str = Field(description="The GPU slug, model family or engine held out")


HELD_OUT_ERROR_EXAMPLE = {
    "held_out": "gpu", "layout_kind": "tp",
    "by_metric": {"ttft": {"rows": 1471, "median_abs_pct_error": 38.0, "p90_abs_pct_error": 111.3,
                           "median_ratio": 0.9},
                  "tpot_itl": {"rows": 1463, "median_abs_pct_error": 15.0, "p90_abs_pct_error": 48.3,
                               "median_ratio": 1.02}},
    "gpus": [{"group": "h200-sxm", **HELD_OUT_STATS_EXAMPLE}],
    "model_family": {"group": "meta-llama", **HELD_OUT_STATS_EXAMPLE},
    "engine": {"group": "vllm", **HELD_OUT_STATS_EXAMPLE},
    "targets": {"throughput": 12.0, "tpot_itl": 10.0, "ttft": 20.0, "e2e": 12.0},
}


class HeldOutErrorOut(BaseModel):
    """How far an answer's kind of prediction was from published measurements that its fit never saw: the
    calibration profile's cross-validation (`python -m app.calibrate`; docs/ACCURACY.md). Each error is
    |predicted / measured - 1| of a measured run's own statistic (its mean, or the one it states), not of
    the answer's own figures. Held-out errors are what to expect where the data has no measurements of the
    GPU, model family or engine; the profile itself was fitted on every group's rows."""

    model_config = schema_examples(HELD_OUT_ERROR_EXAMPLE)

    held_out: Literal["gpu"] = Field(description=(
        "How `by_metric` was held out: every GPU's rows predicted by a fit that never saw that GPU (its "
        "datasheet and the other GPUs' rows are all the fit knew of it)"))
    layout_kind: LayoutKind = Field(description=f"The answer's layout family: {LAYOUT_KIND_DESCRIPTION}")
    by_metric: dict[str, HeldOutStatsOut] = Field(description=(
        "The held-out rows of this layout family, by metric kind (ttft, tpot_itl, e2e, throughput); a metric kind "
        "with no such rows is absent: its error is unmeasured"))
    gpus: list[HeldOutGroupOut] = Field(description=(
        "Each GPU type of the answer (both pools of a disaggregated one) that the profile's data has rows of: those "
        "rows, every metric and layout, predicted by a fit without any of them. A GPU absent here has no measured "
        "rows: its predictions rest on its datasheet and its GPU family's (or the global) entry"))
    model_family: HeldOutGroupOut | None = Field(description=(
        "The model's publisher (the organization of its Hugging Face id) held out: its models' rows predicted by a "
        "fit without any of them; null when the profile's data has no rows of this family"))
    engine: HeldOutGroupOut | None = Field(description=(
        "The engine held out: its rows predicted by a fit without any of them; null when the profile's data has "
        "no rows of this engine (the generic engine), and in answers that name no engine (/v1/roofline)"))
    targets: dict[str, float] = Field(description="The target median held-out error per metric kind, percent")


HELD_OUT_MEDIANS_EXAMPLE = {"gpu": 22.8, "model_family": 17.6, "engine": 28.0}


class HeldOutMedians(BaseModel):
    """A profile's overall held-out medians, by what each fold left out."""

    model_config = schema_examples(HELD_OUT_MEDIANS_EXAMPLE)

    gpu: float | None = Field(description="Leave one GPU out: median absolute % error")
    model_family: float | None = Field(description="Leave one model family out: median absolute % error")
    engine: float | None = Field(description="Leave one engine out: median absolute % error")


HOLD_OUT_EXAMPLE = {"held_out": "gpu", "overall": HELD_OUT_STATS_EXAMPLE,
                    "by_metric": {"throughput": HELD_OUT_STATS_EXAMPLE},
                    "by_group": [{"group": "mi300x", **HELD_OUT_STATS_EXAMPLE}],
                    "by_layout": [{"layout_kind": "dp_ep", "by_metric": {"tpot_itl": HELD_OUT_STATS_EXAMPLE}}]}


class HeldOutLayoutOut(BaseModel):
    model_config = schema_examples({"layout_kind": "dp_ep", "by_metric": {"tpot_itl": HELD_OUT_STATS_EXAMPLE}})

    layout_kind: LayoutKind = Field(description=LAYOUT_KIND_DESCRIPTION)
    by_metric: dict[str, HeldOutStatsOut] = Field(description="By metric kind: throughput, tpot_itl, ttft, e2e")


class HoldOutOut(BaseModel):
    """Each group predicted by a fit that never saw it (at the chosen level)."""

    model_config = schema_examples(HOLD_OUT_EXAMPLE)

    held_out: Literal["gpu", "model_family", "engine"]
    overall: HeldOutStatsOut
    by_metric: dict[str, HeldOutStatsOut] = Field(description="By metric kind: throughput, tpot_itl, ttft, e2e")
    by_group: list[HeldOutGroupOut]
    by_layout: list[HeldOutLayoutOut] = Field(
        default_factory=list,
        description="By the layout the measured run used, per metric kind (empty in profiles fitted before this "
                    "breakdown existed)")
