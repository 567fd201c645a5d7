"""/v1/calibrations and /v1/validate: profiles fitted to uploaded measurements, stored in the database
and used by the sizing endpoints; error reports that store nothing; bad uploads as 422 problems.

The uploads are the 35 real rows of examples/calibration-sample.csv (20 of them TensorRT-LLM on H100
in fp8: enough for a hopper/fp8 entry of its own; 5 Poisson rows, which a fit does not use; 2 ShareGPT
rows without fixed lengths, which are skipped).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from app.calibration import service as calibration
from app.calibration.examples import CALIBRATION_ROWS_EXAMPLE
from app.calibration.profiles import (
    DEFAULT_PROFILE_PATH,
    builtin_profile,
    load_default_profile,
    profile_from_entries,
)
from app.calibration.rows import RowsInvalid, observed_rows, rows_from_csv
from app.calibration.schemas import (
    MAX_CALIBRATE_ROWS,
    MAX_CALIBRATE_SIMULATED_RUNS,
    MAX_VALIDATE_ROWS,
    MAX_VALIDATE_SIMULATED_RUNS,
    CalibrationRequest,
    ValidationRequest,
)
from app.calibration.tables import CalibrationProfileRecord
from app.catalog.repository import bump_catalog_revision
from app.catalog.schemas import GPU_SPEC_EXAMPLE, MODEL_ARCHITECTURE_EXAMPLE
from tests.api.problems import assert_problem
from tests.api.test_slo_plan_disaggregated import LONG_PROMPTS
from tests.conftest import TEST_API_KEY

SAMPLE = Path(__file__).parents[2] / "examples" / "calibration-sample.csv"
MEASURED = Path(__file__).parents[1] / "data" / "measured-calibration.csv"
SAMPLE_TEXT = SAMPLE.read_text()
SAMPLE_ROWS = [row.model_dump(mode="json") for row in rows_from_csv(SAMPLE_TEXT)]


@pytest.fixture(autouse=True)
def no_profiles(app: FastAPI) -> Iterator[None]:
    """Every test starts and ends without stored profiles (other tests expect the builtin default).
    Written through the application's own sessions, so its cache sees the change at once."""
    def clear() -> None:
        with app.state.session_factory() as session, session.begin():
            session.execute(delete(CalibrationProfileRecord))
            bump_catalog_revision(session)  # as every write to what sizing reads

    clear()
    yield
    clear()


def calibrate(client: TestClient, headers: dict[str, str], name: str = "sample-trtllm", **fields: Any) -> Any:
    return client.post("/v1/calibrations", headers=headers, json={"name": name, "rows": SAMPLE_ROWS, **fields})


def roofline_efficiency(client: TestClient, **fields: Any) -> dict[str, Any]:
    """Decode of Llama-3-8B on an H100: the efficiencies and the overhead its expected time used."""
    response = client.post("/v1/roofline", json={"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode",
                                                 "context_tokens": 1024, **fields})
    assert response.status_code == 200, response.text
    answer = response.json()
    return {**answer["assumptions"]["efficiency"], "overhead_time_ms": answer["overhead_time_ms"]}


# Profiles and the default ----------------------------------------------------------------------

def test_a_gpu_of_a_family_without_an_entry_takes_its_makers_entry(client: TestClient,
                                                                   default_profile_loaded: None) -> None:
    """A GPU of a generation the shipped profile has no entry for (an inline spec of family "rubin", as a user
    describes a new part) takes the shipped file's entry of its maker: NVIDIA's (`vendor:nvidia`, fitted on
    every NVIDIA GPU's rows) or AMD's; a GPU whose maker has no entry, or is not stated, the global one (`*`).
    Each is read off the file: its bandwidth fraction, and its source named in the answer."""
    shipped = {entry["family"]: entry for entry in json.loads(DEFAULT_PROFILE_PATH.read_text())["entries"]
               if entry["compute_dtype"] == "*"}
    assert shipped["vendor:nvidia"]["rows"] > 0 and shipped["vendor:amd"]["rows"] > 0
    for vendor, family in (("NVIDIA", "vendor:nvidia"), ("AMD", "vendor:amd"), ("Cerebras", "*"), ("", "*")):
        gpu = {**GPU_SPEC_EXAMPLE, "family": "rubin", "vendor": vendor}
        response = client.post("/v1/roofline", json={"model": "llama-3-8b", "gpu_spec": gpu, "phase": "decode",
                                                     "context_tokens": 1024})
        assert response.status_code == 200, response.text
        used = response.json()["assumptions"]["efficiency"]
        assert used["bandwidth_fraction_ratio"] == pytest.approx(shipped[family]["bandwidth_fraction"]), vendor
        assert shipped[family]["source"] in used["source"]
    assert shipped["vendor:nvidia"]["bandwidth_fraction"] != shipped["*"]["bandwidth_fraction"]


def test_builtin_is_the_default_until_the_default_profile_is_loaded(client: TestClient) -> None:
    listing = client.get("/v1/calibrations").json()
    assert listing["default_profile"] == "builtin"
    assert [item["name"] for item in listing["items"]] == ["builtin"]
    assert listing["total"] == 1
    builtin = client.get("/v1/calibrations/builtin").json()
    assert builtin["origin"] == "builtin" and builtin["provenance"] is None
    (entry,) = builtin["entries"]
    assert (entry["gpu_family"], entry["compute_dtype"], entry["bandwidth_fraction_ratio"]) == ("*", "*", 0.7)
    assert roofline_efficiency(client)["calibration_profile"] == "builtin"


def test_a_listed_summary_is_the_full_profiles_own_fields(client: TestClient, default_profile_loaded: None) -> None:
    """The listing reads a record's columns without parsing its entries: each item must still be, field for
    field, what reading that profile in full says (builtin's cited constants and the stored default)."""
    items = client.get("/v1/calibrations").json()["items"]
    assert [item["name"] for item in items] == ["builtin", "default"]
    for item in items:
        full = client.get(f"/v1/calibrations/{item['name']}").json()
        assert item == {field: full[field] for field in item}
        assert set(full) - set(item) == {"entries", "provenance"}
    assert items[0]["origin"] == "builtin" and items[0]["rows_used"] == 0
    assert items[1]["rows_used"] > 0 and items[1]["source_sha256"] is not None


