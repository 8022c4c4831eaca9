"""The ``gru4rec`` command line: one registry of subcommands, each a few lines over the Python API.

    gru4rec demo                                   synthetic data -> train -> evaluate, one command
    gru4rec train DATA [-ps STR] [-pf FILE] [--save MODEL] [--test TEST ...] [-m 1 5 10 20] ...
    gru4rec evaluate MODEL -t TEST [TEST ...] [-m ...] [-e MODE]
    gru4rec baseline pop|spop|itemknn TRAIN -t TEST [TEST ...] [-m ...] [-e MODE]
    gru4rec recommend MODEL -i SESSIONS -o RECS [-k 20] [--exclude-seen]
    gru4rec info FILE [--train TRAIN]              a model file, or an event file's sessions and repeats
    gru4rec export MODEL [--onnx STEP.onnx [--top-k K]] [--item-embeddings FILE] [--session-embeddings TEST FILE]
    gru4rec serve MODEL [--host H] [--port P] [--state memory|redis://...]
    gru4rec items add MODEL NEW_ITEMS -o MODEL2      new cold items for a model trained with --item-features
    gru4rec synth OUT_DIR
    gru4rec preprocess DATASET RAW_PATH... --out DIR | split INPUT --out DIR
    gru4rec paropt ...                             (registered from its module's hooks)
    gru4rec report RUN_DIR [RUN_DIR ...] [--study URL --study-name NAME] -o report.html

Each command is a module of this package with its settings (a dataclass, a field per flag
declared with it: :func:`~gru4rec.cli.common.flag`), the parser derived from them
(``add_arguments``) and its action (``run``, which takes the settings):
:mod:`~gru4rec.cli.train`, :mod:`~gru4rec.cli.evaluate`, :mod:`~gru4rec.cli.baseline`,
:mod:`~gru4rec.cli.recommend`, :mod:`~gru4rec.cli.info`, :mod:`~gru4rec.cli.export`, :mod:`~gru4rec.cli.serve`,
:mod:`~gru4rec.cli.synth` (synth, demo), :mod:`~gru4rec.cli.preprocess` (preprocess, split),
:mod:`~gru4rec.cli.report`, :mod:`~gru4rec.cli.paropt`; what they share is in
:mod:`~gru4rec.cli.common` and :mod:`~gru4rec.cli.console`. This module holds the registry,
the parser, the dispatch and the entry points.

Conventions shared by every subcommand:

* exit code 0 on success, 1 for a runtime error (bad data, unreadable or corrupt file, ...),
  2 for a usage error (bad flags, invalid hyperparameters), 130 when interrupted (143 for SIGTERM),
  with a line that says how to resume or that nothing was kept;
* an error from :mod:`gru4rec.errors` (or a missing/unreadable file) prints one line
  ``gru4rec: error: ...`` and no traceback; ``--debug`` shows the traceback instead;
* results go to stdout, messages (progress, timings, warnings) to stderr through logging:
  ``-q/--quiet`` keeps only warnings and errors, ``-v/--verbose`` adds debugging messages
  (``run.py`` keeps the original's single stream on stdout);
* nothing a user made is overwritten without ``--force``.

``run.py`` at the repository root is the original GRU4Rec's command line (flag-compatible); its
parser is :mod:`gru4rec.cli.run_py` and it runs through :func:`run_py_main`, so both share the
training/evaluation code and the error handling.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gru4rec.cli import baseline, evaluate, export, info, items, preprocess, recommend, report, run_py, serve, synth, train
from gru4rec.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Flag,
    S,
    UsageError,
    error_message,
    settings_from,
    typed_command,
)
from gru4rec.cli.console import VERBOSITY_DESTS, add_verbosity_flags, command_console, verbosity
from gru4rec.errors import ConfigError, Gru4RecError, OutputExistsError
from gru4rec.kernels.memory import keep_freed_memory

__all__ = ["main", "run_py_main", "Command", "COMMANDS", "Settings", "dispatch", "register", "typed", "build_parser", "build_run_py_parser"]

log = logging.getLogger(__name__)

#: The original ``run.py``'s parser (flag for flag).
build_run_py_parser = run_py.build_parser

# ------------------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, how to add its flags and how to run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], object]
    run: Callable[[argparse.Namespace], int | None]
    description: str | None = None
    #: Returns why the command cannot run in this installation (None when it can).
    unavailable: Callable[[], str | None] = lambda: None
    #: Keep the package's default console for the command's messages (INFO on stdout), as the
    #: original scripts printed everything on stdout; otherwise every message goes to stderr.
    messages_on_stdout: bool = False
    #: The command's settings dataclass and the flags declared for its fields outside it (see
    #: :func:`~gru4rec.cli.common.settings_flags`), or None; a test holds its parser to them.
    settings: Callable[[], Settings | None] = lambda: None


@dataclasses.dataclass(frozen=True)
class Settings:
    """A command's settings dataclass (``cls``) and the :class:`~gru4rec.cli.common.Flag` of
    those of its fields that do not declare their own (``flags``, by field name)."""

    cls: type[Any]
    flags: Mapping[str, Flag | None] | None = None


def typed(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], object], cls: type[S],
          run: Callable[[S], int | None], *, flags: Mapping[str, Flag | None] | None = None,
          description: str | None = None) -> Command:
    """A command whose ``run`` takes its settings dataclass ``cls``, built from the parsed flags."""
    settings = Settings(cls, flags)
    return Command(name, help, add_arguments, typed_command(cls, run, flags), description, settings=lambda: settings)


#: The one registry of subcommands, in the order ``gru4rec --help`` lists them.
COMMANDS: dict[str, Command] = {}


def register(command: Command) -> Command:
    """Add (or replace) a subcommand in :data:`COMMANDS`."""
    COMMANDS[command.name] = command
    return command


def _hook_command(
    name: str,
    help: str,
    module: str,
    *,
    add: str = "add_arguments",
    run: str = "run",
    description: str | None = None,
    messages_on_stdout: bool = False,
) -> Command:
    """A subcommand implemented in another module by two hooks: ``<add>(parser)`` adds its
    flags and ``<run>(args) -> int`` runs it (by default named ``add_arguments`` and ``run``);
    the module's ``SETTINGS`` and ``FLAGS`` are its :class:`Settings`.

    The module is imported only when this subcommand is used, so ``gru4rec --help`` and every
    other command keep working when the module (or its optional dependency) is missing.
    """

    add_name, run_name = add, run

    def resolve() -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int | None]] | str:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            return f"the '{name}' command is not available: cannot import {module} ({exc})"
        add_hook = getattr(mod, add_name, None)
        run_hook = getattr(mod, run_name, None)
        if not callable(add_hook) or not callable(run_hook):
            return f"the '{name}' command is not available: {module} has no {add_name}/{run_name} hooks"
        return add_hook, run_hook

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        hooks = resolve()
        if not isinstance(hooks, str):
            hooks[0](parser)

    def run_command(args: argparse.Namespace) -> int | None:
        hooks = resolve()
        if isinstance(hooks, str):
            raise Gru4RecError(hooks)
        return hooks[1](args)

    def unavailable() -> str | None:
        hooks = resolve()
        return hooks if isinstance(hooks, str) else None

    def settings() -> Settings | None:
        if isinstance(resolve(), str):
            return None
        mod = importlib.import_module(module)
        cls = getattr(mod, "SETTINGS", None)
        return None if cls is None else Settings(cls, getattr(mod, "FLAGS", None))

    return Command(name, help, add_arguments, run_command, description, unavailable, messages_on_stdout, settings)


register(typed("train", "train a model on an event file (optionally save and evaluate it)",
                train.add_arguments, train.TrainSettings, train.run, flags=train.FLAGS))
register(typed("evaluate", "evaluate a saved model on test files (Recall, MRR, NDCG, ...)",
               evaluate.add_arguments, evaluate.EvaluateSettings, evaluate.run, flags=evaluate.FLAGS))
register(typed("baseline", "fit pop, spop or itemknn and evaluate it like 'evaluate' (to compare with GRU4Rec)",
               baseline.add_arguments, baseline.BaselineSettings, baseline.run, description=baseline.DESCRIPTION))
register(typed("recommend", "top-k recommendations for the sessions in a file",
               recommend.add_arguments, recommend.RecommendSettings, recommend.run, flags=recommend.FLAGS,
               description=recommend.DESCRIPTION))
register(typed("info", "describe a model file (format, items, configuration) or an event file (sessions, repeats)",
               info.add_arguments, info.InfoSettings, info.run))
register(typed("items", "add new items to a model trained with --item-features, as cold items (no retraining)",
               items.add_arguments, items.ItemsSettings, items.run, flags=items.FLAGS,
               description=items.DESCRIPTION))
register(typed("export", "export a model: the one-click step as ONNX, item or session embeddings",
               export.add_arguments, export.ExportSettings, export.run, flags=export.FLAGS,
               description=export.DESCRIPTION))
register(typed("serve", "serve live next-item recommendations over HTTP (needs gru4rec[serve])",
               serve.add_arguments, serve.ServeCommand, serve.run, flags=serve.FLAGS, description=serve.DESCRIPTION))
register(typed("synth", "write the synthetic data set (train_full, test, train_tr, train_valid)",
               synth.add_synth_arguments, synth.SynthSettings, synth.run_synth))
register(typed("demo", "one-command quick start: synthetic data -> train -> evaluate",
               synth.add_demo_arguments, synth.DemoSettings, synth.run_demo))
register(typed("preprocess", "preprocess a public data set's raw files into train/test files",
               preprocess.add_preprocess_arguments, preprocess.PreprocessSettings, preprocess.run_preprocess))
register(typed("split", "split your own event file by time into train/test files",
               preprocess.add_split_arguments, preprocess.SplitSettings, preprocess.run_split))
# paropt's command line lives with the search (optional dependency: optuna); like the original
# paropt.py it prints its progress on stdout.
register(_hook_command("paropt", "hyperparameter optimisation with Optuna", "gru4rec.cli.paropt",
                       messages_on_stdout=True))
register(typed("report", "an HTML report (with PNGs) of run folders and/or an Optuna study",
               report.add_arguments, report.ReportSettings, report.run, description=report.DESCRIPTION))


# ----------------------------------------------------------------------------------- the parser

#: The destinations of the flags every subcommand accepts before or after its name.
_GLOBAL_DESTS = ("debug", *VERBOSITY_DESTS)


def _add_global_flags(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    # On subparsers the defaults are suppressed so that a flag before the command is not reset.
    parser.add_argument("--debug", action="store_true",
                        default=argparse.SUPPRESS if sub else False,
                        help="show the full traceback of an error")
    add_verbosity_flags(parser, sub=sub)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gru4rec`` parser; only ``command``'s flags are added (the others stay unimported)."""
    from gru4rec import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GRU4Rec session-based recommendation. Run 'gru4rec demo' for a one-minute "
                    "tour, 'gru4rec COMMAND --help' for a command's options.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_global_flags(parser, sub=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, cmd in COMMANDS.items():
        # 'resolve': a command's own flag of a global name wins (paropt's -v/--verbose).
        sub = subparsers.add_parser(name, help=cmd.help, description=cmd.description or cmd.help,
                                    formatter_class=_Formatter, conflict_handler="resolve")
        _add_global_flags(sub, sub=True)
        sub.set_defaults(_command=name)
        if name == command:
            cmd.add_arguments(sub)
            for action in sub._actions:  # such a flag must not reset the one given before the name
                if action.dest in _GLOBAL_DESTS:
                    action.default = argparse.SUPPRESS
    return parser


