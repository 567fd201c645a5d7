"""The SVG charts: /v1/roofline/chart, /v1/roofline/batch-sweep/chart and /v1/slo-plan/chart.

Each test parses the SVG (xml.etree) and checks what a reader sees: the size, the title, the axis
labels, the values written on the chart, and one marker per plotted point, located by the element
ids the charts give their pieces. Numbers on the charts are derived by hand below.

Llama-3-8B on H100 SXM in bf16 (see tests/api/test_roofline.py and test_batch_sweep.py for the
arithmetic): catalog peak 989.5e12 dense bf16 FLOP/s (the datasheet's 1,979 "with sparsity" / 2),
1,979e12 fp8, HBM 3.35e12 B/s, 85,520,809,984 B of memory as the driver reports it.
"""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from app.catalog.schemas import GPU_SPEC_EXAMPLE
from app.charts.service import round_ticks, tick_label
from tests.api.problems import assert_problem

SVG = "{http://www.w3.org/2000/svg}"
ROOFLINE = "/v1/roofline/chart"
SWEEP = "/v1/roofline/batch-sweep/chart"
PLAN = "/v1/slo-plan/chart"
PEAK_BF16 = 989.5e12
PEAK_FP8 = 1979e12
BANDWIDTH = 3.35e12
H100_MEMORY = 85_520_809_984

DECODE_1024 = {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 1024}


# Reading an SVG ----------------------------------------------------------------------------

def chart(response: Any) -> ET.Element:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/svg+xml"
    root = ET.fromstring(response.content)
    assert root.tag == f"{SVG}svg"
    ids = [element.get("id") for element in root.iter() if element.get("id") is not None]
    assert len(ids) == len(set(ids)), "element ids must be unique in an SVG document"
    return root


def texts(root: ET.Element) -> list[str]:
    return ["".join(element.itertext()) for element in root.iter(f"{SVG}text")]


def group(root: ET.Element, gid: str) -> ET.Element:
    found = [element for element in root.iter(f"{SVG}g") if element.get("id") == gid]
    assert len(found) == 1, f"expected one element with id {gid!r}, found {len(found)}"
    return found[0]


def has_group(root: ET.Element, gid: str) -> bool:
    return any(element.get("id") == gid for element in root.iter(f"{SVG}g"))


def markers(element: ET.Element) -> list[tuple[float, float]]:
    """Centres of the markers drawn in this element (matplotlib places each with a <use>)."""
    return [(float(use.get("x", "nan")), float(use.get("y", "nan"))) for use in element.iter(f"{SVG}use")]


def path_x(element: ET.Element) -> float:
    """The x of the first point of the first path in this element (a vertical line's position)."""
    path = next(element.iter(f"{SVG}path"))
    numbers = re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))
    return float(numbers[0])


def text_in(root: ET.Element, gid: str) -> str:
    return "".join(group(root, gid).itertext()).strip()


def one_text(root: ET.Element, fragment: str) -> str:
    matching = [text for text in texts(root) if fragment in text]
    assert len(matching) == 1, (fragment, texts(root))
    return matching[0]


def get(client: TestClient, url: str, params: dict[str, Any]) -> Any:
    """GET with these query parameters (None: left out; a list: repeated)."""
    given = {name: value for name, value in params.items() if value is not None}
    return client.get(f"{url}?{urlencode(given, doseq=True)}")


# Every chart -------------------------------------------------------------------------------

def test_charts_are_800_by_500_pixels(client: TestClient) -> None:
    """8 x 5 in at 100 dpi. matplotlib draws in points (8 in x 72 = 576 pt, 5 in x 72 = 360 pt): the
    viewBox keeps that drawing, the width and height show it at 800 x 500 px."""
    for response in (client.post(ROOFLINE, json=DECODE_1024),
                     client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm",
                                              "context_tokens": 128})):
        root = chart(response)
        assert (root.get("width"), root.get("height")) == ("800", "500")
        assert root.get("viewBox") == "0 0 576 360"


