"""`python -m app.validate FILE.csv [--json OUT.json] [--profile NAME] [--markdown OUT.md]`.

Predicts every row of a measurements file (the schema of measured-calibration.csv) through the same core
the API uses, and prints the median and p90 absolute percentage error by scenario x metric x GPU family,
the headline categories and the worst rows. Validation never fits: the measured values are compared
with the predictions, never used to make them. Rows that cannot be predicted are skipped with a reason.

`--profile`: `default` (the shipped fitted profile, app/data/calibration/default-profile.json),
`builtin` (the uncalibrated constants), or the path of a profile JSON written by `python -m app.calibrate`.
`--json` writes every row (`row_id`, `predicted`, `measured`, `abs_pct_error` or `skipped_reason`) and
the summary; `--markdown` writes the accuracy page (docs/ACCURACY.md is generated this way:
`python -m app.validate tests/data/measured-calibration.csv --capacity tests/data/measured-capacity.csv
--markdown docs/ACCURACY.md`). `--capacity` adds the capacity section: vLLM's start-up figures (KV tokens
and GiB, max concurrency, weights, activation peak) predicted by the capacity core
(`app.calibration.capacity_runs`).
Predictions use the catalog shipped in app/data (no database needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.calibration.capacity_runs import (
    capacity_markdown,
    capacity_report,
    fit_vllm_activation,
    read_capacity_runs,
)
from app.calibration.profiles import (
    BUILTIN_DESCRIPTION,
    BUILTIN_PROFILE,
    DEFAULT_PROFILE,
    DEFAULT_PROFILE_PATH,
    builtin_profile,
    profile_from_entries,
    read_default_profile_document,
)
from app.calibration.rows import read_measurement_files
from app.calibration.service import (
    CONTRADICTION_RATIO,
    LATENCY_LIGHT_LOAD,
    LATENCY_LOADED,
    LIGHT_LOAD_USERS,
    THROUGHPUT,
    Contradiction,
    ObservedRow,
    ReferenceCatalog,
    Report,
    contradiction_document,
    file_sha256,
    row_document,
    summary_document,
    validate,
)
from app.sizing import CALCULATION_VERSION
from app.sizing.calibration.fit import MIN_LATENCY_ROWS, SMALL_M_FLATNESS, CalibrationProfile, parameter_value
from app.sizing.calibration.predict import (
    CLOSED_LOOP_REQUESTS_PER_USER,
    LATENCY_METRICS,
    MAX_SIMULATED_REQUESTS,
)
from app.sizing.layout import KIND_DISAGGREGATED, KIND_DP_EP, KIND_PP, KIND_TP

WORST_ROWS = 10
LAYOUT_LABELS = {KIND_TP: "TP only", KIND_DP_EP: "DP+EP", KIND_PP: "PP > 1", KIND_DISAGGREGATED: "prefill/decode"}
CATEGORY_LABELS = {THROUGHPUT: "throughput rows", LATENCY_LIGHT_LOAD: "latency, batch 1 and light load",
                   LATENCY_LOADED: "latency under load (queueing)"}


def load_profile(name: str) -> tuple[CalibrationProfile, dict[str, Any] | None]:
    """The profile and its JSON document (None for builtin)."""
    if name == BUILTIN_PROFILE:
        return builtin_profile(), None
    document = read_default_profile_document(DEFAULT_PROFILE_PATH if name == DEFAULT_PROFILE else Path(name))
    return profile_from_entries(document["name"], document["entries"]), document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE",
                        help="measurements CSV (the measured-calibration.csv schema); several are read as one")
    parser.add_argument("--json", type=Path, help="write every row's prediction and the summary here")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="default | builtin | path to a profile JSON")
    parser.add_argument("--markdown", type=Path, help="write the accuracy page here")
    parser.add_argument("--source", action="append", help="only the rows of this source_id (repeatable)")
    parser.add_argument("--stat-when-unstated", choices=("mean", "median"),
                        help="read latencies whose statistic the source does not state as this one (named in "
                             "the report); without it they are predicted as the mean, and each row says so")
    parser.add_argument("--skip-invalid-rows", action="store_true",
                        help="accepted for older commands: rows outside the measurement schema (capacity rows, "
                             "rows without a weight dtype) are always skipped with the reason, never the file")
    parser.add_argument("--capacity", type=Path,
                        help="capacity runs CSV (vLLM start-up figures, scenario capacity): adds the capacity section")
    args = parser.parse_args(argv)

    read = read_measurement_files(args.files, sources=args.source)
    if read is None:
        return 2
    rows, files = read
    rows = with_stat(rows, args.stat_when_unstated)
    try:
        profile, document = load_profile(args.profile)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read profile {args.profile!r}: {exc}", file=sys.stderr)
        return 2
    report = validate(rows, ReferenceCatalog(), profile)
    source = {"file": files.names, "sha256": files.sha256}
    print(text_report(report, source))
    if args.json:
        args.json.write_text(json.dumps({
            "profile": report.profile, "source_file": source["file"], "source_sha256": source["sha256"],
            "calculation_version": CALCULATION_VERSION,
            "rows": [_row_json(row_document(outcome)) for outcome in report.outcomes],
            "summary": summary_document(report.summary),
            "contradictions": [contradiction_document(group) for group in report.contradictions],
        }, indent=1) + "\n", encoding="utf-8")
    capacity_section = ""
    if args.capacity:
        runs = read_capacity_runs(args.capacity)
        capacity_source = {"file": args.capacity.name, "sha256": file_sha256(args.capacity.read_bytes())}
        capacity_section = capacity_markdown(capacity_report(runs, ReferenceCatalog()), capacity_source)
        print(capacity_section)
        print(f"activation refit on these runs: {fit_vllm_activation(runs, ReferenceCatalog())}")
    if args.markdown:
        page = markdown_report(report, source, document, command=_command(args))
        args.markdown.write_text(page + ("\n" + capacity_section if capacity_section else ""), encoding="utf-8")
    return 0


def with_stat(rows: list[ObservedRow], stat: str | None) -> list[ObservedRow]:
    """The rows, latencies without a statistic read as `stat` (unchanged when None)."""
    if stat is not None:
        rows = [replace(row, measurement=replace(row.measurement, stat=stat))
                if row.measurement is not None and row.measurement.metric in LATENCY_METRICS
                and row.measurement.stat is None else row
                for row in rows]
    return rows


def _row_json(row: dict[str, Any]) -> dict[str, Any]:
    """A predicted row carries predicted/abs_pct_error, a skipped one its reason (not both)."""
    keep = ("predicted", "abs_pct_error", "assumption") if row["skipped_reason"] is None else ("skipped_reason",)
    return {key: value for key, value in row.items()
            if key not in ("predicted", "abs_pct_error", "skipped_reason", "assumption")
            or (key in keep and value is not None)}


def _command(args: argparse.Namespace) -> str:
    parts = ["python -m app.validate", *map(str, args.files)]
    if args.profile != DEFAULT_PROFILE:
        parts += ["--profile", args.profile]
    for source in args.source or []:
        parts += ["--source", source]
    if args.stat_when_unstated:
        parts += ["--stat-when-unstated", args.stat_when_unstated]
    if args.skip_invalid_rows:
        parts += ["--skip-invalid-rows"]
    if args.capacity:
        parts += ["--capacity", str(args.capacity)]
    return " ".join(parts + ["--markdown", str(args.markdown)])


# Text -------------------------------------------------------------------------------------------

def _times(value: float | None) -> str:
    """A median predicted / measured: '×0.68'; '–' where the profile has none."""
    return "–" if value is None else f"×{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _score(value: float | None) -> str:
    """A level's score to two decimals (levels a tenth of a point apart are told apart), '-' without one."""
    return "-" if value is None else f"{value:.2f}%"


