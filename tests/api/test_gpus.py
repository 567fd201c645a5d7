"""/v1/gpus: reads with pagination, filters and ETags; writes with keys and preconditions."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from app import web
from app.catalog import service as catalog_service
from app.catalog.schemas import GpuIn
from app.catalog.tables import GpuRecord
from app.errors import PreconditionFailed
from tests.conftest import OTHER_API_KEY

NEW_GPU = {
    "name": "Example Accelerator 64GB",
    "vendor": "Example",
    "family": "hopper",
    "memory_bytes": 68_719_476_736,  # 64 GiB = 64 x 2^30
    "memory_bandwidth_bytes_per_s": 2.0e12,
    "interconnect_bandwidth_bytes_per_s": 64e9,
    "gpus_per_node": 4,
    "bf16_tflops": 400.0,
    "price_per_hour_usd": 1.5,
    "source": "vendor datasheet",
}


def test_list_is_ordered_by_slug_and_paginated(client: TestClient) -> None:
    first = client.get("/v1/gpus", params={"limit": 5})
    assert first.status_code == 200
    page = first.json()
    assert (page["total"], page["limit"], page["offset"]) == (34, 5, 0)
    # The five smallest slugs in byte order: "a10" < "a100-..." < "a10g" ("0" < "g").
    assert [item["slug"] for item in page["items"]] == [
        "a10", "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm", "a10g"]
    # 34 rows: offset 30 leaves the last 4.
    last = client.get("/v1/gpus", params={"limit": 5, "offset": 30}).json()
    assert [item["slug"] for item in last["items"]] == ["tpu-v5p", "tpu-v6e", "v100-pcie-32gb", "v100-sxm2-32gb"]
    assert client.get("/v1/gpus", params={"offset": 34}).json()["items"] == []


def test_default_limit_is_50(client: TestClient) -> None:
    page = client.get("/v1/gpus").json()
    assert page["limit"] == 50 and len(page["items"]) == 34


@pytest.mark.parametrize(("params", "total"), [
    ({"vendor": "AMD"}, 4),  # mi250x mi300x mi325x mi355x
    ({"vendor": "amd"}, 4),  # case-insensitive
    ({"vendor": "Google"}, 3),
    ({"family": "hopper"}, 8),  # h100-sxm h100-pcie h100-nvl h200-sxm h200-nvl h20 gh200-96gb gh200-144gb
    ({"family": "blackwell"}, 4),  # b200 b300 gb200 gb300 (the data-center die)
    ({"family": "blackwell-sm120"}, 1),  # rtx-pro-6000 (GB202, compute capability 12.0)
    ({"vendor": "NVIDIA", "family": "ada"}, 4),  # l4 l40s rtx-4090 rtx-6000-ada
    ({"vendor": "Nobody"}, 0),
])
def test_filters(client: TestClient, params: dict[str, str], total: int) -> None:
    assert client.get("/v1/gpus", params=params).json()["total"] == total


def test_a_vendor_outside_ascii_is_found_whatever_its_case(client: TestClient, write_headers: dict[str, str]) -> None:
    """The filter is case-insensitive for every letter on both databases: SQLite's own lower() folds ASCII
    only, so 'ÜBERCHIP Ltd' was found on PostgreSQL and not on SQLite, even as stored."""
    body = {**{key: value for key, value in client.get("/v1/gpus/h100-sxm").json().items()
               if key not in ("slug", "origin", "version", "created_at", "updated_at", "written_by")},
            "vendor": "ÜBERCHIP Ltd"}
    assert client.put("/v1/gpus/u-gpu", json=body, headers=write_headers).status_code == 201
    for vendor in ("ÜBERCHIP Ltd", "überchip ltd", "ÜBERCHIP LTD"):
        assert client.get("/v1/gpus", params={"vendor": vendor}).json()["total"] == 1, vendor


def test_get_one(client: TestClient) -> None:
    response = client.get("/v1/gpus/b200")
    assert response.status_code == 200
    body = response.json()
    assert body["memory_bytes"] == 192_265_846_784  # 183,359 MiB x 2^20
    assert body["memory_bandwidth_bytes_per_s"] == 7.7e12
    assert body["interconnect_bandwidth_bytes_per_s"] == 900e9  # NVLink 5: 1.8 TB/s bidirectional / 2
    assert body["origin"] == "reference" and body["version"] == 1
    assert body["created_at"].endswith("Z")


def test_unknown_slug_is_a_404_problem(client: TestClient) -> None:
    response = client.get("/v1/gpus/h900")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == "No gpu with slug 'h900' in the catalog; no slug is close; GET /v1/gpus lists them all"


@pytest.mark.parametrize("path", ["/v1/gpus", "/v1/gpus/h100-sxm", "/v1/gpus?vendor=AMD&limit=2"])
def test_strong_etag_and_304(client: TestClient, path: str) -> None:
    first = client.get(path)
    etag = first.headers["etag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    assert client.get(path).headers["etag"] == etag  # stable
    again = client.get(path, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    assert client.get(path, headers={"If-None-Match": f"W/{etag}"}).status_code == 304  # weak comparison
    assert client.get(path, headers={"If-None-Match": '"other"'}).status_code == 200


def test_put_creates_with_201_and_location_then_replaces_with_200(client: TestClient,
                                                                  write_headers: dict[str, str]) -> None:
    created = client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=write_headers)
    assert created.status_code == 201
    assert created.headers["location"] == "/v1/gpus/example-64gb"
    body = created.json()
    assert (body["slug"], body["origin"], body["version"]) == ("example-64gb", "user", 1)
    assert body["scale_out_bandwidth_bytes_per_s"] == 50e9  # default when not given
    assert created.headers["etag"] == client.get("/v1/gpus/example-64gb").headers["etag"]

    replaced = client.put("/v1/gpus/example-64gb", json={**NEW_GPU, "price_per_hour_usd": 2.0},
                          headers=write_headers)
    assert replaced.status_code == 200
    assert (replaced.json()["price_per_hour_usd"], replaced.json()["version"]) == (2.0, 2)
    assert replaced.headers["etag"] != created.headers["etag"]
    assert client.get("/v1/gpus").json()["total"] == 35


def test_put_over_a_reference_row_makes_it_a_user_row(client: TestClient, write_headers: dict[str, str]) -> None:
    current = client.get("/v1/gpus/l4").json()
    body = {key: current[key] for key in NEW_GPU.keys() | {"form_factor", "interconnect", "notes"}}
    response = client.put("/v1/gpus/l4", json={**body, "price_per_hour_usd": 0.42}, headers=write_headers)
    assert response.status_code == 200
    assert (response.json()["origin"], response.json()["version"]) == ("user", 2)


def test_if_match_current_etag_writes_stale_etag_is_412(client: TestClient, write_headers: dict[str, str]) -> None:
    client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=write_headers)
    etag_v1 = client.get("/v1/gpus/example-64gb").headers["etag"]
    ok = client.put("/v1/gpus/example-64gb", json={**NEW_GPU, "tdp_w": 500.0},
                    headers={**write_headers, "If-Match": etag_v1})
    assert ok.status_code == 200
    stale = client.put("/v1/gpus/example-64gb", json={**NEW_GPU, "tdp_w": 600.0},
                       headers={**write_headers, "If-Match": etag_v1})
    assert stale.status_code == 412
    assert stale.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/gpus/example-64gb").json()["tdp_w"] == 500.0  # the stale write did not land
    assert client.delete("/v1/gpus/example-64gb", headers={**write_headers, "If-Match": etag_v1}).status_code == 412
    assert client.put("/v1/gpus/nothing-here", json=NEW_GPU,
                      headers={**write_headers, "If-Match": etag_v1}).status_code == 412


def test_if_none_match_star_only_creates(client: TestClient, write_headers: dict[str, str]) -> None:
    create_only = {**write_headers, "If-None-Match": "*"}
    assert client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=create_only).status_code == 201
    assert client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=create_only).status_code == 412


def test_if_none_match_compares_weakly_on_writes_as_on_reads(client: TestClient, write_headers: dict[str, str]) -> None:
    """RFC 9110 13.1.2: If-None-Match uses the weak comparison, so W/"<current tag>" names the row as it is: a GET
    with it is a 304, and a PUT or DELETE with it a 412 that changes nothing (it was a 200 that overwrote the row);
    a weak tag of another version is no match, and the write goes through."""
    client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=write_headers)
    etag = client.get("/v1/gpus/example-64gb").headers["etag"]
    weak = {**write_headers, "If-None-Match": f"W/{etag}"}
    assert client.get("/v1/gpus/example-64gb", headers={"If-None-Match": f"W/{etag}"}).status_code == 304
    assert client.put("/v1/gpus/example-64gb", json={**NEW_GPU, "tdp_w": 701.0}, headers=weak).status_code == 412
    assert client.delete("/v1/gpus/example-64gb", headers=weak).status_code == 412
    assert client.get("/v1/gpus/example-64gb").json()["tdp_w"] is None  # NEW_GPU states none
    other = {**write_headers, "If-None-Match": 'W/"0123456789abcdef0123456789abcdef"'}
    assert client.put("/v1/gpus/example-64gb", json={**NEW_GPU, "tdp_w": 701.0}, headers=other).status_code == 200


def test_delete_is_204_then_404(client: TestClient, write_headers: dict[str, str]) -> None:
    etag = client.get("/v1/gpus/t4").headers["etag"]
    deleted = client.delete("/v1/gpus/t4", headers={**write_headers, "If-Match": etag})
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get("/v1/gpus/t4").status_code == 404
    assert client.delete("/v1/gpus/t4", headers=write_headers).status_code == 404
    assert client.get("/v1/gpus").json()["total"] == 33


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong-key-0123456789abcdef"},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "Bearer"},
])
def test_writes_need_a_valid_key(client: TestClient, headers: dict[str, str]) -> None:
    for response in (client.put("/v1/gpus/example-64gb", json=NEW_GPU, headers=headers),
                     client.delete("/v1/gpus/h100-sxm", headers=headers)):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/gpus/h100-sxm").status_code == 200


def test_a_rotated_key_is_accepted_too(client: TestClient) -> None:
    response = client.put("/v1/gpus/example-64gb", json=NEW_GPU,
                          headers={"Authorization": f"Bearer {OTHER_API_KEY}"})
    assert response.status_code == 201


def test_inconsistent_spec_is_a_422_naming_the_field(client: TestClient, write_headers: dict[str, str]) -> None:
    no_compute = {key: value for key, value in NEW_GPU.items() if key != "bf16_tflops"}
    response = client.put("/v1/gpus/example-64gb", json=no_compute, headers=write_headers)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/body"
    assert "peak compute" in response.json()["detail"]


def test_two_writers_that_read_the_same_version_cannot_both_win(engine: Engine, fresh_catalog: None) -> None:
    """Both read version 1; the first commits; the second's UPDATE ... WHERE version = 1 matches nothing."""
    first, second = Session(engine), Session(engine)
    try:
        columns = {}
        for session in (first, second):
            record = session.get(GpuRecord, "a10")
            assert record is not None and record.version == 1
            columns = GpuIn.model_validate(record, from_attributes=True).model_dump()
        catalog_service.put(first, catalog_service.GPUS, "a10", {**columns, "price_per_hour_usd": 1.11},
                            web.Preconditions(), written_by="key-1")
        first.commit()
        with pytest.raises(PreconditionFailed):
            catalog_service.put(second, catalog_service.GPUS, "a10", {**columns, "price_per_hour_usd": 2.22},
                                web.Preconditions(), written_by="key-2")
        second.rollback()
    finally:
        first.close()
        second.close()
    with Session(engine) as session:
        record = session.get(GpuRecord, "a10")
        assert record is not None and (record.price_per_hour_usd, record.version) == (1.11, 2)
