"""The README's curl commands run as written against a live server on loopback.

Every ```bash block of README.md that calls curl runs in bash (errexit, pipefail) from a scratch
folder that has the repository's examples/, with the README's `$KEY` set to a write key. curl
itself is wrapped only to connect `localhost:8000` to the test server's port and to fail on an HTTP
error (`--fail-with-body`), so a command that answers 4xx or 5xx fails the test. The other blocks
(`make run`/`make test`, docker) are what CI and tests/test_deployment_files.py exercise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import TEST_API_KEY

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCED_BASH = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def curl_blocks() -> list[str]:
    return [block for block in FENCED_BASH.findall(README.read_text(encoding="utf-8")) if "curl " in block]


BLOCKS = curl_blocks()


@pytest.fixture(scope="module")
def curl() -> str:
    found = shutil.which("curl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("curl is not installed; CI must install it (apt-get install -y curl)")
        pytest.skip("curl is not installed: the README's commands were not run")
    return found


def test_the_readme_has_the_curl_examples_the_tests_run() -> None:
    # The catalog, round trip, kv-cache, roofline, three capacity (TP, DP + EP, disaggregated), two slo-plan,
    # quotes, validate and chart blocks.
    assert len(BLOCKS) == 12, [block.splitlines()[0] for block in BLOCKS]
    named = set(re.findall(r"@(examples/[\w.-]+)", "\n".join(BLOCKS)))
    assert named == {"examples/my-h100.json", "examples/config.json", "examples/slo-plan-request.json",
                     "examples/calibration-sample.csv"}
    for path in named:
        assert (ROOT / path).is_file(), path


@pytest.mark.parametrize("block", BLOCKS, ids=[block.split("\n")[0][:60] for block in BLOCKS])
def test_the_readme_commands_run_as_written(block: str, curl: str, live_url: str, fresh_catalog: None,
                                            tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    port = urlsplit(live_url).port
    prelude = ("set -euo pipefail\n"
               f'curl() {{ "{curl}" --fail-with-body --show-error --connect-to localhost:8000:127.0.0.1:{port} "$@"; }}\n')
    completed = subprocess.run(["bash", "-c", prelude + block], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120, check=False, env={**os.environ, "KEY": TEST_API_KEY})
    assert completed.returncode == 0, f"{block}\nstdout: {completed.stdout[-3000:]}\nstderr: {completed.stderr[-3000:]}"
    assert completed.stdout or list(tmp_path.glob("*.svg")), block


def test_the_readme_figures_are_the_services(curl: str, live_url: str, fresh_catalog: None) -> None:
    """The KV-cache figures the README quotes for its example: Llama-3-70B, 8,192 tokens, batch 32.
    By hand: 2 (K, V) x 8 KV heads x 128 head_dim x 2 bytes x 80 layers = 327,680 B per token;
    x 8,192 = 2,684,354,560 B per sequence; x 32 = 85,899,345,920 B."""
    [block] = [block for block in BLOCKS if "/v1/kv-cache" in block]
    text = README.read_text(encoding="utf-8")
    assert "`bytes_per_sequence` 2,684,354,560 (327,680 B/token), `total_bytes` 85,899,345,920" in text
    port = urlsplit(live_url).port
    command = block.replace("curl -s", f"{curl} -s --connect-to localhost:8000:127.0.0.1:{port}")
    answer = json.loads(subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                                       check=True).stdout)
    assert (answer["bytes_per_sequence"], answer["total_bytes"]) == (2_684_354_560, 85_899_345_920)
    assert answer["bytes_per_sequence"] / 8192 == 327_680
