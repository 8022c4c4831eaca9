"""Tests of gru4rec.cli.paropt: exit codes and one-line errors of paropt.py, `gru4rec paropt`
running the same command, and what a rerun prints and refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.cli.paropt import main  # noqa: E402
from tune_helpers import cli_args, data_fixture  # noqa: E402,F401 - data is a fixture


def has_line(text: str, *facts: str) -> bool:
    """Whether one line of ``text`` holds every fact (names, numbers, paths, flags), in any wording."""
    return any(all(fact in line for fact in facts) for line in text.splitlines())


def test_command_lines(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Invalid input: exit code 2 and one line on stderr.
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "layers", "dtype": "int", "values": [64]}\n')
    assert main([str(data["train"]), str(data["valid"]), "-opf", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: invalid paramspace" in err and "line 1" in err and err.count("\n") == 1 and "Traceback" not in err
    # Missing data: a runtime error (1), before any storage is created.
    assert main([str(tmp_path / "nope.tsv"), str(data["valid"]), "-opf", str(data["space"]), "--out", str(tmp_path / "m")]) == 1
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


def test_reruns_extend_the_study_and_print_both_counts(data: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = [*cli_args(data, out=str(out), study_name="again"), "-nt", "1", "--no-pruning"]
    assert main(args) == 0
    first = capsys.readouterr().out
    db = f"sqlite:///{(out / 'paropt.db').resolve()}"
    assert has_line(first, "Starting", "'again'", db, "no trials")
    assert has_line(first, "1 more trial", "-nt", "hold 1")  # this run's count and the study's
    assert has_line(first, "TPE", "seed 42")  # seeded by default
    assert has_line(first, "Heartbeat", "60 s", "180 s")
    assert has_line(first, "optuna-dashboard", f"'{db}'", "'again'")
    # The same command again: the study has finished, and it extends it.
    assert main(args) == 0
    second = capsys.readouterr().out
    assert has_line(second, "Resuming", "'again'", "1 trial (1 COMPLETE)")
    assert has_line(second, "hold 2")
    assert has_line(second, "This run", "1 trial (1 COMPLETE)") and has_line(second, "'again'", "2 trials (2 COMPLETE)")
    # The same study name in another storage: a runtime error (1) that says whose the files are
    # and that nothing happened; the files stay as they were.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = tmp_path / "other.db"
    assert main([*args, "--storage", str(other), "--seed", "7"]) == 1
    err = capsys.readouterr().err
    assert "error: the reports " in err and err.count("\n") == 1
    assert has_line(err, "the reports", "'again'", db, f"sqlite:///{other.resolve()}", "overwritten", "no trial")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_help_says_what_nt_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0  # the dispatcher's exit code, as every command's
    text = " ".join(capsys.readouterr().out.split())
    assert has_line(text, "-nt", "THIS RUN", "failed and pruned", "total")
    assert has_line(text, "TPE", "(default 42)", "--enqueue PARAMFILE")


def test_an_interrupted_run_says_what_to_rerun(data: dict[str, Path], tmp_path: Path) -> None:
    from gru4rec.tune.runner import _resume_hint
    from tune_helpers import settings

    hint = _resume_hint(settings(data, tmp_path, n_trials=50), finished_before=20)
    # What to type and the counts: 20 finished + 50 planned = 70 in all; rerun as is: 50 more.
    assert has_line(hint, "interrupted", "'-nt 70 --total'", "70 finished", "50 more")
    assert has_line(_resume_hint(settings(data, tmp_path, n_trials=70, total=True), finished_before=20),
                    "same command", "holds 70")


def test_quiet_still_prints_the_result_lines(data: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # docs/tuning.md's command ends with -q: the messages go, the results stay (as with
    # `gru4rec -q train`), and they are the numbers the study's summary file holds.
    import json

    out = tmp_path / "quiet"
    args = [*cli_args(data, out=str(out), study_name="quiet"), "-nt", "1", "-m", "5", "-fm", "5", "10",
            "--final-test", str(data["test"]), "-q"]
    assert main(args) == 0
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "quiet.summary.json").read_text())
    final = summary["final_test"]
    expected = [
        f"Best trial 0: MRR@5={summary['best_value']:.6f} (standard ties)",
        f"Best parameters: {summary['best_param_string']}",
        f"Recall@5: {final['recall']['5']:.6f} MRR@5: {final['mrr']['5']:.6f}",
        f"Recall@10: {final['recall']['10']:.6f} MRR@10: {final['mrr']['10']:.6f}",
    ]
    assert printed == expected
    # `gru4rec -q paropt`, the same command: the same lines (its study extended by one trial, the
    # best of two; the final test of the best again).
    from gru4rec import cli

    assert cli.main(["-q", "paropt", *args[:-1]]) == 0
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "quiet.summary.json").read_text())
    final = summary["final_test"]
    assert printed[1:] == [
        f"Best parameters: {summary['best_param_string']}",
        f"Recall@5: {final['recall']['5']:.6f} MRR@5: {final['mrr']['5']:.6f}",
        f"Recall@10: {final['recall']['10']:.6f} MRR@10: {final['mrr']['10']:.6f}",
    ]
    assert printed[0] == f"Best trial {summary['best_trial']}: MRR@5={summary['best_value']:.6f} (standard ties)"
