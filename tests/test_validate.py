"""The validator and calibration commands on a sample of real published rows.

examples/calibration-sample.csv holds 35 rows copied unchanged from measured-calibration.csv: TensorRT-LLM
0.9 static batches and batch-1 first-token latencies, TensorRT-LLM 0.17 offline and Poisson-load rows,
gpt-fast batch-1 and LMDeploy static rows, and two vLLM rows from a dataset (ShareGPT) without fixed
lengths, which must be skipped.
"""

from __future__ import annotations

import csv
import json
import math
import os
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app import calibrate as calibrate_command
from app import validate as validate_command
from app.calibration import service
from app.calibration.crossval import (
    CHOICE_CONFIDENCE,
    MEDIAN_INTERVAL_RESAMPLES,
    _hold_out_document,
    held_out_error,
    level_choice,
    median_interval,
    model_family,
    publisher,
    stated_layout,
    task_runner,
)
from app.calibration.profiles import HeldOutErrors, builtin_profile, profile_from_entries
from app.calibration.rows import RowsInvalid, observed_rows, read_rows, rows_from_csv
from app.calibration.service import ReferenceCatalog, validate
from app.sizing.calibration.fit import GLOBAL_PARAMETERS, parameters_at_bounds, same_fits
from app.sizing.calibration.holdout import HeldOut
from app.sizing.calibration.predict import Measurement, PoolLayout, prepare

DATA = Path(__file__).parent / "data"
SAMPLE = Path(__file__).parents[1] / "examples" / "calibration-sample.csv"
DATASET_ROWS = {"LAMBDA_VLLM_054-1399", "LAMBDA_VLLM_054-1400"}  # ShareGPT: lengths from the shipped histogram


def scaled_copy(source: Path, target: Path, factor: float) -> None:
    """The same file with every published value multiplied by `factor`."""
    with source.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        header = reader.fieldnames
    with target.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "value": repr(float(row["value"]) * factor)})


