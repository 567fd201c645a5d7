"""A typed client generated from the committed spec works against a live service.

openapi-python-client (pinned in constraints.txt) generates a package from openapi/openapi.json,
offline; the test imports it and calls every JSON operation through it against the app served on
loopback, with request bodies built from the client's own models. Each answer must parse into the
typed model the spec promises (a `Problem` or an untyped answer fails). The chart operations answer
SVG, which the generator leaves untyped, and /metrics answers Prometheus text: those are not JSON
operations. Function names are the spec's operation ids (`kv_cache`, not `kv_cache_v1_kv_cache_post`).
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from app.calibration.rows import rows_from_csv
from scripts.export_openapi import OUTPUT
from tests.conftest import TEST_API_KEY

PACKAGE = "sizing_client"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NON_JSON_OPERATIONS = {"metrics", "roofline_chart_get", "roofline_chart_post", "batch_sweep_chart_get",
                       "batch_sweep_chart_post", "slo_plan_chart_get", "slo_plan_chart_post"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The generated package's folder (on sys.path while the module's tests run)."""
    work = tmp_path_factory.mktemp("client")
    config = work / "config.json"
    config.write_text(json.dumps({"post_hooks": []}))  # no formatter run: nothing but the generator
    completed = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(OUTPUT), "--meta", "none",
         "--output-path", str(work / PACKAGE), "--config", str(config)],
        capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    add_missing_unset_imports(work / PACKAGE)
    sys.path.insert(0, str(work))
    try:
        yield work / PACKAGE
    finally:
        sys.path.remove(str(work))
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def add_missing_unset_imports(package: Path) -> list[str]:
    """openapi-python-client 0.29.1 annotates an operation that takes two request media types (JSON or
    a multipart CSV upload: /v1/validate, /v1/calibrations) with `Unset` but imports only `UNSET`, so
    the module fails to import. Add the import (a generator defect, not the spec's); returns the files."""
    patched = []
    for path in sorted(package.glob("api/*/*.py")):
        text = path.read_text(encoding="utf-8")
        imported = re.search(r"^from \.\.\.types import .*\bUnset\b", text, re.MULTILINE)
        if re.search(r"\bUnset\b", text) and not imported:
            path.write_text("from ...types import Unset\n" + text, encoding="utf-8")
            patched.append(path.stem)
    return patched


def module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


def model(name: str, document: dict[str, Any]) -> Any:
    return getattr(module("models"), name).from_dict(document)


def spec_operation_ids() -> set[str]:
    spec = json.loads(OUTPUT.read_text(encoding="utf-8"))
    return {operation["operationId"] for item in spec["paths"].values() for operation in item.values()}


def test_the_functions_are_named_after_the_operation_ids(generated: Path) -> None:
    functions = {path.stem for path in (generated / "api").glob("*/*.py") if path.stem != "__init__"}
    assert functions == spec_operation_ids()


def test_every_json_operation_works_through_the_generated_client(generated: Path, live_url: str,
                                                                 fresh_catalog: None) -> None:
    api = {path.stem: module(f"api.{path.parent.name}.{path.stem}")
           for path in (generated / "api").glob("*/*.py") if path.stem != "__init__"}
    client_module = module("client")
    anonymous = client_module.Client(base_url=live_url, raise_on_unexpected_status=True)
    writer = client_module.AuthenticatedClient(base_url=live_url, token=TEST_API_KEY,
                                               raise_on_unexpected_status=True)
    models = module("models")
    called: set[str] = set()

    def call(operation: str, expected: str, status: int = 200, *, client: Any = anonymous, **arguments: Any) -> Any:
        response = api[operation].sync_detailed(client=client, **arguments)
        assert response.status_code == status, (operation, response.content[:2000])
        if expected:
            assert type(response.parsed).__name__ == expected, (operation, response.parsed)
        called.add(operation)
        return response.parsed

    call("healthz", "Health")
    call("readyz", "Readiness")

    # Catalog: read, GET -> modify -> PUT the same representation back, create, import, delete.
    call("list_gpus", "GpuPage", vendor="NVIDIA", limit=5)
    gpu = call("get_gpu", "GpuOut", slug="h100-sxm")
    gpu.price_per_hour_usd = 2.5
    replaced = call("put_gpu", "GpuOut", client=writer, slug="h100-sxm",
                    body=models.GpuPut.from_dict(gpu.to_dict()))
    assert (replaced.price_per_hour_usd, replaced.version) == (2.5, 2)
    created = call("put_gpu", "GpuOut", 201, client=writer, slug="my-h100",
                   body=model("GpuPut", json.loads((EXAMPLES / "my-h100.json").read_text())))
    assert created.slug == "my-h100"
    call("delete_gpu", "", 204, client=writer, slug="my-h100")
    call("list_models", "ModelPage", architecture="moe")
    llama = call("get_model", "ModelOut", slug="llama-3-8b")
    llama.notes = "edited through a generated client"
    call("put_model", "ModelOut", client=writer, slug="llama-3-8b", body=models.ModelPut.from_dict(llama.to_dict()))
    config = json.loads((EXAMPLES / "config.json").read_text())
    imported = call("import_model", "ModelImport", 201, client=writer, slug="qwen2.5-7b-imported", dry_run=False,
                    body=model("ImportModelBody", config))
    assert imported.stored
    call("delete_model", "", 204, client=writer, slug="qwen2.5-7b-imported")

    # Sizing.
    call("kv_cache", "KvCacheResponse",
         body=model("KvCacheRequest", {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 32}))
    call("roofline", "RooflineResponse", body=model("RooflineRequest", {
        "model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 1, "context_tokens": 1024}))
    call("batch_sweep", "BatchSweepResponse",
         body=model("BatchSweepRequest", {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128}))
    call("capacity", "CapacityResponse", body=model("CapacityRequest", {
        "model": "llama-3.1-70b", "gpu": "h100-sxm", "tensor_parallel": 4, "engine": "vllm",
        "input_tokens": 1000, "output_tokens": 500}))
    plan_request = {"model": "llama-3.1-8b",
                    "workload": {"input_tokens": 1000, "output_tokens": 250, "requests_per_s": 2},
                    "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
                    "candidates": {"gpus": ["h100-sxm", "l40s"], "tensor_parallel": [1]},
                    "simulated_requests": 500}
    call("slo_plan", "SloPlanResponse", body=model("SloPlanRequest", plan_request))

    # Quotes (every quote route needs a key).
    quote = call("create_quote", "QuoteOut", 201, client=writer, body=model("SloPlanRequest", plan_request),
                 idempotency_key="generated-client")
    call("get_quote", "QuoteOut", client=writer, quote_id=quote.id)
    call("list_quotes", "QuotePage", client=writer)
    call("reprice_quote", "RepriceOut", client=writer, quote_id=quote.id)
    reproduced = call("reproduce_quote", "ReproduceOut", client=writer, quote_id=quote.id)
    assert reproduced.identical

    # Calibration: the README's 35-row sample as JSON rows.
    rows = [row.model_dump(mode="json") for row in rows_from_csv((EXAMPLES / "calibration-sample.csv").read_text())]
    call("validate_rows", "ValidationResponse", body=model("ValidateRowsJsonValidationRequest", {"rows": rows}))
    call("create_calibration", "CalibrationResponse", 201, client=writer,
         body=model("CreateCalibrationJsonCalibrationRequest", {"name": "generated-client", "rows": rows}))
    call("get_calibration", "ProfileOut", name="generated-client")
    call("list_calibrations", "ProfileList")

    assert called == spec_operation_ids() - NON_JSON_OPERATIONS
