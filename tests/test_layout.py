"""The package's layout as docs/design.md states it, held over the import graph that ``ast`` reads
from every module (TYPE_CHECKING and function-local imports counted too): no cycle between modules
or between rooms, and each room's never-import rule."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gru4rec"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's gru4rec modules, from every import statement in it."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names if a.name.split(".")[0] == "gru4rec")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] == "gru4rec":
                    deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else resolve(base) for a in node.names)
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    graph = _imports(_modules())
    assert "gru4rec.training.batching" in graph["gru4rec.training.loop"]  # the graph sees imports
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _room(module: str) -> str:
    """The room a module lives in: its folder under ``gru4rec``, or the root module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gru4rec"


def _room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for name, deps in graph.items():
        rooms.setdefault(_room(name), set()).update(_room(d) for d in deps if _room(d) != _room(name))
    return rooms


def _importers(graph: dict[str, set[str]], room: str) -> set[str]:
    """The rooms whose modules import ``room``."""
    return {_room(name) for name, deps in graph.items() for d in deps if _room(d) == room and _room(name) != room}


def test_rooms_form_no_cycle() -> None:
    rooms = _room_graph(_imports(_modules()))
    assert {"machine", "config", "formats", "network", "tracking", "fitting", "training"} <= set(rooms)  # the rooms are seen
    assert _cycles(rooms) == []


def test_the_library_never_imports_the_commands() -> None:
    """``cli`` is the top; ``tune``, ``report`` and ``serve`` are used by the commands (and by each
    other: the study report reads tune's storage), never by the library."""
    graph = _imports(_modules())
    assert _importers(graph, "cli") <= {"__main__"}
    for room in ("tune", "report", "serve"):
        assert _importers(graph, room) <= {"cli", "tune", "report", "serve"}, room


def test_training_never_imports_what_sits_above_it() -> None:
    graph = _imports(_modules())
    for name, deps in graph.items():
        if _room(name) == "training":
            above = {d for d in deps if _room(d) in ("evaluation", "fitting", "recommender", "tracking", "cli", "tune", "serve")}
            assert not above, name


def test_evaluation_uses_only_the_slot_assignment_of_training() -> None:
    graph = _imports(_modules())
    for name, deps in graph.items():
        if _room(name) == "evaluation":
            assert {d for d in deps if _room(d) == "training"} <= {"gru4rec.training.batching"}, name


def test_a_room_rule_fails_on_a_back_arrow() -> None:
    """The checks above can fail: a made-up library module that imports a command is caught."""
    graph = {"gru4rec.data.events": {"gru4rec.cli.train"}, "gru4rec.cli.train": {"gru4rec.data.events"}}
    assert _importers(graph, "cli") == {"data"}
    assert _cycles(_room_graph(graph)) == [["cli", "data"]]


def test_kernels_do_not_import_training() -> None:
    graph = _imports(_modules())
    for name, deps in graph.items():
        if name.startswith("gru4rec.kernels"):
            assert not [d for d in deps if d.startswith("gru4rec.training")], name
