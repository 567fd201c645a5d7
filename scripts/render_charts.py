"""Render each chart endpoint's example to docs/charts/<name>.png through headless Chromium.

`python scripts/render_charts.py` builds a throwaway SQLite database with the real migrations and
the reference catalog, asks the application for each chart (SVG), and screenshots it at 800 x 500 in
Chromium (Debian: `apt-get install chromium`) — what a browser shows, not what matplotlib meant.
tests/test_chart_render.py uses the same requests and the same conversion.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_DIR = ROOT / "docs" / "charts"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WINDOW = "800,500"


@dataclass(frozen=True)
class ChartExample:
    name: str
    path: str  # POSTed with `body`; the query string carries chart options such as the metric
    body: dict[str, Any]


EXAMPLES = (
    ChartExample("roofline", "/v1/roofline/chart",
                 {"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 2048,
                  "tensor_parallel": 4}),
    ChartExample("batch-sweep", "/v1/roofline/batch-sweep/chart",
                 {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128}),
    ChartExample("slo-plan", "/v1/slo-plan/chart?metric=tpot",
                 {"model": "llama-3.1-8b",
                  "workload": {"input_tokens": 1000, "output_tokens": 250, "requests_per_s": 20},
                  "slo": {"ttft_ms": 1000, "tpot_ms": 40, "percentile": 95},
                  "candidates": {"gpus": ["h100-sxm", "h200-sxm", "a100-80gb-sxm", "l40s"],
                                 "weight_dtypes": ["bf16", "fp8"]},
                  "simulated_requests": 500}),
)


def chromium() -> str | None:
    """The headless browser's executable, or None when none is installed."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def svg_to_png(svg: Path, png: Path, browser: str) -> None:
    """Screenshot the SVG as Chromium displays it, in an 800 x 500 window."""
    with tempfile.TemporaryDirectory() as profile:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--force-device-scale-factor=1", f"--user-data-dir={profile}", f"--window-size={WINDOW}",
                   f"--screenshot={png}", svg.resolve().as_uri()]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if completed.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{browser} could not render {svg.name}: {completed.stderr[-2000:]}")


def main() -> int:
    browser = chromium()
    if browser is None:
        print("No Chromium found: apt-get install chromium", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT))
    from alembic import command
    from alembic.config import Config
    from fastapi.testclient import TestClient

    from app.catalog.reference import load_reference_catalog
    from app.db import MIGRATIONS_DIR
    from app.main import create_app
    from app.settings import Settings

    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        app = create_app(Settings(database_url=f"sqlite:///{work}/charts.db", log_level="warning"))
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with app.state.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
        with app.state.session_factory() as session, session.begin():
            load_reference_catalog(session)
        with TestClient(app) as client:
            for example in EXAMPLES:
                response = client.post(example.path, json=example.body)
                if response.status_code != 200:
                    print(f"{example.path}: {response.status_code} {response.text}", file=sys.stderr)
                    return 1
                svg = Path(work) / f"{example.name}.svg"
                svg.write_bytes(response.content)
                png = OUTPUT_DIR / f"{example.name}.png"
                svg_to_png(svg, png, browser)
                print(f"wrote {png.relative_to(ROOT)}")
        app.state.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
