"""Write openapi/openapi.json from the application's schema (`make openapi`).

Deterministic: sorted keys, 2-space indent, UTF-8, one trailing newline. The contract test
(tests/contract/test_openapi_snapshot.py) fails when the committed file differs from the served spec.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "openapi" / "openapi.json"


def served_spec() -> dict[str, Any]:
    """The spec the application serves at /openapi.json (independent of the database)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings(database_url="sqlite://")).openapi()


def render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render(served_spec()), encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
