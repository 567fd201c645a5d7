"""A browser shows the charts: headless Chromium renders each chart's SVG to an 800 x 500 PNG.

The SVG tests (tests/api/test_charts.py) check what the file says; this checks what a browser makes
of it (fonts, the viewBox scaling, the colours). Chromium is Debian's `chromium` package. Where it is
missing the test is skipped, except in CI (CI=true), where a missing browser is a failure: CI installs
it, so its absence there means the check silently stopped running (the `browser` fixture, tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from matplotlib.image import imread

from scripts.render_charts import EXAMPLES, ChartExample, svg_to_png

# Okabe-Ito colours each chart draws its data in (RGB 0..1): vermillion and blue.
VERMILLION = (0xD5 / 255, 0x5E / 255, 0x00 / 255)
BLUE = (0x00 / 255, 0x72 / 255, 0xB2 / 255)
DATA_COLOURS = {"roofline": (VERMILLION, BLUE), "batch-sweep": (BLUE,), "slo-plan": (VERMILLION,)}


def pixels_near(image: np.ndarray, colour: tuple[float, float, float], tolerance: float = 0.04) -> int:
    return int(np.all(np.abs(image[..., :3] - np.asarray(colour)) < tolerance, axis=-1).sum())


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_chromium_renders_the_chart(client: TestClient, browser: str, tmp_path: Path,
                                    example: ChartExample) -> None:
    response = client.post(example.path, json=example.body)
    assert response.status_code == 200, response.text
    svg = tmp_path / f"{example.name}.svg"
    svg.write_bytes(response.content)
    png = tmp_path / f"{example.name}.png"
    svg_to_png(svg, png, browser)
    assert png.stat().st_size > 10_000  # a blank 800 x 500 PNG compresses to a few hundred bytes
    image = imread(png)
    assert image.shape[:2] == (500, 800)
    white = np.all(image[..., :3] > 0.98, axis=-1)
    dark = np.all(image[..., :3] < 0.3, axis=-1)
    # Mostly white page, but a real drawing: axes, text and data cover a fair share of it.
    assert 0.5 < white.mean() < 0.97, white.mean()
    assert dark.mean() > 0.01, "no text or axes drawn"
    for colour in DATA_COLOURS[example.name]:
        assert pixels_near(image, colour) > 50, f"the data colour {colour} is missing from {example.name}"
    # The drawing fills the window: the viewBox scales 576 x 360 pt to 800 x 500 px. Shown at 1 pt =
    # 4/3 px it would stop at 768 x 480; the x-axis label sits near the bottom edge (~490 px) and the
    # rightmost text or axes past 740 px only once scaled.
    assert np.flatnonzero(dark.any(axis=1)).max() > 480
    assert np.flatnonzero(dark.any(axis=0)).max() > 740
