"""The compiled build (setup.py, app/compiled.py): the modules it compiles are the ones this checkout runs,
built from the bytes of their .py files now, and a module whose .py changed since its build runs as the .py."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from app import compiled
from app.compiled import COMPILED_MODULES, REBUILD, SOURCES_MANIFEST

ROOT = Path(__file__).resolve().parents[2]
BUILT = any(compiled.extension_path(module) for module in COMPILED_MODULES)
# CI installs with the compiler (make test): there a missing build is a failure, not a skip.
needs_a_build = pytest.mark.skipif(not BUILT and not os.environ.get("CI"),
                                   reason="a pure-Python install (SIZING_PURE_PYTHON=1): nothing compiled to check")


def test_the_makefile_rebuilds_when_a_compiled_source_changes() -> None:
    listed = re.search(r"^COMPILED_SOURCES := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert listed, "the Makefile lists the compiled sources"
    assert sorted(listed.group(1).split()) == sorted(
        str(compiled.source_path(module).relative_to(ROOT)) for module in COMPILED_MODULES)


@needs_a_build
def test_this_checkout_runs_its_compiled_modules_built_from_their_sources_now() -> None:
    assert compiled.stale_modules() == [], f"the compiled build is out of date; {REBUILD}"
    assert compiled.running_compiled() == dict.fromkeys(COMPILED_MODULES, True), \
        f"the compiled modules are not installed; {REBUILD}"


def _fake_build(root: Path, module: str, source: bytes, built_from: bytes | None) -> None:
    """A module's .py, an extension file beside it, and a manifest naming the bytes it was built from."""
    path = compiled.source_path(module, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source)
    path.with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    if built_from is not None:
        manifest = {module: hashlib.sha256(built_from).hexdigest()}
        (root / "app" / SOURCES_MANIFEST).write_text(json.dumps(manifest))


def test_a_module_is_stale_when_its_source_is_not_what_was_compiled(tmp_path: Path) -> None:
    module = "app.sizing.serving.scheduler"
    _fake_build(tmp_path, module, b"x = 1\n", built_from=b"x = 1\n")
    assert compiled.stale_modules(tmp_path, [module]) == []
    compiled.source_path(module, tmp_path).write_bytes(b"x = 2\n")  # edited after the build
    assert compiled.stale_modules(tmp_path, [module]) == [module]
    (tmp_path / "app" / SOURCES_MANIFEST).unlink()  # an extension nothing vouches for
    assert compiled.stale_modules(tmp_path, [module]) == [module]
    compiled.extension_path(module, tmp_path).unlink()  # no extension: the .py runs anyway
    assert compiled.stale_modules(tmp_path, [module]) == []


_PROBE = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import app.compiled
from types import SimpleNamespace
from app.catalog.reference import gpu_spec_from_record, model_spec_from_record, reference_gpu_rows, reference_model_rows
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.serving.simulate import SchedulerConfig, simulate
from app.sizing.serving.workload import Fixed, LogNormal, Workload
model = next(model_spec_from_record(SimpleNamespace(**row)) for row in reference_model_rows()
             if row["slug"] == "gemma-2-27b")
gpu = next(gpu_spec_from_record(SimpleNamespace(**row)) for row in reference_gpu_rows() if row["slug"] == "h100-sxm")
steps = build_step_time_model(model, gpu, tensor_parallel=2, weight_dtype="bf16", kv_dtype="bf16")
result = simulate(steps, SchedulerConfig(30_000), workload=Workload(LogNormal(mean=3000, p50=2000), Fixed(300),
                  requests_per_s=6.0), num_requests=300, seed=1)
print(json.dumps({"compiled": app.compiled.running_compiled(), "warnings": [str(w.message) for w in caught],
                  "preemptions": result.preemptions,
                  "answer": [float(x).hex() for x in (*result.first_token_s, *result.finish_s)]}))
"""


def _probe(tree: Path) -> dict:
    """Import the service's code from `tree` alone (no editable install: -S) and simulate a windowed model."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), sysconfig.get_paths()["purelib"]])}
    done = subprocess.run([sys.executable, "-S", "-c", _PROBE], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_a_build
def test_an_edited_module_runs_from_its_source_with_the_same_answers(tmp_path: Path) -> None:
    """A copy of the built tree runs compiled; after an edit to one compiled .py it runs every compiled module
    as its .py, warns naming the rebuild, and answers the same to the last bit."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    built = _probe(tmp_path)
    assert built["compiled"] == dict.fromkeys(COMPILED_MODULES, True) and built["warnings"] == []
    assert built["preemptions"] > 0  # the run exercises the scheduler's harder paths
    with compiled.source_path(COMPILED_MODULES[0], tmp_path).open("a") as source:
        source.write("\n# edited after the build\n")
    edited = _probe(tmp_path)
    assert edited["compiled"] == dict.fromkeys(COMPILED_MODULES, False)
    assert len(edited["warnings"]) == 1 and COMPILED_MODULES[0] in edited["warnings"][0]
    assert "make venv" in edited["warnings"][0]
    assert edited["answer"] == built["answer"]
