"""Tests of gru4rec.tune.cli: exit codes and one-line errors of paropt.py, and `gru4rec paropt`
running the same command."""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.tune import main  # noqa: E402
from tune_helpers import cli_args, data  # noqa: E402,F401 - data is a fixture


def test_command_lines(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Invalid input: exit code 2 and one line on stderr.
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "layers", "dtype": "int", "values": [64]}\n')
    assert main([str(data["train"]), str(data["valid"]), "-opf", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid paramspace") and "line 1" in err and "Traceback" not in err
    # Missing data: the same, before any storage is created.
    assert main([str(tmp_path / "nope.tsv"), str(data["valid"]), "-opf", str(data["space"]), "--out", str(tmp_path / "m")]) == 2
    assert "nope.tsv: file not found" in capsys.readouterr().err and not (tmp_path / "m").exists()
    # `gru4rec paropt` runs the same command.
    from gru4rec import cli

    out = tmp_path / "cli"
    code = cli.main(["paropt", *cli_args(data, out=str(out), study_name="cli"), "-nt", "1", "-m", "5", "-fm", "5", "10",
                     "--final-test", str(data["test"])])
    printed = capsys.readouterr().out
    assert code == 0
    assert "Best parameters: loss=cross-entropy,n_sample=16,n_epochs=2,logq=1.0,layers=" in printed
    assert "Recall@5: " in printed and "MRR@10: " in printed
    assert (out / "cli.best.json").is_file() and (out / "cli.best.py").is_file() and (out / "paropt.db").is_file()
