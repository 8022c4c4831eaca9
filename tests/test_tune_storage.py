"""Tests of gru4rec.tune.storage: storage URLs (default, environment variable, bare paths,
journal files, PostgreSQL drivers), errors and printed URLs that do not show the password, the
heartbeat and retry callback of RDB storages, and a real PostgreSQL server."""
from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import Gru4RecError  # noqa: E402
from gru4rec.tune import STORAGE_ENV, open_storage  # noqa: E402
from postgres_server import postgres_fixture  # noqa: E402,F401 - a fixture


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


def test_storage_url_forms_redaction_and_the_dashboard_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from gru4rec.tune.storage import dashboard_command, redact, resolve_storage_url

    assert redact("postgresql://alice:pa55@db.example:5432/optuna") == "postgresql://alice:***@db.example:5432/optuna"
    assert redact("postgresql://db/optuna?user=a&password=pa55&x=1") == "postgresql://db/optuna?user=a&password=***&x=1"
    assert redact("sqlite:////a/b.db") == "sqlite:////a/b.db"
    # postgresql:// (and the hosting services' postgres://) with the driver that is installed.
    resolved = resolve_storage_url("postgres://alice:pa55@db/optuna", tmp_path)
    if importlib.util.find_spec("psycopg2") is not None:
        assert resolved == "postgresql://alice:pa55@db/optuna"
    else:
        assert resolved == "postgresql+psycopg://alice:pa55@db/optuna"
    assert resolve_storage_url("mysql+pymysql://u@h/db", tmp_path) == "mysql+pymysql://u@h/db"
    monkeypatch.chdir(tmp_path)
    assert resolve_storage_url("journal:runs/j.log", tmp_path) == f"journal:{tmp_path.resolve() / 'runs' / 'j.log'}"
    # The dashboard takes SQLAlchemy URLs and journal files.
    assert dashboard_command("postgresql+psycopg://alice:pa55@db/optuna") == "optuna-dashboard 'postgresql+psycopg://alice:***@db/optuna'"
    assert dashboard_command(f"journal:{tmp_path}/j.log") == f"optuna-dashboard {tmp_path}/j.log"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_rdb_storages_get_the_heartbeat_and_the_retry_callback(tmp_path: Path) -> None:
    from gru4rec.tune.storage import MAX_RETRIES, has_heartbeat

    storage, _ = open_storage(f"sqlite:///{tmp_path / 'h.db'}", tmp_path, heartbeat_interval=3, grace_period=7)
    assert has_heartbeat(storage) and storage.get_heartbeat_interval() == 3 and storage.grace_period == 7
    callback = storage.get_heartbeat_stale_trial_callback() if hasattr(storage, "get_heartbeat_stale_trial_callback") \
        else storage.get_failed_trial_callback()
    assert type(callback).__name__ in ("RetryHeartbeatStaleTrialCallback", "RetryFailedTrialCallback")
    assert callback._max_retry == MAX_RETRIES
    # The callback queues a failed trial again with its parameters, naming the trial it repeats.
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    trial.suggest_int("layers", 8, 24)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    callback(study, study.trials[0])
    waiting = study.trials[1]
    assert waiting.state == optuna.trial.TrialState.WAITING and waiting.system_attrs["failed_trial"] == 0
    journal, _ = open_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)
    assert not has_heartbeat(journal)  # Optuna's journal storage has none


def test_a_real_postgresql_server(postgres: object, tmp_path: Path) -> None:
    url = postgres.url(postgres.new_database(), password="s3cret")  # type: ignore[attr-defined]
    storage, resolved = open_storage(url, tmp_path)
    assert resolved.endswith(f"@127.0.0.1:{postgres.port}/" + url.rsplit("/", 1)[1])  # type: ignore[attr-defined]
    study = optuna.create_study(storage=storage, study_name="pg")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert len(optuna.load_study(study_name="pg", storage=open_storage(url, tmp_path)[0]).trials) == 3
    # Nothing listens there: one clear error, without the password.
    closed = url.replace(f":{postgres.port}/", ":1/")  # type: ignore[attr-defined]
    with pytest.raises(Gru4RecError, match="cannot open the Optuna storage") as info:
        open_storage(closed, tmp_path)
    assert "s3cret" not in str(info.value) and "postgres:***@" in str(info.value)