def test_same_request_same_bytes(client: TestClient) -> None:
    """Fixed ids (hash salt), no date in the metadata: a chart can be cached and compared."""
    first = client.post(ROOFLINE, json=DECODE_1024)
    second = client.post(ROOFLINE, json=DECODE_1024)
    assert first.status_code == 200
    assert first.content == second.content
    assert b"<dc:date>" not in first.content


def test_concurrent_requests_get_the_same_bytes(client: TestClient) -> None:
    """Endpoints run in a thread pool; drawing is serialized, so parallel requests cannot swap the
    pinned rendering settings under each other."""
    expected = client.post(ROOFLINE, json=DECODE_1024).content
    with ThreadPoolExecutor(max_workers=4) as pool:
        bodies = list(pool.map(lambda _: client.post(ROOFLINE, json=DECODE_1024).content, range(4)))
    assert bodies == [expected] * 4


def test_text_stays_text_in_a_colour_blind_safe_palette(client: TestClient) -> None:
    """fonttype "none" keeps labels as <text> (searchable, readable by screen readers); the data
    colours are Okabe-Ito's vermillion (prefill) and blue (decode)."""
    body = client.post(ROOFLINE, json=DECODE_1024).content.decode()
    assert "<text" in body
    assert "#d55e00" in body.lower() and "#0072b2" in body.lower()


