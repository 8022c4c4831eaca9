"""Tests of gru4rec.tune.storage: storage URLs (default, environment variable, bare paths,
journal files) and errors that do not show the password."""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import Gru4RecError  # noqa: E402
from gru4rec.tune import STORAGE_ENV, open_storage  # noqa: E402


def test_storage_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    _, url = open_storage(None, tmp_path / "o")
    assert url == f"sqlite:///{(tmp_path / 'o' / 'paropt.db').resolve()}"
    monkeypatch.setenv(STORAGE_ENV, f"sqlite:///{tmp_path / 'env.db'}")
    assert open_storage(None, tmp_path)[1] == f"sqlite:///{tmp_path / 'env.db'}"
    assert open_storage(str(tmp_path / "x.db"), tmp_path)[1] == f"sqlite:///{(tmp_path / 'x.db').resolve()}"
    storage, url = open_storage(str(tmp_path / "j.log"), tmp_path)
    assert url == f"journal:{(tmp_path / 'j.log').resolve()}"
    assert isinstance(storage, optuna.storages.JournalStorage)
    with pytest.raises(Gru4RecError, match="cannot open the Optuna storage"):
        open_storage("nosuchdb://user:secret@host/db", tmp_path)
    try:
        open_storage("nosuchdb://user:secret@host/db", tmp_path)
    except Gru4RecError as exc:
        assert "secret" not in str(exc)