def test_an_answer_from_an_entry_with_a_pinned_parameter_says_so(client: TestClient,
                                                                default_profile_loaded: None) -> None:
    """The shipped profile's provenance lists cdna3's compute_scale at its floor and all-reduce latency at its
    ceiling, both away from their cited priors: an MI300X answer's efficiency source names them; an H100's
    (hopper: only its overlapped host work at the floor its prior 0 sits at) names none."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    pinned = {(item["gpu_family"], item["parameter"]): item for item in shipped["provenance"]["parameters_at_bounds"]}
    scale, latency = pinned["cdna3", "compute_scale"], pinned["cdna3", "allreduce_latency_s"]
    assert (scale["bound"], latency["bound"]) == ("low", "high")
    mi300x = roofline_efficiency(client, gpu="mi300x")["source"]
    assert "entry cdna3/*" in mi300x and f"Pinned: compute_scale {scale['value']:.4g} at the low end" in mi300x
    assert f"allreduce_latency_s {latency['value']:.4g} at the high end" in mi300x
    assert "Pinned" not in roofline_efficiency(client)["source"]


def test_a_listed_profile_gives_its_held_out_error_beside_its_in_sample_one(client: TestClient,
                                                                           default_profile_loaded: None) -> None:
    """The fit's error on its own rows is not an accuracy figure: the listing labels it in-sample and gives the
    cross-validated medians beside it, each the overall median of the fold that left its group out."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    hold_outs = {item["held_out"]: item for item in shipped["provenance"]["cross_validation"]["hold_outs"]}
    builtin, default = client.get("/v1/calibrations").json()["items"]
    assert builtin["held_out_median_abs_pct_error"] is None
    assert default["held_out_median_abs_pct_error"] == {
        held_out: hold_outs[held_out]["overall"]["median_abs_pct_error"] for held_out in ("gpu", "model_family", "engine")}
    assert default["fit_median_abs_pct_error"] == shipped["provenance"]["fit_error"]["after"]["median_abs_pct_error"]
    summary = client.get("/openapi.json").json()["components"]["schemas"]["ProfileSummaryOut"]["properties"]
    assert summary["fit_median_abs_pct_error"]["description"].startswith("In-sample")