def test_charts_are_documented_as_svg_images(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in (ROOFLINE, SWEEP, PLAN):
        for method in ("get", "post"):
            operation = spec["paths"][path][method]
            svg_content = {"image/svg+xml": {"schema": {"type": "string"}}}
            assert operation["responses"]["200"]["content"] == svg_content
            assert "422" in operation["responses"]
        names = {parameter["name"]: parameter for parameter in spec["paths"][path]["get"]["parameters"]}
        assert names["model"]["required"] is True
    roofline_parameters = {p["name"] for p in spec["paths"][ROOFLINE]["get"]["parameters"]}
    assert {"model", "gpu", "phase", "batch_size", "prompt_tokens", "context_tokens", "tensor_parallel",
            "data_parallel", "expert_parallel", "weight_dtype", "kv_dtype", "compute_dtype",
            "weight_recipe", "calibration"} == roofline_parameters


# /v1/roofline/chart ------------------------------------------------------------------------

def test_roofline_chart_of_a_decode_step(client: TestClient) -> None:
    """Decode at 1,024 cached tokens: 15,546,712,064 FLOPs over 15,148,673,536 B (test_roofline.py)
    = 1.0263 FLOP/byte, memory-bound. Its companion is the prefill of the 1,024-token prompt: at
    least 1,024 x 2 x 6,979,321,856 = 1.43e13 FLOPs against ~15.0e9 B of weights + ~4.2e9 B of
    per-token activations (1,024 x 4,063,232) + 0.13e9 B of KV written: ~750 FLOP/byte,
    compute-bound. Ridge point 989.5e12 / 3.35e12 = 295.37 FLOP/byte."""
    root = chart(client.post(ROOFLINE, json=DECODE_1024))
    all_text = texts(root)
    assert "Roofline: llama-3-8b on h100-sxm" in all_text
    assert "compute bf16, weights bf16, KV bf16; batch 1, TP1" in all_text
    assert "Arithmetic intensity (FLOP/byte)" in all_text
    assert "Performance per GPU (TFLOP/s)" in all_text
    assert text_in(root, "ridge-label") == "ridge point 295 FLOP/byte"
    assert round(PEAK_BF16 / BANDWIDTH) == 295
    one_text(root, "roof: HBM 3.35 TB/s, bf16 peak 989.5 TFLOP/s")
    decode = one_text(root, "decode at 1,024 tokens: ")
    assert decode.startswith("decode at 1,024 tokens: 1.03 FLOP/byte, memory-bound, ")
    assert round(15_546_712_064 / 15_148_673_536, 2) == 1.03
    prefill = one_text(root, "prefill 1,024 tokens: ")
    found = re.search(r": ([\d,.]+) FLOP/byte", prefill)
    assert found is not None
    intensity = float(found.group(1).replace(",", ""))
    assert 650 < intensity < 850
    assert ", compute-bound, " in prefill
    # One marker per phase, on either side of the ridge; each labelled.
    [(decode_x, decode_y)] = markers(group(root, "point-decode"))
    [(prefill_x, _)] = markers(group(root, "point-prefill"))
    [(ridge_x, ridge_y)] = markers(group(root, "ridge-point"))
    assert decode_x < ridge_x < prefill_x
    assert decode_y > ridge_y  # lower on the chart: far below the compute roof
    assert text_in(root, "label-decode") == "decode"
    assert text_in(root, "label-prefill") == "prefill"


def test_roofline_chart_draws_what_the_json_endpoint_returns(client: TestClient) -> None:
    """The legend's numbers are /v1/roofline's, for both phases, to three significant figures."""
    root = chart(client.post(ROOFLINE, json=DECODE_1024))
    decode = client.post("/v1/roofline", json=DECODE_1024).json()
    prefill = client.post("/v1/roofline", json={**DECODE_1024, "phase": "prefill", "context_tokens": None,
                                                "prompt_tokens": 1024}).json()
    for answer, label in ((decode, "decode at 1,024 tokens"), (prefill, "prefill 1,024 tokens")):
        text = one_text(root, label)
        assert f"{answer['bound']}-bound" in text
        assert f"{answer['expected_time_ms']:.3g}" in text.replace(",", "")
        assert f"{answer['arithmetic_intensity']:.3g}" in text.replace(",", "")


def test_roofline_chart_of_a_prefill_after_a_cached_prefix(client: TestClient) -> None:
    """A prefill of 1,024 tokens after 512 cached ones is followed by decode at 512 + 1,024 = 1,536
    tokens. Llama-3-70B at TP4 (64 heads / 4): the title says so."""
    root = chart(client.post(ROOFLINE, json={"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "prefill",
                                             "prompt_tokens": 1024, "context_tokens": 512,
                                             "tensor_parallel": 4}))
    assert "Roofline: llama-3-70b on h100-sxm" in texts(root)
    assert "compute bf16, weights bf16, KV bf16; batch 1, TP4" in texts(root)
    one_text(root, "prefill 1,024 tokens after 512: ")
    one_text(root, "decode at 1,536 tokens: ")


def test_roofline_chart_at_fp8(client: TestClient) -> None:
    """fp8 weights on an H100 compute at its fp8 rate: roof 1,979 TFLOP/s, ridge 1,979e12 / 3.35e12 =
    590.7 FLOP/byte, twice the bf16 ridge."""
    root = chart(client.post(ROOFLINE, json={**DECODE_1024, "weight_dtype": "fp8"}))
    assert "compute fp8, weights fp8, KV bf16; batch 1, TP1" in texts(root)
    assert round(PEAK_FP8 / BANDWIDTH) == 591
    assert text_in(root, "ridge-label") == "ridge point 591 FLOP/byte"
    one_text(root, "fp8 peak 1,979.0 TFLOP/s")


def test_roofline_chart_from_query_parameters_is_the_post_chart(client: TestClient) -> None:
    body = {"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 2048,
            "tensor_parallel": 4, "batch_size": 2, "kv_dtype": "fp8"}
    assert get(client, ROOFLINE, body).content == client.post(ROOFLINE, json=body).content


# /v1/roofline/batch-sweep/chart ------------------------------------------------------------

def test_batch_sweep_chart_marks_the_knee(client: TestClient) -> None:
    """At 128 cached tokens (test_batch_sweep.py): F = 15,076,950,016 FLOPs and s = 21,383,680 B per
    sequence, W = 15,009,849,344 B read once per step; compute-bound from
    B >= W / (F x 3.35e12 / 989.5e12 - s) = 506.06: the knee is at 507, between the swept 256 and 512."""
    flops = 13_958_643_712 + 1_050_673_152 + 524_288 * 129
    own_bytes = 8_192 + 4_336_128 + 131_072 * 130
    assert math.ceil(15_009_849_344 / (flops * BANDWIDTH / PEAK_BF16 - own_bytes)) == 507
    root = chart(client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128}))
    all_text = texts(root)
    assert "Decode batching: llama-3-8b on h100-sxm" in all_text
    assert "compute bf16, weights bf16, KV bf16; 128 cached tokens per sequence, TP1" in all_text
    assert {"Aggregate (tokens/s)", "Per user (tokens/s)",
            "Batch size (concurrent sequences)"} <= set(all_text)
    assert text_in(root, "knee-label") == "knee: batch 507 (compute-bound from here)"
    # 1, 2, 4, ..., 1024: eleven points on each curve, left to right.
    for curve in ("aggregate-expected", "per-user-expected"):
        xs = [x for x, _ in markers(group(root, curve))]
        assert len(xs) == 11 and xs == sorted(xs)
    xs = [x for x, _ in markers(group(root, "aggregate-expected"))]
    knee_x = path_x(group(root, "knee-aggregate"))
    assert xs[8] < knee_x < xs[9]  # batch 256 < 507 < 512
    assert knee_x - xs[8] > 10 * (xs[9] - knee_x)  # log scale: 507 sits next to 512
    assert path_x(group(root, "knee-per-user")) == knee_x
    assert not has_group(root, "unfit-aggregate")  # 1,024 x 131,072 x 129 B of KV + 16.06e9 B of weights fit


