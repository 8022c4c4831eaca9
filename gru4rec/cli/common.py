"""What the subcommands share: exit codes, usage errors, argument types, the common flags, the
checks made before any work starts, and loading a model.

Nothing here imports torch or pandas at import time: ``gru4rec --help`` stays fast.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gru4rec.errors import OutputPathError
from gru4rec.files import atomic_write, check_output_path

if TYPE_CHECKING:  # the heavy imports happen inside load_model
    from _typeshed import DataclassInstance

    from gru4rec.data import ItemMap
    from gru4rec.evaluation.metrics import TieMode
    from gru4rec.inference import SessionModel
    from gru4rec.recommender import GRU4Rec

__all__ = [
    "DEVICE_FLAG",
    "EVAL_MODES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Interrupted",
    "MODEL_FILE_EXAMPLE",
    "PROG",
    "UsageError",
    "ColumnFlags",
    "EvalFlags",
    "FLAG",
    "Flag",
    "MachineFlags",
    "column_flags",
    "flag_field",
    "eval_test_flag",
    "FORCE_FLAG",
    "PRECISION_FLAG",
    "THREADS_FLAG",
    "add_flags",
    "check_readable",
    "check_writable_target",
    "declared_flag",
    "error_message",
    "field_default",
    "flag",
    "item_map_of",
    "load_model",
    "log_device_memory",
    "nonnegative_int",
    "not_a_flag",
    "positive_int",
    "reset_device_memory_peak",
    "settings_flags",
    "settings_from",
    "typed_command",
    "uses_threads",
    "write_json",
]

log = logging.getLogger(__name__)

PROG = "gru4rec"
#: The model file name the help texts show: ``model`` + :data:`gru4rec.formats.checkpoint.MODEL_SUFFIX`
#: (written out so that building a parser imports no torch; a test holds the two equal).
MODEL_FILE_EXAMPLE = "model.safetensors"
EVAL_MODES = ("standard", "conservative", "median", "tiebreaking")
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A problem with the command line itself (exit code 2); raised by the commands' checks."""


