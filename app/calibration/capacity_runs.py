"""Capacity rows (vLLM's start-up figures) predicted through the capacity core, and the activation fit.

A capacity run is the four rows one vLLM start-up log gives (scenario `capacity` in the schema of
measured-calibration-2.csv): `kv_cache_tokens` (the replica's "GPU KV cache size"), `kv_cache_gib`
(per GPU), `max_concurrency` (for `max_model_len` tokens per request) and `weights_gib` (per GPU); the
notes add the measured activation peak, non-torch and CUDA-graph GiB. Each run is predicted with the
engine version, `gpu_memory_utilization`, `max_model_len`, layout, checkpoint recipe and KV dtype the run
used, and nothing measured. Runs of models outside the catalog are skipped (no architecture to size).

`fit_vllm_activation` fits the two parameters of `engines.vllm.SamplerFit` on the single-GPU runs of
catalog models; the report gives the error on those runs and on the held-out multi-GPU runs apart.
"""

from __future__ import annotations

import csv
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from app.sizing.engines import EngineConfig, resolve_engine
from app.sizing.engines.base import parse_version
from app.sizing.engines.vllm import ACTIVATION_FIT, SamplerFit
from app.sizing.model.kv import kv_cache_bytes_for_batch
from app.sizing.model.recipes import RECIPES, WeightRecipe, uniform_recipe
from app.sizing.serving.capacity import model_dtype_bytes
from app.sizing.serving.memory import kv_bytes_per_token_per_gpu, kv_token_capacity, memory_budget
from app.sizing.specs import GpuSpec, ModelSpec

GIB = 1 << 30
METRICS = ("weights_gib", "kv_cache_gib", "kv_cache_tokens", "max_concurrency", "activation_gib")
METRIC_LABELS = {"weights_gib": "weights (GiB per GPU)", "kv_cache_gib": "KV cache (GiB per GPU)",
                 "kv_cache_tokens": "KV tokens (replica)", "max_concurrency": "max concurrency at max_model_len",
                 "activation_gib": "activation peak (GiB per GPU)"}
# The checkpoint recipe of a run, from its `quantization=` note and weight dtype.
QUANTIZED_RECIPES = {("compressed-tensors", "fp8"): "fp8_dynamic", ("compressed-tensors", "int8"): "w8a8_int8",
                     ("gptq", "int4"): "gptq_int4", ("awq", "int4"): "awq_int4", ("mxfp4", "fp4"): "gpt_oss_mxfp4"}


class Catalog(Protocol):
    """What the validation needs from a catalog: specs by slug (None when absent)."""

    def model(self, slug: str) -> ModelSpec | None: ...

    def gpu(self, slug: str) -> GpuSpec | None: ...


@dataclass(frozen=True, slots=True)
class CapacityRun:
    run_id: str  # the vLLM log file name
    model: str
    gpu: str
    tp: int
    pp: int
    weight_dtype: str
    kv_dtype: str
    quantization: str
    engine_version: str
    gpu_memory_utilization: float
    max_model_len: int
    measured: dict[str, float]  # metric -> value (activation_gib from the notes)
    row_ids: dict[str, str] = field(default_factory=dict)


def _note(notes: str, key: str) -> str | None:
    match = re.search(rf"(?:^|; ){re.escape(key)}=([^;]+)", notes)
    return match[1].strip() if match else None


def read_capacity_runs(path: Path) -> list[CapacityRun]:
    """The capacity runs of a measurements CSV (rows of other scenarios are ignored)."""
    runs: dict[str, dict] = {}
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["scenario"] != "capacity":
                continue
            run_id = _note(row["notes"], "log") or row["row_id"]
            run = runs.setdefault(run_id, {"row": row, "measured": {}, "row_ids": {}})
            run["measured"][row["metric"]] = float(row["value"])
            run["row_ids"][row["metric"]] = row["row_id"]
            activation = _note(row["notes"], "activation_gib")
            if activation is not None:
                run["measured"]["activation_gib"] = float(activation)
    result = []
    for run_id, run in runs.items():
        row = run["row"]
        result.append(CapacityRun(
            run_id=run_id, model=row["model"], gpu=row["gpu"], tp=int(row["tp"] or 1), pp=int(row["pp"] or 1),
            weight_dtype=row["weight_dtype"], kv_dtype=row["kv_dtype"] or row["weight_dtype"],
            quantization=_note(row["notes"], "quantization") or "None",
            engine_version=row["engine_version"], gpu_memory_utilization=float(row["gpu_memory_utilization"]),
            max_model_len=int(row["max_model_len"]), measured=run["measured"], row_ids=run["row_ids"]))
    return result