def test_a_knee_below_every_swept_batch_stays_on_the_axis(client: TestClient) -> None:
    """Batches 1,000 and 2,000 at 128 cached tokens: the knee (507, above) lies left of both. The axis starts below
    it, so its line is drawn left of the first point, inside the plot (it was clipped and its label drawn over
    the y axis, at a negative x)."""
    root = chart(client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128,
                                          "batch_sizes": [1000, 2000]}))
    first_x = min(x for x, _ in markers(group(root, "aggregate-expected")))
    assert 0 < path_x(group(root, "knee-aggregate")) < first_x


def test_charts_of_an_attention_dp_layout_say_so(client: TestClient) -> None:
    """DeepSeek-V3 fp8 on H200 as DP8 + EP8: both titles name the layout, and that the batch is one rank's."""
    layout = {"model": "deepseek-v3", "gpu": "h200-sxm", "weight_dtype": "fp8", "kv_dtype": "bf16",
              "data_parallel": 8, "expert_parallel": 8}
    sweep = chart(client.post(SWEEP, json={**layout, "context_tokens": 2047}))
    assert one_text(sweep, "cached tokens per sequence").endswith("2,047 cached tokens per sequence, "
                                                                   "TP1 DP8 EP8 (batch per rank)")
    step = chart(client.post(ROOFLINE, json={**layout, "phase": "decode", "context_tokens": 2047, "batch_size": 4}))
    assert one_text(step, "; batch 4").endswith("; batch 4, TP1 DP8 EP8 (batch per rank)")


def test_aggregate_rises_and_per_user_falls(client: TestClient) -> None:
    """The money slide: a bigger batch shares the weight read (aggregate tokens/s up, the curve rises:
    smaller y in SVG coordinates) and each user waits for the whole batch (per-user tokens/s down)."""
    root = chart(client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128,
                                          "batch_sizes": [1, 8, 64, 256]}))
    aggregate = [y for _, y in markers(group(root, "aggregate-expected"))]
    per_user = [y for _, y in markers(group(root, "per-user-expected"))]
    assert aggregate == sorted(aggregate, reverse=True)
    assert per_user == sorted(per_user)


def test_batch_sweep_chart_without_a_knee_shades_what_does_not_fit(client: TestClient) -> None:
    """At 8,191 cached tokens every added sequence reads 131,072 x 8,193 B of KV, far more than its
    FLOPs take at peak: no knee. Weights 16,060,522,496 B + 64 x 1,073,741,824 B = 84,779,999,232 B
    fit in 85,520,809,984 B; 65 sequences (85,853,741,056 B) do not: the shading starts at 65."""
    assert 16_060_522_496 + 64 * 131_072 * 8_192 <= H100_MEMORY < 16_060_522_496 + 65 * 131_072 * 8_192
    root = chart(client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 8191,
                                          "batch_sizes": [1, 16, 64, 65]}))
    assert text_in(root, "knee-label") == "no knee: memory-bound at every batch"
    assert not has_group(root, "knee-aggregate")
    xs = [x for x, _ in markers(group(root, "aggregate-expected"))]
    for panel in ("aggregate", "per-user"):  # from the 65-sequence point on
        assert path_x(group(root, f"unfit-{panel}")) == pytest.approx(xs[3], abs=0.01)
    assert "weights + KV exceed GPU memory" in texts(root)


