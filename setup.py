"""The build: the package as plain Python, plus the simulator's hot modules compiled with mypyc.

`app.compiled.COMPILED_MODULES` (the scheduler's event loop and the step-time model's scalar path) are
compiled into extension modules beside their .py files, which stay valid Python and ship too. The build
also writes `app/compiled-sources.json`, the SHA-256 of the bytes each module was compiled from, which the
import guard (app/compiled.py) checks so that an edited .py never runs as its old extension.

The compiler is required: without a working C compiler and the Python headers the install fails with a
message saying so. `SIZING_PURE_PYTHON=1` installs without compiling (the same answers, whole-catalog
plans about three times slower).
"""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import ClassVar

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
GUARD = runpy.run_path(str(ROOT / "app" / "compiled.py"))
MODULES: tuple[str, ...] = GUARD["COMPILED_MODULES"]
PURE_PYTHON = os.environ.get("SIZING_PURE_PYTHON", "") not in ("", "0")


def _relative_source(module: str) -> str:
    return str(GUARD["source_path"](module, ROOT).relative_to(ROOT))


def _digests() -> dict[str, str]:
    return {module: GUARD["source_digest"](GUARD["source_path"](module, ROOT)) for module in MODULES}


class BuildCompiled(build_ext):
    """build_ext that fails with a message a person can act on, and records what it compiled."""

    digests: ClassVar[dict[str, str]] = {}

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # CompileError, LinkError, a missing gcc (DistutilsExecError, OSError)
            raise SystemExit(
                f"llm-sizing: compiling {', '.join(MODULES)} with mypyc failed: {error}\n"
                "Install a C compiler and the Python headers (Debian: apt-get install gcc python3-dev), or "
                "install without compiling: SIZING_PURE_PYTHON=1 (same answers, plans about 3x slower).") from error
        if self.extensions:
            manifest = Path(self.get_ext_fullpath("app.manifest")).parent / GUARD["SOURCES_MANIFEST"]
            manifest.write_text(json.dumps(self.digests, indent=1, sort_keys=True) + "\n")


def _extensions() -> list:
    if PURE_PYTHON:
        return []
    from mypyc.build import mypycify

    before = _digests()
    # Imported modules are type-checked only as far as the compiled ones need: errors in them do not fail
    # the build (the compiled modules' own do). Installed packages (numpy) are not looked at, so every build
    # compiles the same code whether or not the environment already has them (a fresh venv builds the
    # package before installing its dependencies): they are typed Any, which is how compiled code calls
    # them anyway. opt_level 3 is mypyc's default, stated.
    options = ["--follow-imports=silent", "--no-site-packages", "--ignore-missing-imports"]
    extensions = mypycify([*options, *map(_relative_source, MODULES)], opt_level="3", group_name=GUARD["GROUP_NAME"])
    if _digests() != before:
        raise SystemExit("llm-sizing: a compiled module's source changed while it was being compiled; build again")
    BuildCompiled.digests = before
    return extensions


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCompiled})
