"""One grammar for every ``gru4rec`` subcommand, checked on the parsers themselves: a model file
is the positional MODEL, long options are spelled with hyphens, the shared flags have the same
names everywhere (``-f/--force``, ``-e/--eval-mode``, ``-sk/-ik/-tk``, ``-q``/``-v``); the
original's ``paropt.py`` keeps its own spellings and accepts ``-q``."""
from __future__ import annotations

import argparse
import re

import pytest

from gru4rec import cli
from gru4rec.cli.common import EVAL_MODES

LONG_OPTION = re.compile(r"--[a-z0-9]+(-[a-z0-9]+)*")


def subparser(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser(name)
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[name]  # type: ignore[index]


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_subcommand_follows_the_grammar(name: str) -> None:
    parser = subparser(name)
    flags = options(parser)
    for flag in flags:
        if flag.startswith("--"):
            assert LONG_OPTION.fullmatch(flag), f"gru4rec {name}: {flag} is not spelled --lower-case-with-hyphens"
    assert "--model" not in flags, f"gru4rec {name}: the model file is the positional MODEL, not --model"
    for action in parser._actions:
        if action.dest == "model":
            assert not action.option_strings and action.metavar == "MODEL", f"gru4rec {name}: MODEL must be positional"
        if action.choices is not None and set(EVAL_MODES) <= set(action.choices):
            assert action.option_strings == ["-e", "--eval-mode"], f"gru4rec {name}: the tie mode is -e/--eval-mode"
        assert not re.search(r"default: \w+/\w+", action.help or ""), f"gru4rec {name}: {action.help!r}"
    if "--force" in flags:
        assert flags["-f"] is flags["--force"], f"gru4rec {name}: --force needs its short form -f"
    for short, long in (("-q", "--quiet"), ("-v", "--verbose")):
        assert flags[short] is flags[long], f"gru4rec {name}: {short}/{long}"
    keys = {"-sk": "--session-key", "-ik": "--item-key", "-tk": "--time-key"}
    if any(k in flags or v in flags for k, v in keys.items()):
        for short, long in keys.items():
            assert flags[short] is flags[long], f"gru4rec {name}: {short}/{long}"


@pytest.mark.parametrize("name", ["evaluate", "recommend", "export", "serve"])
def test_commands_of_a_model_take_it_first(name: str) -> None:
    positional = [a for a in subparser(name)._actions if not a.option_strings and a.dest != "help"]
    assert positional[0].dest == "model"


def test_info_takes_a_model_or_an_event_file_first() -> None:
    (positional,) = [a for a in subparser("info")._actions if not a.option_strings and a.dest != "help"]
    assert (positional.dest, positional.metavar) == ("file", "FILE")
    assert "model file" in positional.help and "event file" in positional.help


def test_paropt_py_keeps_the_original_spellings_and_takes_q() -> None:
    pytest.importorskip("optuna")
    from gru4rec.cli.paropt import build_parser

    original = build_parser()
    args = original.parse_args(["T", "V", "-opf", "S", "--eval_type", "conservative", "--item_key", "P", "-q"])
    assert (args.eval_mode, args.item_key, args.quiet) == ("conservative", "P", True)
    ours = subparser("paropt")
    args = ours.parse_args(["T", "V", "-opf", "S", "--eval-mode", "conservative", "--item-key", "P", "-q"])
    assert (args.eval_mode, args.item_key, args.quiet) == ("conservative", "P", True)
    with pytest.raises(SystemExit):
        ours.parse_args(["T", "V", "-opf", "S", "--eval_type", "conservative"])


def test_baseline_help_names_each_column_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["baseline", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "session id column (default: SessionId)" in text and "item id column (default: ItemId)" in text


def test_train_help_lists_every_hyperparameter_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.config import Config

    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    assert "docs/behaviour.md §7" in text
    listed = text[text.index("and their defaults"):]
    for item in Config().to_param_string().split(","):
        assert item in listed, item


@pytest.mark.parametrize("name", sorted(set(cli.COMMANDS) - {"paropt"}))
def test_a_flag_spelt_with_underscores_gets_its_hyphenated_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    hyphenated = sorted(f for f in options(subparser(name)) if f.startswith("--") and "-" in f[2:])
    for flag in hyphenated:
        snake = "--" + flag[2:].replace("-", "_")
        assert cli.main([name, "X", f"{snake}=1"]) == 2
        assert capsys.readouterr().err == f"gru4rec: error: unknown flag {snake} (did you mean {flag}?)\n"
    assert cli.main(["train", "X", "--init_frm", "m"]) == 2  # a near miss too
    assert "(did you mean --init-from?)" in capsys.readouterr().err


def test_a_typo_in_a_flag_gets_the_flag_it_is_close_to(capsys: pytest.CaptureFixture[str]) -> None:
    """A newcomer's --vaild got argparse's bare 'unrecognized arguments' under the top-level usage."""
    assert cli.main(["train", "X", "--vaild", "v.tsv"]) == 2
    assert capsys.readouterr().err == "gru4rec: error: unknown flag --vaild (did you mean --valid?)\n"
    assert cli.main(["train", "X", "--zzzz"]) == 2  # nothing close: argparse's own message
    assert "unrecognized arguments: --zzzz" in capsys.readouterr().err


def test_run_py_keeps_its_underscores_and_corrects_ours(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run_py_main(["X", "-ps", "layers=8", "--run_dir", "r"]) == 2
    assert capsys.readouterr().err == "run.py: error: unknown flag --run_dir (did you mean --run-dir?)\n"
