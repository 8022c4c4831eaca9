"""The command line's declarations: the library (here :mod:`gru4rec.tune`) never imports
:mod:`gru4rec.cli`, and every parser flag agrees with the settings field it fills."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gru4rec"


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (function-local ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return names


def test_the_search_never_imports_the_command_line() -> None:
    # tune/__main__.py is an entry point (python -m gru4rec.tune), like paropt.py: it may.
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(n for n in _imported_modules(path) if n.startswith("gru4rec.cli"))
        for path in (PACKAGE / "tune").rglob("*.py") if path.name != "__main__.py"
    }
    assert {k: v for k, v in offenders.items() if v} == {}