def test_batch_sweep_chart_from_query_parameters_is_the_post_chart(client: TestClient) -> None:
    body = {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 512, "batch_sizes": [1, 4, 32, 128]}
    assert get(client, SWEEP, body).content == client.post(SWEEP, json=body).content


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.integers(1, 4096), min_size=1, max_size=20), context=st.integers(0, 100_000))
def test_one_marker_per_distinct_batch(client: TestClient, batches: list[int], context: int) -> None:
    root = chart(client.post(SWEEP, json={"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": context,
                                          "batch_sizes": batches}))
    xs = [x for x, _ in markers(group(root, "per-user-expected"))]
    assert len(xs) == len(set(batches))
    assert xs == sorted(xs)


# Bad input: problems, never SVG --------------------------------------------------------------

@pytest.mark.parametrize(("body", "pointer"), [
    ({**DECODE_1024, "tensor_parallel": 3}, "/body/tensor_parallel"),  # 32 heads
    ({**DECODE_1024, "context_tokens": 0}, "/body/context_tokens"),  # no prompt to prefill
    ({**DECODE_1024, "compute_dtype": "fp4"}, "/body/compute_dtype"),  # an H100 has no fp4 rate
    ({**DECODE_1024, "batch_size": 1_000_001}, "/body/batch_size"),
    ({"gpu": "h100-sxm", "phase": "decode", "context_tokens": 1}, "/body/model_spec"),  # no model at all
])
def test_bad_roofline_chart_bodies(client: TestClient, body: dict[str, Any], pointer: str) -> None:
    assert_problem(client.post(ROOFLINE, json=body), 422, pointer)


@pytest.mark.parametrize(("params", "pointer"), [
    ({**DECODE_1024, "tensor_parallel": 3}, "/query/tensor_parallel"),
    ({**DECODE_1024, "context_tokens": 0}, "/query/context_tokens"),
    ({**DECODE_1024, "compute_dtype": "fp4"}, "/query/compute_dtype"),
    ({**DECODE_1024, "batch_size": 0}, "/query/batch_size"),
    ({**DECODE_1024, "context_tokens": "lots"}, "/query/context_tokens"),
    ({**DECODE_1024, "context_tokens": "1e3"}, "/query/context_tokens"),
    # Integers as the JSON body takes them (12.0 is a 422 there): these were read as numbers.
    ({**DECODE_1024, "context_tokens": "12.0"}, "/query/context_tokens"),
    ({**DECODE_1024, "context_tokens": " 12"}, "/query/context_tokens"),
    ({**DECODE_1024, "context_tokens": "1_000"}, "/query/context_tokens"),
    ({**DECODE_1024, "phase": "training"}, "/query/phase"),
    ({**DECODE_1024, "context_tokens": None}, "/query/context_tokens"),  # required for decode
    ({**DECODE_1024, "prompt_tokens": 10}, "/query/prompt_tokens"),  # prefill only
    ({"gpu": "h100-sxm", "phase": "decode", "context_tokens": 10}, "/query/model"),
    ({**DECODE_1024, "colour": "red"}, "/query/colour"),
])
def test_bad_roofline_chart_query_parameters(client: TestClient, params: dict[str, Any],
                                             pointer: str) -> None:
    assert_problem(get(client, ROOFLINE, params), 422, pointer)


def test_bad_batch_sweep_chart_input(client: TestClient) -> None:
    base = {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 100}
    assert_problem(client.post(SWEEP, json={**base, "batch_sizes": []}), 422, "/body/batch_sizes")
    assert_problem(get(client, SWEEP, {**base, "batch_sizes": [1, 0]}), 422, "/query/batch_sizes/1")
    assert_problem(get(client, SWEEP, {**base, "batch_sizes": [1, "2.0"]}), 422, "/query/batch_sizes/1")
    assert get(client, SWEEP, {**base, "batch_sizes": [1, "+2"]}).status_code == 200
    assert_problem(get(client, SWEEP, {**base, "batch_sizes": list(range(1, 66))}), 422, "/query/batch_sizes")
    assert_problem(get(client, SWEEP, {**base, "context_tokens": 10_000_001}), 422, "/query/context_tokens")


