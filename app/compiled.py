"""The modules the build compiles with mypyc, and the guard that never runs one built from other source.

The build (setup.py) compiles `COMPILED_MODULES` into extension modules next to their .py files and
writes `SOURCES_MANIFEST` into the package: the SHA-256 of the .py bytes each was compiled from. Python
imports an extension in preference to the .py beside it, so after an edit of a compiled module's .py and
no rebuild the old machine code would run. `install_guard()`, which `app/__init__.py` runs before any
core module is imported, compares the manifest with the sources: when a compiled module's extension is
present and its .py is not the one it was built from (or the manifest does not vouch for it), every
compiled module is imported from its .py instead (they are built as one group that calls itself
natively) and a RuntimeWarning names the rebuild. `make` rebuilds when these sources change, and
tests/structure/test_compiled.py fails when a checkout runs them uncompiled or stale.

Standard library only: setup.py reads this file before anything is installed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED_MODULES = ("app.sizing.hardware.step_scalar", "app.sizing.serving.scheduler")
# The extension the group's shared code lives in (mypyc names it after the group).
GROUP_NAME = "app.sizing.native"
SOURCES_MANIFEST = "compiled-sources.json"
REBUILD = "rebuild it: `make venv`, or `pip install -e .`"

ROOT = Path(__file__).resolve().parent.parent  # the folder that holds app/


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_path(module: str, root: Path = ROOT) -> Path | None:
    """The compiled module's extension file, if one was built there."""
    source = source_path(module, root)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.is_file():
            return candidate
    return None


def built_digests(root: Path = ROOT) -> dict[str, str]:
    """What the last build compiled: module -> SHA-256 of its .py bytes (empty without a build)."""
    try:
        return json.loads((root / "app" / SOURCES_MANIFEST).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def stale_modules(root: Path = ROOT, modules: Sequence[str] = COMPILED_MODULES) -> list[str]:
    """Compiled modules whose extension was not built from the bytes of their .py now."""
    built = built_digests(root)
    return [module for module in modules
            if extension_path(module, root) is not None and source_path(module, root).is_file()
            and built.get(module) != source_digest(source_path(module, root))]


def running_compiled(modules: Sequence[str] = COMPILED_MODULES) -> dict[str, bool]:
    """Whether each compiled module, once imported, runs from its extension (True) or its .py."""
    loaded: dict[str, ModuleType] = {module: sys.modules.get(module) or importlib.import_module(module)
                                     for module in modules}
    return {module: Path(loaded[module].__file__ or "").suffix not in (".py", ".pyc") for module in modules}


class _FromSource(importlib.abc.MetaPathFinder):
    """Imports the named modules from their .py files, ahead of the extensions beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def install_guard(root: Path = ROOT) -> list[str]:
    """Fall back to the .py of every compiled module when any is stale; return the stale ones."""
    stale = stale_modules(root)
    if stale:
        sys.meta_path.insert(0, _FromSource({module: source_path(module, root) for module in COMPILED_MODULES}))
        warnings.warn(f"{', '.join(stale)}: the compiled build is of other source bytes, so the compiled modules "
                      f"run as plain Python (slower, same answers); {REBUILD}", RuntimeWarning, stacklevel=2)
    return stale