def text_report(report: Report, source: dict[str, str]) -> str:
    summary = report.summary
    lines = [
        (f"Validation of {source['file']} (sha256 {source['sha256'][:12]}) with calibration profile "
         f"{report.profile!r}"),
        (f"rows: {summary.rows_total} total, {summary.rows_predicted} predicted ({summary.predicted_ratio:.1%}), "
         f"{summary.rows_total - summary.rows_predicted} skipped"),
        (f"overall: median {_pct(summary.overall.median_abs_pct_error)}%, "
         f"p90 {_pct(summary.overall.p90_abs_pct_error)}% absolute error"),
    ]
    for name, label in CATEGORY_LABELS.items():
        stats = summary.categories[name]
        lines.append(f"  {label}: {stats.rows} rows, median {_pct(stats.median_abs_pct_error)}%, "
                     f"p90 {_pct(stats.p90_abs_pct_error)}%")
    lines += ["", f"{'layout':<13} {'metric':<28} {'rows':>5} {'median %':>9} {'p90 %':>7}"]
    for (kind, metric), stats in summary.by_layout:
        lines.append(f"{LAYOUT_LABELS[kind]:<13} {metric:<28} {stats.rows:>5} "
                     f"{_pct(stats.median_abs_pct_error):>9} {_pct(stats.p90_abs_pct_error):>7}")
    lines += ["", f"{'scenario':<13} {'metric':<28} {'gpu family':<10} {'rows':>5} {'median %':>9} {'p90 %':>7}"]
    for (scenario, metric, family), stats in summary.by_group:
        lines.append(f"{scenario:<13} {metric:<28} {family:<10} {stats.rows:>5} "
                     f"{_pct(stats.median_abs_pct_error):>9} {_pct(stats.p90_abs_pct_error):>7}")
    if summary.skipped_reasons:
        lines += ["", "skipped:"] + [f"  {count:>5}  {reason}" for reason, count in summary.skipped_reasons.items()]
    lines += ["", f"worst {WORST_ROWS} rows:"]
    for outcome in report.worst(WORST_ROWS):
        lines.append(f"  {outcome.row.row_id:<36} predicted {outcome.predicted:>12.4g}  measured "
                     f"{outcome.row.value:>12.4g}  error {outcome.abs_pct_error:.0f}%")
    return "\n".join(lines)


