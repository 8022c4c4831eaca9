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
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(n for n in _imported_modules(path) if n.startswith("gru4rec.cli"))
        for path in (PACKAGE / "tune").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


# ------------------------------------------------------------------ every flag agrees with its field

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import typing  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from gru4rec import cli  # noqa: E402
from gru4rec.cli.common import FLAG, Flag, add_flags, field_default, flag, not_a_flag, settings_flags  # noqa: E402

#: Destinations every parser has that are no command's setting (help, --debug, -q/-v, the name).
GLOBAL_DESTS = {"help", "version", "debug", "quiet", "verbose", "command", "_command"}
#: Names of Literal types of strings in the settings' annotations (checked against the flag's choices).
STRING_LITERALS = {"TieMode"}


def _members(annotation: str) -> list[str]:
    """The members of a (string) annotation's top-level union: ``int | None`` -> int, None."""
    members, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            members.append(annotation[start:i].strip())
            start = i + 1
    return [*members, annotation[start:].strip()]


def _value_type(action: argparse.Action) -> str:
    """The name of the type of one value the flag parses."""
    if action.type is None:
        return "str"
    hints = typing.get_type_hints(action.type) if not isinstance(action.type, type) else {}
    kind = action.type if isinstance(action.type, type) else hints.get("return")
    return getattr(kind, "__name__", str(kind))


def mismatches(parser: argparse.ArgumentParser, cls: type[Any], flags: Mapping[str, Flag | None] | None = None) -> list[str]:
    """Every way ``parser``'s flags and the settings dataclass ``cls`` disagree: a flag without a
    field of its destination's name, a field that no flag sets (unless declared no flag), a
    default or a value type that differs."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    specs = settings_flags(cls, flags)
    explicit = {name for name, f in fields.items() if FLAG in f.metadata} | set(flags or ())
    # The flags every command shares (-q, -v, ...) are a setting where the settings have a field of their name.
    actions = {a.dest: a for a in parser._actions if a.dest not in GLOBAL_DESTS or a.dest in fields}
    problems = [f"flag {'/'.join(a.option_strings) or a.dest}: {cls.__name__} has no field {dest!r}"
                for dest, a in actions.items() if dest not in fields]
    for name, field in fields.items():
        spec = specs.get(name)
        action = actions.get(name)
        if action is None:
            if spec is not None or name not in explicit:
                problems.append(f"field {name}: no flag sets it (declare it not_a_flag() if none should)")
            continue
        if name in explicit and spec is None:
            problems.append(f"field {name}: declared no flag, but {'/'.join(action.option_strings)} sets it")
            continue
        if spec is not None and tuple(action.option_strings) != spec.names:
            problems.append(f"field {name}: declared as {spec.names}, parsed as {tuple(action.option_strings)}")
        problems += _default_problems(name, field, action, spec) + _type_problems(name, field, action)
    return problems


def _default_problems(name: str, field: dataclasses.Field[Any], action: argparse.Action, spec: Flag | None) -> list[str]:
    """The flag's default is the field's (after the conversion settings_from applies)."""
    default = field_default(field)
    if action.default is argparse.SUPPRESS:  # a shared flag (-q, -v): its default is the main parser's
        return []
    if default is dataclasses.MISSING:
        # A field without a default: its flag is required, or its default lives in the library
        # (imported only when the command runs), declared there once.
        if action.option_strings and not action.required and action.default is None:
            return [f"field {name}: no default, and its flag's is None"]
        return []
    parsed = action.default
    if spec is not None and spec.convert is not None:
        parsed = spec.convert(parsed)
    elif isinstance(parsed, list) and isinstance(default, tuple):
        parsed = tuple(parsed)
    if parsed != default or type(parsed) is not type(default):
        return [f"field {name}: default {default!r}, its flag's {action.default!r}"]
    return []


def _type_problems(name: str, field: dataclasses.Field[Any], action: argparse.Action) -> list[str]:
    """What the flag parses is what the field's annotation holds."""
    members = [m for m in _members(str(field.type)) if m != "None"]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        wanted, many = "bool", False
    else:
        wanted = _value_type(action)
        many = isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*") or isinstance(action.nargs, int)
    choices = set(action.choices) if action.choices is not None else None
    ok = False
    for member in members:
        origin, _, inner = member.partition("[")
        inner = inner.removesuffix("]")
        if many:
            ok |= origin in ("list", "tuple") and inner.split(",")[0].strip() == wanted
        elif origin == "Literal":  # its values are the flag's choices
            ok |= choices is not None and choices == set(ast.literal_eval(f"[{inner}]"))
        else:
            ok |= origin == wanted or (wanted == "str" and choices is not None and origin in STRING_LITERALS)
    problems = [] if ok else [f"field {name}: {field.type}, its flag parses {'a list of ' if many else ''}{wanted}"]
    return problems + [f"field {name}: choice {c!r} of its flag is not a {wanted}"
                       for c in action.choices or () if type(c).__name__ != wanted]


def subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser(name)
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name]  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_flag_of_every_command_agrees_with_its_settings_field(name: str) -> None:
    if name == "paropt":
        pytest.importorskip("optuna")
    settings = cli.COMMANDS[name].settings()
    assert settings is not None, f"gru4rec {name} declares no settings dataclass"
    assert mismatches(subparser(name), settings.cls, settings.flags) == []


def test_run_py_and_paropt_py_agree_with_their_settings() -> None:
    from gru4rec.cli import run_py

    assert mismatches(run_py.build_parser(), run_py.RunPySettings) == []
    pytest.importorskip("optuna")
    from gru4rec.cli import paropt

    assert mismatches(paropt.build_parser(), paropt.ParoptSettings, paropt.flags(original=True)) == []


def test_a_flag_and_a_field_that_disagree_are_found() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Toy:
        data: str = flag(help="data", metavar="DATA")
        epochs: int = flag("-e", "--epochs", default=10, type=int, help="epochs")
        rate: float = 0.1
        seeds: tuple[int, ...] = ()
        names: list[str] = dataclasses.field(default_factory=list)
        command_line: list[str] | None = not_a_flag()

    derived = argparse.ArgumentParser()
    add_flags(derived, Toy)
    derived.add_argument("--rate", type=float, default=0.1)
    derived.add_argument("--seeds", type=int, nargs="*", default=[])
    derived.add_argument("--names", action="append", default=[])
    assert mismatches(derived, Toy) == []
    assert vars(derived.parse_args(["D", "-e", "3"])) == {"data": "D", "epochs": 3, "rate": 0.1, "seeds": [], "names": []}

    by_hand = argparse.ArgumentParser()
    by_hand.add_argument("data")
    by_hand.add_argument("-e", "--epochs", type=int, default=20)       # another default
    by_hand.add_argument("--rate", type=int, default=0.1)              # another type
    by_hand.add_argument("--seed", type=int, nargs="*", default=[])    # another name
    by_hand.add_argument("--command-line")                             # declared no flag
    assert mismatches(by_hand, Toy) == [
        "flag --seed: Toy has no field 'seed'",
        "field epochs: default 10, its flag's 20",
        "field rate: float, its flag parses int",
        "field seeds: no flag sets it (declare it not_a_flag() if none should)",
        "field names: no flag sets it (declare it not_a_flag() if none should)",
        "field command_line: declared no flag, but --command-line sets it",
    ]