def run_validator(tmp_path: Path, source: Path, *extra: str) -> dict:
    out = tmp_path / f"{source.stem}.json"
    assert validate_command.main([str(source), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_predictions_do_not_depend_on_the_measured_column(tmp_path: Path) -> None:
    """Scale every published value x10: every prediction is unchanged, every error changes."""
    scaled = tmp_path / "scaled.csv"
    scaled_copy(SAMPLE, scaled, 10.0)
    original = run_validator(tmp_path, SAMPLE, "--profile", "builtin")
    tenfold = run_validator(tmp_path, scaled, "--profile", "builtin")
    predicted = {row["row_id"]: row.get("predicted") for row in original["rows"]}
    assert predicted == {row["row_id"]: row.get("predicted") for row in tenfold["rows"]}
    assert sum(value is not None for value in predicted.values()) == 35
    for before, after in zip(original["rows"], tenfold["rows"], strict=True):
        assert after["measured"] == pytest.approx(10 * before["measured"])
        if "predicted" in before:
            assert after["abs_pct_error"] != before["abs_pct_error"]


def test_the_json_report_has_every_row_and_a_summary(tmp_path: Path) -> None:
    """Predicted rows carry predicted, measured and abs_pct_error = |p − m| / m x 100; the summary counts
    them. The two ShareGPT rows are predicted from the shipped length histogram and say so."""
    report = run_validator(tmp_path, SAMPLE, "--profile", "builtin")
    assert report["profile"] == "builtin"
    assert len(report["rows"]) == 35
    for row in report["rows"]:
        assert "skipped_reason" not in row
        assert row["abs_pct_error"] == pytest.approx(abs(row["predicted"] - row["measured"]) / row["measured"] * 100)
        if row["row_id"] in DATASET_ROWS:
            assert "ShareGPT as vLLM's benchmark samples it" in row["assumption"]
            assert "sharegpt-lengths-tekken-240718.json" in row["assumption"]  # Llama-3.1: the 131k BPE
    summary = report["summary"]
    assert (summary["rows_total"], summary["rows_predicted"], summary["rows_skipped"]) == (35, 35, 0)
    assert summary["skipped_reasons"] == {}
    assert sum(group["rows"] for group in summary["by_group"]) == 35
    assert summary["throughput"]["rows"] + summary["latency_light_load"]["rows"] + summary["latency_loaded"]["rows"] == 35
    groups = {(g["scenario"], g["metric"], g["gpu_family"]) for g in summary["by_group"]}
    assert ("static_batch", "output_tokens_per_s_per_gpu", "hopper") in groups
    assert ("batch1", "output_tokens_per_s", "ampere") in groups


def test_the_printed_table_names_groups_skips_and_worst_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_validator(tmp_path, SAMPLE, "--profile", "builtin")
    printed = capsys.readouterr().out
    assert "35 predicted (100.0%)" in printed
    assert "static_batch  output_tokens_per_s_per_gpu  hopper" in printed
    assert "worst 10 rows:" in printed


def test_the_markdown_page_is_written_by_the_command(tmp_path: Path) -> None:
    page = tmp_path / "ACCURACY.md"
    assert validate_command.main([str(SAMPLE), "--profile", "builtin", "--markdown", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Accuracy")
    assert f"python -m app.validate {SAMPLE} --profile builtin --markdown {page}" in text
    assert "| throughput rows |" in text
    assert "35 of 35 rows predicted (100.0%)" in text


def test_a_malformed_file_is_refused_with_the_offending_cells(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.csv"
    text = SAMPLE.read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace(",h100-sxm,1,1,1,", ",h100-sxm,one,1,1,", 1)]) + "\n")
    assert validate_command.main([str(bad)]) == 2
    assert "num_gpus" in capsys.readouterr().err


def test_csv_rows_need_the_required_columns_and_numbers() -> None:
    with pytest.raises(RowsInvalid, match="lacks required columns: value"):
        rows_from_csv("row_id,model,gpu,num_gpus,weight_dtype,engine,scenario,metric\n"
                      "r1,llama-3.1-8b,h100-sxm,1,bf16,vllm,batch1,ttft_ms\n")
    with pytest.raises(RowsInvalid) as raised:
        rows_from_csv("row_id,model,gpu,num_gpus,weight_dtype,engine,scenario,metric,value,isl\n"
                      "r1,llama-3.1-8b,h100-sxm,1,bf16,vllm,batch1,ttft_ms,fast,12\n")
    assert [pointer for pointer, _ in raised.value.errors] == ["/body/file/2/value"]
    with pytest.raises(RowsInvalid, match="more than 1 rows"):
        rows_from_csv(SAMPLE.read_text(), max_rows=1)
    with pytest.raises(RowsInvalid, match="cannot be read: field larger than field limit"):
        rows_from_csv("row_id,model,gpu,num_gpus,weight_dtype,engine,scenario,metric,value\n" + "x" * 200_000)


def test_an_unclosed_quote_is_named_on_the_row_it_opens() -> None:
    """A stray double quote on line 3 opens a quoted cell that swallows every later line: the file ends inside it.
    Read leniently, the rows after it vanished into one cell and the file was reported as missing fields on its
    line 3; the error names line 3 and what is wrong."""
    header = "row_id,model,gpu,num_gpus,weight_dtype,engine,scenario,metric,value\n"
    good = "r1,llama-3.1-8b,h100-sxm,1,bf16,vllm,batch1,ttft_ms,10\n"
    with pytest.raises(RowsInvalid) as raised:
        rows_from_csv(header + good + '"r2,llama-3.1-8b,h100-sxm,1,bf16,vllm,batch1,ttft_ms,11\n' + good.replace("r1", "r3"))
    unclosed = "line 3: a quoted cell on this row is never closed: the file ends inside it (a stray double quote?)"
    assert raised.value.errors == [("/body/file", unclosed)]
    quoted = rows_from_csv(header + good + '"r2","llama-3.1-8b",h100-sxm,1,bf16,vllm,batch1,ttft_ms,"11"\n')
    assert [row.row_id for row in quoted] == ["r1", "r2"]  # closed quotes are read as ever


def test_row_ids_must_be_unique() -> None:
    rows = rows_from_csv(SAMPLE.read_text())
    with pytest.raises(RowsInvalid, match="unique"):
        observed_rows([rows[0], rows[0]])


def test_unknown_slugs_are_skipped_not_guessed() -> None:
    text = SAMPLE.read_text().splitlines()
    renamed = "\n".join([text[0], text[1].replace("llama-3.1-8b", "llama-9-8b", 1),
                         text[2].replace("h100-sxm", "h900-sxm", 1)]) + "\n"
    report = validate(observed_rows(rows_from_csv(renamed)), ReferenceCatalog(), builtin_profile())
    assert [outcome.skipped_reason for outcome in report.outcomes] == [
        "unknown model slug 'llama-9-8b'", "unknown GPU slug 'h900-sxm'"]
    assert report.summary.skipped_reasons == {"unknown model slug": 1, "unknown GPU slug": 1}


HEADER = "row_id,model,gpu,num_gpus,tp,weight_dtype,engine,scenario,isl,osl,batch,metric,stat,value,deployment,dp,ep,moe_tp"
GOOD = "llama-3.1-8b,h100-sxm,1,1,bf16,trtllm,static_batch,128,128,4"


# A Hugging Face repository id in the model column: the reason says where a catalog model would come from.
QWEN2_HF_ID_REASON = ("unknown model slug 'Qwen/Qwen2-7B': 'Qwen/Qwen2-7B' is a Hugging Face repository id, not a "
                      "catalog slug. GET /v1/models lists each model's hf_id; a model not in the catalog can be "
                      "imported from its config.json with POST /v1/models/import?slug=qwen2-7b (or sized inline "
                      "with model_spec)")


def test_rows_outside_the_vocabulary_are_skipped_with_the_reason_never_the_file() -> None:
    """A Hugging Face id, a GPU the catalog lacks, a capacity metric, an unpriced precision and a
    disaggregated run without its worker counts each skip their row when read (an unstated precision does
    not: the predictor assumes the published one); data- and
    expert-parallel rows are read
    and handed to the predictor, which says why a layout it cannot run is skipped."""
    text = "\n".join([
        HEADER,
        f"ok,{GOOD},tpot_ms,,12.5,aggregated,1,1,1",
        "hf,Qwen/Qwen2-7B,h100-sxm,1,1,bf16,trtllm,static_batch,128,128,4,tpot_ms,,12.5,,,,",
        "gpu,llama-3.1-8b,a100-variant-unstated,1,1,fp16,vllm,static_batch,128,128,4,e2e_ms,,900,,,,",
        "cap,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,capacity,,,,kv_cache_tokens,,150000,,,,",
        "nodtype,llama-3.1-8b,h100-sxm,1,1,,other,static_batch,128,128,4,e2e_ms,,900,,,,",
        "fp32,llama-3.1-8b,h100-sxm,1,1,fp32,vllm,static_batch,128,128,4,e2e_ms,,900,,,,",
        "disagg,deepseek-r1,b200,,,fp4,trtllm,closed_loop,1024,1024,,tpot_ms,,20,disaggregated,n/a,,",
        f"adp,{GOOD},tpot_ms,,12.5,aggregated,8,1,1",
        f"ep,{GOOD},tpot_ms,,12.5,aggregated,1,8,1",
        f"moetp,{GOOD},tpot_ms,,12.5,aggregated,1,1,4",
    ]) + "\n"
    rows = read_rows(text, pointer="file.csv")
    assert {row.row_id: row.skipped_reason for row in rows} == {
        "ok": None,
        "hf": QWEN2_HF_ID_REASON,
        "gpu": None,  # a slug: the catalog decides, when the rows are predicted
        "cap": "scenario not predicted: 'capacity' (expected 'offline', 'static_batch', 'batch1', 'closed_loop' or "
               "'poisson')",
        "nodtype": None,
        "fp32": "weight_dtype not predicted: 'fp32' (expected 'bf16', 'fp16', 'fp8', 'int8', 'int4' or 'fp4')",
        "disagg": "layout not stated: a disaggregated run without its worker counts",
        "adp": None,  # layouts are predicted (or refused by prepare, with the reason)
        "ep": None,
        "moetp": None,
    }
    assert rows[0].measurement is not None and rows[0].measurement.stat is None
    report = validate(rows, ReferenceCatalog(), builtin_profile())
    outcomes = {outcome.row.row_id: outcome for outcome in report.outcomes}
    assert outcomes["gpu"].skipped_reason == "unknown GPU slug 'a100-variant-unstated'"
    assert outcomes["ok"].predicted is not None
    assert outcomes["ok"].assumption == "the source does not state the statistic of tpot_ms: predicted as the mean"
    assert report.summary.skipped_reasons["layout not stated"] == 1  # the disaggregated row
    # The layout rows reach the predictor, which says why these two cannot run as stated; Llama-3.1-8B has
    # no experts, so its moe_tp means nothing and that row is predicted.
    assert outcomes["nodtype"].assumption == ("the source does not state the statistic of e2e_ms: predicted as the "
                                              "mean; the source does not state the weight dtype: predicted at the "
                                              "published checkpoint's bf16 (not fitted on)")
    assert "dp" in outcomes["adp"].skipped_reason or "DP" in outcomes["adp"].skipped_reason
    assert outcomes["ep"].skipped_reason.startswith("expert_parallel 8 must divide tensor_parallel x data_parallel")
    assert outcomes["moetp"].predicted == outcomes["ok"].predicted


def test_rows_the_stated_columns_cannot_tell_apart_are_reported_with_the_least_error_any_model_has() -> None:
    """a, b and c state one configuration (one prediction serves them) and measure 10, 20 and 12 ms: a group,
    ×2.00 from its lowest to its highest value. Whatever the prediction p, the worse of p / 10 − 1 and
    1 − p / 20 is least at p = 2 x 10 x 20 / (10 + 20) = 13.33 ms, where both are 1/3: (20 − 10) / (20 + 10) =
    33.3%. d and e (batch 8) differ by ×1.2 only, under the report's ×1.3; f measures another
    metric and g runs on another GPU: neither has a twin."""
    other_batch = GOOD.removesuffix(",4") + ",8"
    text = "\n".join([
        HEADER,
        f"a,{GOOD},tpot_ms,,10,aggregated,1,1,1",
        f"b,{GOOD},tpot_ms,,20,aggregated,1,1,1",
        f"c,{GOOD},tpot_ms,,12,aggregated,1,1,1",
        f"d,{other_batch},tpot_ms,,10,aggregated,1,1,1",
        f"e,{other_batch},tpot_ms,,12,aggregated,1,1,1",
        f"f,{GOOD},e2e_ms,,900,aggregated,1,1,1",
        f"g,{GOOD.replace('h100-sxm', 'h200-sxm')},tpot_ms,,30,aggregated,1,1,1",
    ]) + "\n"
    report = validate(read_rows(text, pointer="file.csv"), ReferenceCatalog(), builtin_profile())
    assert all(outcome.predicted is not None for outcome in report.outcomes)
    [group] = report.contradictions
    assert [outcome.row.row_id for outcome in group.outcomes] == ["a", "b", "c"]
    assert (group.low, group.high, group.ratio) == (10, 20, 2)
    assert group.least_worst_error_pct == pytest.approx(100 / 3, rel=1e-12)
    page = validate_command._contradictions_section(report)
    assert "| a, b, c | tpot_ms | 10 | 20 | ×2.00 | 33% |" in page
    assert any(line.startswith("1 group of predicted rows (3 rows): each states one configuration") for line in page)


def test_a_gpu_or_model_outside_the_catalog_is_the_reason_before_an_unstated_cell() -> None:
    """Argonne's rows on an A100 of unstated memory leave the precision empty too: no precision would make
    them predictable, the missing GPU is the reason they are skipped (and counted under)."""
    rows = ["a1,llama-3.1-8b,a100-variant-unstated,1,1,,other,static_batch,128,128,4,e2e_ms,,900,,,,",
            "hf,Qwen/Qwen2-7B,h100-sxm,1,1,,other,static_batch,128,128,4,e2e_ms,,900,,,,"]
    text = "\n".join([HEADER, *rows]) + "\n"
    report = validate(read_rows(text, pointer="file.csv"), ReferenceCatalog(), builtin_profile())
    assert [outcome.skipped_reason for outcome in report.outcomes] == [
        "unknown GPU slug 'a100-variant-unstated'", QWEN2_HF_ID_REASON]


def test_an_unstated_weight_dtype_is_predicted_at_the_published_precision_and_not_fitted() -> None:
    """Without a quantization flag an engine serves the checkpoint as published: Llama-3.1-8B in bf16,
    DeepSeek-R1 in its FP8 (catalog `dtype`). A row that leaves weight_dtype empty predicts exactly what
    the same row stating that precision does, says it assumed it, and is kept out of a fit."""
    lines = ["row_id,model,gpu,num_gpus,tp,weight_dtype,engine,scenario,isl,osl,batch,metric,value",
             "bf16,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,static_batch,128,128,4,e2e_ms,900",
             "none,llama-3.1-8b,h100-sxm,1,1,,vllm,static_batch,128,128,4,e2e_ms,900",
             "fp8,deepseek-r1,h200-sxm,8,8,fp8,trtllm,static_batch,1024,128,8,e2e_ms,900",
             "none8,deepseek-r1,h200-sxm,8,8,,trtllm,static_batch,1024,128,8,e2e_ms,900"]
    text = "\n".join(lines) + "\n"
    prepared, skipped = service.prepare_rows(read_rows(text, pointer="file.csv"), ReferenceCatalog())
    assert skipped == {}
    rows = {item.row.row_id: item for item in prepared}
    efficiency = builtin_profile().efficiency_for("hopper", "bf16")
    assert rows["none"].predict(efficiency) == rows["bf16"].predict(efficiency)
    assert rows["none8"].predict(efficiency) == rows["fp8"].predict(efficiency)
    assert "predicted at the published checkpoint's fp8" in rows["none8"].assumption
    assert rows["bf16"].fittable and rows["fp8"].fittable
    assert not rows["none"].fittable and not rows["none8"].fittable


def test_the_ttft_of_a_loaded_closed_loop_is_validated_but_not_fitted() -> None:
    """How long a user of a closed loop waits for its first token depends on whether the harness keeps the
    users in step, which no source states: such a TTFT is predicted but kept out of a fit. Its TPOT, the
    TTFT of a single user (no one to queue behind) and the TTFT of an offline run (everyone sent at once,
    nothing left to the harness) are fitted. The TTFT of 8 users on one scheduler (a light load: their 1k
    prompts fit one 8,192-token step) of an MoE model whose engine runs prompt steps outside CUDA graphs
    (Mixtral-8x7B at TP2 under TensorRT-LLM's PyTorch backend) is read by the fit, but only for the cost of
    those steps; 16 users over two TP2 replicas are 8 per scheduler too. A dense model's (Llama-3.1-8B) pays
    no such cost: read by no stage of the fit, so not counted among its rows."""
    lines = ["row_id,model,gpu,num_gpus,tp,weight_dtype,engine,scenario,isl,osl,concurrency,num_requests,metric,value",
             "ttft16,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,closed_loop,1024,128,16,,ttft_ms,300",
             "tpot16,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,closed_loop,1024,128,16,,tpot_ms,20",
             "ttft1,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,closed_loop,1024,128,1,,ttft_ms,60",
             "ttft8dense,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,closed_loop,1024,128,8,,ttft_ms,150",
             "ttft8,mixtral-8x7b,h100-sxm,2,2,bf16,trtllm,closed_loop,1024,128,8,,ttft_ms,150",
             "ttft16x2,mixtral-8x7b,h100-sxm,4,2,bf16,trtllm,closed_loop,1024,128,16,,ttft_ms,150",
             "offline,llama-3.1-8b,h100-sxm,1,1,bf16,vllm,offline,1024,128,,64,ttft_ms,900"]
    prepared, skipped = service.prepare_rows(read_rows("\n".join(lines) + "\n", pointer="file.csv"),
                                             ReferenceCatalog())
    assert skipped == {}
    assert {item.row.row_id: item.pays_prefill_overhead for item in prepared if item.row.row_id.startswith("ttft8")} \
        == {"ttft8dense": False, "ttft8": True}
    fittable = {item.row.row_id: item.fittable for item in prepared}
    assert fittable == {"ttft16": False, "tpot16": True, "ttft1": True, "ttft8dense": False, "ttft8": True,
                        "ttft16x2": True, "offline": True}
    steps = {item.row.row_id: item.measures_steps for item in prepared}
    assert steps == {"ttft16": False, "tpot16": True, "ttft1": True, "ttft8dense": False, "ttft8": False,
                     "ttft16x2": False, "offline": True}


def test_a_row_with_an_unreadable_number_still_refuses_the_file() -> None:
    with pytest.raises(RowsInvalid) as raised:
        read_rows(HEADER + "\nr1,Qwen/Qwen2-7B,h100-sxm,1,1,bf16,trtllm,static_batch,128,128,4,tpot_ms,,fast,,,,\n",
                  pointer="file.csv")
    assert [pointer for pointer, _ in raised.value.errors] == ["file.csv/2/value"]


def test_the_second_measurement_file_is_read_whole() -> None:
    """All 11,287 rows of measured-calibration-2.csv are read (none refuses the file); a row is skipped
    up front only for a name outside the vocabulary, a disaggregated run without its worker counts, or
    layout columns that contradict the run."""
    rows = read_rows((DATA / "measured-calibration-2.csv").read_text(encoding="utf-8-sig"), pointer="file2")
    assert len(rows) == 11287
    kinds = {row.skipped_reason.split(":")[0].split(" '")[0].strip() for row in rows if row.skipped_reason}
    assert kinds == {"unknown model slug", "scenario not predicted", "weight_dtype not predicted", "layout not stated",
                     "layout contradicts the run's id", "layout contradicts the run's load",
                     "layout in its source's inflated pattern"}


def test_a_closed_loop_with_more_users_than_its_layouts_batch_is_skipped_not_guessed() -> None:
    """AIC_SILICON_SAMPLE-1781: Qwen3-32B on one TP2 replica of batch 13 with 416 users and 15,000-token
    prompts measured a 719 ms TTFT; the 403 users beyond the batch would queue for tens of seconds, so more
    replicas ran than the columns say (416 = 32 x 13). -1769: DeepSeek-R1 tp 8, ep 8, dp n/a, batch 10, 80 users
    (8 attention-DP ranks of 10, the DP unrecorded). Both are skipped naming the load; a row at its batch
    (-1836: 16 users, batch 16) is kept, and so is a row whose dp holds its users (-5384: 256 = dp 8 x 32)."""
    rows = {row.row_id: row for row in read_rows((DATA / "measured-calibration-2.csv").read_text(encoding="utf-8-sig"),
                                                 pointer="file2")}
    assert rows["AIC_SILICON_SAMPLE-1781"].skipped_reason == (
        "layout contradicts the run's load: 416 users exceed the batch of 13 per rank x dp 1 that the columns state "
        "(the source's concurrency is the whole deployment's: more attention ranks or replicas ran)")
    assert rows["AIC_SILICON_SAMPLE-1769"].skipped_reason.startswith(
        "layout contradicts the run's load: 80 users exceed the batch of 10 per rank x dp 1")
    assert rows["AIC_SILICON_SAMPLE-1836"].skipped_reason is None
    assert rows["AIC_SILICON_SAMPLE-5384"].skipped_reason is None


def test_a_row_whose_layout_contradicts_its_run_id_is_skipped_not_guessed() -> None:
    """AIC_SILICON_SAMPLE-8236's id says tp4 ep4; its columns say tp 16, ep 4, moe_tp 4 on 16 GPUs, and its
    twin -4018 (tp 4, ep 4, moe_tp 1, 4 GPUs, the id's layout) measured the same 25.288749212016892 ms TPOT.
    -4018 is predicted; -8236 is skipped naming both layouts, and so is -756, the same run without an id
    (tp x dp = 16 = 4², moe_tp = ep = 4). An agreeing id with attention DP (tp1 x dp8 = the id's tp8) is kept."""
    rows = {row.row_id: row for row in read_rows((DATA / "measured-calibration-2.csv").read_text(encoding="utf-8-sig"),
                                                 pointer="file2")}
    twins = [rows[f"AIC_SILICON_SAMPLE-{n}"] for n in (4018, 8236, 756)]
    assert {row.value for row in twins} == {25.288749212016892}
    assert twins[0].skipped_reason is None
    assert twins[1].skipped_reason == ("layout contradicts the run's id: the id names tp4 ep4, the columns tp 16 x "
                                       "dp 1 = 16 GPUs, ep 4, moe_tp 4")
    assert twins[2].skipped_reason.startswith("layout in its source's inflated pattern: the columns tp 16 x dp 1")
    header = "row_id,source_id,model,gpu,num_gpus,tp,weight_dtype,engine,scenario,isl,osl,concurrency,metric,value,dp,ep,moe_tp,notes"
    line = "r{n},{source},deepseek-r1,b200,{gpus},{tp},fp4,trtllm,closed_loop,1024,1024,64,tpot_ms,20,{dp},{ep},{moe_tp},id=x_c64_tp8_ep8_1"
    text = "\n".join([header, line.format(n=1, source="AIC_SILICON_SAMPLE", gpus=8, tp=1, dp=8, ep=8, moe_tp=1),
                      line.format(n=2, source="AIC_SILICON_SAMPLE", gpus=64, tp=64, dp=1, ep=8, moe_tp=8),
                      line.format(n=3, source="upload", gpus=16, tp=16, dp=1, ep=4, moe_tp=4).replace("id=x_c64_tp8_ep8_1", "")])
    read = {row.row_id: row.skipped_reason for row in read_rows(text, pointer="file.csv")}
    assert read["r1"] is None  # tp 1 x dp 8 = the id's tp8, ep 8
    assert read["r2"].startswith("layout contradicts the run's id: the id names tp8 ep8")
    assert read["r3"] is None  # another source's 4 EP groups of TP4: a real layout


def test_calibrating_on_the_sample_writes_a_profile_the_validator_reads(tmp_path: Path) -> None:
    """The fit only improves on the builtin constants for the rows it saw; the written profile carries
    its provenance, and validating with it reproduces the 'after' error the fit reported."""
    output = tmp_path / "sample-profile.json"
    assert calibrate_command.main([str(SAMPLE), "--name", "sample", "--output", str(output),
                                   "--no-cross-validation"]) == 0
    document = json.loads(output.read_text())
    provenance = document["provenance"]
    assert document["name"] == "sample"
    assert provenance["rows_total"] == 35 and provenance["rows_predicted"] == 35
    assert provenance["rows_used"] == 30  # every predicted row but the 5 Poisson ones
    assert provenance["source_file"] == "calibration-sample.csv"
    assert len(provenance["source_sha256"]) == 64
    before, after = provenance["fit_error"]["before"], provenance["fit_error"]["after"]
    assert after["median_abs_pct_error"] < before["median_abs_pct_error"]
    keys = {(entry["family"], entry["compute_dtype"]) for entry in document["entries"]}
    # hopper: 20 fp8 rows and 3 bf16 ones (a family entry on 23, an fp8 entry); NVIDIA's entry on those and the
    # A100's 7 (too few for an ampere entry: the A100 falls back to NVIDIA's); nothing else but the global entry
    assert keys == {("*", "*"), ("hopper", "*"), ("hopper", "fp8"), ("vendor:nvidia", "*")}
    assert {entry["family"]: entry["rows"] for entry in document["entries"] if entry["compute_dtype"] == "*"} == {
        "*": 30, "hopper": 23, "vendor:nvidia": 30}
    profile_from_entries("sample", document["entries"])  # a valid profile
    report = run_validator(tmp_path, SAMPLE, "--profile", str(output))
    assert report["summary"]["overall"]["median_abs_pct_error"] == pytest.approx(after["median_abs_pct_error"])


def test_cross_validation_holds_out_each_gpu_model_family_and_engine_and_ships_the_best_level() -> None:
    """On the sample: every predicted row is predicted once per hold-out by a fit that never saw its
    GPU (or model family, or engine); the shipped level is the last one the choice's steps took (each step
    scored by its level's mean of the GPU and model-family held-out medians, `_chosen_by_steps`), and the
    shipped profile has that level's entries."""
    rows = read_rows(SAMPLE.read_text(), pointer="sample")
    result = service.calibrate(rows, ReferenceCatalog(), name="cv", description="", base=builtin_profile(),
                               fit_global=True, cross_validation=True, source_file="sample", source_sha256="0" * 64,
                               max_evaluations=10)
    validation = result.document["provenance"]["cross_validation"]
    assert [item["held_out"] for item in validation["hold_outs"]] == ["gpu", "model_family", "engine"]
    for item in validation["hold_outs"]:
        assert item["overall"]["rows"] == 35 == sum(group["rows"] for group in item["by_group"])
        assert sum(stats["rows"] for stats in item["by_metric"].values()) == 35
    families = {group["group"] for group in validation["hold_outs"][1]["by_group"]}
    # gpt-j-6b (EleutherAI/gpt-j-6b), llama-2-7b and llama-3.1-8b (meta-llama), mistral-7b-v0.1 (mistralai)
    assert families == {"EleutherAI", "meta-llama", "mistralai"}
    scores = {level: (medians["gpu"] + medians["model_family"]) / 2
              for level, medians in validation["candidates"].items()}
    assert validation["chosen_level"] == _chosen_by_steps(validation, scores)
    keys = {entry.key for entry in result.profile.entries}
    nvidia = ("vendor:nvidia", "*")  # the A100's entry: NVIDIA's, fitted on every NVIDIA row (all of them here)
    assert keys == {"global": {("*", "*")}, "family": {("*", "*"), ("hopper", "*"), nvidia},
                    "family_precision": {("*", "*"), ("hopper", "*"), ("hopper", "fp8"), nvidia}}[
        validation["chosen_level"]]


def _chosen_by_steps(validation: dict, scores: dict[str, float]) -> str:
    """The level the recorded choice arrives at: from the global entry, each more specific level in turn against
    the one chosen so far, taken where its score is lower in at least 95% of the paired resamples; each step's
    scores are the candidates' (the mean of the GPU and model-family held-out medians)."""
    chosen = "global"
    assert [step["level"] for step in validation["choice"]] == ["family", "family_precision"]
    for step in validation["choice"]:
        assert step["against"] == chosen
        assert step["score"] == pytest.approx(scores[step["level"]])
        assert step["against_score"] == pytest.approx(scores[chosen])
        assert step["chosen"] == (step["better_in"] >= 0.95)
        if step["chosen"]:
            chosen = step["level"]
    return chosen


def test_the_tasks_run_in_worker_processes_and_come_back_in_their_order() -> None:
    """`task_runner(2)` runs each task (a fold for one group, a whole fit) in a worker process forked from this
    one (the tasks, closures over this process's data, are inherited, not pickled), tasks of different folds
    in one run, and returns their results in the order of the tasks, whichever finishes first; `task_runner(1)`
    runs them here, in order."""
    here = os.getpid()
    scale = {"a": 1.0, "b": 2.0, "c": 3.0}  # data only this process holds: a worker sees it by inheritance

    def fold(name: str) -> list[dict[str, float]]:
        return [{"pid": float(os.getpid()), "value": scale[name]}]

    def negated(name: str) -> list[dict[str, float]]:
        return [{"pid": float(os.getpid()), "value": -scale[name]}]

    tasks = [partial(fold, "c"), partial(negated, "a"), partial(fold, "a"), partial(fold, "b"),
             partial(negated, "c")]
    forked = task_runner(2)(tasks)
    assert [result[0]["value"] for result in forked] == [3.0, -1.0, 1.0, 2.0, -3.0]
    assert all(result[0]["pid"] != here for result in forked)
    serial = task_runner(1)(tasks)
    assert [(result[0]["pid"], result[0]["value"]) for result in serial] == [
        (here, 3.0), (here, -1.0), (here, 1.0), (here, 2.0), (here, -3.0)]


def test_a_cross_validation_in_worker_processes_gives_the_numbers_of_one_process() -> None:
    """Each fold's fit reads only its own rows, so running the sample's whole fit and its folds two at a time
    (the whole fit then in a worker too, its profile sent back) gives the same document as running them one
    after another: every group's errors at every level, to the last bit, and the same chosen level and
    profile."""
    rows = read_rows(SAMPLE.read_text(), pointer="sample")

    def calibrated(jobs: int) -> service.Calibration:
        return service.calibrate(rows, ReferenceCatalog(), name="cv", description="", base=builtin_profile(),
                                 fit_global=True, cross_validation=True, source_file="sample",
                                 source_sha256="0" * 64, max_evaluations=10, jobs=jobs)

    one, two = calibrated(1), calibrated(2)
    assert one.document["provenance"]["cross_validation"] == two.document["provenance"]["cross_validation"]
    assert one.document["entries"] == two.document["entries"]


def test_a_hold_out_of_some_groups_gives_what_the_whole_cross_validation_gives_them(capsys) -> None:
    """`--hold-out gpu=a100-80gb-sxm` fits on every other GPU's rows exactly as the whole cross-validation
    does when it holds the A100 out: the A100's 7 sample rows (5 llama-2-7b + 2 llama-3.1-8b) get the same
    errors at every level, and nothing is written."""
    shipped = Path(validate_command.DEFAULT_PROFILE_PATH).read_bytes()
    assert calibrate_command.main([str(SAMPLE), "--hold-out", "gpu=a100-80gb-sxm", "--evaluations", "10"]) == 0
    quick = json.loads(capsys.readouterr().out)
    assert (quick["held_out"], quick["groups"]) == ("gpu", ["a100-80gb-sxm"])
    assert all(quick["levels"][level]["overall"]["rows"] == 7 for level in ("global", "family", "family_precision"))
    rows = read_rows(SAMPLE.read_text(), pointer="sample")
    result = service.calibrate(rows, ReferenceCatalog(), name="cv", description="", base=builtin_profile(),
                               fit_global=True, cross_validation=True, source_file="sample", source_sha256="0" * 64,
                               max_evaluations=10)
    validation = result.document["provenance"]["cross_validation"]
    whole = next(group for group in validation["hold_outs"][0]["by_group"] if group["group"] == "a100-80gb-sxm")
    assert quick["levels"][validation["chosen_level"]]["by_group"] == [whole]
    assert Path(validate_command.DEFAULT_PROFILE_PATH).read_bytes() == shipped
    assert calibrate_command.main([str(SAMPLE), "--hold-out", "gpu"]) == 2
    assert calibrate_command.main([str(SAMPLE), "--hold-out", "rack=a100-80gb-sxm"]) == 2
    assert calibrate_command.main([str(SAMPLE), "--hold-out", "gpu=tpu-v5e", "--evaluations", "10"]) == 1


def test_a_hold_out_writes_the_rows_behind_its_medians(tmp_path, capsys) -> None:
    """`--rows FILE.csv` beside `--hold-out gpu=a100-80gb-sxm`: one line per A100 row of the sample (those
    whose gpu cell says so, read here from the file itself), its measured value as published, and at each
    level the held-out prediction with |predicted / measured - 1| x 100 as its error; the errors' median is
    the median the printed document reports. Without --hold-out, --rows is a usage error."""
    with SAMPLE.open(newline="") as file:
        rows_by_id = {row["row_id"]: row for row in csv.DictReader(file) if row["gpu"] == "a100-80gb-sxm"}
    a100 = {row_id: float(row["value"]) for row_id, row in rows_by_id.items()}
    assert len(a100) == 7
    written = tmp_path / "held-out" / "rows.csv"
    assert calibrate_command.main([str(SAMPLE), "--hold-out", "gpu=a100-80gb-sxm", "--evaluations", "10",
                                   "--rows", str(written)]) == 0
    document = json.loads(capsys.readouterr().out)
    with written.open(newline="") as file:
        lines = list(csv.DictReader(file))
    assert {line["row_id"]: float(line["measured"]) for line in lines} == a100
    assert {(line["held_out_group"], line["gpu"]) for line in lines} == {("a100-80gb-sxm", "a100-80gb-sxm")}
    # Each line carries its run as the file states it: every A100 row of the sample is tp 1, pp 1 ("TP1 PP1"); the
    # two Lambda rows say "vLLM 0.5.4" and are ShareGPT runs (no fixed lengths) of 320 requests, no concurrency.
    for line in lines:
        cells = rows_by_id[line["row_id"]]
        assert line["layout"] == "TP1 PP1"
        assert [line[column] for column in ("isl", "osl", "concurrency", "batch")] == [
            cells[column] for column in ("isl", "osl", "concurrency", "batch")]
    assert {line["engine_version"] for line in lines if line["source_id"] == "LAMBDA_VLLM_054"} == {"0.5.4"}
    for level in ("global", "family", "family_precision"):
        errors = []
        for line in lines:
            predicted, measured = float(line[f"predicted_{level}"]), float(line["measured"])
            assert predicted > 0
            assert float(line[f"abs_pct_error_{level}"]) == pytest.approx(abs(predicted / measured - 1) * 100)
            errors.append(float(line[f"abs_pct_error_{level}"]))
        errors.sort()
        assert document["levels"][level]["overall"]["median_abs_pct_error"] == pytest.approx(errors[3])  # 4th of 7
    assert calibrate_command.main([str(SAMPLE), "--rows", str(tmp_path / "alone.csv")]) == 2
    assert not (tmp_path / "alone.csv").exists()


def test_a_held_out_row_names_the_layout_its_run_states() -> None:
    """`stated_layout`: the layout as a plan labels it (tp 8, ep 8 -> "TP8 EP8 PP1"; DP and EP named above 1),
    nothing where the source states no tp; a disaggregated run's pools as aiconfigurator's AIC_SILICON_SAMPLE-1110
    states them (one prefill worker of 8 attention-DP ranks with 8-way EP and batch 1, three TP8 EP8 decode workers
    of batch 2): "P 1x TP1 DP8 EP8 PP1 b1 | D 3x TP8 EP8 PP1 b2"."""
    def run(**layout) -> Measurement:
        return Measurement(scenario="closed_loop", metric="tpot_ms", num_gpus=8, weight_dtype="fp8", engine="trtllm",
                           **layout)

    assert stated_layout(run(tp=8, ep=8)) == "TP8 EP8 PP1"
    assert stated_layout(run(tp=2, pp=4, dp=1)) == "TP2 PP4"
    assert stated_layout(run(tp=1)) == "TP1 PP1"
    assert stated_layout(run()) == ""
    assert stated_layout(run(disaggregated=True, prefill=PoolLayout(workers=1, tp=1, dp=8, ep=8, batch=1),
                             decode=PoolLayout(workers=3, tp=8, ep=8, batch=2))) == (
        "P 1x TP1 DP8 EP8 PP1 b1 | D 3x TP8 EP8 PP1 b2")


def test_the_shipped_default_profile_reports_its_cross_validation_and_its_defects() -> None:
    """The default profile, as the calibration command wrote it: fitted to both published files, with
    the three hold-outs, the level cross-validation chose, every held-out median with its 90% interval around
    it, and every fitted parameter at a bound listed (recomputed here from the entries: the report hides none)."""
    document = json.loads((Path(validate_command.DEFAULT_PROFILE_PATH)).read_text())
    provenance = document["provenance"]
    assert provenance["source_file"] == "measured-calibration.csv + measured-calibration-2.csv"
    assert provenance["rows_total"] == 1263 + 11287
    validation = provenance["cross_validation"]
    assert [item["held_out"] for item in validation["hold_outs"]] == ["gpu", "model_family", "engine"]
    scores = {level: (medians["gpu"] + medians["model_family"]) / 2
              for level, medians in validation["candidates"].items()}
    assert validation["chosen_level"] == _chosen_by_steps(validation, scores)
    for item in validation["hold_outs"]:
        stats = [item["overall"], *item["by_metric"].values(), *item["by_group"],
                 *(cell for layout in item["by_layout"] for cell in layout["by_metric"].values())]
        for cell in stats:
            if cell["rows"]:
                assert cell["median_abs_pct_error_low"] <= cell["median_abs_pct_error"] <= cell["median_abs_pct_error_high"]
    profile = profile_from_entries("default", document["entries"])
    listed = [(item["gpu_family"], item["compute_dtype"], item["parameter"], item["value"], item["bound"])
              for item in provenance["parameters_at_bounds"]]
    assert listed == parameters_at_bounds(profile)
    copies = same_fits(profile)
    assert [item["same_fit_as"] for item in provenance["parameters_at_bounds"]] == [
        "/".join(copies[family, dtype]) if (family, dtype) in copies else None for family, dtype, *_ in listed]
    assert set(provenance["parameter_priors"]) == {bound.name for bound in GLOBAL_PARAMETERS}


def test_full_calibration_file_is_the_published_one() -> None:
    """tests/data/measured-calibration.csv is the reference data, all 1,263 rows, unchanged."""
    rows = rows_from_csv((DATA / "measured-calibration.csv").read_text(encoding="utf-8-sig"))
    assert len(rows) == 1263
    assert len({row.source_id for row in rows}) == 7


LAYOUT_CSV = """row_id,source_id,model,gpu,num_gpus,tp,pp,dp,ep,moe_tp,deployment,weight_dtype,engine,scenario,isl,osl,concurrency,metric,stat,value
a,AIC,mixtral-8x7b,h100-sxm,8,1,1,8,8,1,aggregated,bf16,trtllm,closed_loop,1000,1000,64,tpot_ms,,20
b,AIC,llama-3.1-8b,h100-sxm,2,2,1,n/a,0,0,aggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
c,AIC,mixtral-8x7b,h100-sxm,8,8,1,n/a,8,2,aggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
d,AIC,mixtral-8x7b,h100-sxm,,8,1,,,,disaggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
e,OTHER,llama-3.1-8b,h100-sxm,2,1,2,,,,aggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
f,AIC,mixtral-8x7b,h100-sxm,8,,1,,,,disaggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
"""


def test_layout_columns_sources_and_unstated_statistics(tmp_path: Path) -> None:
    """Row a: DP8 x EP8 (moe_tp 1 = 1 x 8 / 8), statistic unstated: predicted as the mean (said in the row) or
    read as the statistic named. Row b: "n/a" and 0 in the layout columns mean 1 (plain TP2). Row c: tp 8 x
    dp 1 != ep 8 x moe_tp 2, skipped. Row d: disaggregated without num_gpus, skipped when read; row f:
    disaggregated without its pools, skipped by the predictor.
    Row e belongs to another source."""
    path = tmp_path / "layouts.csv"
    path.write_text(LAYOUT_CSV)
    rows = read_rows(LAYOUT_CSV, pointer="layouts", sources={"AIC"})
    assert [row.row_id for row in rows] == ["a", "b", "c", "d", "f"]
    assert (rows[0].measurement.dp, rows[0].measurement.ep, rows[1].measurement.dp, rows[1].measurement.ep) == (
        8, 8, None, None)
    out = tmp_path / "out.json"
    assert validate_command.main([str(path), "--source", "AIC", "--stat-when-unstated", "mean", "--json",
                                  str(out)]) == 0
    report = json.loads(out.read_text())
    reasons = {row["row_id"]: row.get("skipped_reason") for row in report["rows"]}
    assert reasons["a"] is None and reasons["b"] is None
    assert reasons["c"].startswith("inconsistent layout")
    assert reasons["d"] == "layout not stated: a disaggregated run without its worker counts"
    assert reasons["f"].startswith("disaggregated run without its prefill and decode pools")
    kinds = {(item["layout_kind"], item["metric"]): item["rows"] for item in report["summary"]["by_layout"]}
    assert kinds == {("tp", "tpot_ms"): 1, ("dp_ep", "tpot_ms"): 1}
    named = {row["row_id"]: row for row in report["rows"]}["a"]
    assert validate_command.main([str(path), "--source", "AIC", "--json", str(out)]) == 0
    unstated = {row["row_id"]: row for row in json.loads(out.read_text())["rows"]}["a"]
    assert unstated["predicted"] == named["predicted"]
    assert unstated["assumption"] == "the source does not state the statistic of tpot_ms: predicted as the mean"


DISAGGREGATED_CSV = """row_id,source_id,model,gpu,num_gpus,deployment,weight_dtype,engine,scenario,isl,osl,concurrency,metric,stat,value,prefill_workers,prefill_tp,prefill_dp,prefill_ep,prefill_batch,decode_workers,decode_tp,decode_dp,decode_ep,decode_batch
g,AIC,mixtral-8x7b,h100-sxm,4,disaggregated,bf16,trtllm,closed_loop,1000,200,16,ttft_ms,mean,100,1,2,1,1,4,1,2,1,1,16
h,AIC,mixtral-8x7b,h100-sxm,4,disaggregated,bf16,trtllm,closed_loop,1000,200,16,tpot_ms,mean,10,1,2,1,1,4,1,2,1,1,16
i,AIC,mixtral-8x7b,h100-sxm,4,disaggregated,bf16,trtllm,closed_loop,1000,200,16,tpot_ms,mean,10,n/a,2,1,1,n/a,n/a,2,1,1,n/a
"""


def test_disaggregated_rows_are_predicted_from_their_pools(tmp_path: Path) -> None:
    """Rows g and h: one prefill and one decode worker of Mixtral-8x7B at TP2 each (4 GPUs), 16 users:
    predicted, and reported as their own layout kind. Row i does not state its worker counts: skipped."""
    path = tmp_path / "disaggregated.csv"
    path.write_text(DISAGGREGATED_CSV)
    rows = read_rows(DISAGGREGATED_CSV, pointer="disaggregated")
    assert rows[0].measurement.prefill == PoolLayout(workers=1, tp=2, batch=4)
    assert rows[0].measurement.decode == PoolLayout(workers=1, tp=2, batch=16)
    assert rows[2].measurement.prefill is None
    out = tmp_path / "out.json"
    assert validate_command.main([str(path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    by_id = {row["row_id"]: row for row in report["rows"]}
    assert by_id["g"]["predicted"] > 0 and by_id["h"]["predicted"] > 0
    assert by_id["i"]["skipped_reason"].startswith("disaggregated run without its prefill and decode pools")
    kinds = {(item["layout_kind"], item["metric"]): item["rows"] for item in report["summary"]["by_layout"]}
    assert kinds == {("disaggregated", "ttft_ms"): 1, ("disaggregated", "tpot_ms"): 1}


def test_a_prefill_pools_stated_batch_is_not_a_limit_a_decode_pools_is() -> None:
    """Mixtral-8x7B on H100s under TensorRT-LLM, one TP2 prefill and one TP2 decode worker, 16 users of
    1,000/200 tokens. The prefill ranks keep TensorRT-LLM's default max_batch_size of 2,048 (its LLM-API
    build default) whether the source states a prefill batch of 1 or none, so the two predict the same TTFT;
    the decode rank takes the stated 16, or 4, and with 4 slots for 16 users 12 requests wait for a decode
    slot after their prefill, so the TTFT rises."""
    catalog = ReferenceCatalog()
    model, gpu = catalog.model("mixtral-8x7b"), catalog.gpu("h100-sxm")

    def run(prefill_batch: int | None, decode_batch: int):
        measurement = Measurement(scenario="closed_loop", metric="ttft_ms", num_gpus=4, weight_dtype="bf16",
                                  engine="trtllm", disaggregated=True, isl=1000, osl=200, concurrency=16,
                                  prefill=PoolLayout(workers=1, tp=2, batch=prefill_batch),
                                  decode=PoolLayout(workers=1, tp=2, batch=decode_batch))
        return prepare(measurement, model, gpu)

    efficiency = builtin_profile().efficiency_for(gpu.family, "bf16")
    stated, unstated, narrow = run(1, 16), run(None, 16), run(1, 4)
    for prepared, decode_seqs in ((stated, 16), (unstated, 16), (narrow, 4)):
        (prefill_layout, _, _), (decode_layout, _, _) = prepared.runs[0]._prefill, prepared.runs[0]._decode
        assert prefill_layout.scheduler.max_num_seqs == 2048
        assert decode_layout.scheduler.max_num_seqs == decode_seqs
    assert stated.predict(efficiency) == unstated.predict(efficiency)
    assert narrow.predict(efficiency) > stated.predict(efficiency)


def test_held_out_errors_are_reported_per_layout_kind_and_metric() -> None:
    """Four held-out rows, errors worked by hand from predicted / measured:
    TP only, TPOT: 11 vs 10 ms -> 10%; TP only, TPOT: 8 vs 10 -> 20% (median of the two: 15%);
    DP+EP, TPOT: 30 vs 20 -> 50%; PP 4, throughput: 900 vs 1000 tok/s -> 10%.
    Their direction, median predicted / measured: TP TPOT (1.1 + 0.8) / 2 = 0.95, DP+EP 1.5, PP 0.9; all four
    TPOT and throughput rows: 0.8, 0.9, 1.1, 1.5 -> (0.9 + 1.1) / 2 = 1.0.
    No disaggregated row, so no disaggregated line; a kind's metric without rows has rows 0 and no median."""
    def held(metric: str, measured: float, predicted: float, **layout: int) -> HeldOut:
        measurement = Measurement(scenario="closed_loop", metric=metric, num_gpus=8, weight_dtype="bf16",
                                  engine="trtllm", **layout)
        target = SimpleNamespace(measured=measured, row=SimpleNamespace(metric=metric, measurement=measurement))
        return HeldOut(group="h100-sxm", target=target, predicted={"family": predicted})

    rows = [held("tpot_ms", 10, 11, tp=8), held("tpot_ms", 10, 8, tp=8), held("tpot_ms", 20, 30, tp=1, dp=8, ep=8),
            held("output_tokens_per_s", 1000, 900, tp=2, pp=4)]
    document = _hold_out_document("gpu", rows, "family")
    by_layout = {item["layout_kind"]: item["by_metric"] for item in document["by_layout"]}
    assert list(by_layout) == ["tp", "dp_ep", "pp"]
    assert by_layout["tp"]["tpot_itl"]["rows"] == 2
    assert by_layout["tp"]["tpot_itl"]["median_abs_pct_error"] == pytest.approx(15.0)
    assert by_layout["dp_ep"]["tpot_itl"]["median_abs_pct_error"] == pytest.approx(50.0)
    assert by_layout["pp"]["throughput"]["median_abs_pct_error"] == pytest.approx(10.0)
    assert by_layout["pp"]["ttft"] == {"rows": 0, "median_abs_pct_error": None, "median_abs_pct_error_low": None,
                                       "median_abs_pct_error_high": None, "p90_abs_pct_error": None,
                                       "median_ratio": None}
    # The TP TPOT median's interval: a resample of its two errors is (10, 10), (10, 20), (20, 10) or (20, 20), each
    # with probability 1/4, so the resampled medians are 10 (1/4), 15 (1/2) and 20 (1/4): 5th percentile 10, 95th 20.
    assert (by_layout["tp"]["tpot_itl"]["median_abs_pct_error_low"],
            by_layout["tp"]["tpot_itl"]["median_abs_pct_error_high"]) == (pytest.approx(10.0), pytest.approx(20.0))
    assert by_layout["tp"]["tpot_itl"]["median_ratio"] == pytest.approx(0.95)
    assert by_layout["dp_ep"]["tpot_itl"]["median_ratio"] == pytest.approx(1.5)
    assert by_layout["pp"]["throughput"]["median_ratio"] == pytest.approx(0.9)
    assert document["overall"]["median_ratio"] == pytest.approx(1.0)


def test_a_held_out_median_comes_with_its_90_percent_interval() -> None:
    """`median_interval`: the 5th and 95th percentiles of the medians of 1,000 resamples (with replacement).
    One row, or rows all alike, give every resample the same median: the interval is that value. Three rows 10,
    20, 30: a resample's median is 10 when at least two of its three draws are 10, 3 x (1/3)^2 x (2/3) + (1/3)^3 =
    7/27 (26%) of resamples, 30 likewise, 20 the other 13/27; with over 5% of the 1,000 medians at each end the
    interval is [10, 30]. No rows, no interval. The seed is fixed: the same rows, the same interval."""
    assert MEDIAN_INTERVAL_RESAMPLES == 1000
    assert median_interval([7.0]) == (7.0, 7.0)
    assert median_interval([5.0, 5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert median_interval([10.0, 20.0, 30.0]) == (10.0, 30.0)
    assert median_interval([]) is None
    spread = [float(value) for value in range(1, 100)]
    low, high = median_interval(spread)
    assert low < 50.0 < high and median_interval(spread) == (low, high)


def _held(predicted: dict[str, list[float]]) -> list[SimpleNamespace]:
    """Held-out rows measured 100, each predicted at every level as given (one list per level, row by row)."""
    count = len(next(iter(predicted.values())))
    return [SimpleNamespace(target=SimpleNamespace(measured=100.0),
                            predicted={level: values[i] for level, values in predicted.items()})
            for i in range(count)]


def _choice(gpu: dict[str, list[float]], family: dict[str, list[float]]) -> tuple[str, list[dict]]:
    held = {"gpu": _held(gpu), "model_family": _held(family)}
    candidates = {level: {name: float(np.median([abs(item.predicted[level] - 100.0) for item in items]))
                          for name, items in held.items()}
                  for level in ("global", "family", "family_precision")}
    return level_choice(held, candidates)


def test_a_more_specific_level_ships_only_where_its_lead_is_more_than_sampling_noise() -> None:
    """`level_choice` on 20 GPU-held-out and 20 family-held-out rows, each measured 100.

    - Global predicts 130 (30% off) everywhere, family 110 (10%): every paired resample has family's medians at
      10 against 30, so family is lower in all of them (100% >= 95%) and replaces global.
    - Family and precision predicts 109 (9%) on every row: lower than family in every resample, shipped.
    - It predicts 109 on 11 of the GPU rows and 111 (11%) on 9: its median is 9 (the 10th and 11th of the sorted
      errors are both 9), its score (9 + 10) / 2 = 9.5 against family's 10, the lowest score. A resample of the 20
      rows has a lower median only when it draws at least 11 of the 9% rows (10 of them give (9 + 11) / 2 = 10,
      fewer give 11); the family-held-out rows err alike at both levels. The count drawn is binomial (20, 11/20):
      P(X >= 11) = sum over k = 11..20 of C(20, k) 0.55^k 0.45^(20-k), about 0.59, so it leads in about 59% of
      resamples (1,000 of them: within 0.05, three standard deviations), under 95%: family ships.
    - With no scored row (every prediction NaN) a level has no score and never ships."""
    assert CHOICE_CONFIDENCE == 0.95
    flat = {"global": [130.0] * 20, "family": [110.0] * 20}
    chosen, steps = _choice({**flat, "family_precision": [109.0] * 20}, {**flat, "family_precision": [109.0] * 20})
    assert chosen == "family_precision"
    assert [(step["level"], step["against"], step["better_in"], step["chosen"]) for step in steps] == [
        ("family", "global", 1.0, True), ("family_precision", "family", 1.0, True)]
    assert steps[0]["score"] == pytest.approx(10.0) and steps[0]["against_score"] == pytest.approx(30.0)

    chosen, steps = _choice({**flat, "family_precision": [109.0] * 11 + [111.0] * 9},
                            {**flat, "family_precision": [110.0] * 20})
    odds = sum(math.comb(20, k) * 0.55 ** k * 0.45 ** (20 - k) for k in range(11, 21))
    assert odds == pytest.approx(0.59, abs=0.01)
    assert steps[1]["score"] == pytest.approx(9.5) and steps[1]["against_score"] == pytest.approx(10.0)
    assert steps[1]["better_in"] == pytest.approx(odds, abs=0.05) and not steps[1]["chosen"]
    assert chosen == "family"

    chosen, steps = _choice({**flat, "family_precision": [math.nan] * 20}, {**flat, "family_precision": [math.nan] * 20})
    assert chosen == "family" and steps[1]["score"] is None and steps[1]["better_in"] == 0.0


def test_the_accuracy_page_says_which_way_held_out_predictions_erred() -> None:
    """The page's layout table gives each cell's median predicted / measured after its rows (×0.68: the
    prediction ran low, at 68% of the measured value), and each hold-out's group table a column of it; a
    profile cross-validated before the ratio existed shows none, not a made-up one."""
    ttft = {"rows": 127, "median_abs_pct_error": 43.2, "median_abs_pct_error_low": 40.8,
            "median_abs_pct_error_high": 48.6, "p90_abs_pct_error": 130.7, "median_ratio": 0.68}
    old = {"rows": 145, "median_abs_pct_error": 9.6, "p90_abs_pct_error": 30.0}
    empty = {"rows": 0, "median_abs_pct_error": None, "p90_abs_pct_error": None}
    by_metric = {"throughput": empty, "tpot_itl": old, "ttft": ttft, "e2e": empty}
    validation = {
        "targets": {"throughput": 12.0, "tpot_itl": 10.0, "ttft": 20.0, "e2e": 12.0},
        "hold_outs": [{"held_out": "gpu", "overall": {**ttft, "rows": 272}, "by_metric": by_metric,
                       "by_group": [{"group": "b200", **ttft}, {"group": "gb200", **old}],
                       "by_layout": [{"layout_kind": "disaggregated", "by_metric": by_metric}]}],
        "chosen_level": "family", "chosen_by": "the lowest mean", "levels": {"family": "an entry per GPU family"},
        "candidates": {"family": {"gpu": 25.8}},
    }
    page = "\n".join(validate_command._cross_validation_section(validation))
    assert ("| leave one GPU out | prefill/decode | – | 9.6% ✓ (145 rows) | 43.2% [40.8–48.6] ✗ (127 rows, ×0.68) "
            "| – |") in page
    assert "| 9.6% ✓ (30.0%, 145 rows) | 43.2% [40.8–48.6] ✗ (130.7%, 127 rows) |" in page  # the headline table
    assert "| b200 | 127 | 43.2% | 130.7% | ×0.68 |" in page
    assert "| gb200 | 145 | 9.6% | 30.0% | – |" in page
    assert "The choice" not in page  # a profile fitted before the choice's steps were recorded shows none


def test_the_accuracy_page_shows_each_step_of_the_level_choice() -> None:
    """Each step: the level, the one chosen before it, both scores to two decimals (20.656 and 20.667 are told
    apart), the share of resamples the level led in, and whether it shipped."""
    stats = {"rows": 0, "median_abs_pct_error": None, "p90_abs_pct_error": None}
    levels = {"global": "one global entry", "family": "an entry per GPU family",
              "family_precision": "an entry per GPU family and compute precision"}
    validation = {
        "targets": {"throughput": 12.0, "tpot_itl": 10.0, "ttft": 20.0, "e2e": 12.0},
        "hold_outs": [{"held_out": "gpu", "overall": stats, "by_group": [], "by_layout": [],
                       "by_metric": {"throughput": stats, "tpot_itl": stats, "ttft": stats, "e2e": stats}}],
        "chosen_level": "family", "chosen_by": "the rule", "levels": levels,
        "candidates": {"family": {"gpu": 23.7, "model_family": 17.6}},
        "choice": [{"level": "family", "against": "global", "score": 20.656, "against_score": 24.319,
                    "better_in": 1.0, "chosen": True},
                   {"level": "family_precision", "against": "family", "score": 20.667, "against_score": 20.656,
                    "better_in": 0.54, "chosen": False}]}
    page = "\n".join(validate_command._cross_validation_section(validation))
    assert ("- an entry per GPU family against one global entry: 20.66% against 24.32%, lower in 100% of the "
            "resamples: shipped.") in page
    assert ("- an entry per GPU family and compute precision against an entry per GPU family: 20.67% against "
            "20.66%, lower in 54% of the resamples: not shipped.") in page



def test_the_accuracy_page_tells_a_parameter_pushed_to_a_bound_from_one_left_on_its_prior() -> None:
    """compute_scale's cited prior is 1.0, its range 0.3-1.0: an entry at 0.3 was pushed there (a defect).
    The overlapped host work's prior is 0, its range 0-1 ms: an entry at 0 sits where its prior does (the data
    showed no such cost) and is listed apart, with the reason it is still listed. None is hidden. AMD's entry,
    carrying cdna3's fit, is the same defect: counted apart and named in cdna3's row."""
    provenance = {
        "parameter_bounds": {"compute_scale": [0.3, 1.0], "overlapped_host_per_sequence_s": [0.0, 1e-3]},
        "parameter_priors": {"compute_scale": {"prior": 1.0, "source": "s"},
                             "overlapped_host_per_sequence_s": {"prior": 0.0, "source": "s"}},
        "parameters_at_bounds": [
            {"gpu_family": "cdna3", "compute_dtype": "*", "parameter": "compute_scale", "value": 0.3, "bound": "low"},
            {"gpu_family": "hopper", "compute_dtype": "fp8", "parameter": "overlapped_host_per_sequence_s",
             "value": 2.7e-7, "bound": "low"},
            {"gpu_family": "vendor:amd", "compute_dtype": "*", "parameter": "compute_scale", "value": 0.3,
             "bound": "low", "same_fit_as": "cdna3/*"}],
    }
    page = "\n".join(validate_command._defects_section(provenance))
    assert ("2 fitted parameters sit at a bound of their cited range (1 more in entries that carry another's fit, "
            "a maker whose rows are all one family's or a family's only precision, listed beside it). 1 of them were "
            "pushed there") in page
    assert "1 sit on the bound their cited prior sits on too" in page
    assert "| vendor:amd |" not in page
    pushed, on_prior = page.index("| cdna3 (and vendor:amd/*: the same fit) | * | compute_scale | 0.3 | low |"), page.index(
        "| hopper | fp8 | overlapped_host_per_sequence_s | 2.7e-07 | low |")
    assert pushed < page.index("1 sit on the bound") < on_prior
    alone = {**provenance, "parameters_at_bounds": provenance["parameters_at_bounds"][:2]}
    assert "2 fitted parameters sit at a bound of their cited range. 1 of them" in "\n".join(
        validate_command._defects_section(alone))
    assert validate_command._defects_section({**provenance, "parameters_at_bounds": []})[-2] == (
        "No fitted parameter sits at a bound of its range.")

def test_a_plan_reads_its_kind_of_prediction_from_the_held_out_errors() -> None:
    """`held_out_error` picks, from a cross-validation document, the leave-one-GPU-out errors of the plan's
    layout kind (only metric kinds with rows: a kind's rows-0 metric is unmeasured, not 0%), and the
    group errors of the plan's GPUs (in the plan's order, each once, skipping one the data lacks), of its
    model family and of its engine (None where the data has no rows of it). A document without
    cross-validation gives None; one without hold-outs or targets, empty answers."""
    stats = {"rows": 3, "median_abs_pct_error": 12.5, "p90_abs_pct_error": 30.0}
    empty = {"rows": 0, "median_abs_pct_error": None, "p90_abs_pct_error": None}
    validation = {
        "targets": {"throughput": 12.0, "tpot_itl": 10.0, "ttft": 20.0, "e2e": 12.0},
        "hold_outs": [
            {"held_out": "gpu", "by_group": [{"group": "b200", **stats}, {"group": "h100-sxm", **empty, "rows": 7}],
             "by_layout": [{"layout_kind": "tp", "by_metric": {"ttft": stats, "throughput": empty}},
                           {"layout_kind": "disaggregated", "by_metric": {"ttft": {**stats, "rows": 9}}}]},
            {"held_out": "model_family", "by_group": [{"group": "deepseek-ai", **stats}], "by_layout": []},
            {"held_out": "engine", "by_group": [{"group": "sglang", **stats}], "by_layout": []},
        ],
    }
    found = held_out_error(validation, layout_kind="disaggregated", gpus=["h100-sxm", "gb200", "b200", "h100-sxm"],
                           model_family="deepseek-ai", engine="trtllm")
    assert found == {
        "held_out": "gpu", "layout_kind": "disaggregated", "by_metric": {"ttft": {**stats, "rows": 9}},
        "gpus": [{"group": "h100-sxm", **empty, "rows": 7}, {"group": "b200", **stats}],
        "model_family": {"group": "deepseek-ai", **stats}, "engine": None,
        "targets": validation["targets"],
    }
    tp = held_out_error(validation, layout_kind="tp", gpus=["b200"], model_family=None, engine="sglang")
    assert tp is not None and tp["by_metric"] == {"ttft": stats}  # throughput has no rows: left out
    assert tp["model_family"] is None and tp["engine"] == {"group": "sglang", **stats}
    assert held_out_error(validation, layout_kind="pp", gpus=[], model_family=None, engine="vllm")["by_metric"] == {}
    assert held_out_error(None, layout_kind="tp", gpus=["b200"], model_family=None, engine="vllm") is None
    # A stored profile written before a breakdown existed answers with what it has, never an error.
    assert held_out_error({"chosen_level": "family"}, layout_kind="tp", gpus=["b200"], model_family="openai",
                          engine="vllm") == {"held_out": "gpu", "layout_kind": "tp", "by_metric": {}, "gpus": [],
                                             "model_family": None, "engine": None, "targets": {}}


def test_an_answers_held_out_error_is_built_once_per_document_and_question() -> None:
    """`HeldOutErrors.out` shares one answer among the requests that ask the same question of the same
    cross-validation document, and answers afresh for another question or another document (a profile stored
    again under its name), even one equal to the first."""
    stats = {"rows": 3, "median_abs_pct_error": 12.5, "p90_abs_pct_error": 30.0}

    def document(error: float) -> dict:
        return {"targets": {"ttft": 20.0}, "hold_outs": [
            {"held_out": "gpu", "by_group": [{"group": "b200", **stats}],
             "by_layout": [{"layout_kind": "tp", "by_metric": {"ttft": {**stats, "median_abs_pct_error": error}}}]}]}

    first = document(12.5)
    answer = HeldOutErrors(first, "meta-llama/Llama-3.1-8B", None).out("tp", ["b200"])
    assert answer is not None and answer.by_metric["ttft"].median_abs_pct_error == 12.5
    assert HeldOutErrors(first, "meta-llama/Llama-3.1-8B", None).out("tp", ["b200"]) is answer
    other_gpu = HeldOutErrors(first, "meta-llama/Llama-3.1-8B", None).out("tp", ["h100-sxm"])
    assert other_gpu is not answer and other_gpu.gpus == [] and answer.gpus[0].group == "b200"
    assert HeldOutErrors(first, "meta-llama/Llama-3.1-8B", "vllm").out("tp", ["b200"]) is not answer
    refitted = HeldOutErrors(document(30.0), "meta-llama/Llama-3.1-8B", None).out("tp", ["b200"])
    assert refitted is not None and refitted.by_metric["ttft"].median_abs_pct_error == 30.0
    equal = HeldOutErrors(document(12.5), "meta-llama/Llama-3.1-8B", None).out("tp", ["b200"])
    assert equal == answer and equal is not answer


def test_a_models_family_is_the_organization_of_its_hugging_face_id() -> None:
    """The rule the cross-validation groups rows by and a plan looks its family up by: "meta-llama" for
    meta-llama/Llama-3.1-70B-Instruct (the catalog's llama-3.1-70b), none for an id without an organization
    or without an id."""
    assert publisher("meta-llama/Llama-3.1-70B-Instruct") == "meta-llama" == model_family("llama-3.1-70b")
    assert publisher("deepseek-ai/DeepSeek-V3") == "deepseek-ai" == model_family("deepseek-v3")
    assert publisher("my-model") is None and publisher(None) is None and publisher("") is None
