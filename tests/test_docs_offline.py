"""The documentation pages work without internet access.

Swagger UI (/docs) and ReDoc (/redoc) load their JavaScript and CSS from the service itself. The
browser test serves the app on loopback and loads each page in headless Chromium with every other
host unreachable: names resolve to nothing and all non-loopback traffic goes to a dead proxy. The
page counts only if the operations are rendered, which needs the script to have run.
"""

from __future__ import annotations

import re
import subprocess
import tempfile

import pytest
from fastapi.testclient import TestClient

# Nothing but loopback: no name resolves, and anything not on loopback goes to a closed port.
OFFLINE_FLAGS = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1")


def rendered_dom(browser: str, url: str) -> str:
    """The page's DOM after its scripts ran (virtual time lets them finish without waiting)."""
    with tempfile.TemporaryDirectory() as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                   *OFFLINE_FLAGS, "--virtual-time-budget=15000", "--dump-dom", url]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


def operation_ids(client: TestClient) -> set[str]:
    spec = client.get("/openapi.json").json()
    return {operation["operationId"] for item in spec["paths"].values() for operation in item.values()}


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_pages_reference_only_the_service(client: TestClient, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200
    references = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert references, page.text
    assert [ref for ref in references if "//" in ref] == []  # every asset is a path on this service
    for ref in references:
        if ref.startswith("/docs/assets/"):
            asset = client.get(ref)
            assert asset.status_code == 200, ref
            assert len(asset.content) > 1000, ref


def test_swagger_ui_lists_the_operations_offline(client: TestClient, live_url: str, browser: str) -> None:
    dom = rendered_dom(browser, f"{live_url}/docs")
    spec = client.get("/openapi.json").json()
    paths = set(re.findall(r'data-path="([^"]+)"', dom))
    assert paths == set(spec["paths"]), paths ^ set(spec["paths"])
    assert dom.count('class="opblock opblock-') == len(operation_ids(client))


def test_redoc_lists_the_operations_offline(client: TestClient, live_url: str, browser: str) -> None:
    dom = rendered_dom(browser, f"{live_url}/redoc")
    # ReDoc anchors each operation as .../operation/<operationId>.
    rendered = set(re.findall(r'id="[^"]*operation/([a-z_]+)"', dom))
    assert rendered == operation_ids(client)
