"""Shared by the tests of gru4rec.tune (tests/test_tune_*.py): synthetic data files, a search
space of tiny models, settings for a study and helpers to read its trials back.

Every study trains real (tiny) GRU4Rec models through the public API; the numbers a study
reports are checked against models trained and evaluated independently in the tests.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.data.events import write_events  # noqa: E402
from gru4rec.datasets.synthetic import generate, time_split  # noqa: E402
from gru4rec.tune import STORAGE_ENV, ParoptSettings, open_storage  # noqa: E402
from postgres_server import postgres_fixture  # noqa: E402,F401 - a fixture, for storage_url

ROOT = Path(__file__).resolve().parents[1]
TrialState = optuna.trial.TrialState
optuna.logging.set_verbosity(optuna.logging.ERROR)

# Tiny models: a trial takes a fraction of a second on one CPU thread.
FIXED = "loss=cross-entropy,n_sample=16,n_epochs=2,logq=1.0"
SPACE_LINES = [
    '{"name": "layers", "dtype": "int", "values": [8, 24], "step": 8}',
    '{"name": "batch_size", "dtype": "int", "values": [8, 32], "step": 8}',
    '{"name": "learning_rate", "dtype": "float", "values": [0.05, 0.2], "step": 0.05}',
    '{"name": "dropout_p_hidden", "dtype": "float", "values": [0.0, 0.5], "step": 0.25}',
    '{"name": "momentum", "dtype": "float", "values": [0.0, 0.5], "step": 0.1}',
]


@pytest.fixture(scope="module", name="data")
def data_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic train / valid / test files (about 1.3k / 0.4k / 0.4k events, 60 items)."""
    folder = tmp_path_factory.mktemp("paropt_data")
    df = generate(500, 60, seed=1, n_days=12)
    train_full, test = time_split(df, 2 * 86400)
    train, valid = time_split(train_full, 2 * 86400)
    paths = {"train": folder / "train.tsv", "valid": folder / "valid.tsv", "test": folder / "test.tsv"}
    for name, frame in (("train", train), ("valid", valid), ("test", test)):
        assert len(frame) > 100, name
        write_events(frame, paths[name])
    space = folder / "space.json"
    space.write_text("\n".join(SPACE_LINES) + "\n")
    paths["space"] = space
    return paths


def settings(data: dict[str, Path], tmp: Path, **kw: object) -> ParoptSettings:
    base: dict[str, object] = dict(
        train=str(data["train"]),
        valid=str(data["valid"]),
        paramspace=str(data["space"]),
        fixed=FIXED,
        n_trials=3,
        primary_metric="mrr",
        out=str(tmp / "out"),
        threads=1,
        sampler_seed=0,
    )
    base.update(kw)
    return ParoptSettings(**base)  # type: ignore[arg-type]


def trials_of(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    """The trials of study ``name`` in the storage of URL ``storage`` (read independently of any run)."""
    opened, _ = open_storage(storage)
    return optuna.load_study(study_name=name, storage=opened).get_trials(deepcopy=False)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop(STORAGE_ENV, None)
    return env


def cli_args(data: dict[str, Path], **kw: str) -> list[str]:
    args = [str(data["train"]), str(data["valid"]), "-opf", str(data["space"]), "-fp", FIXED, "-pm", "mrr", "--threads", "1"]
    for key, value in kw.items():
        args += [f"--{key.replace('_', '-')}", value] if value != "" else [f"--{key.replace('_', '-')}"]
    return args


class AlwaysPrune(optuna.pruners.BasePruner):
    """A pruner that prunes at every opportunity."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return True



@pytest.fixture(params=["sqlite", "postgresql"], name="storage_url")
def storage_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh storage URL: a SQLite file, and a database of a real PostgreSQL server
    (tests/postgres_server.py; skipped where none can run)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    server = request.getfixturevalue("postgres")
    return str(server.url(server.new_database()))


def wait_for(condition: Callable[[], object], what: str, timeout: float = 240, process: subprocess.Popen[bytes] | None = None) -> object:
    """Poll ``condition`` until it returns something true; fails after ``timeout`` seconds or when
    ``process`` ends first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition()
        except KeyError:  # the study does not exist yet
            result = None
        if result:
            return result
        if process is not None and process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            pytest.fail(f"the process ended (code {process.returncode}) before {what}:\n{output[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def running_trial(storage: str, name: str, *, not_pid: int | None = None, only_pid: int | None = None) -> optuna.trial.FrozenTrial | None:
    """A RUNNING trial of the study whose worker process is (not) the given one, or None."""
    for t in trials_of(storage, name):
        worker = t.user_attrs.get("worker", "")
        if t.state != TrialState.RUNNING or not worker:
            continue
        pid = int(worker.rsplit(":", 1)[1])
        if (not_pid is None or pid != not_pid) and (only_pid is None or pid == only_pid):
            return t
    return None


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` if it still runs (test teardown, also after a failure)."""
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stdout:
        process.stdout.close()