def test_client_given_names_are_plain_text(client: TestClient) -> None:
    """An inline GPU's name is the client's: "$...$" stays text (no TeX parsing to fail on), markup is
    escaped, and a control character, which XML cannot carry, is replaced."""
    name = "$\\frac{$ <b>&</b> \x07"
    root = chart(client.post(ROOFLINE, json={**DECODE_1024, "gpu": None,
                                             "gpu_spec": {**GPU_SPEC_EXAMPLE, "name": name}}))
    assert "Roofline: llama-3-8b on $\\frac{$ <b>&</b> \ufffd" in texts(root)


def test_unknown_slugs_are_404_problems(client: TestClient) -> None:
    """In the query form, the 404 points at the query parameter that named the row or profile."""
    assert_problem(get(client, ROOFLINE, {**DECODE_1024, "gpu": "no-such-gpu"}), 404, "/query/gpu")
    assert_problem(get(client, ROOFLINE, {**DECODE_1024, "calibration": "nope"}), 404, "/query/calibration")
    assert_problem(client.post(ROOFLINE, json={**DECODE_1024, "calibration": "nope"}), 404, "/body/calibration")
    unknown_model = {"model": "no-such-model", "gpu": "h100-sxm", "context_tokens": 1}
    assert_problem(client.post(SWEEP, json=unknown_model), 404)


# /v1/slo-plan/chart ------------------------------------------------------------------------

PLAN_BODY = {
    "model": "llama-3.1-8b",
    "workload": {"input_tokens": 1000, "output_tokens": 250, "requests_per_s": 5},
    "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
    "candidates": {"gpus": ["h100-sxm", "l40s"], "tensor_parallel": [1, 2]},
    "simulated_requests": 500,
}


@pytest.fixture
def plan_answer(client: TestClient) -> Iterator[dict[str, Any]]:
    response = client.post("/v1/slo-plan", json=PLAN_BODY)
    assert response.status_code == 200, response.text
    yield response.json()


def test_slo_plan_chart_highlights_the_frontier(client: TestClient, plan_answer: dict[str, Any]) -> None:
    """Every priced plan is a point at (its p95 TPOT, its cost per hour); the plan's Pareto plans are
    the highlighted ones, numbered by rank and described beside the axes; the SLO's 50 ms is a
    vertical line."""
    root = chart(client.post(PLAN, json=PLAN_BODY))
    all_text = texts(root)
    assert "SLO plan: llama-3.1-8b at p95 TTFT ≤ 1,000 ms, TPOT ≤ 50 ms" in all_text
    assert {"TPOT at p95 (ms)", "Cost per hour (USD)"} <= set(all_text)
    assert "SLO: p95 TPOT 50 ms" in all_text
    priced = [plan for plan in plan_answer["plans"] if plan["cost_per_hour_usd"] is not None]
    assert priced, plan_answer
    pareto = {point["rank"] for point in plan_answer["pareto"]}
    on_frontier = [plan for plan in priced if plan["rank"] in pareto]
    others = [plan for plan in priced if plan["rank"] not in pareto]
    assert len(markers(group(root, "frontier"))) == len(on_frontier)
    if others:
        assert len(markers(group(root, "plans"))) == len(others)
    else:
        assert not has_group(root, "plans")
    for plan in on_frontier:
        assert text_in(root, f"frontier-rank-{plan['rank']}") == f"#{plan['rank']}"
        assert (f"#{plan['rank']}: {plan['replicas']} x {plan['gpu']} {plan['layout']} "
                f"{plan['weight_dtype']}, ${plan['cost_per_hour_usd']:,.2f}/h") in all_text
    # Nothing is cheaper than the cheapest plan, so it is on the frontier, at its lowest marker.
    cheapest = min(priced, key=lambda plan: plan["cost_per_hour_usd"])
    assert cheapest["rank"] in pareto
    if others:  # SVG y grows downwards
        lowest_on_frontier = max(y for _, y in markers(group(root, "frontier")))
        assert lowest_on_frontier >= max(y for _, y in markers(group(root, "plans")))
    gpus = ", ".join(sorted({plan["gpu"] for plan in plan_answer["plans"]}))
    assert any(text.startswith(f"GPUs {gpus}; weights ") for text in all_text), all_text
    # The frontier is the plan's (cost against E2E), drawn on this chart's TPOT axis: the legend says both.
    assert "Pareto (cost vs E2E) at their TPOT" in all_text
    dollar_ticks = [float(text[1:].replace(",", "")) for text in all_text if re.fullmatch(r"\$[\d,.]+", text)]
    assert_round_ticks(dollar_ticks)


