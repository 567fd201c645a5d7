"""The code's layout rules (docs/ARCHITECTURE.md): the core is pure, each engine's rules live in its own
module behind one protocol, and modules stay small unless they say why."""

from __future__ import annotations

import ast
import inspect
import types
import typing
from pathlib import Path

import pytest

from app.sizing import engines
from app.sizing.engines.base import Engine

APP = Path(__file__).resolve().parents[2] / "app"
CORE = APP / "sizing"

# The core answers sizing questions with arithmetic alone: no web, database, validation, settings,
# logging, clock or randomness from outside (the simulator's randomness is a seeded numpy generator).
FORBIDDEN_IN_CORE = ("fastapi", "starlette", "sqlalchemy", "pydantic", "pydantic_settings", "alembic",
                     "httpx", "uvicorn", "logging", "time", "datetime", "random", "os")
MAX_MODULE_LINES = 600
SIZE_REASON = "Longer than 600 lines because"


def _modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _imported(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", _modules(CORE), ids=lambda path: str(path.relative_to(APP)))
def test_the_core_imports_only_the_core_and_the_standard_numeric_stack(path: Path) -> None:
    for name in _imported(path):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_IN_CORE, f"{path.name} imports {name}"
        if top == "app":
            assert name == "app.sizing" or name.startswith("app.sizing."), f"{path.name} imports {name}"


def test_the_forbidden_list_catches_a_web_import(tmp_path: Path) -> None:
    """The rule above can fail: a module importing FastAPI is caught."""
    module = tmp_path / "leaky.py"
    module.write_text("from fastapi import APIRouter\nimport app.settings\n")
    assert [name.split(".")[0] for name in _imported(module)] == ["fastapi", "app"]
    assert "fastapi" in FORBIDDEN_IN_CORE


PROTOCOL_MEMBERS = sorted(
    name for name in {*Engine.__annotations__, *vars(Engine)}
    if not name.startswith("_"))


def test_the_protocol_has_the_members_the_callers_use() -> None:
    assert PROTOCOL_MEMBERS == sorted([
        "covered_versions", "default_version", "default_version_source", "defaults", "disaggregation_env", "disaggregation_notes",
        "disaggregation_router", "divides_limits_by_dp",
        "disaggregation_words", "gpu_vendors", "graphs_prefill_steps", "kv_allocation", "kv_dtype", "kv_transfer_over_nvlink",
        "launch_notes", "launch_words",
        "layout_problems",
        "mixes_prefill_into_decode", "moe_exchange", "name", "overlaps_host_work", "overlaps_host_work_in_pipeline",
        "pipeline_split",
        "overlaps_host_work_in_prefill_pool",
        "published_checkpoints", "published_decode_worker_block", "running_limit",
        "speculative_flags", "start_refusals", "utilization_of"])


@pytest.mark.parametrize("name", sorted(engines.ENGINES))
def test_every_engine_implements_the_whole_protocol(name: str) -> None:
    engine = engines.ENGINES[name]
    assert engine.name == name
    hints = typing.get_type_hints(Engine)
    for member in PROTOCOL_MEMBERS:
        assert hasattr(engine, member), f"{name} lacks {member}"
        if member in hints:  # a data attribute: its value has the declared type
            origin = typing.get_origin(hints[member])  # tuple[...] -> tuple; int | None -> UnionType
            declared = typing.get_args(hints[member]) if origin is types.UnionType else origin or hints[member]
            assert isinstance(getattr(engine, member), declared), f"{name}.{member}"
        else:  # a method: same parameters as the protocol's
            expected = list(inspect.signature(getattr(Engine, member)).parameters)[1:]
            assert list(inspect.signature(getattr(engine, member)).parameters) == expected, f"{name}.{member}"
    module = type(engine).__module__
    assert module == f"app.sizing.engines.{name}", f"{name}'s rules live in {module}"


def test_the_api_offers_exactly_the_registered_engines() -> None:
    from app.estimates.capacity_schemas import Engine as CapacityEngine
    from app.planning.schemas import Engine as PlanEngine

    assert set(typing.get_args(CapacityEngine)) == set(engines.ENGINES) == set(typing.get_args(PlanEngine))


ENGINE_NAMES = set(engines.ENGINES)


def _engine_name_tests(path: Path) -> list[int]:
    """Lines comparing something to an engine's name (`x == "sglang"`, `x in ("vllm", ...)`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                if any(isinstance(value, ast.Constant) and value.value in ENGINE_NAMES for value in values):
                    lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", [path for path in _modules(APP) if CORE / "engines" not in path.parents],
                         ids=lambda path: str(path.relative_to(APP)))
def test_no_code_outside_the_engine_modules_tests_an_engines_name(path: Path) -> None:
    assert _engine_name_tests(path) == [], f"{path.relative_to(APP)} branches on an engine name"


def test_the_engine_name_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "branchy.py"
    module.write_text('if engine == "sglang":\n    pass\nif name in ("vllm", "x"):\n    pass\n')
    assert _engine_name_tests(module) == [1, 3]


@pytest.mark.parametrize("path", _modules(APP), ids=lambda path: str(path.relative_to(APP)))
def test_a_long_module_says_why(path: Path) -> None:
    text = path.read_text()
    if len(text.splitlines()) > MAX_MODULE_LINES:
        docstring = ast.get_docstring(ast.parse(text)) or ""
        assert SIZE_REASON in docstring, f"{path.relative_to(APP)} is over {MAX_MODULE_LINES} lines"