def test_the_loaded_default_profile_answers_requests_that_name_none(client: TestClient,
                                                                    default_profile_loaded: None) -> None:
    """Once `default` is stored, a request without `calibration` uses it: an H100 (hopper) at bf16 gets
    the entry of the shipped file that the lookup picks for hopper/bf16 (the most specific one the
    cross-validated level has), and the overhead of a Llama-3-8B step is that entry's per-step overhead +
    32 layers x its per-layer overhead."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    key = profile_from_entries("default", shipped["entries"]).entry_for("hopper", "bf16").key
    entry = next(e for e in shipped["entries"] if (e["family"], e["compute_dtype"]) == key)
    listing = client.get("/v1/calibrations").json()
    assert listing["default_profile"] == "default"
    assert [item["name"] for item in listing["items"]] == ["builtin", "default"]
    used = roofline_efficiency(client)
    assert used["calibration_profile"] == "default"
    assert used["bandwidth_fraction_ratio"] == pytest.approx(entry["bandwidth_fraction"])
    assert used["overhead_time_ms"] == pytest.approx(
        (entry["per_step_overhead_s"] + 32 * entry["per_layer_overhead_s"]) * 1e3)
    assert entry["source"] in used["source"]
    assert roofline_efficiency(client, calibration="builtin")["bandwidth_fraction_ratio"] == 0.7
    stored = client.get("/v1/calibrations/default").json()
    assert stored["origin"] == "reference"
    assert stored["provenance"]["source_sha256"] == shipped["provenance"]["source_sha256"]
    validation = stored["provenance"]["cross_validation"]
    assert [item["held_out"] for item in validation["hold_outs"]] == ["gpu", "model_family", "engine"]
    assert validation["chosen_level"] in validation["levels"]


def test_the_default_profile_loads_once(engine: Engine, default_profile_loaded: None) -> None:
    with Session(engine) as session, session.begin():
        assert load_default_profile(session) == "unchanged"


def test_a_plan_states_the_held_out_error_of_its_kind_of_prediction(client: TestClient,
                                                                      default_profile_loaded: None) -> None:
    """Under the shipped profile every plan carries what its cross-validation measured for the plan's kind,
    read here from the shipped file: the leave-one-GPU-out errors of the plan's layout kind (TP only for an
    aggregated TP2/TP4 plan, the disaggregated rows for a prefill/decode plan), only metric kinds with rows,
    and the held-out errors of H100's rows, of Meta's models (Llama's publisher on Hugging Face) and of vLLM's
    rows. Under `builtin`, which has no cross-validation, it is null."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    hold_outs = {item["held_out"]: item for item in shipped["provenance"]["cross_validation"]["hold_outs"]}
    by_layout = {item["layout_kind"]: item["by_metric"] for item in hold_outs["gpu"]["by_layout"]}

    def group(hold_out: str, name: str) -> dict[str, Any]:
        return next(item for item in hold_outs[hold_out]["by_group"] if item["group"] == name)

    response = client.post("/v1/slo-plan", json=LONG_PROMPTS)
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    assert {plan["deployment"] for plan in plans} == {"aggregated", "disaggregated"}
    for plan in plans:
        error = plan["assumptions"]["held_out_error"]
        kind = "disaggregated" if plan["deployment"] == "disaggregated" else "tp"
        assert error["held_out"] == "gpu" and error["layout_kind"] == kind
        assert error["by_metric"] == {metric: stats for metric, stats in by_layout[kind].items() if stats["rows"]}
        assert error["gpus"] == [group("gpu", "h100-sxm")]
        assert error["model_family"] == group("model_family", "meta-llama")
        assert error["engine"] == group("engine", "vllm")
        assert error["targets"] == {"throughput": 12.0, "tpot_itl": 10.0, "ttft": 20.0, "e2e": 12.0}
    disaggregated = next(plan for plan in plans if plan["deployment"] == "disaggregated")
    assert set(disaggregated["assumptions"]["held_out_error"]["by_metric"]) == {"ttft", "tpot_itl"}

    builtin = client.post("/v1/slo-plan", json={**LONG_PROMPTS, "calibration": "builtin"}).json()
    assert builtin["plans"] and all(plan["assumptions"]["held_out_error"] is None for plan in builtin["plans"])


def test_a_capacity_answer_states_the_held_out_error_of_its_layout_gpu_model_and_engine(
        client: TestClient, default_profile_loaded: None) -> None:
    """/v1/capacity reports what the shipped profile's cross-validation measured for the deployment, read here
    from the shipped file: DeepSeek-V3 as DP8 + EP8 on H200 under SGLang gets the leave-one-GPU-out errors of
    the DP+EP rows (metric kinds with rows only), H200's, DeepSeek's (deepseek-ai on Hugging Face) and SGLang's.
    A disaggregated Llama-3.1-70B with its prefill pool on B200 and its decode pool on H100 gets the
    disaggregated rows' errors and both GPUs', prefill pool first; under the generic engine, which no
    measured row used, no engine's. An inline architecture has no family; `builtin` has no cross-validation."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    hold_outs = {item["held_out"]: item for item in shipped["provenance"]["cross_validation"]["hold_outs"]}
    by_layout = {item["layout_kind"]: item["by_metric"] for item in hold_outs["gpu"]["by_layout"]}

    def group(hold_out: str, name: str) -> dict[str, Any]:
        return next(item for item in hold_outs[hold_out]["by_group"] if item["group"] == name)

    def held_out_error(body: dict[str, Any]) -> dict[str, Any] | None:
        response = client.post("/v1/capacity", json=body)
        assert response.status_code == 200, response.text
        return response.json()["assumptions"]["held_out_error"]

    dp_ep = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "engine": "sglang",
             "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8, "input_tokens": 1000,
             "output_tokens": 1000}
    error = held_out_error(dp_ep)
    assert error is not None and error["held_out"] == "gpu" and error["layout_kind"] == "dp_ep"
    assert error["by_metric"] == {metric: stats for metric, stats in by_layout["dp_ep"].items() if stats["rows"]}
    assert set(error["by_metric"]) == {"ttft", "tpot_itl"}  # the DP+EP rows measure latencies only
    assert error["gpus"] == [group("gpu", "h200-sxm")]
    assert error["model_family"] == group("model_family", "deepseek-ai")
    assert error["engine"] == group("engine", "sglang")

    disaggregated = held_out_error(
        {"model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8", "engine": "generic",
         "deployment": "disaggregated", "prefill": {"gpu": "b200", "tensor_parallel": 4},
         "decode": {"tensor_parallel": 8}, "input_tokens": 8192, "output_tokens": 1024})
    assert disaggregated is not None and disaggregated["layout_kind"] == "disaggregated"
    assert disaggregated["gpus"] == [group("gpu", "b200"), group("gpu", "h100-sxm")]
    assert disaggregated["model_family"] == group("model_family", "meta-llama")
    assert disaggregated["engine"] is None

    inline_error = held_out_error({"model_spec": MODEL_ARCHITECTURE_EXAMPLE, "gpu": "h100-sxm", "input_tokens": 1000,
                                   "output_tokens": 500})
    assert inline_error is not None and inline_error["layout_kind"] == "tp"
    assert inline_error["model_family"] is None and inline_error["engine"] == group("engine", "vllm")
    assert held_out_error({**dp_ep, "calibration": "builtin"}) is None


def test_a_roofline_answer_states_the_held_out_error_of_its_layout_gpu_and_model(
        client: TestClient, default_profile_loaded: None) -> None:
    """/v1/roofline and its batch sweep report what the shipped profile's cross-validation measured for steps
    like theirs, read here from the shipped file. A roofline names no engine, so no engine's error: DeepSeek-V3
    decoding as DP8 + EP8 on H200 gets the DP+EP rows' leave-one-GPU-out errors, H200's and DeepSeek's; a
    disaggregated Llama-3.1-70B prefilling on B200 and decoding on H100 gets the disaggregated rows' and both
    GPUs', prefill pool first; Llama-3-8B's batch sweep on H100 (tensor parallel only) the TP rows',
    H100's and Meta's. An inline architecture has no family; `builtin` has no cross-validation."""
    shipped = json.loads(DEFAULT_PROFILE_PATH.read_text())
    hold_outs = {item["held_out"]: item for item in shipped["provenance"]["cross_validation"]["hold_outs"]}
    by_layout = {item["layout_kind"]: item["by_metric"] for item in hold_outs["gpu"]["by_layout"]}

    def group(hold_out: str, name: str) -> dict[str, Any]:
        return next(item for item in hold_outs[hold_out]["by_group"] if item["group"] == name)

    def held_out_error(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        return response.json()["assumptions"]["held_out_error"]

    dp_ep = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "phase": "decode", "batch_size": 16,
             "context_tokens": 2000, "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8}
    error = held_out_error("/v1/roofline", dp_ep)
    assert error is not None and error["held_out"] == "gpu" and error["layout_kind"] == "dp_ep"
    assert error["by_metric"] == {metric: stats for metric, stats in by_layout["dp_ep"].items() if stats["rows"]}
    assert error["gpus"] == [group("gpu", "h200-sxm")]
    assert error["model_family"] == group("model_family", "deepseek-ai")
    assert error["engine"] is None

    disaggregated = held_out_error("/v1/roofline", {
        "model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
        "deployment": "disaggregated", "prefill": {"gpu": "b200", "tensor_parallel": 4},
        "decode": {"tensor_parallel": 8}, "prompt_tokens": 8192, "batch_size": 32})
    assert disaggregated is not None and disaggregated["layout_kind"] == "disaggregated"
    assert disaggregated["by_metric"] == {metric: stats for metric, stats in by_layout["disaggregated"].items()
                                          if stats["rows"]}
    assert disaggregated["gpus"] == [group("gpu", "b200"), group("gpu", "h100-sxm")]
    assert disaggregated["model_family"] == group("model_family", "meta-llama")
    assert disaggregated["engine"] is None

    sweep = held_out_error("/v1/roofline/batch-sweep", {"model": "llama-3-8b", "gpu": "h100-sxm",
                                                        "context_tokens": 128})
    assert sweep is not None and sweep["layout_kind"] == "tp"
    assert sweep["by_metric"] == {metric: stats for metric, stats in by_layout["tp"].items() if stats["rows"]}
    assert sweep["gpus"] == [group("gpu", "h100-sxm")] and sweep["model_family"] == group("model_family", "meta-llama")

    inline_error = held_out_error("/v1/roofline", {"model_spec": MODEL_ARCHITECTURE_EXAMPLE, "gpu": "h100-sxm",
                                                   "phase": "decode", "batch_size": 1, "context_tokens": 1024})
    assert inline_error is not None and inline_error["layout_kind"] == "tp" and inline_error["model_family"] is None
    assert held_out_error("/v1/roofline", {**dp_ep, "calibration": "builtin"}) is None
    assert held_out_error("/v1/roofline/batch-sweep", {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128,
                                                       "calibration": "builtin"}) is None


# Calibrating -----------------------------------------------------------------------------------

def test_a_calibration_round_trips_through_the_api_and_the_database(client: TestClient, engine: Engine,
                                                                    write_headers: dict[str, str]) -> None:
    """POST fits and stores; GET returns exactly what was stored; the database row holds the same entries;
    a sizing request naming the profile uses its entry for the GPU family and precision."""
    response = calibrate(client, write_headers, description="TensorRT-LLM on our H100s")
    assert response.status_code == 201, response.text
    assert response.headers["location"] == "/v1/calibrations/sample-trtllm"
    created = response.json()
    profile = created["profile"]
    assert (profile["name"], profile["origin"], profile["description"]) == (
        "sample-trtllm", "user", "TensorRT-LLM on our H100s")
    # The test key is a bare secret, named from its SHA-256 so that the name outlives a rotation of other keys.
    assert profile["written_by"] == "key-" + hashlib.sha256(TEST_API_KEY.encode()).hexdigest()[:12]
    assert created["base_profile"] == "builtin"
    assert profile["rows_used"] == 30  # 35 predicted rows but the 5 Poisson ones
    assert profile["held_out_median_abs_pct_error"] is None  # an upload is not cross-validated
    assert profile["provenance"]["rows_total"] == 35
    keys = [(entry["gpu_family"], entry["compute_dtype"], entry["rows"]) for entry in profile["entries"]]
    # The global entry is the base's, kept; hopper has 20 fp8 rows and 3 bf16 ones (too few for an entry);
    # NVIDIA's entry is fitted on those and the A100's 7 (30 rows but the 5 Poisson ones), the A100's fallback.
    assert keys == [("*", "*", 0), ("hopper", "*", 23), ("vendor:nvidia", "*", 30), ("hopper", "fp8", 20)]
    # Each fitted entry names the sources of its rows (examples/calibration-sample.csv): hopper's 23 are
    # TRTLLM_PERF_V09's 12 static batches + 6 batch-1 runs and TRTLLM_PERF_V017's 3 bf16 + 2 fp8 offline runs
    # (its 5 Poisson runs are not fitted); the fp8 entry's 20 leave out the 3 bf16 ones.
    sources = {(entry["gpu_family"], entry["compute_dtype"]): entry["source"] for entry in profile["entries"]}
    assert "(sha256 " in sources[("hopper", "*")]
    assert "; TRTLLM_PERF_V09 18 rows, TRTLLM_PERF_V017 5 rows)" in sources[("hopper", "*")]
    assert "; TRTLLM_PERF_V09 18 rows, TRTLLM_PERF_V017 2 rows)" in sources[("hopper", "fp8")]
    assert created["after"]["overall"]["median_abs_pct_error"] < created["before"]["overall"]["median_abs_pct_error"]
    assert created["after"]["rows_total"] == 35 and created["after"]["rows_predicted"] == 35
    assert len(created["rows"]) == 35
    assert created["contradictions"] == []  # the sample states no configuration twice

    fetched = client.get("/v1/calibrations/sample-trtllm")
    assert fetched.status_code == 200
    assert fetched.json() == profile
    with Session(engine) as session:
        record = session.get(CalibrationProfileRecord, "sample-trtllm")
        assert record is not None and record.origin == "user" and record.rows_used == 30
        stored = {(e["family"], e["compute_dtype"]): e for e in record.entries}
    hopper = stored[("hopper", "fp8")]
    assert hopper["bandwidth_fraction"] == pytest.approx(profile["entries"][3]["bandwidth_fraction_ratio"])

    used = roofline_efficiency(client, calibration="sample-trtllm", weight_dtype="fp8")
    assert used["calibration_profile"] == "sample-trtllm"
    assert used["bandwidth_fraction_ratio"] == pytest.approx(hopper["bandwidth_fraction"])
    assert used["overhead_time_ms"] == pytest.approx(
        (hopper["per_step_overhead_s"] + 32 * hopper["per_layer_overhead_s"]) * 1e3)
    assert "sample-trtllm" in [item["name"] for item in client.get("/v1/calibrations").json()["items"]]


def test_a_csv_upload_fits_the_same_profile(client: TestClient, write_headers: dict[str, str]) -> None:
    as_json = calibrate(client, write_headers, name="from-json").json()["profile"]
    response = client.post("/v1/calibrations", headers=write_headers,
                           data={"name": "from-csv", "description": "uploaded"},
                           files={"file": ("sample.csv", SAMPLE_TEXT, "text/csv")})
    assert response.status_code == 201, response.text
    as_csv = response.json()["profile"]
    assert as_csv["entries"] == [{**entry, "source": entry["source"].replace("from-json", "from-csv")}
                                 for entry in as_json["entries"]]
    assert as_csv["provenance"]["source_sha256"] == as_json["provenance"]["source_sha256"]


def test_a_calibration_can_start_from_another_profile(client: TestClient, write_headers: dict[str, str],
                                                      default_profile_loaded: None) -> None:
    """With the default profile as base, its entries for other GPU families come through unchanged."""
    shipped = {(e["family"], e["compute_dtype"]): e for e in json.loads(DEFAULT_PROFILE_PATH.read_text())["entries"]}
    created = calibrate(client, write_headers, name="on-default", base_profile="default").json()
    assert created["base_profile"] == "default"
    entries = {(e["gpu_family"], e["compute_dtype"]): e for e in created["profile"]["entries"]}
    # The shipped level has an entry per GPU family; the sample's 20 hopper/fp8 rows add one of their own.
    assert set(entries) == set(shipped) | {("hopper", "fp8")}
    ampere = entries[("ampere", "*")]
    assert ampere["bandwidth_fraction_ratio"] == shipped[("ampere", "*")]["bandwidth_fraction"]
    assert entries[("hopper", "fp8")]["rows"] == 20


@pytest.mark.parametrize("fields, status, pointer", [
    ({"name": "builtin"}, 422, "/body/name"),
    ({"name": "default"}, 422, "/body/name"),
    ({"name": "Not A Name"}, 422, "/body/name"),
    ({"base_profile": "no-such-profile"}, 404, "/body/base_profile"),
    ({"rows": []}, 422, "/body/rows"),
    ({"rows": SAMPLE_ROWS[:3]}, 422, "/body/rows"),  # nothing with 10 rows of one GPU family and precision
    ({"rows": [{**SAMPLE_ROWS[0], "value": "fast"}]}, 422, "/body/rows/0/value"),
    ({"rows": [{**SAMPLE_ROWS[0], "value": float("nan")}]}, 422, "/body/rows/0/value"),
    ({"rows": [{**SAMPLE_ROWS[0], "scenario": 5}]}, 422, "/body/rows/0/scenario"),
    ({"rows": [{**SAMPLE_ROWS[0], "model": ""}]}, 422, "/body/rows/0/model"),
    # A row of a scenario outside the vocabulary is kept and skipped: none left to fit on.
    ({"rows": [{**row, "scenario": "burst"} for row in SAMPLE_ROWS]}, 422, "/body/rows"),
    ({"rows": [SAMPLE_ROWS[0], SAMPLE_ROWS[0]]}, 422, "/body/rows/1/row_id"),
    ({"rows": [{**SAMPLE_ROWS[0], "row_id": f"r{i}"} for i in range(MAX_CALIBRATE_ROWS + 1)]}, 422, "/body/rows"),
])
def test_bad_calibration_requests_are_problems(client: TestClient, write_headers: dict[str, str],
                                               fields: dict[str, Any], status: int, pointer: str | None) -> None:
    body = {"name": "bad", "rows": SAMPLE_ROWS, **fields}
    content = json.dumps(body, allow_nan=True)
    response = client.post("/v1/calibrations", headers={**write_headers, "content-type": "application/json"},
                           content=content)
    assert_problem(response, status, pointer)
    assert client.get("/v1/calibrations/bad").status_code == 404  # nothing stored


def test_the_list_pages_through_builtin_then_the_stored_profiles(client: TestClient,
                                                                  write_headers: dict[str, str]) -> None:
    for name in ("zeta", "alpha"):
        assert calibrate(client, write_headers, name=name).status_code == 201

    def names(limit: int, offset: int) -> tuple[list[str], int]:
        page = client.get("/v1/calibrations", params={"limit": limit, "offset": offset}).json()
        return [item["name"] for item in page["items"]], page["total"]

    assert names(2, 0) == (["builtin", "alpha"], 3)
    assert names(2, 2) == (["zeta"], 3)
    assert names(50, 1) == (["alpha", "zeta"], 3)
    assert_problem(client.get("/v1/calibrations", params={"limit": 0}), 422, "/query/limit")


def test_a_calibration_names_the_uploaded_rows_the_stated_columns_cannot_tell_apart(
        client: TestClient, write_headers: dict[str, str]) -> None:
    """The sample plus a copy of its first row measuring three times its value: the two state one configuration,
    so every profile predicts them alike, and whatever that prediction p the worse of them is off by at least
    (3v - v) / (3v + v) = 50% (at p = 2 v 3v / 4v = 1.5v). The response names them, as validation does."""
    first = SAMPLE_ROWS[0]
    twin = {**first, "row_id": "twin", "value": first["value"] * 3}
    response = client.post("/v1/calibrations", headers=write_headers,
                           json={"name": "with-twin", "rows": [*SAMPLE_ROWS, twin]})
    assert response.status_code == 201, response.text
    created = response.json()
    [first_out] = [row for row in created["rows"] if row["row_id"] == first["row_id"]]
    [twin_out] = [row for row in created["rows"] if row["row_id"] == "twin"]
    assert first_out["predicted"] == twin_out["predicted"]
    assert created["contradictions"] == [
        {"row_ids": [first["row_id"], "twin"], "metric": first["metric"], "low": first["value"],
         "high": 3 * first["value"], "ratio": 3.0, "least_worst_error_pct": pytest.approx(50.0, rel=1e-12)}]


def test_a_profile_name_is_never_reused(client: TestClient, write_headers: dict[str, str]) -> None:
    assert calibrate(client, write_headers, name="once").status_code == 201
    assert_problem(calibrate(client, write_headers, name="once"), 409)


def test_calibrating_needs_the_write_key(client: TestClient) -> None:
    assert_problem(client.post("/v1/calibrations", json={"name": "x", "rows": SAMPLE_ROWS}), 401)


@pytest.mark.parametrize(("path", "limit", "command"), [
    ("/v1/validate", MAX_VALIDATE_SIMULATED_RUNS, "python -m app.validate FILE.csv"),
    ("/v1/calibrations", MAX_CALIBRATE_SIMULATED_RUNS, "python -m app.calibrate FILE.csv --name NAME --write-db"),
])
def test_too_many_simulations_in_one_upload_are_refused(client: TestClient, write_headers: dict[str, str],
                                                        path: str, limit: int, command: str) -> None:
    """limit + 1 distinct Poisson loads would each need a simulation: one over the limit. The problem
    names the command that does the same offline (fitting is app.calibrate, not app.validate)."""
    poisson = next(row for row in SAMPLE_ROWS if row["scenario"] == "poisson")
    rows = [{**poisson, "row_id": f"p{rate}", "request_rate": float(rate)} for rate in range(1, limit + 2)]
    problem = assert_problem(client.post(path, json={"name": "many", "rows": rows} if "calibrations" in path
                                         else {"rows": rows}, headers=write_headers), 422, "/body/rows")
    assert f"at most {limit}" in problem["detail"] and f"`{command}`" in problem["detail"]


def test_the_whole_shipped_measurement_file_validates_in_one_request(client: TestClient) -> None:
    """tests/data/measured-calibration.csv (1,263 rows, 573 distinct simulated runs) fits the upload
    limits of /v1/validate: same rows, same summary as the command-line validator's."""
    text = MEASURED.read_text(encoding="utf-8")
    assert len(text.encode()) < 1 << 20
    response = client.post("/v1/validate", files={"file": ("measured-calibration.csv", text, "text/csv")})
    assert response.status_code == 200, response.text
    summary = response.json()["summary"]
    # 1,263 rows, every one predicted (the 207 ShareGPT rows from the shipped length histograms).
    assert (summary["rows_total"], summary["rows_predicted"]) == (1263, 1263), summary


# CSV uploads -----------------------------------------------------------------------------------

HEADER = SAMPLE_TEXT.splitlines()[0]
FIRST_ROW = SAMPLE_TEXT.splitlines()[1]


@pytest.mark.parametrize("text, pointer", [
    ("row_id,model,gpu\nr1,llama-3.1-8b,h100-sxm\n", "/body/file"),  # missing columns
    (HEADER + "\n" + FIRST_ROW.replace(",29526.04,", ",lots,").replace(",28836.77,", ",lots,") + "\n",
     "/body/file/2/value"),  # a non-numeric value
    (HEADER + "\n", "/body/file"),  # no rows
    (HEADER + "\n" + "\n".join(FIRST_ROW.replace("TRTLLM_PERF_V017-2,", f"r{i},", 1)
                               for i in range(MAX_VALIDATE_ROWS + 1)) + "\n", "/body/file"),  # too many rows
    (HEADER + "\n" + FIRST_ROW + "\n" + FIRST_ROW + "\n", "/body/file/3/row_id"),  # line 3 repeats line 2's id
    # Python's literal syntax, which int() and float() read (1_000 as 1000), is no number in a cell:
    (HEADER + "\n" + FIRST_ROW.replace(",28836.77,", ",28_836.77,") + "\n", "/body/file/2/value"),
    (HEADER + "\n" + FIRST_ROW.replace(",offline,128,128,", ",offline,1_28,128,") + "\n", "/body/file/2/isl"),
])
def test_bad_csv_uploads_are_problems(client: TestClient, text: str, pointer: str) -> None:
    response = client.post("/v1/validate", files={"file": ("rows.csv", text, "text/csv")})
    assert_problem(response, 422, pointer)


def test_a_bad_cell_of_a_row_spanning_lines_names_the_rows_first_line() -> None:
    """Line 1 the header; the first row's quoted notes cell holds a line break: lines 2-3; line 4 blank (skipped);
    the second row, its notes spanning lines 5-6, has a word for its isl. The error names line 5, where that row
    starts (it named line 6, where the row ends)."""
    spanning = FIRST_ROW.replace("synthetic fixed", "synthetic\nfixed")
    second = spanning.replace("TRTLLM_PERF_V017-2,", "second-row,", 1).replace(",offline,128,128,", ",offline,lots,128,")
    with pytest.raises(RowsInvalid) as raised:
        rows_from_csv(HEADER + "\n" + spanning + "\n\n" + second + "\n")
    assert [pointer for pointer, _ in raised.value.errors] == ["/body/file/5/isl"]
    assert raised.value.errors[0][1].startswith("line 5: ")


def test_old_mac_line_ends_and_a_spreadsheets_empty_rows_read_as_the_plain_file() -> None:
    """The sample's first two rows with lines ending in a lone \r (universal newlines), and with rows of empty
    cells after them (",,,," as spreadsheets export a used range): the same two rows as the plain file; a file of
    nothing but such rows has no rows (422 at /body/file), as a header alone has."""
    plain = "\n".join(SAMPLE_TEXT.splitlines()[:3]) + "\n"
    expected = rows_from_csv(plain)
    assert len(expected) == 2
    assert rows_from_csv(plain.replace("\n", "\r")) == expected
    empty_row = "," * (len(HEADER.split(",")) - 1)
    assert rows_from_csv(plain + empty_row + "\n" + empty_row + "\n") == expected
    with pytest.raises(RowsInvalid) as raised:
        rows_from_csv(HEADER + "\n" + empty_row + "\n")
    assert raised.value.errors == [("/body/file", "no data rows after the header")]


def test_a_csv_that_names_a_column_twice_is_refused_not_read_from_one_copy() -> None:
    """The first sample row with a second `model` column (llama-3-70b beside the row's llama-3.1-8b) and a second
    `value` (7): which copy is the row's cannot be told, so the upload is a 422 naming both columns, never read
    from the last copy (a validation of the wrong model, or a fit to the wrong number). The same header without
    the copies is read (spaces around the names stripped, as they are around cells)."""
    doubled = (HEADER + ",model,value\n" + FIRST_ROW + ",llama-3-70b,7\n")
    with pytest.raises(RowsInvalid) as raised:
        rows_from_csv(doubled)
    assert raised.value.errors == [
        ("/body/file", "column 'model' appears 2 times in the header; keep one"),
        ("/body/file", "column 'value' appears 2 times in the header; keep one")]
    spaced = ", ".join(HEADER.split(",")) + "\n" + FIRST_ROW + "\n"
    (row,) = rows_from_csv(spaced)
    assert (row.model, row.value) == ("llama-3.1-8b", 28836.77)


def test_uploads_need_a_csv_file_or_json(client: TestClient) -> None:
    no_file = {"calibration": (None, "builtin")}  # a multipart form without the file part
    assert_problem(client.post("/v1/validate", files=no_file), 422, "/body/file")
    assert_problem(client.post("/v1/validate", data={"calibration": "builtin"}), 422, "/header/content-type")
    assert_problem(client.post("/v1/validate", content=SAMPLE_TEXT, headers={"content-type": "text/csv"}),
                   422, "/header/content-type")
    assert_problem(client.post("/v1/validate", files={"file": ("rows.csv", b"\xff\xfe\x00", "text/csv")}),
                   422, "/body/file")
    assert_problem(client.post("/v1/validate", content=b"{not json", headers={"content-type": "application/json"}),
                   422)


def test_an_unknown_form_field_is_a_problem_as_an_unknown_json_member_is(client: TestClient) -> None:
    """`calibrations` (a typo of `calibration`) is not silently dropped: the rows would be validated against
    the default profile instead of the one meant."""
    upload = {"file": ("rows.csv", SAMPLE_TEXT, "text/csv"), "calibrations": (None, "builtin")}
    response = client.post("/v1/validate", files=upload)
    assert_problem(response, 422, "/body/calibrations")
    assert "it takes file, calibration" in response.text
    assert_problem(client.post("/v1/validate", json={"rows": SAMPLE_ROWS[:1], "calibrations": "builtin"}), 422,
                   "/body/calibrations")
    assert client.post("/v1/validate", files={"file": upload["file"], "calibration": (None, "builtin")}
                       ).status_code == 200


# Validating ------------------------------------------------------------------------------------

def test_validation_reports_every_row_and_stores_nothing(client: TestClient) -> None:
    response = client.post("/v1/validate", json={"calibration": "builtin", "rows": SAMPLE_ROWS})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["calibration_profile"] == "builtin"
    assert len(report["rows"]) == 35
    for row in report["rows"]:  # every row, the two ShareGPT ones from the shipped length histogram
        assert row["skipped_reason"] is None
        assert row["abs_pct_error"] == pytest.approx(abs(row["predicted"] - row["measured"]) / row["measured"] * 100)
    assert report["summary"]["rows_predicted"] == 35
    assert report["summary"]["skipped_reasons"] == {}
    assert [item["name"] for item in client.get("/v1/calibrations").json()["items"]] == ["builtin"]


def test_validation_names_the_rows_the_stated_columns_cannot_tell_apart(client: TestClient) -> None:
    """A sample row and a copy measuring twice its value state one configuration, so they get one prediction p:
    one contradiction, x2.00, whose worse row is off by at least (2v - v) / (2v + v) = 33.3% whatever p (at
    p = 4v/3). The sample's own 35 rows hold none."""
    first = SAMPLE_ROWS[0]
    twin = {**first, "row_id": "twin", "value": first["value"] * 2}
    report = client.post("/v1/validate", json={"rows": [first, twin]}).json()
    assert report["rows"][0]["predicted"] == report["rows"][1]["predicted"]
    assert report["contradictions"] == [
        {"row_ids": [first["row_id"], "twin"], "metric": first["metric"], "low": first["value"],
         "high": 2 * first["value"], "ratio": 2.0, "least_worst_error_pct": pytest.approx(100 / 3, rel=1e-12)}]
    assert client.post("/v1/validate", json={"rows": SAMPLE_ROWS}).json()["contradictions"] == []


def test_validation_of_a_csv_upload_matches_the_json_rows(client: TestClient) -> None:
    as_json = client.post("/v1/validate", json={"rows": SAMPLE_ROWS}).json()
    as_csv = client.post("/v1/validate", files={"file": ("rows.csv", SAMPLE_TEXT, "text/csv")}).json()
    assert as_csv == as_json
    assert as_json["calibration_profile"] == "builtin"  # the default before `default` is loaded


def test_a_user_profile_validates_better_than_builtin_on_its_own_rows(client: TestClient,
                                                                       write_headers: dict[str, str]) -> None:
    calibrate(client, write_headers, name="mine")
    builtin = client.post("/v1/validate", json={"calibration": "builtin", "rows": SAMPLE_ROWS}).json()
    mine = client.post("/v1/validate", json={"calibration": "mine", "rows": SAMPLE_ROWS}).json()
    assert mine["calibration_profile"] == "mine"
    assert mine["summary"]["overall"]["median_abs_pct_error"] < builtin["summary"]["overall"]["median_abs_pct_error"]


def test_unknown_rows_are_skipped_with_the_reason(client: TestClient) -> None:
    rows = [{**SAMPLE_ROWS[0], "row_id": "a", "model": "no-such-model"},
            {**SAMPLE_ROWS[0], "row_id": "b", "gpu": "no-such-gpu"}]
    report = client.post("/v1/validate", json={"rows": rows}).json()
    assert [row["skipped_reason"] for row in report["rows"]] == [
        "unknown model slug 'no-such-model'", "unknown GPU slug 'no-such-gpu'"]


# A name outside what the service knows, per column that names one, and the reason its row gets.
OUTSIDE_THE_VOCABULARY = [
    ("model", "Qwen/Qwen2-7B",
     ("unknown model slug 'Qwen/Qwen2-7B': 'Qwen/Qwen2-7B' is a Hugging Face repository id, not a catalog slug. "
     "GET /v1/models lists each model's hf_id; a model not in the catalog can be imported from its config.json "
     "with POST /v1/models/import?slug=qwen2-7b (or sized inline with model_spec)")),
    ("model", "meta-llama/Meta-Llama-3.1-8B",
     ("unknown model slug 'meta-llama/Meta-Llama-3.1-8B': 'meta-llama/Meta-Llama-3.1-8B' is a Hugging Face "
     "repository id; its catalog slug is 'llama-3.1-8b'")),
    ("gpu", "H100", "unknown GPU slug 'H100'"),
    ("engine", "foo",
     "engine not predicted: 'foo' (expected 'trtllm', 'vllm', 'sglang', 'lmdeploy', 'gpt-fast' or 'other')"),
    ("scenario", "burst",
     "scenario not predicted: 'burst' (expected 'offline', 'static_batch', 'batch1', 'closed_loop' or 'poisson')"),
    ("metric", "capacity",
     ("metric not predicted: 'capacity' (expected 'output_tokens_per_s', 'output_tokens_per_s_per_gpu', "
     "'total_tokens_per_s', 'requests_per_s', 'ttft_ms', 'tpot_ms', 'itl_ms' or 'e2e_ms')")),
    ("weight_dtype", "fp32",
     "weight_dtype not predicted: 'fp32' (expected 'bf16', 'fp16', 'fp8', 'int8', 'int4' or 'fp4')"),
    ("compute_dtype", "int4",
     "compute_dtype not predicted: 'int4' (expected 'fp32', 'tf32', 'bf16', 'fp16', 'fp8', 'int8' or 'fp4')"),
    ("kv_dtype", "fp4", "kv_dtype not predicted: 'fp4' (expected 'bf16', 'fp16', 'fp8', 'int8' or 'fp32')"),
    ("stat", "p95", "stat not predicted: 'p95' (expected 'mean', 'median', 'p50', 'p90' or 'p99')"),
]


def test_names_outside_the_vocabulary_skip_their_row_not_the_upload(client: TestClient) -> None:
    """A file of published measurements names Hugging Face ids, other GPUs, other metrics: each such row is
    kept and skipped with the reason, as the command-line validator reads a file; the rest are predicted, and
    a CSV upload reads the same as the JSON rows."""
    rows = [SAMPLE_ROWS[0]] + [{**SAMPLE_ROWS[0], "row_id": f"outside-{i}", column: value}
                               for i, (column, value, _) in enumerate(OUTSIDE_THE_VOCABULARY)]
    report = client.post("/v1/validate", json={"rows": rows})
    assert report.status_code == 200, report.text
    reasons = [row["skipped_reason"] for row in report.json()["rows"]]
    assert reasons == [None] + [reason for _, _, reason in OUTSIDE_THE_VOCABULARY]
    assert report.json()["summary"]["skipped_reasons"] == {
        "unknown model slug": 2, "unknown GPU slug": 1, "engine not predicted": 1, "scenario not predicted": 1,
        "metric not predicted": 1, "weight_dtype not predicted": 1, "compute_dtype not predicted": 1,
        "kv_dtype not predicted": 1, "stat not predicted": 1}

    lines = [HEADER, FIRST_ROW]
    columns = HEADER.split(",")
    for i, (column, value, _) in enumerate(OUTSIDE_THE_VOCABULARY):
        cells = FIRST_ROW.split(",")
        cells[columns.index("row_id")], cells[columns.index(column)] = f"outside-{i}", value
        lines.append(",".join(cells))
    as_csv = client.post("/v1/validate", files={"file": ("rows.csv", "\n".join(lines) + "\n", "text/csv")})
    assert as_csv.status_code == 200, as_csv.text
    assert as_csv.json() == report.json()


def test_json_text_is_stripped_as_a_csv_cell_is(client: TestClient) -> None:
    """' llama-3.1-8b ' names the catalog model, as the same CSV cell does, ' aggregated ' the deployment; a blank
    statistic is one not stated (a blank CSV cell); ' r1 ' repeats 'r1'."""
    padded = {**SAMPLE_ROWS[0], "model": f" {SAMPLE_ROWS[0]['model']} ", "row_id": " r1 ",
              "deployment": " aggregated ", "stat": "  "}
    report = client.post("/v1/validate", json={"rows": [padded]}).json()
    assert report["rows"][0]["row_id"] == "r1" and report["rows"][0]["skipped_reason"] is None
    assert report["rows"][0]["stat"] is None
    assert_problem(client.post("/v1/validate", json={"rows": [padded, {**SAMPLE_ROWS[0], "row_id": "r1"}]}), 422,
                   "/body/rows/1/row_id")


def test_a_fit_skips_the_rows_outside_the_vocabulary(client: TestClient, write_headers: dict[str, str]) -> None:
    """The sample's rows plus one of each name outside the vocabulary: the same efficiencies as the sample
    alone (the skipped rows are not fitted on), and the report lists them with their reasons."""
    extra = [{**SAMPLE_ROWS[0], "row_id": f"outside-{i}", column: value}
             for i, (column, value, _) in enumerate(OUTSIDE_THE_VOCABULARY)]
    alone = calibrate(client, write_headers, name="alone").json()
    response = client.post("/v1/calibrations", headers=write_headers,
                           json={"name": "with-extra", "rows": SAMPLE_ROWS + extra})
    assert response.status_code == 201, response.text
    created = response.json()

    def fitted(profile: dict[str, Any]) -> list[dict[str, Any]]:  # each entry, less its source (name and upload hash)
        return [{key: value for key, value in entry.items() if key != "source"} for entry in profile["entries"]]

    assert fitted(created["profile"]) == fitted(alone["profile"])
    assert [row["skipped_reason"] for row in created["rows"][-len(extra):]] == [
        reason for _, _, reason in OUTSIDE_THE_VOCABULARY]


# DeepSeek-V3 on H200 as aiconfigurator's disaggregated runs state it: pools, no aggregated degrees.
DISAGGREGATED_ROW = {"row_id": "pd", "model": "deepseek-v3", "gpu": "h200-sxm", "engine": "trtllm",
                     "scenario": "closed_loop", "isl": 1024, "osl": 1024, "concurrency": 64, "metric": "tpot_ms",
                     "value": 30.0, "weight_dtype": "fp8", "compute_dtype": "fp8", "deployment": "disaggregated",
                     "prefill_workers": 1, "prefill_tp": 8, "decode_workers": 1, "decode_tp": 8}


def test_a_disaggregated_upload_row_reads_as_the_command_line_reads_it(client: TestClient) -> None:
    """Its num_gpus may be left out: 1 x 8 + 1 x 8 = 16, the pools' GPUs (predicted as if stated). Without its
    worker counts it is skipped (1,350 rows of measured-calibration-2.csv are), not refused. Layout columns that
    contradict the run skip it too: a num_gpus other than the pools' 16, an aggregated degree on a disaggregated
    run, a pool's column on an aggregated one. An aggregated row without num_gpus is still a 422."""
    no_workers = {key: value for key, value in DISAGGREGATED_ROW.items() if not key.endswith(("_workers", "_tp"))}
    # Pools of 100,000 workers of 8 GPUs: 800,008 GPUs, beyond what a row may state (100,000): a 422, not a row
    # "without its worker counts".
    huge = {**DISAGGREGATED_ROW, "prefill_workers": 100_000}
    assert_problem(client.post("/v1/validate", json={"rows": [huge]}), 422, "/body/rows/0/num_gpus")
    rows = [DISAGGREGATED_ROW, {**DISAGGREGATED_ROW, "row_id": "stated", "num_gpus": 16},
            {**no_workers, "row_id": "no-workers"},
            {**DISAGGREGATED_ROW, "row_id": "three", "num_gpus": 3},
            {**DISAGGREGATED_ROW, "row_id": "tp4", "num_gpus": 16, "tp": 4},
            {**SAMPLE_ROWS[0], "row_id": "pool-on-aggregated", "decode_workers": 2}]
    report = client.post("/v1/validate", json={"rows": rows})
    assert report.status_code == 200, report.text
    outcome = {row["row_id"]: row for row in report.json()["rows"]}
    assert outcome["pd"]["predicted"] == outcome["stated"]["predicted"] > 0
    assert outcome["no-workers"]["skipped_reason"] == "layout not stated: a disaggregated run without its worker counts"
    assert outcome["three"]["skipped_reason"] == (
        "layout contradicts the run's GPUs: num_gpus 3, the pools' workers x tp x pp x dp 16")
    assert outcome["tp4"]["skipped_reason"] == (
        "layout contradicts the run's deployment: a disaggregated run that states tp (each pool states its own)")
    assert outcome["pool-on-aggregated"]["skipped_reason"] == (
        "layout contradicts the run's deployment: an aggregated run that states decode_workers")
    aggregated = {key: value for key, value in SAMPLE_ROWS[0].items() if key != "num_gpus"}
    assert_problem(client.post("/v1/validate", json={"rows": [aggregated]}), 422, "/body/rows/0/num_gpus")


def test_a_row_too_large_to_simulate_is_skipped_with_the_reason(client: TestClient) -> None:
    """A Poisson run of 100,000-token answers at one request per 1,000 s: the simulation stops at its 50,000,000
    engine steps with requests unfinished. It is simulated afresh per efficiency, so it finds out only when
    predicted; the row is skipped saying so, and the rest of the upload is predicted."""
    poisson = {**SAMPLE_ROWS[0], "row_id": "slow", "scenario": "poisson", "request_rate": 0.001, "osl": 100_000,
               "metric": "ttft_ms", "value": 28.0}
    report = client.post("/v1/validate", json={"rows": [SAMPLE_ROWS[0], poisson]})
    assert report.status_code == 200, report.text
    first, slow = report.json()["rows"]
    assert first["predicted"] is not None and slow["predicted"] is None
    assert slow["skipped_reason"].startswith("too large to simulate: simulation passed 50000000 engine steps")
    assert report.json()["summary"]["skipped_reasons"] == {"too large to simulate": 1}


def test_nothing_to_fit_says_why_each_row_is_not_fitted(client: TestClient, write_headers: dict[str, str]) -> None:
    """Five offline rows whose weight dtype is unstated are predicted (at the published precision) but not
    fitted, and one row names a GPU outside the catalog: the 422 says both, with their counts."""
    unstated = [{**SAMPLE_ROWS[0], "row_id": f"u{i}", "isl": 128 + i, "weight_dtype": None} for i in range(5)]
    other = {**SAMPLE_ROWS[0], "row_id": "other", "gpu": "h100-pcie-96gb"}
    response = client.post("/v1/calibrations", headers=write_headers, json={"name": "none", "rows": [*unstated, other]})
    assert_problem(response, 422, "/body/rows")
    assert response.json()["detail"] == ("no row can be used by a fit: 5 predicted rows: its weight dtype is not "
                                         "stated; 1 skipped: unknown GPU slug")


def test_an_unreadable_form_is_a_problem_that_says_what_the_upload_takes(client: TestClient) -> None:
    file = ("rows.csv", SAMPLE_TEXT, "text/csv")
    response = client.post("/v1/validate", files=[("file", file), ("file", file)])
    assert_problem(response, 422, "/body")
    assert response.json()["errors"][0]["detail"] == (
        "Too many files. Maximum number of files is 1; the upload takes one file part and at most the fields "
        "calibration")


def test_rows_of_models_outside_the_catalog_take_none_of_the_simulation_budget(client: TestClient) -> None:
    """1,001 closed loops of distinct lengths (one simulated run each, over the 1,000 one request may run) of a
    model the catalog lacks are skipped, not simulated: a 200, as when the model is named by a Hugging Face id."""
    rows = [{**SAMPLE_ROWS[0], "row_id": f"r{i}", "model": "no-such-model", "scenario": "closed_loop",
             "concurrency": 4, "metric": "tpot_ms", "isl": 100 + i, "value": 10.0}
            for i in range(MAX_VALIDATE_SIMULATED_RUNS + 1)]
    response = client.post("/v1/validate", json={"rows": rows})
    assert response.status_code == 200, response.text
    assert response.json()["summary"]["skipped_reasons"] == {"unknown model slug": MAX_VALIDATE_SIMULATED_RUNS + 1}
    known = [{**row, "model": "llama-3.1-8b"} for row in rows]
    assert_problem(client.post("/v1/validate", json={"rows": known}), 422, "/body/rows")


def test_unknown_profiles_are_404_naming_the_field(client: TestClient, write_headers: dict[str, str]) -> None:
    """As an unknown model or GPU is: the 404 points at where the request named the profile, in a JSON body or a
    CSV upload's form field."""
    assert_problem(client.post("/v1/validate", json={"calibration": "nope", "rows": SAMPLE_ROWS[:1]}), 404,
                   "/body/calibration")
    assert_problem(client.post("/v1/validate", files={"file": ("rows.csv", SAMPLE.read_bytes(), "text/csv")},
                               data={"calibration": "nope"}), 404, "/body/calibration")
    assert_problem(client.post("/v1/calibrations", headers=write_headers,
                               files={"file": ("rows.csv", SAMPLE.read_bytes(), "text/csv")},
                               data={"name": "on-nothing", "base_profile": "nope"}), 404, "/body/base_profile")
    assert_problem(client.get("/v1/calibrations/nope"), 404, "/path/name")
    assert_problem(client.get("/v1/calibrations/Not%20A%20Name"), 422)


def test_a_150_row_sample_of_the_shipped_file_is_within_the_fit_limits() -> None:
    """Every eighth row of measured-calibration.csv (158 rows) is one request's work for /v1/calibrations
    (fitting it takes seconds, measured in app/schemas/calibration.py); checked without running the fit."""
    rows = rows_from_csv(MEASURED.read_text(encoding="utf-8"))[::8]
    assert len(rows) == 158  # ceil(1,263 / 8)
    request = CalibrationRequest(name="sample", rows=rows)
    calibration.check_upload_work(observed_rows(request.rows), request.max_simulated_runs, "-", calibration.ReferenceCatalog())


def test_validation_checks_before_each_row_it_prepares_and_each_it_predicts() -> None:
    """The 35 sample rows: 35 checks while preparing them, 35 while predicting, 70 in all (the API's check stops
    a request past its deadline there). A check that raises on its 36th call, the first prediction's, stops the
    validation: the exception comes out, and no report."""
    rows = observed_rows(ValidationRequest(rows=SAMPLE_ROWS).rows)
    calls: list[int] = []
    report = calibration.validate(rows, calibration.ReferenceCatalog(), builtin_profile(),
                                  check=lambda: calls.append(1))
    assert len(calls) == 70 and len(report.outcomes) == 35

    def stop_at_the_first_prediction() -> None:
        if len(calls) == 70 + 35:
            raise TimeoutError("past the deadline")
        calls.append(1)

    with pytest.raises(TimeoutError):
        calibration.validate(rows, calibration.ReferenceCatalog(), builtin_profile(), check=stop_at_the_first_prediction)
    assert len(calls) == 70 + 35


def test_profiles_are_listed_in_the_byte_order_of_their_names(client: TestClient, write_headers: dict[str, str],
                                                              engine: Engine) -> None:
    """'-' (0x2D) < '.' (0x2E) < '_' (0x5F) < 'a' (0x61): fit-b, fit.c, fit_a, fita, whatever the database's
    collation (the PostgreSQL test database sorts text by ICU's en-US, which ignores punctuation and put fit_a
    first), as the catalog lists its slugs."""
    for name in ("fita", "fit_a", "fit.c", "fit-b"):
        response = client.post("/v1/calibrations", json={"name": name, "rows": CALIBRATION_ROWS_EXAMPLE},
                               headers=write_headers)
        assert response.status_code == 201, response.text
    try:
        names = [profile["name"] for profile in client.get("/v1/calibrations?limit=100").json()["items"]]
        assert [name for name in names if name.startswith("fit")] == ["fit-b", "fit.c", "fit_a", "fita"]
    finally:
        with Session(engine) as session, session.begin():
            session.execute(delete(CalibrationProfileRecord).where(CalibrationProfileRecord.name.like("fit%")))
            bump_catalog_revision(session)