def assert_round_ticks(ticks: list[float]) -> None:
    """At least three ticks, evenly spaced by 1, 2 or 5 x 10^k (not 2.5), each labelled exactly."""
    assert len(ticks) >= 3, ticks
    steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1, ticks
    mantissa = steps.pop() / 10 ** math.floor(math.log10(ticks[1] - ticks[0]))
    assert round(mantissa, 9) in (1, 2, 5), ticks


@pytest.mark.parametrize(("value", "label"), [
    (2.5, "2.5"), (2.0, "2"), (1500.0, "1,500"), (0.05, "0.05"), (-0.0, "0"), (12.5, "12.5"),
])
def test_tick_labels_are_the_exact_values(value: float, label: str) -> None:
    assert tick_label(value) == label


@pytest.mark.parametrize("limits", [(0, 18.3), (0, 2.9), (0, 9.4), (0, 1.37), (0, 4_800), (0, 0.071)])
def test_round_ticks_step_by_one_two_or_five(limits: tuple[float, float]) -> None:
    """matplotlib's default locator steps 0..18.3 by 2.5 (0, 2.5, 5, 7.5, ...), which "${x:,.0f}"
    printed as $0, $2, $5, $8; and 0..2.9 by 0.5, printed $0, $0, $1, $2. These axes step by 1, 2 or
    5 x 10^k only, and print 0.5 as 0.5."""
    figure = Figure(figsize=(8, 5))
    axes = figure.add_subplot()
    axes.set_ylim(*limits)
    round_ticks(axes.yaxis, prefix="$")
    FigureCanvasSVG(figure).draw()
    ticks = [tick for tick in axes.get_yticks() if limits[0] <= tick <= limits[1]]
    assert_round_ticks(ticks)
    labels = [label.get_text() for label in axes.get_yticklabels() if label.get_text()]
    assert labels[:len(ticks)] == [f"${tick_label(tick)}" for tick in ticks]


def test_slo_plan_chart_against_ttft(client: TestClient) -> None:
    root = chart(client.post(f"{PLAN}?metric=ttft", json=PLAN_BODY))
    assert "TTFT at p95 (ms)" in texts(root)
    assert "SLO: p95 TTFT 1,000 ms" in texts(root)
    assert "Pareto (cost vs E2E) at their TTFT" in texts(root)


def test_slo_plan_chart_from_query_parameters_is_the_post_chart(client: TestClient) -> None:
    params = {"model": "llama-3.1-8b", "input_tokens": 1000, "output_tokens": 250, "requests_per_s": 5,
              "ttft_ms": 1000, "tpot_ms": 50, "percentile": 95, "gpus": ["h100-sxm", "l40s"],
              "tensor_parallel": [1, 2], "simulated_requests": 500, "metric": "tpot"}
    assert get(client, PLAN, params).content == client.post(PLAN, json=PLAN_BODY).content


def test_an_infeasible_plan_is_still_a_chart(client: TestClient) -> None:
    """A 0.01 ms TPOT is beyond any GPU: the chart says so instead of failing, and its title lists no GPUs,
    weights or KV of plans it has none of (it read "GPUs none" beside the candidates it searched)."""
    body = {**PLAN_BODY, "slo": {"ttft_ms": 1000, "tpot_ms": 0.01}}
    root = chart(client.post(PLAN, json=body))
    assert any(text.startswith("No plan meets the SLO") for text in texts(root))
    assert not has_group(root, "frontier")
    assert not any("GPUs none" in text or "GPUs " in text for text in texts(root))


