"""Self-contained quotes: the snapshot holds the calibration profile (content and provenance) and the
versions, so a quote reproduces byte for byte from itself after its profile is deleted or a new
default profile is shipped, and a reprice lists the profile's differences like the catalog's."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from app.calibration.profiles import load_default_profile, read_default_profile_document, store_profile
from app.calibration.tables import CalibrationProfileRecord
from app.quotes.tables import QuoteRecord
from app.sizing import ENGINE_RULES_VERSION
from tests.api.test_quotes import PLAN


def canonical(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def scaled_profile(name: str, bandwidth_scale: float, created_at: str) -> dict[str, Any]:
    """The shipped default profile under another name, every entry's HBM bandwidth fraction scaled."""
    document = copy.deepcopy(read_default_profile_document())
    document["name"], document["created_at"] = name, created_at
    for entry in document["entries"]:
        entry["bandwidth_fraction"] = round(entry["bandwidth_fraction"] * bandwidth_scale, 6)
    return document


@pytest.fixture(autouse=True)
def no_profiles_or_quotes(engine: Engine) -> Iterator[None]:
    """Start and end with no stored profiles (other tests expect the builtin default) and no quotes."""
    def clear() -> None:
        with Session(engine) as session, session.begin():
            session.execute(delete(CalibrationProfileRecord))
            session.execute(delete(QuoteRecord))

    clear()
    yield
    clear()


@pytest.fixture
def client(client: TestClient, write_headers: dict[str, str]) -> TestClient:
    client.headers.update(write_headers)  # quotes are read with a key
    return client


def ship_new_default(engine: Engine, tmp_path: Path) -> None:
    """What `python -m app.load_catalog` does after a release with a refitted default profile."""
    path = tmp_path / "default-profile.json"
    path.write_text(json.dumps(scaled_profile("default", 0.9, "2026-12-01T00:00:00Z")))
    with Session(engine) as session, session.begin():
        assert load_default_profile(session, path=path) == "updated"


def test_a_quote_with_a_named_profile_reproduces_after_it_is_deleted_and_a_new_default_ships(
        client: TestClient, engine: Engine, tmp_path: Path) -> None:
    deal_profile = scaled_profile("deal-profile", 0.8, "2026-11-30T00:00:00Z")
    with Session(engine) as session, session.begin():
        store_profile(session, deal_profile, origin="user", written_by="calibration-desk")
        assert load_default_profile(session) == "inserted"
    created = client.post("/v1/quotes", json={**PLAN, "calibration": "deal-profile"})
    assert created.status_code == 201, created.text
    quote, location = created.json(), created.headers["location"]
    stored_profile = quote["catalog_snapshot"]["calibration_profile"]
    assert (stored_profile["name"], stored_profile["origin"], stored_profile["written_by"]) == (
        "deal-profile", "user", "calibration-desk")
    assert stored_profile["entries"] == deal_profile["entries"]
    assert stored_profile["provenance"] == deal_profile["provenance"]
    assert quote["catalog_snapshot"]["engine_rules_version"] == ENGINE_RULES_VERSION
    assert quote["result"]["plans"][0]["assumptions"]["efficiency"]["calibration_profile"] == "deal-profile"

    with Session(engine) as session, session.begin():
        session.execute(delete(CalibrationProfileRecord).where(CalibrationProfileRecord.name == "deal-profile"))
    ship_new_default(engine, tmp_path)
    assert client.post("/v1/slo-plan", json={**PLAN, "calibration": "deal-profile"}).status_code == 404

    assert client.get(location).content == created.content
    reproduced = client.post(f"{location}/reproduce")
    assert reproduced.status_code == 200, reproduced.text
    assert reproduced.json()["identical"] is True
    assert canonical(reproduced.json()["result"]) == canonical(quote["result"])

    differences = client.post(f"{location}/reprice").json()["differences"]
    calibration = [difference for difference in differences if difference["kind"] == "calibration"]
    assert calibration == [{
        "kind": "calibration", "subject": "calibration profile deal-profile", "field": None, "change": "deleted",
        "before": "deal-profile", "after": None,
        "detail": "calibration profile deal-profile was deleted since; the reprice uses the copy stored in the quote",
    }]


def test_a_quote_on_the_default_profile_reproduces_after_a_new_default_ships(
        client: TestClient, engine: Engine, tmp_path: Path) -> None:
    """The reprice uses the new default and says which of the profile's fields changed; the quote still
    reproduces from the old default it stored."""
    with Session(engine) as session, session.begin():
        assert load_default_profile(session) == "inserted"
    created = client.post("/v1/quotes", json=PLAN)
    quote, location = created.json(), created.headers["location"]
    assert quote["catalog_snapshot"]["calibration_profile"]["name"] == "default"
    ship_new_default(engine, tmp_path)

    reproduced = client.post(f"{location}/reproduce").json()
    assert reproduced["identical"] is True
    assert canonical(reproduced["result"]) == canonical(quote["result"])
    repriced = client.post(f"{location}/reprice").json()
    changed = {difference["field"] for difference in repriced["differences"] if difference["kind"] == "calibration"}
    assert changed == {"created_at", "entries"}
    # 10 % less HBM bandwidth makes every memory-bound decode step slower: the answer moves.
    old_plan, new_plan = quote["result"]["plans"][0], repriced["repriced"]["plans"][0]
    assert new_plan["predicted"]["tpot"]["p50_ms"] > old_plan["predicted"]["tpot"]["p50_ms"]


