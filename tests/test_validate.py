"""The validator and calibration commands on a sample of real published rows.

examples/calibration-sample.csv holds 35 rows copied unchanged from measured-calibration.csv: TensorRT-LLM
0.9 static batches and batch-1 first-token latencies, TensorRT-LLM 0.17 offline and Poisson-load rows,
gpt-fast batch-1 and LMDeploy static rows, and two vLLM rows from a dataset (ShareGPT) without fixed
lengths, which must be skipped.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from app import calibrate as calibrate_command
from app import validate as validate_command
from app.calibration.profiles import builtin_profile, profile_from_entries
from app.calibration.service import ReferenceCatalog, RowsInvalid, observed_rows, rows_from_csv, validate
from app.sizing.calibration.predict import PoolLayout

DATA = Path(__file__).parent / "data"
SAMPLE = Path(__file__).parents[1] / "examples" / "calibration-sample.csv"
DATASET_ROWS = {"LAMBDA_VLLM_054-1399", "LAMBDA_VLLM_054-1400"}


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
    assert sum(value is not None for value in predicted.values()) == 33
    for before, after in zip(original["rows"], tenfold["rows"], strict=True):
        assert after["measured"] == pytest.approx(10 * before["measured"])
        if "predicted" in before:
            assert after["abs_pct_error"] != before["abs_pct_error"]


def test_the_json_report_has_every_row_and_a_summary(tmp_path: Path) -> None:
    """Predicted rows carry predicted, measured and abs_pct_error = |p − m| / m x 100; skipped rows carry
    the reason instead; the summary counts them."""
    report = run_validator(tmp_path, SAMPLE, "--profile", "builtin")
    assert report["profile"] == "builtin"
    assert len(report["rows"]) == 35
    for row in report["rows"]:
        if row["row_id"] in DATASET_ROWS:
            assert "predicted" not in row and "abs_pct_error" not in row
            assert row["skipped_reason"].startswith("dataset-driven lengths")
        else:
            assert "skipped_reason" not in row
            assert row["abs_pct_error"] == pytest.approx(abs(row["predicted"] - row["measured"]) / row["measured"] * 100)
    summary = report["summary"]
    assert (summary["rows_total"], summary["rows_predicted"], summary["rows_skipped"]) == (35, 33, 2)
    assert summary["skipped_reasons"] == {"dataset-driven lengths": 2}
    assert sum(group["rows"] for group in summary["by_group"]) == 33
    assert summary["throughput"]["rows"] + summary["latency_light_load"]["rows"] + summary["latency_loaded"]["rows"] == 33
    groups = {(g["scenario"], g["metric"], g["gpu_family"]) for g in summary["by_group"]}
    assert ("static_batch", "output_tokens_per_s_per_gpu", "hopper") in groups
    assert ("batch1", "output_tokens_per_s", "ampere") in groups


def test_the_printed_table_names_groups_skips_and_worst_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_validator(tmp_path, SAMPLE, "--profile", "builtin")
    printed = capsys.readouterr().out
    assert "33 predicted (94.3%)" in printed
    assert "static_batch  output_tokens_per_s_per_gpu  hopper" in printed
    assert "dataset-driven lengths" in printed
    assert "worst 10 rows:" in printed


def test_the_markdown_page_is_written_by_the_command(tmp_path: Path) -> None:
    page = tmp_path / "ACCURACY.md"
    assert validate_command.main([str(SAMPLE), "--profile", "builtin", "--markdown", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Accuracy")
    assert f"python -m app.validate {SAMPLE} --profile builtin --markdown {page}" in text
    assert "| throughput rows |" in text
    assert "33 of 35 rows predicted (94.3%)" in text


def test_a_malformed_file_is_refused_with_the_offending_cells(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.csv"
    text = SAMPLE.read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1].replace(",fp8,fp8,fp8,", ",fp8,fp8,fp9,", 1)]) + "\n")
    assert validate_command.main([str(bad)]) == 2
    assert "kv_dtype" in capsys.readouterr().err


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


def test_calibrating_on_the_sample_writes_a_profile_the_validator_reads(tmp_path: Path) -> None:
    """The fit only improves on the builtin constants for the rows it saw; the written profile carries
    its provenance, and validating with it reproduces the 'after' error the fit reported."""
    output = tmp_path / "sample-profile.json"
    assert calibrate_command.main([str(SAMPLE), "--name", "sample", "--output", str(output),
                                   "--no-leave-one-out"]) == 0
    document = json.loads(output.read_text())
    provenance = document["provenance"]
    assert document["name"] == "sample"
    assert provenance["rows_total"] == 35 and provenance["rows_predicted"] == 33
    assert provenance["rows_used"] == 28  # every predicted row but the 5 Poisson ones
    assert provenance["source_file"] == "calibration-sample.csv"
    assert len(provenance["source_sha256"]) == 64
    before, after = provenance["fit_error"]["before"], provenance["fit_error"]["after"]
    assert after["median_abs_pct_error"] < before["median_abs_pct_error"]
    keys = {(entry["family"], entry["compute_dtype"]) for entry in document["entries"]}
    # hopper: 20 fp8 rows and 3 bf16 ones (a family entry on 23, an fp8 entry); the rest falls back to global
    assert keys == {("*", "*"), ("hopper", "*"), ("hopper", "fp8")}
    profile_from_entries("sample", document["entries"])  # a valid profile
    report = run_validator(tmp_path, SAMPLE, "--profile", str(output))
    assert report["summary"]["overall"]["median_abs_pct_error"] == pytest.approx(after["median_abs_pct_error"])


def test_the_shipped_default_profile_meets_its_accuracy_targets() -> None:
    """The default profile, as the calibration command wrote it: fitted to the full published data, with
    leave-one-source-out error at most 30% (the accuracy page's headline), and a valid profile."""
    document = json.loads((Path(validate_command.DEFAULT_PROFILE_PATH)).read_text())
    provenance = document["provenance"]
    assert provenance["source_file"] == "measured-calibration.csv"
    assert provenance["rows_total"] == 1263
    assert provenance["leave_one_source_out"]["median_abs_pct_error"] <= 30
    assert provenance["fit_error"]["after"]["median_abs_pct_error"] <= 20
    profile = profile_from_entries("default", document["entries"])
    assert profile.entry_for("hopper", "fp8").rows > 0


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
f,AIC,mixtral-8x7b,h100-sxm,8,8,1,,,,disaggregated,bf16,trtllm,closed_loop,1000,1000,8,tpot_ms,mean,10
"""


def test_layout_columns_sources_and_unstated_statistics(tmp_path: Path) -> None:
    """Row a: DP8 x EP8 (moe_tp 1 = 1 x 8 / 8), statistic unstated: skipped unless read as a mean. Row b: "n/a"
    and 0 in the layout columns mean 1 (plain TP2). Row c: tp 8 x dp 1 != ep 8 x moe_tp 2, skipped. Row d has
    no num_gpus (outside the schema: left out with --skip-invalid-rows). Row e belongs to another source. Row
    f: disaggregated workers, skipped."""
    path = tmp_path / "layouts.csv"
    path.write_text(LAYOUT_CSV)
    invalid: list[str] = []
    rows = observed_rows(rows_from_csv(LAYOUT_CSV, sources={"AIC"}, invalid=invalid))
    assert [row.row_id for row in rows] == ["a", "b", "c", "f"] and invalid == ["num_gpus: Field required"]
    assert (rows[0].measurement.dp, rows[0].measurement.ep, rows[1].measurement.dp, rows[1].measurement.ep) == (
        8, 8, None, None)
    out = tmp_path / "out.json"
    assert validate_command.main([str(path), "--source", "AIC", "--skip-invalid-rows", "--stat-when-unstated",
                                  "mean", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    reasons = {row["row_id"]: row.get("skipped_reason") for row in report["rows"]}
    assert reasons["a"] is None and reasons["b"] is None
    assert reasons["c"].startswith("inconsistent layout") and reasons["f"].startswith("disaggregated")
    kinds = {(item["layout_kind"], item["metric"]): item["rows"] for item in report["summary"]["by_layout"]}
    assert kinds == {("tp", "tpot_ms"): 1, ("dp_ep", "tpot_ms"): 1}
    assert validate_command.main([str(path), "--source", "AIC", "--skip-invalid-rows", "--json", str(out)]) == 0
    unstated = {row["row_id"]: row.get("skipped_reason") for row in json.loads(out.read_text())["rows"]}
    assert unstated["a"].startswith("tpot_ms without its statistic")


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
    rows = observed_rows(rows_from_csv(DISAGGREGATED_CSV))
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