class Interrupted(KeyboardInterrupt):
    """A command stopped by Ctrl-C or SIGTERM, with what the user can do next (``hint``: how to
    resume, or that nothing was kept) and the exit code (128 + the signal's number)."""

    def __init__(self, hint: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(hint)
        self.hint = hint
        self.exit_code = exit_code


# --------------------------------------------------------------------------------- settings


class HasThreads(Protocol):
    """Settings with a ``--threads`` value (see :func:`uses_threads`)."""

    @property
    def threads(self) -> int | None: ...


S = TypeVar("S", bound="DataclassInstance")
T = TypeVar("T", bound=HasThreads)


#: A :class:`Flag` without a default of its own (``dataclasses.MISSING`` would mean "required" to
#: the dataclass that Flag is).
_NO_DEFAULT: Any = object()

#: The key of a settings field's metadata that holds its :class:`Flag` (None: not a flag).
FLAG = "gru4rec.cli.flag"


@dataclasses.dataclass(frozen=True)
class Flag:
    """How one settings field is given on the command line: the field is the one declaration of
    the flag's destination (its name), default and value type; this says the rest. ``names``
    empty: a positional argument. ``convert`` turns the parsed value into the field's (e.g. a
    list into a tuple); ``group`` is the help section the flag is listed in."""

    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    nargs: str | int | None = None
    action: str | None = None
    const: Any = None
    group: str | None = None
    convert: Callable[[Any], Any] | None = None
    #: The default of a field that has none because its value lives in the library (imported
    #: only when the command runs, so given here by the command's ``add_arguments``).
    default: Any = _NO_DEFAULT

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup, dest: str, default: Any) -> None:
        """Add the flag to ``parser``: its value goes to ``dest``, ``default`` when not given (a
        field's default; ``dataclasses.MISSING``: the flag's own, else none: the flag is required)."""
        kwargs: dict[str, Any] = {"help": self.help}
        for key in ("metavar", "type", "choices", "nargs", "action", "const"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        if default is dataclasses.MISSING and self.default is not _NO_DEFAULT:
            default = self.default
        if default is dataclasses.MISSING:
            if self.names:
                kwargs["required"] = True
        else:
            # argparse appends to (and copies) a list default: a tuple field's default is given as one.
            kwargs["default"] = list(default) if isinstance(default, tuple) else default
        if self.names:
            parser.add_argument(*self.names, dest=dest, **kwargs)
        else:
            parser.add_argument(dest, **kwargs)


def flag(*names: str, help: str, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING,
         **options: Any) -> Any:
    """A settings field that is a command-line flag: ``verbose: bool = flag("-v", help=...)``
    (the field's type annotation and ``default`` are the flag's; no ``names``: a positional
    argument; ``options`` are :class:`Flag`'s)."""
    return flag_field(Flag(tuple(names), help, **options), default, default_factory)


def flag_field(spec: Flag, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING) -> Any:
    """A settings field set by the flag ``spec`` (one that several settings share)."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={FLAG: spec})
    return dataclasses.field(default=default, metadata={FLAG: spec})


def declared_flag(cls: type[Any], name: str, **changes: Any) -> Flag:
    """The :class:`Flag` declared with field ``name`` of ``cls``, with ``changes`` — what only the
    library knows, imported when the command runs (choices, a default, the help that names it)."""
    spec = next(f for f in dataclasses.fields(cls) if f.name == name).metadata[FLAG]
    return dataclasses.replace(spec, **changes)


def not_a_flag(default: Any = None) -> Any:
    """A settings field that no flag sets (``command_line``: set by the dispatcher)."""
    return dataclasses.field(default=default, metadata={FLAG: None})


def field_default(field: dataclasses.Field[Any]) -> Any:
    """The field's default (its factory's value), or ``dataclasses.MISSING``."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def settings_flags(cls: type[Any], flags: Mapping[str, Flag | None] | None = None) -> dict[str, Flag | None]:
    """Each field of the settings dataclass ``cls`` and its :class:`Flag`, in the order the help
    lists them (the class's own fields, then those of each base in turn): the field's metadata,
    else ``flags[name]`` — for a dataclass of the library (:class:`gru4rec.tune.ParoptSettings`,
    :class:`gru4rec.serve.settings.ServeSettings`), whose flags the command declares beside it.
    A field that is in neither is no flag (it keeps its default unless the dispatcher sets it)."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(flags or ()) - set(by_name))
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)} (a flag declared for it)")
    order: list[str] = []

    def visit(klass: type[Any]) -> None:
        own = [n for n in inspect.get_annotations(klass) if n in by_name and n not in order]
        order.extend(own)
        for base in klass.__bases__:
            if dataclasses.is_dataclass(base):
                visit(base)

    visit(cls)
    return {name: (flags or {}).get(name, by_name[name].metadata.get(FLAG)) for name in order}


def add_flags(parser: argparse.ArgumentParser, cls: type[Any], flags: Mapping[str, Flag | None] | None = None,
              groups: Mapping[str, str] | None = None) -> None:
    """Add the flag of every field of ``cls`` (:func:`settings_flags`) to ``parser``: the parser
    is derived from the settings, so that a flag and its field cannot disagree. ``groups``: the
    description of a help section, by its title."""
    sections: dict[str, argparse._ArgumentGroup] = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    declared = [(name, spec) for name, spec in settings_flags(cls, flags).items() if spec is not None]
    # Positionals first, in field order (argparse reads them in the order they are added).
    for name, spec in sorted(declared, key=lambda item: bool(item[1].names)):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if spec.group is not None:
            if spec.group not in sections:
                sections[spec.group] = parser.add_argument_group(spec.group, (groups or {}).get(spec.group))
            target = sections[spec.group]
        spec.add_to(target, name, field_default(fields[name]))


def settings_from(cls: type[S], args: argparse.Namespace, flags: Mapping[str, Flag | None] | None = None) -> S:
    """A command's typed settings (a dataclass) from its parsed command line: each field is the
    flag of its name (converted by its :class:`Flag`, a list into a tuple for a tuple default); a
    field without a flag (``command_line``, ...) is the Namespace's value where the dispatcher
    set one, else its default. The one place a Namespace becomes settings."""
    given = vars(args)
    specs = settings_flags(cls, flags)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in given:
            continue
        value, spec = given[f.name], specs.get(f.name)
        if spec is not None and spec.convert is not None:
            value = spec.convert(value)
        elif isinstance(value, list) and isinstance(field_default(f), tuple):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


def typed_command(cls: type[S], run: Callable[[S], int | None],
                  flags: Mapping[str, Flag | None] | None = None) -> Callable[[argparse.Namespace], int | None]:
    """``run`` (which takes settings of type ``cls``) as a command of the registry (which hands
    it the parsed Namespace)."""

    @functools.wraps(run)
    def from_args(args: argparse.Namespace) -> int | None:
        return run(settings_from(cls, args, flags))

    return from_args


# ------------------------------------------------------------------------------ argument types


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


# -------------------------------------------------------------------------------- shared flags
# The flag groups several commands share, as settings a command's settings dataclass extends
# (each field declared once, with its flag). Keyword-only, so that a command's own required
# fields (MODEL, DATA, ...) may come after them.


def column_flags(default_from: str | None) -> dict[str, Flag]:
    """``-sk/-ik/-tk`` (the fields of :class:`ColumnFlags`): the session, item and time column
    names; by default ``default_from``'s (e.g. "the model's"), else — ``default_from`` None —
    SessionId, ItemId and Time. A command whose default is another's passes these to
    :func:`add_flags` (its help says where the default comes from)."""
    flags: dict[str, Flag] = {}
    for name, short, long, what, column in (("session_key", "-sk", "--session-key", "session id", "SessionId"),
                                            ("item_key", "-ik", "--item-key", "item id", "ItemId"),
                                            ("time_key", "-tk", "--time-key", "timestamp", "Time")):
        default = column if default_from is None else f"{default_from}, normally {column}"
        flags[name] = Flag((short, long), f"{what} column (default: {default})", metavar="COLUMN", group="column names")
    return flags


_COLUMNS = column_flags(None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ColumnFlags:
    """``--session-key``, ``--item-key``, ``--time-key`` (see :func:`column_flags`)."""

    session_key: str | None = flag_field(_COLUMNS["session_key"], None)
    item_key: str | None = flag_field(_COLUMNS["item_key"], None)
    time_key: str | None = flag_field(_COLUMNS["time_key"], None)


_EVALUATION = "evaluation"


def eval_test_flag(*, required: bool) -> Flag:
    """``-t/--test``: the test files of an evaluation (``required``: the command's purpose)."""
    return Flag(("-t", "--test"), "test event files; events with items unknown to the model are dropped"
                + ("" if required else " (default: no evaluation)"), metavar="TEST", nargs="+", group=_EVALUATION)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalFlags:
    """``-t``, ``-m``, ``-e``, ``--eval-batch-size``, ``--metrics-json``: an evaluation's settings."""

    test: list[str] | None = flag_field(eval_test_flag(required=False), None)
    measure: list[int] = flag("-m", "--measure", metavar="K", type=positive_int, nargs="+", group=_EVALUATION,
                              default_factory=lambda: [20],
                              help="cutoffs of the ranked lists for Recall@K, MRR@K, ... (default: 20)")
    eval_mode: TieMode = flag("-e", "--eval-mode", choices=EVAL_MODES, group=_EVALUATION, default="standard",
                              help="how ties with the target's score count in its rank: standard "
                                   "(optimistic, the original's default), conservative (pessimistic, "
                                   "used for published comparisons), median, or tiebreaking (random "
                                   "noise) (default: standard)")
    eval_batch_size: int = flag("--eval-batch-size", metavar="N", type=positive_int, group=_EVALUATION, default=512,
                                help="test sessions evaluated in parallel (memory vs speed; default: 512)")
    metrics_json: str | None = flag("--metrics-json", metavar="FILE", group=_EVALUATION, default=None,
                                    help="also write every metric of every test file to FILE as JSON")


#: ``-d/--device`` of a ``device: str = "auto"`` field.
DEVICE_FLAG = Flag(("-d", "--device"), "torch device: auto (CUDA if available, else CPU), cpu, cuda, cuda:1, ... (default: auto)")
#: ``--precision`` of training, of a ``precision: str = "float32"`` field.
PRECISION_FLAG = Flag(("--precision",), "training precision: float32 (default), or bfloat16 for 16-bit operands "
                      "in the matrix products (mixed precision; the loss, the gates and the optimiser stay float32)",
                      choices=("float32", "bfloat16"))
#: ``--threads``: torch's threads for the command (see :mod:`gru4rec.machine.threads`), of a ``threads: int | None`` field.
THREADS_FLAG = Flag(("--threads",), "CPU threads, exactly (default: chosen while running between 1 and the CPUs "
                    "this process may use — its affinity and cgroup quota — from the measured step "
                    "times; OMP_NUM_THREADS fixes it when set)", metavar="N", type=positive_int)
#: ``-f/--force``: allow replacing existing output files, of a ``force: bool = False`` field.
FORCE_FLAG = Flag(("-f", "--force"), "overwrite output files that already exist", action="store_true")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MachineFlags:
    """``-d/--device``, ``--threads``, ``-f/--force``."""

    device: str = flag_field(DEVICE_FLAG, "auto")
    threads: int | None = flag_field(THREADS_FLAG, None)
    force: bool = flag_field(FORCE_FLAG, False)


def uses_threads(run: Callable[[T], int]) -> Callable[[T], int]:
    """Run a command under its ``--threads``; torch's setting is restored afterwards, so that
    calling the command line from Python leaves the caller's as it was."""

    @functools.wraps(run)
    def wrapped(args: T) -> int:
        from gru4rec.machine.threads import using_threads

        with using_threads(args.threads):
            return run(args)

    return wrapped


def error_message(exc: BaseException) -> str:
    """An exception as one line: a file error as 'reason: path', several problems joined (the
    dispatcher's ``gru4rec: error: ...`` line; here so that a command can word its own)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)) and exc.filename:
        reason = exc.strerror or str(exc)
        return f"{reason}: {exc.filename}"
    # Some messages list several problems on indented '- ' lines: keep them on one line.
    parts = [line.strip().removeprefix("- ").strip() for line in str(exc).strip().splitlines()]
    parts = [p for p in parts if p]
    if not parts:
        return type(exc).__name__
    head, rest = parts[0], parts[1:]
    if rest:
        return head + (" " if head.endswith(":") else "; ") + "; ".join(rest)
    return head


# ------------------------------------------------------------------------------ checks up front


def check_writable_target(path: str | None, force: bool, what: str, *, folder: bool = False) -> None:
    """Fail before hours of training, not after, when an output file (or ``folder``) could not be
    written (:func:`gru4rec.files.check_output_path`; a usage error)."""
    if path is None:
        return
    try:
        check_output_path(path, what, force, folder=folder)
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None


def check_readable(paths: Sequence[str] | None, what: str) -> None:
    """Every path exists (FileNotFoundError naming the first missing one and ``what`` it is)."""
    for path in paths or ():
        if not Path(path).exists():
            raise FileNotFoundError(2, f"{what} not found", path)


def write_json(path: str, payload: Any, *, force: bool) -> None:
    """Atomic JSON write that refuses to replace a user's file without ``force``."""
    p = check_output_path(path, "JSON file", force)
    atomic_write(p, lambda tmp: tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8"))


# ---------------------------------------------------------------------------- model and device


def load_model(path: str, device: str) -> GRU4Rec:
    """Load a saved model onto ``device``, saying how long it took."""
    from gru4rec.recommender import GRU4Rec

    start = time.perf_counter()
    model = GRU4Rec.load(path, device=device)
    log.info("Loaded model %s (%d items) in %.2fs", path, len(item_map_of(model)), time.perf_counter() - start)
    return model


def item_map_of(model: SessionModel) -> ItemMap:
    """The item map of a fitted model (:func:`gru4rec.inference.require_fitted`)."""
    from gru4rec.inference.protocol import require_fitted

    return require_fitted(model)[0]


def _on_cuda(model: Any) -> bool:
    return getattr(getattr(model, "device", None), "type", None) == "cuda"


def reset_device_memory_peak(model: Any) -> None:
    """Start a new peak so that each phase (training, evaluation) reports its own."""
    if _on_cuda(model):
        import torch

        torch.cuda.reset_peak_memory_stats(model.device)


def log_device_memory(model: Any, phase: str) -> None:
    """Log the peak CUDA memory of the model's device since the last reset (nothing off CUDA)."""
    if not _on_cuda(model):
        return
    import torch

    peak = torch.cuda.max_memory_allocated(model.device)
    reserved = torch.cuda.max_memory_reserved(model.device)
    log.info("Peak device memory (%s): %.1f MiB allocated, %.1f MiB reserved on %s",
             phase, peak / 2**20, reserved / 2**20, model.device)