def run_recipe(run: CapacityRun) -> WeightRecipe | str:
    """The run's checkpoint recipe, or why there is none."""
    if run.quantization == "None":
        try:
            return uniform_recipe(run.weight_dtype)
        except ValueError:
            return f"weight dtype {run.weight_dtype} without a recipe"
    name = QUANTIZED_RECIPES.get((run.quantization, run.weight_dtype))
    return RECIPES[name] if name else f"no recipe for quantization {run.quantization} {run.weight_dtype}"


@dataclass(frozen=True, slots=True)
class RunPrediction:
    run: CapacityRun
    predicted: dict[str, float]
    skipped_reason: str | None = None

    def error(self, metric: str) -> float | None:
        """Absolute error in percent of the measured value, or None when either side is missing."""
        measured, predicted = self.run.measured.get(metric), self.predicted.get(metric)
        if measured is None or predicted is None or measured == 0:
            return None
        return abs(predicted - measured) / measured * 100


def predict_run(run: CapacityRun, catalog: Catalog) -> RunPrediction:
    model, gpu = catalog.model(run.model), catalog.gpu(run.gpu)
    if model is None:
        return RunPrediction(run, {}, "model not in the catalog")
    if gpu is None:
        return RunPrediction(run, {}, "GPU not in the catalog")
    recipe = run_recipe(run)
    if isinstance(recipe, str):
        return RunPrediction(run, {}, recipe)
    if run.max_model_len > model.max_position_embeddings:
        return RunPrediction(run, {}, "max_model_len beyond the catalog model's positions")
    version = parse_version(run.engine_version)
    config = EngineConfig(engine="vllm", engine_version=".".join(map(str, version)),
                          gpu_memory_utilization=run.gpu_memory_utilization, max_model_len=run.max_model_len)
    layout = {"tensor_parallel": run.tp, "pipeline_parallel": run.pp}
    engine = resolve_engine(config, model, gpu, run.tp, run.pp, model_dtype_bytes(recipe))
    memory = memory_budget(model, gpu, engine, weight_dtype=recipe, **layout)
    kv_tokens, _ = kv_token_capacity(model, memory.kv_budget_bytes_per_stage, run.kv_dtype,
                                     block_size=engine.block_size, **layout)
    # vLLM's "Maximum concurrency": the pool over one request of max_model_len (window layers hold less).
    per_request = kv_cache_bytes_for_batch(model, (run.max_model_len,), run.kv_dtype, run.tp, run.pp,
                                           engine.block_size)
    per_token = kv_bytes_per_token_per_gpu(model, run.kv_dtype, **layout)
    return RunPrediction(run, {
        "weights_gib": memory.weights_bytes_per_gpu / GIB,
        "kv_cache_gib": memory.kv_budget_bytes_per_gpu / GIB,
        "kv_cache_tokens": float(kv_tokens),
        "max_concurrency": kv_tokens * per_token / per_request,
        "activation_gib": memory.activation_bytes_per_gpu / GIB,
    })


def is_fit_run(prediction: RunPrediction) -> bool:
    """The runs the activation fit uses: single-GPU runs of catalog models."""
    return prediction.skipped_reason is None and prediction.run.tp * prediction.run.pp == 1


def fit_vllm_activation(runs: Sequence[CapacityRun], catalog: Catalog) -> SamplerFit:
    """Least squares of activation − S·V·b = base + β·S·V over the fit runs (one point per model and
    weight dtype), S = max_num_seqs, V = vocabulary, b = the model dtype's bytes; the sampler term is
    the larger one on every fit run at vLLM's defaults (checked by the tests)."""
    points: dict[tuple[str, str], tuple[float, float]] = {}
    for run in runs:
        prediction = predict_run(run, catalog)
        if not is_fit_run(prediction) or "activation_gib" not in run.measured:
            continue
        model, gpu, recipe = catalog.model(run.model), catalog.gpu(run.gpu), run_recipe(run)
        assert model is not None and gpu is not None and not isinstance(recipe, str)
        engine = resolve_engine(EngineConfig(engine="vllm", engine_version=run.engine_version.split()[0]),
                                model, gpu, 1, 1)
        logits = (engine.max_num_seqs or 1) * model.vocab_size
        target = run.measured["activation_gib"] * GIB - logits * model_dtype_bytes(recipe)
        points[(run.model, run.weight_dtype)] = (logits, target)
    if len(points) < 2:
        raise ValueError("the activation fit needs at least two single-GPU runs of catalog models")
    x = np.array([[1.0, logits] for logits, _ in points.values()])
    y = np.array([target for _, target in points.values()])
    (base, per_logit), *_ = np.linalg.lstsq(x, y, rcond=None)
    return SamplerFit(base_bytes=round(float(base)), float32_bytes_per_logit=round(float(per_logit), 3))