def test_reprice_names_a_new_default(client: TestClient, engine: Engine) -> None:
    """A quote made when no default profile was loaded used `builtin`; once the shipped default is loaded,
    requests that name no profile use it, and the reprice says so."""
    created = client.post("/v1/quotes", json=PLAN)
    location = created.headers["location"]
    assert created.json()["catalog_snapshot"]["calibration_profile"]["name"] == "builtin"
    with Session(engine) as session, session.begin():
        load_default_profile(session)
    calibration = [difference for difference in client.post(f"{location}/reprice").json()["differences"]
                   if difference["kind"] == "calibration"]
    assert [(item["subject"], item["field"], item["before"], item["after"]) for item in calibration] == [
        ("calibration profile (default)", "name", "builtin", "default")]
    assert client.post(f"{location}/reproduce").json()["identical"] is True


def test_reproduce_reads_the_snapshot_and_nothing_else(client: TestClient, engine: Engine) -> None:
    """Halving the stored profile's bandwidth fractions inside the quote changes the reproduced answer
    (so the snapshot is what it reads), while the profile in the database is untouched."""
    created = client.post("/v1/quotes", json=PLAN)
    quote = created.json()
    with Session(engine) as session, session.begin():
        record = session.get(QuoteRecord, quote["id"])
        assert record is not None
        snapshot = copy.deepcopy(record.catalog_snapshot)
        for entry in snapshot["calibration_profile"]["entries"]:
            entry["bandwidth_fraction"] /= 2
        record.catalog_snapshot = snapshot
    reproduced = client.post(f"{created.headers['location']}/reproduce").json()
    assert reproduced["identical"] is False
    assert (reproduced["result"]["plans"][0]["predicted"]["tpot"]["p50_ms"]
            > quote["result"]["plans"][0]["predicted"]["tpot"]["p50_ms"])


def test_reproduce_reports_the_stored_and_current_engine_rules_versions(client: TestClient, engine: Engine) -> None:
    """As a reprice does: the engine rules version the quote was made under next to today's, so a result that is
    not identical is explained. A quote made now has today's; one whose snapshot says older rules (rewritten here)
    reports those; one made before snapshots kept the version reports null."""
    created = client.post("/v1/quotes", json=PLAN)
    location, today = created.headers["location"], created.json()["catalog_snapshot"]["engine_rules_version"]

    def versions(stored: str | None, *, keep: bool = True) -> tuple[Any, Any]:
        with Session(engine) as session, session.begin():
            record = session.get(QuoteRecord, created.json()["id"])
            assert record is not None
            snapshot = {key: value for key, value in record.catalog_snapshot.items() if key != "engine_rules_version"}
            record.catalog_snapshot = {**snapshot, **({"engine_rules_version": stored} if keep else {})}
        reproduced = client.post(f"{location}/reproduce").json()
        return reproduced["stored_engine_rules_version"], reproduced["engine_rules_version"]

    assert versions(today) == (today, today)
    assert versions("2020.01.01.1") == ("2020.01.01.1", today)
    assert versions(None, keep=False) == (None, today)


def test_a_quote_without_a_stored_profile_cannot_be_reproduced(client: TestClient, engine: Engine) -> None:
    created = client.post("/v1/quotes", json=PLAN)
    with Session(engine) as session, session.begin():
        record = session.get(QuoteRecord, created.json()["id"])
        assert record is not None
        record.catalog_snapshot = {key: value for key, value in record.catalog_snapshot.items()
                                   if key in ("models", "gpus")}  # as quotes were stored before
    response = client.post(f"{created.headers['location']}/reproduce")
    assert response.status_code == 409 and "reprice it instead" in response.json()["detail"]
    assert client.post(f"{created.headers['location']}/reprice").status_code == 200


def test_a_quote_keeps_its_inline_gpu_and_reproduces_without_the_catalog_knowing_it(client: TestClient) -> None:
    """An inline GPU (the H100 SXM spec at $2.10) lives in the quote's request, not in the catalog: the
    quote reproduces from itself and the catalog has no such row."""
    row = client.get("/v1/gpus/h100-sxm").json()
    spec = {name: row[name] for name in ("family", "memory_bytes", "memory_bandwidth_bytes_per_s",
                                         "interconnect_bandwidth_bytes_per_s", "gpus_per_node", "bf16_tflops",
                                         "fp16_tflops", "fp8_tflops")}
    body = {**PLAN, "candidates": {"gpus": [], "tensor_parallel": [1],
                                   "gpu_specs": [{**spec, "slug": "h100-deal", "price_per_hour_usd": 2.1}]}}
    created = client.post("/v1/quotes", json=body)
    assert created.status_code == 201, created.text
    quote = created.json()
    assert quote["request"]["candidates"]["gpu_specs"][0]["slug"] == "h100-deal"
    assert quote["catalog_snapshot"]["gpus"] == {}
    assert quote["result"]["plans"][0]["gpu"] == "h100-deal"
    assert quote["result"]["plans"][0]["cost_per_hour_usd"] == pytest.approx(2.1)  # one replica of one GPU
    assert client.get("/v1/gpus/h100-deal").status_code == 404
    assert client.post(f"{created.headers['location']}/reproduce").json()["identical"] is True
    assert client.post(f"{created.headers['location']}/reprice").json()["differences"] == []
