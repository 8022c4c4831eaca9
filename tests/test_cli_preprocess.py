"""``gru4rec preprocess`` / ``gru4rec split``: the command-line glue of gru4rec.cli.preprocess,
parsed and run directly (moved here from the preprocessing tests
with the glue). The parsers carry the global ``-q/--quiet`` that every subcommand has."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gru4rec.cli import preprocess as cli_preprocess
from gru4rec.cli.common import settings_from
from gru4rec.cli.console import add_verbosity_flags
from gru4rec.errors import DataError
from test_preprocess_io import digi_file
from test_preprocess_split import EXPECTED, assert_outputs, frame


def parser_with_global_flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_verbosity_flags(parser, sub=False)
    return parser


def split(args: argparse.Namespace) -> cli_preprocess.SplitSettings:
    return settings_from(cli_preprocess.SplitSettings, args)


def test_split_arguments_parse_and_run(tmp_path: Path, capsys) -> None:
    src = tmp_path / "events.tsv"
    frame().to_csv(src, sep="\t", index=False)
    parser = parser_with_global_flags()
    cli_preprocess.add_split_arguments(parser)
    args = parser.parse_args([str(src), "--out", str(tmp_path / "o"), "--days", "1", "--min-item-support", "2",
                              "--quiet"])
    assert cli_preprocess.run_split(split(args)) == 0
    assert "train_valid" in capsys.readouterr().out
    assert_outputs(tmp_path / "o", EXPECTED)
    # a second run refuses to overwrite, --force replaces
    with pytest.raises(DataError, match=r"train_full\.tsv already exists; pass force=True"):
        cli_preprocess.run_split(split(args))
    # ... which the command line words its own way
    from gru4rec.cli import main

    assert main(["split", str(src), "--out", str(tmp_path / "o"), "--days", "1", "--min-item-support", "2", "-q"]) == 1
    err = capsys.readouterr().err
    assert "train_full.tsv already exists; pass --force to replace it" in err and "force=True" not in err
    assert cli_preprocess.run_split(split(parser.parse_args([*map(str, [src, "--out", tmp_path / "o"]), "--force", "--quiet",
                                                            "--min-item-support", "2"]))) == 0


def test_preprocess_arguments_parse_and_run(tmp_path: Path, capsys) -> None:
    parser = parser_with_global_flags()
    cli_preprocess.add_preprocess_arguments(parser)
    args = parser.parse_args(["diginetica", str(digi_file(tmp_path)), "--out", str(tmp_path / "o"), "--quiet",
                              "--format", "tsv", "--min-item-support", "5"])
    assert cli_preprocess.run_preprocess(settings_from(cli_preprocess.PreprocessSettings, args)) == 0
    out = capsys.readouterr().out
    assert "train_full" in out and "train_valid" in out
    assert (tmp_path / "o" / "train_valid.tsv").exists()
