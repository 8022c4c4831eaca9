"""Tests of gru4rec.tune.report_files: a study's reports are replaced by a rerun of the same study,
and nothing else in --out is ever overwritten (another study's or storage's reports, a user's
own file, an edited report) — checked byte for byte; writes are two-phase and take turns."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

from gru4rec.tune.report_files import ReportConflict, ReportOwner, check_reports, output_paths, write_reports

OWNER = ReportOwner("s", "sqlite:////data/a.db", "uid-a")
OTHER = ReportOwner("s", "postgresql://u:***@host/db", "uid-b")


def _render(tag: str, keys: tuple[str, ...] = ("trials_csv", "trials_json", "best_json", "best_py")):
    def render() -> tuple[dict[str, str], dict[str, object]]:
        return {key: f"{key} {tag}\n" for key in keys}, {"counts": {"COMPLETE": len(tag)}}
    return render


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".s.lock"}


def test_reports_record_their_owner_and_digests_and_a_rerun_replaces_them(tmp_path: Path) -> None:
    paths = output_paths(tmp_path, "s")
    assert {k: p.name for k, p in paths.items()} == {
        "best_json": "s.best.json", "best_py": "s.best.py", "trials_csv": "s.trials.csv",
        "trials_json": "s.trials.json", "summary": "s.summary.json"}
    files = write_reports(paths, OWNER, _render("one"), force=False)
    assert files == {key: str(path) for key, path in paths.items()}
    summary = json.loads(paths["summary"].read_text())
    assert summary["owner"] == {"study_name": "s", "storage": "sqlite:////data/a.db", "study_uid": "uid-a"}
    assert summary["counts"] == {"COMPLETE": 3}
    for key in ("trials_csv", "trials_json", "best_json", "best_py"):
        assert paths[key].read_text() == f"{key} one\n"
        assert summary["files"][key] == {"file": paths[key].name,
                                         "sha256": [hashlib.sha256(paths[key].read_bytes()).hexdigest()]}
    # The same study (same id, even through another URL) replaces its own reports.
    same = ReportOwner("s", "sqlite:///../a.db", "uid-a")
    check_reports(paths, same, force=False)
    write_reports(paths, same, _render("two"), force=False)
    assert paths["best_py"].read_text() == "best_py two\n"
    # A report this run does not rewrite stays listed, so it stays the study's.
    write_reports(paths, OWNER, _render("three", ("trials_csv", "trials_json")), force=False)
    assert paths["best_py"].read_text() == "best_py two\n"
    check_reports(paths, OWNER, force=False)
    assert (tmp_path / ".s.lock").is_file()


def test_files_that_are_not_this_studys_reports_are_never_overwritten(tmp_path: Path) -> None:
    paths = output_paths(tmp_path, "s")
    write_reports(paths, OWNER, _render("one"), force=False)
    before = _snapshot(tmp_path)
    # Another study of the same name in another storage: refused, naming the owner of the files.
    with pytest.raises(ReportConflict) as info:
        write_reports(paths, OTHER, _render("two"), force=False)
    message = str(info.value)
    assert "belong to study 's' in sqlite:////data/a.db, not to this run's study 's' in postgresql://u:***@host/db" in message
    assert "Nothing was overwritten" in message and "--force" in message
    # A study that does not exist yet owns no files.
    with pytest.raises(ReportConflict, match="not to this run's new study 's'"):
        check_reports(paths, ReportOwner("s", "sqlite:////data/a.db", None), force=False)
    assert _snapshot(tmp_path) == before

    # A report edited by hand is the user's now.
    paths["best_json"].write_text('{"layers": [64]}\n')
    with pytest.raises(ReportConflict, match=r"s\.best\.json was changed after paropt wrote it.*no trial was run"):
        check_reports(paths, OWNER, force=False)
    # A file the study's summary does not list (this study never wrote one there).
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    unlisted = output_paths(fresh, "s")
    write_reports(unlisted, OWNER, _render("one", ("trials_csv", "trials_json")), force=False)
    unlisted["best_json"].write_text('{"layers": [64]}\n')
    with pytest.raises(ReportConflict, match=r"s\.best\.json is not a report of this study \(no s\.summary\.json lists it\)"):
        check_reports(unlisted, OWNER, force=False)
    # A user's own file that no summary lists, and a summary that is not paropt's.
    mine = tmp_path / "mine"
    mine.mkdir()
    own = output_paths(mine, "s")
    own["best_py"].write_text("# my notes\n")
    with pytest.raises(ReportConflict, match=r"s\.best\.py is not a report of this study \(no s\.summary\.json lists it\)"):
        write_reports(own, OWNER, _render("x"), force=False)
    assert _snapshot(mine) == {"s.best.py": b"# my notes\n"}
    own["summary"].write_text("not json")
    with pytest.raises(ReportConflict, match="is not a paropt summary"):
        check_reports(own, OWNER, force=False)
    # --force replaces them.
    write_reports(own, OWNER, _render("x"), force=True)
    assert own["best_py"].read_text() == "best_py x\n"


def test_a_writer_killed_half_way_leaves_files_the_summary_vouches_for(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import gru4rec.tune.report_files as report_files

    paths = output_paths(tmp_path, "s")
    write_reports(paths, OWNER, _render("old"), force=False)
    real_write = report_files._write
    written: list[str] = []

    def dying_write(path: Path, data: bytes) -> None:
        if len(written) == 3:  # the staged summary and two reports are written, then the process dies
            raise KeyboardInterrupt
        written.append(path.name)
        real_write(path, data)

    monkeypatch.setattr(report_files, "_write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        write_reports(paths, OWNER, _render("new"), force=False)
    monkeypatch.setattr(report_files, "_write", real_write)
    assert written[0] == "s.summary.json"
    texts = {key: paths[key].read_text() for key in ("trials_csv", "trials_json", "best_json", "best_py")}
    assert sorted(texts.values()) == ["best_json old\n", "best_py old\n", "trials_csv new\n", "trials_json new\n"]
    check_reports(paths, OWNER, force=False)  # a mix of old and new, every one listed: the rerun may go on
    write_reports(paths, OWNER, _render("new"), force=False)
    summary = json.loads(paths["summary"].read_text())
    assert all(len(entry["sha256"]) == 1 for entry in summary["files"].values())


def test_writers_in_one_folder_take_turns(tmp_path: Path) -> None:
    paths = output_paths(tmp_path, "s")
    inside: list[int] = []
    overlaps: list[int] = []

    def slow(tag: str):
        def render() -> tuple[dict[str, str], dict[str, object]]:
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(1)
            time.sleep(0.2)
            inside.pop()
            return _render(tag)()
        return render

    threads = [threading.Thread(target=write_reports, args=(paths, OWNER, slow(tag), False)) for tag in ("a", "bb", "ccc")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    # Whoever wrote last, the summary vouches for exactly the files on disk.
    summary = json.loads(paths["summary"].read_text())
    tag = paths["best_py"].read_text().split()[1]
    assert summary["counts"] == {"COMPLETE": len(tag)}
    for key, entry in summary["files"].items():
        assert entry["sha256"] == [hashlib.sha256(paths[key].read_bytes()).hexdigest()]