@pytest.mark.parametrize(("params", "pointer"), [
    ({"requests_per_s": "nan"}, "/query/requests_per_s"),
    ({"requests_per_s": "inf"}, "/query/requests_per_s"),
    ({"tpot_ms": -1}, "/query/tpot_ms"),
    ({"metric": "e2e"}, "/query/metric"),
    ({"tensor_parallel": [0]}, "/query/tensor_parallel/0"),
    ({"concurrent_users": 10}, "/query"),  # both an arrival rate and a user count
    ({"think_time_s": 3}, "/query/think_time_s"),  # a closed loop's pause in an open loop
    ({"think_time_s": "nan"}, "/query/think_time_s"),
])
def test_bad_slo_plan_chart_query_parameters(client: TestClient, params: dict[str, Any],
                                             pointer: str) -> None:
    base = {"model": "llama-3.1-8b", "input_tokens": 1000, "output_tokens": 250, "requests_per_s": 5,
            "ttft_ms": 1000, "tpot_ms": 50, "gpus": ["h100-sxm"], "simulated_requests": 500}
    assert_problem(get(client, PLAN, {**base, **params}), 422, pointer)


def test_a_non_finite_query_number_is_called_so_as_in_a_json_body(client: TestClient) -> None:
    """nan or inf in a query parameter is "not a finite number", as in the JSON body, not a range miss."""
    base = {"model": "llama-3.1-8b", "input_tokens": 1000, "output_tokens": 250, "concurrent_users": 5,
            "ttft_ms": 1000, "tpot_ms": 50, "gpus": ["h100-sxm"]}
    for text in ("nan", "inf"):
        problem = assert_problem(get(client, PLAN, {**base, "think_time_s": text}), 422, "/query/think_time_s")
        assert [error["detail"] for error in problem["errors"]] == ["Input should be a finite number"]


def test_bad_slo_plan_chart_body(client: TestClient) -> None:
    assert_problem(client.post(PLAN, json={**PLAN_BODY, "slo": {"ttft_ms": 1000}}), 422, "/body/slo/tpot_ms")
    assert_problem(client.post(f"{PLAN}?metric=e2e", json=PLAN_BODY), 422, "/query/metric")


def test_slo_plan_chart_shows_both_kinds_of_deployment(client: TestClient) -> None:
    """With deployment "both", disaggregated plans are squares (ringed on the frontier) and labelled with
    both pools; aggregated ones stay circles."""
    body = {"model": "llama-3.1-70b",
            "workload": {"input_tokens": 8000, "output_tokens": 1000, "requests_per_s": 2},
            "slo": {"ttft_ms": 2000, "tpot_ms": 30, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [2, 4], "weight_dtypes": ["fp8"],
                           "kv_dtypes": ["fp8"], "deployment": "both"},
            "simulated_requests": 500}
    answer = client.post("/v1/slo-plan", json=body).json()
    root = chart(client.post(PLAN, json=body))
    pareto = {point["rank"] for point in answer["pareto"]}
    split = [plan for plan in answer["plans"] if plan["deployment"] == "disaggregated"]
    assert split, answer
    split_on_frontier = [plan for plan in split if plan["rank"] in pareto]
    split_others = [plan for plan in split if plan["rank"] not in pareto]
    if split_on_frontier:
        assert len(markers(group(root, "frontier-disaggregated"))) == len(split_on_frontier)
        all_text = texts(root)
        for plan in split_on_frontier:
            prefill, decode = plan["disaggregation"]["prefill"], plan["disaggregation"]["decode"]
            assert (f"#{plan['rank']}: {prefill['workers']} x {prefill['gpu']} {prefill['layout']} "
                    f"prefill + {decode['workers']} x {decode['gpu']} {decode['layout']} decode "
                    f"{plan['weight_dtype']}, ${plan['cost_per_hour_usd']:,.2f}/h") in all_text
    if split_others:
        assert len(markers(group(root, "plans-disaggregated"))) == len(split_others)