def _selected_command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word), or None."""
    for token in argv:
        if token == "--":
            return None
        if not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


# ------------------------------------------------------------------------------------- dispatch


def _report(prog: str, text: str, *, debug: bool) -> None:
    """The one line that ends a failed command (after the traceback with ``--debug``), on
    stderr in argparse's own ``prog: error: ...`` form."""
    if debug:
        traceback.print_exc()
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of the subcommands whose flags it holds."""
    flags: set[str] = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _option_strings(sub)
    return flags


def _misspelt_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """A usage error for the first ``--flag`` that is not a flag but close to one — with dashes
    for underscores or a typo: ``--init_from`` -> did you mean ``--init-from``?, ``--vaild`` ->
    ``--valid``? (None: none; argparse then says what it says of an unknown flag)."""
    import difflib

    flags = None
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name == "--":
            continue
        flags = _option_strings(parser) if flags is None else flags
        if name in flags:
            continue
        kebab = name.replace("_", "-")
        long_flags = sorted(f for f in flags if f.startswith("--"))
        close = [kebab] if kebab in flags else difflib.get_close_matches(kebab, long_flags, n=1, cutoff=0.8)
        if close:
            return f"unknown flag {name} (did you mean {close[0]}?)"
    return None


def _dispatch(parser: argparse.ArgumentParser, argv: Sequence[str],
              run: Callable[[argparse.Namespace], int | None], *, prog: str) -> int:
    """Parse, run, and turn user errors into one line and an exit code."""
    debug = "--debug" in argv
    misspelt = _misspelt_flag(parser, argv)
    if misspelt is not None:
        _report(prog, f"error: {misspelt}", debug=False)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    debug = bool(getattr(args, "debug", False)) or debug
    try:
        code = run(args)
        return EXIT_OK if code is None else int(code)
    except BrokenPipeError:
        # The reader of standard output stopped early (`gru4rec recommend -o - | head`): that is
        # what it wanted, not an error. Further writes (and the flush at exit) go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt as exc:
        # A command that knows what was kept says so (how to resume, or that nothing was).
        hint = getattr(exc, "hint", "")
        _report(prog, "interrupted" + (f"; {hint}" if hint else ""), debug=debug)
        return int(getattr(exc, "exit_code", EXIT_INTERRUPTED))
    except (UsageError, ConfigError) as exc:
        _report(prog, f"error: {error_message(exc)}", debug=debug)
        return EXIT_USAGE
    except OutputExistsError as exc:  # the command line's words, not the API's
        _report(prog, f"error: {exc.message('--force')}", debug=debug)
        return EXIT_ERROR
    except (Gru4RecError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        _report(prog, f"error: {error_message(exc)}", debug=debug)
        return EXIT_ERROR
    except ImportError as exc:
        # An optional dependency (pyarrow, optuna) missing: the message carries the install hint.
        _report(prog, f"error: {error_message(exc)}", debug=debug)
        return EXIT_ERROR
    except MemoryError as exc:
        _report(prog, f"error: out of host memory: {error_message(exc)}", debug=debug)
        return EXIT_ERROR
    except RuntimeError as exc:
        # torch.OutOfMemoryError (a RuntimeError) is a resource problem the user can act on;
        # any other RuntimeError is a bug and keeps its traceback.
        if type(exc).__name__ != "OutOfMemoryError":
            raise
        first = error_message(exc).split(". ")[0]
        _report(prog, f"error: out of device memory ({first}); try a smaller batch_size, "
                      "n_sample, layers or --eval-batch-size", debug=debug)
        return EXIT_ERROR


#: The one error -> exit-code dispatcher, for the command lines outside this registry
#: (``paropt.py``: :func:`gru4rec.cli.paropt.main`).
dispatch = _dispatch


# ---------------------------------------------------------------------------------- entry points


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gru4rec`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code. Without
    ``argv`` this is the process's own command line (the console script, ``python -m gru4rec``),
    which asks for the allocator tuning (:func:`gru4rec.kernels.memory.keep_freed_memory`)."""
    if argv is None:
        keep_freed_memory()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _selected_command(argv)
    if command is not None:
        reason = COMMANDS[command].unavailable()
        if reason:
            # Its flags are unknown, so parsing would only add a confusing usage error.
            _report(PROG, f"error: {reason}", debug=False)
            return EXIT_ERROR
    parser = build_parser(command)
    if not [a for a in argv if a != "--debug"]:
        parser.print_help()
        return EXIT_OK

    def run(args: argparse.Namespace) -> int | None:
        name = getattr(args, "_command", None)
        if name is None:
            parser.print_help()
            return EXIT_OK
        cmd = COMMANDS[name]
        args.command_line = [PROG, *argv]  # as given: a run folder records it, an interrupted run tells how to resume
        with command_console(PROG, level=verbosity(args), messages_on_stdout=cmd.messages_on_stdout):
            log.debug("%s %s with %s", PROG, name, vars(args))
            return cmd.run(args)

    return _dispatch(parser, argv, run, prog=PROG)


def run_py_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the repository's ``run.py``; returns the exit code (without ``argv``, the
    process's own command line: it asks for the allocator tuning, as :func:`main`)."""
    if argv is None:
        keep_freed_memory()
    argv = list(sys.argv[1:] if argv is None else argv)

    def run(args: argparse.Namespace) -> int | None:
        args.command_line = ["python", run_py.PROG, *argv]  # as run (a run folder records it)
        with command_console(run_py.PROG, level=logging.INFO, messages_on_stdout=True):
            return run_py.run(settings_from(run_py.RunPySettings, args))

    return _dispatch(run_py.build_parser(), argv, run, prog=run_py.PROG)
