"""The repository's modules outside the package, as the tests that check them import them: the
benchmarks (``benchmarks.train.train_speed``, ...) as modules of their package, the tools
(``tools/docs_check.py``) from their files."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def import_module(name: str) -> ModuleType:
    """The module ``name`` of a package at the repository root (``benchmarks.serve.serve_load``),
    imported as ``python -m`` from the root imports it. The root goes last on ``sys.path`` where
    it is missing (pytest's console script does not put it there): a ``gru4rec`` found earlier
    is this tree's, installed in development mode."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return importlib.import_module(name)


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """The script at ``ROOT/relative`` as a module (registered in ``sys.modules`` under ``name``,
    by default its file name, so that its dataclasses and pickles resolve)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
