"""Reading parameter files: the name→value mapping of a GRU4Rec configuration on disk.

Four formats hold the same mapping of hyperparameter names to values:

* ``.py``, the original implementation's format, ``gru4rec_params = OrderedDict([...])``; it is
  *read*, never executed: the literal is extracted with :mod:`ast`, and a file that holds any
  other code is refused;
* ``.json``: one object;
* ``.toml``: the top-level table, or a single ``[gru4rec_params]`` table;
* ``.yaml``/``.yml``: one mapping (needs PyYAML).

:func:`read_param_file` returns the raw mapping; converting and validating the values is
:class:`gru4rec.config.Config`'s job (``Config.from_file`` does both).
"""
from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from typing import Any

from gru4rec.errors import ConfigError

__all__ = ["read_param_file"]


def read_param_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw name→value mapping of a parameter file (not yet converted or validated).

    ``.py``: the original's format, read with :mod:`ast` and never executed; ``.json``: an
    object; ``.toml``: the top-level table (or a ``[gru4rec_params]`` table); ``.yaml``/``.yml``:
    a mapping (needs PyYAML). Raises ConfigError naming the file for a missing file, bad syntax
    or content of the wrong shape.
    """
    file = Path(path)
    label = f"param file '{path}'"
    if not file.is_file():
        reason = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigError(f"{label} {reason}")
    suffix = file.suffix.lower()
    readers = {".py": _read_py, ".json": _read_json, ".toml": _read_toml, ".yaml": _read_yaml, ".yml": _read_yaml}
    if suffix not in readers:
        raise ConfigError(f"{label}: unknown format {suffix!r}; use .py (OrderedDict), .json, .toml or .yaml")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{label} cannot be read: {exc.strerror or exc}") from None
    params = readers[suffix](data, label)
    if not isinstance(params, dict):
        raise ConfigError(f"{label}: expected a mapping of parameter names to values, got {type(params).__name__}")
    return params


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label} is not UTF-8 text: {exc}") from None


def _read_json(data: bytes, label: str) -> Any:
    try:
        return json.loads(_decode(data, label))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{label} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


def _read_toml(data: bytes, label: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ConfigError(f"{label}: reading TOML on Python < 3.11 needs tomli (pip install tomli)") from None
    try:
        table = tomllib.loads(_decode(data, label))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label} is not valid TOML: {exc}") from None
    if set(table) == {"gru4rec_params"} and isinstance(table["gru4rec_params"], dict):
        return table["gru4rec_params"]
    return table


def _read_yaml(data: bytes, label: str) -> Any:
    try:
        import yaml  # optional dependency
    except ModuleNotFoundError:
        raise ConfigError(f"{label}: reading YAML needs PyYAML (pip install pyyaml), or use .json/.toml") from None
    try:
        return yaml.safe_load(_decode(data, label))  # safe_load builds plain data only
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} is not valid YAML: {exc}") from None


# The original's param files: imports, an optional docstring, and one assignment
#     gru4rec_params = OrderedDict([('loss', 'bpr-max'), ('layers', [512]), ...])
# The value is a literal, so it is extracted without running anything.
_PY_TARGET = "gru4rec_params"
_PY_CONSTRUCTORS = ("OrderedDict", "collections.OrderedDict", "dict")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _read_py(data: bytes, label: str) -> dict[str, Any]:
    source = _decode(data, label)
    try:
        tree = ast.parse(source, filename=label)
    except SyntaxError as exc:
        raise ConfigError(f"{label} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    value_node: ast.expr | None = None
    foreign: ast.stmt | None = None  # first statement that is neither an import nor the literal
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue  # the usual 'from collections import OrderedDict'; nothing is imported here
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # docstring or comment-like string
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        if isinstance(target, ast.Name) and target.id == _PY_TARGET and value is not None:
            if value_node is not None:
                raise ConfigError(f"{label} assigns {_PY_TARGET} more than once (line {statement.lineno})")
            value_node = value
            continue
        foreign = foreign or statement
    if value_node is None:
        raise ConfigError(f"{label} does not define {_PY_TARGET} = OrderedDict([(name, value), ...])")
    if foreign is not None:
        # Code in a param file would run under the original; here nothing runs, so refuse the
        # file rather than silently ignore what its author expected to happen.
        code = ast.get_source_segment(source, foreign) or type(foreign).__name__
        first_line = code.splitlines()[0] if code else ""
        raise ConfigError(
            f"{label}, line {foreign.lineno}: only imports and the assignment "
            f"'{_PY_TARGET} = OrderedDict([...])' are allowed; param files are read, never run "
            f"(found: {first_line[:80]!r}). Use a .json or .toml file for anything else."
        )
    return _py_literal(value_node, label)


def _py_literal(node: ast.expr, label: str) -> dict[str, Any]:
    """The mapping of a dict literal or an ``OrderedDict([...])`` / ``dict(...)`` call."""
    where = f"{label}, line {node.lineno}"
    expected = f"{_PY_TARGET} must be OrderedDict([(name, value), ...]) or a dict literal"

    def literal(item: ast.expr) -> Any:
        try:
            return ast.literal_eval(item)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            code = ast.unparse(item)
            raise ConfigError(f"{label}, line {item.lineno}: {code[:80]!r} is not a literal value") from None

    pairs: list[tuple[Any, Any]] = []
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is None:
                raise ConfigError(f"{where}: '**' unpacking is not allowed in {_PY_TARGET}")
            pairs.append((literal(key), literal(value)))
    elif isinstance(node, ast.Call) and _dotted(node.func) in _PY_CONSTRUCTORS:
        if len(node.args) > 1:
            raise ConfigError(f"{where}: {expected}")
        if node.args:
            items = literal(node.args[0])
            if isinstance(items, dict):
                items = list(items.items())
            if not isinstance(items, (list, tuple)):
                raise ConfigError(f"{where}: {expected}")
            for item in items:
                if not (isinstance(item, (list, tuple)) and len(item) == 2):
                    raise ConfigError(f"{where}: {item!r} is not a (name, value) pair; {expected}")
                pairs.append((item[0], item[1]))
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ConfigError(f"{where}: '**' unpacking is not allowed in {_PY_TARGET}")
            pairs.append((keyword.arg, literal(keyword.value)))
    else:
        raise ConfigError(f"{where}: {expected}")
    params: dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: parameter names must be strings, got {key!r}")
        if key in params:
            raise ConfigError(f"{where}: parameter {key!r} is given more than once")
        params[key] = value
    return params