# Markdown ---------------------------------------------------------------------------------------

def _data_text(report: Report, source: dict[str, str], command: str) -> str:
    if source["file"] == "measured-calibration.csv" and "--source" not in command:
        return (f"`{source['file']}` (sha256 `{source['sha256']}`): {report.summary.rows_total} published "
                "measurements of TensorRT-LLM, vLLM, LMDeploy and gpt-fast (offline throughput, fixed-batch "
                "throughput, batch-1 latency, latency under a Poisson load) on A100, H100, H200, GH200, L40S and "
                "MI300X. Sources and how each one measured: `measured-calibration-sources.md` in the reference data.")
    sources = sorted({outcome.row.source_id for outcome in report.outcomes})
    stem = source["file"].removesuffix(".csv")
    return (f"`{source['file']}` (sha256 `{source['sha256']}`), the rows of {', '.join(sources)}: "
            f"{report.summary.rows_total} published measurements. Sources and how each one measured: "
            f"`{stem}-sources.md` in the reference data.")


def markdown_report(report: Report, source: dict[str, str], document: dict[str, Any] | None, *,
                    command: str) -> str:
    summary = report.summary
    provenance = document["provenance"] if document else None
    validation = provenance.get("cross_validation") if provenance else None
    out = [
        "# Accuracy",
        "",
        f"<!-- Generated by `{command}`; do not edit by hand. -->",
        "",
        ("How far the service's expected numbers are from published measurements of real serving engines, and how "
         "the efficiencies behind them were fitted. Every number on this page comes from the command above and "
         "the profile's provenance (written by `make calibrate`)."),
        "",
    ]
    out += _cross_validation_section(validation)
    if validation:
        out += _cross_validation_caveats(provenance)
    out += _defects_section(provenance)
    out += [
        "## Data",
        "",
        _data_text(report, source, command) if "--source" in command else
        (f"`{source['file']}` (sha256 `{source['sha256']}`): {summary.rows_total} published measurements of "
         "TensorRT-LLM, vLLM, SGLang, LMDeploy, gpt-fast and others: offline and fixed-batch throughput, batch-1 "
         "latency, latency under a Poisson load, aiconfigurator's end-to-end TTFT/TPOT at fixed concurrency on "
         "H100/H200/B200/GB200, Argonne's static batches (end-to-end latency and throughput) across A100, H100, "
         "GH200, MI250, MI300X and Gaudi2, and capacity rows. Sources and how each one measured: "
         "`measured-calibration-sources.md` and `measured-calibration-2-sources.md` in the reference data."),
        "",
        (f"**{summary.rows_predicted} of {summary.rows_total} rows predicted ({summary.predicted_ratio:.1%})**; the "
        "rest are skipped with the reason (table below), never guessed."),
        "",
        "## Method",
        "",
        ("- Each row is predicted through the same core the API uses: the engine's memory accounting and KV capacity "
         "(/v1/capacity), the step-time model (roofline with efficiencies), and the continuous-batching simulator "
         "(/v1/slo-plan) for offline, closed-loop and Poisson runs; a static batch is one prefill step and osl − 1 "
         "decode steps (its end-to-end latency is the whole run). The measured value is never read while "
         "predicting. A latency whose statistic the source does not state is predicted as the mean, and a row that "
         "does not state its weight dtype is predicted at the model's published checkpoint precision (what an engine serves "
         "without a quantization flag); each such row says so. Each row runs with its engine's defaults at the "
         "release it states (memory accounting, scheduler limits, KV dtype), the engine's default release where "
         "it states none or only the year (/v1/capacity's: vLLM's latest the engine reference covers). A closed loop "
         f"whose source states no request count is {CLOSED_LOOP_REQUESTS_PER_USER} requests per user, at most "
         f"{MAX_SIMULATED_REQUESTS:,} simulated on its busiest scheduler and every one counted (past "
         f"{MAX_SIMULATED_REQUESTS // CLOSED_LOOP_REQUESTS_PER_USER} users a scheduler the first round, all sent at "
         "once, weighs more than a tenth). A row whose layout columns contradict the run "
         "(its own run id, or its source's pattern of such rows) is skipped."),
        ("- The efficiencies (achieved HBM-bandwidth fraction, compute-curve scale and its flatness below 64 rows, "
         "per-step overhead (added to the step, or in engines that overlap host work with the GPU the least a step "
         "lasts), per-layer overhead, all-reduce latency, the per-step overhead and host work per sequence per "
         "step of engines that do not overlap host work with the GPU: vLLM before 0.8, the host work per sequence "
         "per step that engines which do overlap it hide while the GPU takes longer (a step lasts at least that "
         "long), and the cost per "
         "MoE layer of a step with prompt "
         "tokens in engines that run such steps outside CUDA graphs: TensorRT-LLM's PyTorch backend, SGLang before "
         "0.5.10, vLLM before 0.8, and what each step of a disaggregated deployment's decode worker costs beyond "
         "an aggregated worker's) are fitted inside cited physical ranges, the global "
         "entry pulled toward cited priors and each family or precision entry toward the level above it, minimizing "
         "the mean |ln(predicted / measured)|; never per row. The fixed costs of a step (per step, per layer, "
         "all-reduce latency) and the small-matmul floor, which shape small batches' short steps, are fitted "
         f"only by an entry with at least {MIN_LATENCY_ROWS} latency rows (TPOT/ITL, TTFT, E2E); an entry with "
         "fewer keeps the level above's. Poisson rows are validated but not fitted on (their "
         "schedule depends on the step time), nor are rows whose weight dtype is assumed, nor the TTFT of a "
         "closed loop of several users (mostly queueing behind the other users' prompts, which depends on "
         "whether the harness keeps its users in step, which no source states). At a light load (at most "
         f"{LIGHT_LOAD_USERS} users per scheduler, whose 1k-token prompts fit one prefill step) such a TTFT of an "
         "MoE model is read for "
         "one parameter only: after each entry's search, the cost per MoE layer of a prompt step is refitted on "
         "the entry's MoE rows with every other efficiency held (the entries below start from the search's "
         "values). A disaggregated run's TPOT is read for one parameter only, the decode worker's extra cost "
         "per step: one value for every entry, fitted last on those TPOTs, each at its own entry, with every "
         "other efficiency held (such a run is simulated afresh per efficiency, too slow for the search)."),
        ("- A profile can be one global entry, an entry per GPU family (and per GPU maker, for that maker's GPUs "
         "whose family has none: fitted on all of the maker's rows, from the global entry, as a family's is), or "
         "an entry per GPU family and compute precision. Which one ships is decided by the cross-validated error above, never by the error on the "
         "data it was fitted to."),
        "",
        f"## Profile `{report.profile}`",
        "",
    ]
    if provenance:
        out += [
            (f"Fitted on {provenance['fitted_on']} to `{provenance['source_file']}` (sha256 "
             f"`{provenance['source_sha256'][:16]}`…): {provenance['rows_used']} of {provenance['rows_total']} rows "
             f"usable by the fit, starting from `{provenance['base_profile']}`. {provenance['method']}."),
            "",
            ("| GPU family | compute | rows | HBM bandwidth fraction | compute scale | small-M flatness "
             "| per step (ms) | per step, V0 host loop (ms) | per layer (µs) | all-reduce α (µs) | PCIe link fraction "
             "| per sequence, V0 host loop (µs) | per sequence, overlapped host loop (µs) "
             "| per MoE layer, prompt steps outside CUDA graphs (ms) | per step, disaggregated decode worker (ms) |"),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for entry in profile_from_entries(document["name"], document["entries"]).entries:
            e = entry.efficiency
            out.append(f"| {entry.family} | {entry.compute_dtype} | {entry.rows} | {e.bandwidth_fraction:.3f} | "
                       f"{e.compute_scale:.3f} | {parameter_value(e, SMALL_M_FLATNESS):.2f} | "
                       f"{e.per_step_overhead_s * 1e3:.3f} | {e.serial_step_s * 1e3:.3f} | "
                       f"{e.per_layer_overhead_s * 1e6:.1f} | "
                       f"{e.allreduce_latency_s * 1e6:.1f} | {e.pcie_link_fraction:.3f} | {e.per_sequence_overhead_s * 1e6:.1f} | "
                       f"{e.overlapped_host_per_sequence_s * 1e6:.1f} | {e.prefill_moe_layer_overhead_s * 1e3:.3f} | "
                       f"{e.decode_worker_step_overhead_s * 1e3:.3f} |")
        out.append("")
        priors = provenance.get("parameter_priors") or {}
        if priors:
            out += ["### Parameter ranges and priors", "", "| parameter | range | prior | source |", "|---|---|---:|---|"]
            out += [f"| {name} | {low:g}–{high:g} | {priors[name]['prior']:g} | {priors[name]['source']} |"
                    for name, (low, high) in provenance["parameter_bounds"].items() if name in priors]
            out.append("")
    else:
        out += [BUILTIN_DESCRIPTION, ""]
    out += [
        "## Error on the calibration data (in-sample: not a measure of generalization)",
        "",
        "| rows | count | median abs. error | p90 abs. error |",
        "|---|---:|---:|---:|",
        (f"| all predicted | {summary.overall.rows} | {_pct(summary.overall.median_abs_pct_error)}% | "
         f"{_pct(summary.overall.p90_abs_pct_error)}% |"),
    ]
    for name, label in CATEGORY_LABELS.items():
        stats = summary.categories[name]
        out.append(f"| {label} | {stats.rows} | {_pct(stats.median_abs_pct_error)}% | "
                   f"{_pct(stats.p90_abs_pct_error)}% |")
    out += [
        "",
        ("Light load: a single stream, a static batch of one, one closed-loop user, or a Poisson load at most half "
         "of what the predicted engine serves at most."),
        "",
        "### By layout kind",
        "",
        ("TP only: tensor (and no pipeline) parallelism; DP+EP: attention data parallelism and/or expert "
         "parallelism (each rank its own requests and KV, experts split, an all-to-all per MoE layer); PP > 1: "
         "pipeline stages with micro-batches in flight."),
        "",
        "| layout | metric | rows | median abs. error | p90 abs. error |",
        "|---|---|---:|---:|---:|",
    ]
    out += [f"| {LAYOUT_LABELS[kind]} | {metric} | {stats.rows} | {_pct(stats.median_abs_pct_error)}% | "
            f"{_pct(stats.p90_abs_pct_error)}% |" for (kind, metric), stats in summary.by_layout]
    out += [
        "",
        "### By scenario, metric and GPU family",
        "",
        "| scenario | metric | GPU family | rows | median abs. error | p90 abs. error |",
        "|---|---|---|---:|---:|---:|",
    ]
    out += [f"| {scenario} | {metric} | {family} | {stats.rows} | {_pct(stats.median_abs_pct_error)}% | "
            f"{_pct(stats.p90_abs_pct_error)}% |" for (scenario, metric, family), stats in summary.by_group]
    if summary.skipped_reasons:
        out += ["", "## Skipped rows", "", "| reason | rows |", "|---|---:|"]
        out += [f"| {reason} | {count} |" for reason, count in summary.skipped_reasons.items()]
    out += _contradictions_section(report)
    out += ["", f"## Worst {WORST_ROWS} rows", "", "| row | predicted | measured | error |", "|---|---:|---:|---:|"]
    out += [f"| {outcome.row.row_id} | {outcome.predicted:.4g} | {outcome.row.value:.4g} | "
            f"{outcome.abs_pct_error:.0f}% |" for outcome in report.worst(WORST_ROWS)]
    return "\n".join(out) + "\n"


def _contradictions_section(report: Report) -> list[str]:
    """The predicted rows the stated columns cannot tell apart (`service.contradictions`): how many by source and
    metric, and the widest groups."""
    groups = report.contradictions
    if not groups:
        return []
    by_kind: dict[tuple[str, str], list[Contradiction]] = {}
    for group in groups:
        first = group.outcomes[0].row
        by_kind.setdefault((first.source_id, first.metric), []).append(group)
    out = ["", "## Rows the stated columns cannot tell apart", "",
           (f"{len(groups)} group{'s' if len(groups) > 1 else ''} of predicted rows "
            f"({sum(len(group.outcomes) for group in groups)} rows): each states one configuration (model, GPU and "
            "every column a prediction reads, so one prediction serves the group), yet its measured values differ by "
            f"×{CONTRADICTION_RATIO:g} or more: something the rows do not record differs (an engine setting such as "
            "speculative decoding, the harness, the run). Whatever the model, the worst-predicted row of a group is "
            "off by at least (high − low) / (high + low)."),
           "", "| source | metric | groups | rows | median high / low |", "|---|---|---:|---:|---:|"]
    out += [f"| {source} | {metric} | {len(kind)} | {sum(len(group.outcomes) for group in kind)} | "
            f"×{statistics.median(group.ratio for group in kind):.2f} |"
            for (source, metric), kind in sorted(by_kind.items())]
    out += ["", f"The widest {min(WORST_ROWS, len(groups))}:", "",
            "| rows | metric | low | high | high / low | least error of the worst row |", "|---|---|---:|---:|---:|---:|"]
    out += [f"| {', '.join(outcome.row.row_id for outcome in group.outcomes)} | {group.outcomes[0].row.metric} | "
            f"{group.low:.4g} | {group.high:.4g} | ×{group.ratio:.2f} | {group.least_worst_error_pct:.0f}% |"
            for group in groups[:WORST_ROWS]]
    return out


HOLD_OUT_LABELS = {"gpu": "leave one GPU out", "model_family": "leave one model family out",
                   "engine": "leave one engine out"}
METRIC_KIND_LABELS = {"throughput": "throughput", "tpot_itl": "TPOT / ITL", "ttft": "TTFT", "e2e": "end-to-end"}


def _interval(stats: dict[str, Any]) -> str:
    """' [low–high]': a held-out median's 90% interval (`crossval.median_interval`), '' where the profile has none."""
    low, high = stats.get("median_abs_pct_error_low"), stats.get("median_abs_pct_error_high")
    return "" if low is None or high is None else f" [{_pct(low)}–{_pct(high)}]"


def _cross_validation_caveats(provenance: dict[str, Any]) -> list[str]:
    """What the held-out figures above do and do not guard against, and the code they were computed with."""
    fitted_at = provenance["calculation_version"]
    version = (f"The held-out fits ran at calculation version {fitted_at}, the code's own." if fitted_at ==
               CALCULATION_VERSION else
               f"The held-out fits ran at calculation version {fitted_at}; this page was generated at "
               f"{CALCULATION_VERSION}, whose changes since leave these predictions as they were (a change that "
               "moves them comes with a refit, `make calibrate`).")
    return [
        ("How far to trust them: no fitted value saw the held-out rows, but these same folds judged the model's "
         "design as it grew (the rows an entry needs, the split of the V0 host loop's overheads, the rows taken "
         "from each source, the level shipped; see the comments of app/sizing/calibration/fit.py and "
         "app/calibration/crossval.py), and nothing was held back for a last look, so the medians are somewhat "
         "optimistic. The global prior of the bandwidth fraction, 0.70, comes from two A100 batch-1 rows that are "
         "in the data (at the priors' weight, 0.02), and vLLM's activation and non-torch memory from the vLLM 0.19 "
         "H100 capacity runs (the capacity section of docs/ACCURACY.md). " + version),
        "",
    ]


def _cross_validation_section(validation: dict[str, Any] | None) -> list[str]:
    """The headline: held-out error per hold-out and metric kind, against the targets."""
    out = ["## Cross-validated error (the yardstick)", ""]
    if not validation:
        return out + [("This profile was not cross-validated (`python -m app.calibrate` without "
                      "`--no-cross-validation` does it)."), ""]
    targets = validation["targets"]
    out += [
        ("Every group below was predicted by a fit that never saw it: leave one GPU out (its datasheet is all the "
         "fit knows of it), leave one model family out (a family is the publisher of the weights: Llama 2, 3 and 4 "
         "go together), leave one engine out. A held-out GPU whose family has other GPUs in the data (H100 among "
         "H200 and GH200, B200 beside GB200) still gets its family's entry, fitted on those siblings; one alone in "
         "its family (L40S, A100, the RTX PRO 6000: sm_120, not the data-center Blackwell) gets its maker's entry, "
         "fitted on the other NVIDIA GPUs' rows; MI300X and Gaudi 2, alone among their makers' GPUs in the data, fall "
         "back to the global entry. Median absolute error per metric, with the target; [low–high] is the median's 90% "
         "interval (`crossval.median_interval`: its spread over resamples of the held-out rows; rows of one source "
         "err together, so the true spread is wider), and a ✓ or ✗ whose interval holds the target is a verdict "
         "within that spread; the 90th percentile in brackets."),
        "",
        "| held out | " + " | ".join(f"{METRIC_KIND_LABELS[kind]} (target ≤ {targets[kind]:g}%)"
                                     for kind in targets) + " | all rows |",
        "|---|" + "---:|" * (len(targets) + 1),
    ]
    for item in validation["hold_outs"]:
        cells = []
        for kind in targets:
            stats = item["by_metric"][kind]
            median = stats["median_abs_pct_error"]
            verdict = "" if median is None else (" ✓" if median <= targets[kind] else " ✗")
            cells.append(f"{_pct(median)}%{_interval(stats)}{verdict} ({_pct(stats['p90_abs_pct_error'])}%, "
                         f"{stats['rows']} rows)")
        overall = item["overall"]
        out.append(f"| {HOLD_OUT_LABELS[item['held_out']]} | " + " | ".join(cells)
                   + f" | {_pct(overall['median_abs_pct_error'])}% ({overall['rows']} rows) |")
    if any(item.get("by_layout") for item in validation["hold_outs"]):
        out += [
            "",
            ("By the layout the measured run used (TP only; DP+EP: attention data and/or expert parallelism; "
             "PP > 1: pipeline stages; disaggregated prefill and decode pools), each row held out as above; "
             "×r is the median predicted / measured, which way the predictions erred (below 1: they ran low):"),
            "",
            "| held out | layout | " + " | ".join(f"{METRIC_KIND_LABELS[kind]} (target ≤ {targets[kind]:g}%)"
                                                 for kind in targets) + " |",
            "|---|---|" + "---:|" * len(targets),
        ]
        for item in validation["hold_outs"]:
            for layout in item.get("by_layout", ()):
                cells = []
                for kind in targets:
                    stats = layout["by_metric"][kind]
                    median = stats["median_abs_pct_error"]
                    verdict = "" if median is None else (" ✓" if median <= targets[kind] else " ✗")
                    ratio = "" if stats.get("median_ratio") is None else f", {_times(stats['median_ratio'])}"
                    cells.append("–" if not stats["rows"] else
                                 f"{_pct(median)}%{_interval(stats)}{verdict} ({stats['rows']} rows{ratio})")
                out.append(f"| {HOLD_OUT_LABELS[item['held_out']]} | {LAYOUT_LABELS[layout['layout_kind']]} | "
                           + " | ".join(cells) + " |")
    out += [
        "",
        (f"Shipped level: **{validation['levels'][validation['chosen_level']]}**, chosen by {validation['chosen_by']}. "
         "Median held-out error of each level:"),
        "",
        "| level | " + " | ".join(HOLD_OUT_LABELS[name] for name in HOLD_OUT_LABELS) + " |",
        "|---|" + "---:|" * len(HOLD_OUT_LABELS),
    ]
    out += [f"| {validation['levels'][level]} | " + " | ".join(f"{_pct(medians.get(name))}%" for name in HOLD_OUT_LABELS)
            + " |" for level, medians in validation["candidates"].items()]
    if validation.get("choice"):
        out += ["", ("The choice, from the general to the specific (score: the mean of the leave-one-GPU-out and "
                     "leave-one-model-family-out medians; a level ships over the one before it only where its score "
                     "is the lower one in the share of paired resamples of the held-out rows shown):"), ""]
        out += [f"- {validation['levels'][step['level']]} against {validation['levels'][step['against']]}: "
                f"{_score(step['score'])} against {_score(step['against_score'])}, lower in "
                f"{step['better_in']:.0%} of the resamples: {'shipped' if step['chosen'] else 'not shipped'}."
                for step in validation["choice"]]
    for item in validation["hold_outs"]:
        label = HOLD_OUT_LABELS[item["held_out"]]
        out += ["", f"### {label[0].upper()}{label[1:]}", "",
                "| held out | rows | median abs. error | p90 abs. error | median predicted / measured |",
                "|---|---:|---:|---:|---:|"]
        out += [f"| {group['group']} | {group['rows']} | {_pct(group['median_abs_pct_error'])}% | "
                f"{_pct(group['p90_abs_pct_error'])}% | {_times(group.get('median_ratio'))} |"
                for group in item["by_group"]]
    return out + [""]


def _defects_section(provenance: dict[str, Any] | None) -> list[str]:
    """Fitted parameters at a bound of their cited range: defects of the model, listed as such."""
    if not provenance or "parameters_at_bounds" not in provenance:
        return []
    found = provenance["parameters_at_bounds"]
    out = ["## Parameters at a bound (defects of the model)", ""]
    if not found:
        return out + ["No fitted parameter sits at a bound of its range.", ""]
    copies: dict[tuple[str, str], list[str]] = {}
    for item in found:
        if item.get("same_fit_as"):
            copies.setdefault((item["same_fit_as"], item["parameter"]), []).append(
                f"{item['gpu_family']}/{item['compute_dtype']}")
    distinct = [item for item in found if not item.get("same_fit_as")]
    at_prior = [item for item in distinct if _prior_on_bound(provenance, item)]
    pushed = [item for item in distinct if item not in at_prior]
    out += [(f"{len(distinct)} fitted parameters sit at a bound of their cited range"
             + (f" ({len(found) - len(distinct)} more in entries that carry another's fit, a maker whose rows are "
                "all one family's or a family's only precision, listed beside it)" if copies else "")
             + f". {len(pushed)} of them were pushed there from their cited prior: each is a defect, the parameter "
             "absorbs physics the model lacks, and its value is not a measurement of the hardware."), ""]
    if pushed:
        out += _bound_table(pushed, copies)
    if at_prior:
        out += [(f"{len(at_prior)} sit on the bound their cited prior sits on too (a cost that may be absent, prior "
                 "0): the data showed none of it. Listed all the same: a cost the data would put below zero, which "
                 "would be a defect, sits there too."), ""]
        out += _bound_table(at_prior, copies)
    return out


def _prior_on_bound(provenance: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether the parameter's cited prior (the global entry's) is the bound the fitted value sits at."""
    name = item["parameter"]
    prior = (provenance.get("parameter_priors") or {}).get(name, {}).get("prior")
    low, high = (provenance.get("parameter_bounds") or {}).get(name, (None, None))
    return prior is not None and prior == (low if item["bound"] == "low" else high)


def _bound_table(items: list[dict[str, Any]], copies: dict[tuple[str, str], list[str]]) -> list[str]:
    """One row per defect: an entry, with the entries that carry its fit (`copies`, by 'family/precision' and
    parameter) named beside it."""
    def family(item: dict[str, Any]) -> str:
        also = copies.get((f"{item['gpu_family']}/{item['compute_dtype']}", item["parameter"]))
        return item["gpu_family"] + (f" (and {', '.join(also)}: the same fit)" if also else "")

    return (["| GPU family | compute | parameter | value | bound |", "|---|---|---|---:|---|"]
            + [f"| {family(item)} | {item['compute_dtype']} | {item['parameter']} | {item['value']:.4g} | "
               f"{item['bound']} |" for item in items] + [""])


if __name__ == "__main__":
    sys.exit(main())