# Report ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CapacityReport:
    predictions: tuple[RunPrediction, ...]

    @property
    def predicted(self) -> tuple[RunPrediction, ...]:
        return tuple(p for p in self.predictions if p.skipped_reason is None)

    def median_error(self, metric: str, runs: Iterable[RunPrediction] | None = None) -> float | None:
        errors = [e for p in (self.predicted if runs is None else runs) if (e := p.error(metric)) is not None]
        return statistics.median(errors) if errors else None

    def count(self, metric: str, runs: Iterable[RunPrediction] | None = None) -> int:
        return sum(p.error(metric) is not None for p in (self.predicted if runs is None else runs))


def capacity_report(runs: Sequence[CapacityRun], catalog: Catalog) -> CapacityReport:
    return CapacityReport(tuple(predict_run(run, catalog) for run in runs))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}%"


def capacity_markdown(report: CapacityReport, source: dict[str, str]) -> str:
    """The capacity section of the accuracy page."""
    held_out = [p for p in report.predicted if not is_fit_run(p)]
    fitted = [p for p in report.predicted if is_fit_run(p)]
    skipped: dict[str, int] = {}
    for p in report.predictions:
        if p.skipped_reason:
            skipped[p.skipped_reason] = skipped.get(p.skipped_reason, 0) + 1
    fit = ACTIVATION_FIT
    lines = [
        "## Capacity: vLLM start-up figures",
        "",
        (f"Source: `{source['file']}` (sha256 `{source['sha256'][:16]}…`): the `capacity` rows of "
         "measured-calibration-2.csv, verbatim: the llm-d planner's vLLM 0.19.0 runs on H100 80GB HBM3 "
         "(sources in measured-calibration-2-sources.md). Each run is predicted from its engine version, gpu_memory_utilization, "
         "max_model_len, layout, checkpoint recipe and KV dtype; nothing measured enters a prediction."),
        "",
        f"Runs: {len(report.predictions)}; predicted {len(report.predicted)}; skipped "
        + (", ".join(f"{n} ({reason})" for reason, n in sorted(skipped.items())) or "none") + ".",
        "",
        ("Fitted on these rows: the activation peak's two parameters (base "
         f"{fit.base_bytes / GIB:.3f} GiB, {fit.float32_bytes_per_logit} float32 bytes per logit), by least "
         "squares on the single-GPU runs of catalog models (one point per model and dtype). The non-torch "
         "defaults come from the runs of models outside the catalog, which are not predicted here. "
         "Errors are shown on all predicted runs (the fitted ones among them) and on the multi-GPU runs, which the "
         "fit did not see. Not cross-validated by GPU, model family or engine as the latency figures above are: "
         "every run is vLLM 0.19 on H100, and some multi-GPU runs are of models whose single-GPU runs were fitted, "
         "so the held-out column says how the accounting carries across layouts, not to other GPUs or engines."),
        "",
        "| metric | runs | median abs error | multi-GPU runs (held out) | their median abs error |",
        "|---|---:|---:|---:|---:|",
    ]
    for metric in METRICS:
        lines.append(f"| {METRIC_LABELS[metric]} | {report.count(metric)} | {_pct(report.median_error(metric))} "
                     f"| {report.count(metric, held_out)} | {_pct(report.median_error(metric, held_out))} |")
    lines += ["", ("| run | model | TP×PP | weights | KV | measured → predicted KV tokens | error "
                   "| max concurrency error |"),
              "|---|---|---|---|---|---:|---:|---:|"]
    for p in sorted(report.predicted, key=lambda p: -(p.error("kv_cache_tokens") or 0)):
        run = p.run
        lines.append(
            f"| {run.run_id.removesuffix('.log')} | {run.model} | {run.tp}×{run.pp} | {run_recipe(run).name} "  # type: ignore[union-attr]
            f"| {run.kv_dtype} | {run.measured.get('kv_cache_tokens', 0):,.0f} → "
            f"{p.predicted['kv_cache_tokens']:,.0f} | {_pct(p.error('kv_cache_tokens'))} "
            f"| {_pct(p.error('max_concurrency'))} |")
    lines.append(f"\nFit runs: {len(fitted)}; held-out runs: {len(held_out)}. Max concurrency is the pool over one "
                 "request of max_model_len with sliding-window layers holding only their window; where vLLM "
                 "0.19 printed tokens / max_model_len for a window model (gemma-2) the two differ.")
    return "\n".join(lines) + "\n"
