"""The one messages/progress facility (gru4rec/log.py)."""
from __future__ import annotations

import logging

import pytest

from gru4rec import log


@pytest.fixture(autouse=True)
def _restore():
    root = logging.getLogger(log.LOGGER_NAME)
    level = root.level
    yield
    log.set_verbosity(level)
    log.enable_default_handler()


def test_info_goes_to_stdout_and_warnings_to_stderr(capsys):
    logging.getLogger("gru4rec.training.loop").info("Epoch1 --> loss: 1.0")
    logging.getLogger("gru4rec.data").warning("3 rows dropped")
    out, err = capsys.readouterr()
    assert out == "Epoch1 --> loss: 1.0\n"
    assert err == "warning: 3 rows dropped\n"


def test_quiet_keeps_warnings_only(capsys):
    log.set_verbosity(logging.WARNING)
    logging.getLogger("gru4rec.x").info("hidden")
    logging.getLogger("gru4rec.x").warning("shown")
    out, err = capsys.readouterr()
    assert out == "" and err == "warning: shown\n"


def test_an_application_can_take_the_records_over(capsys):
    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    collect = Collect()
    logging.getLogger().addHandler(collect)  # the application's own handler, on the root logger
    try:
        logging.getLogger("gru4rec.x").info("kept by the default handler")
        log.disable_default_handler()
        logging.getLogger("gru4rec.x").info("to the application")
    finally:
        logging.getLogger().removeHandler(collect)
    out, err = capsys.readouterr()
    assert out == "kept by the default handler\n" and err == ""
    assert collect.messages == ["to the application"]


def test_progress_bars_follow_the_switches():
    assert log.progress_bar(10, "x", enabled=False).disable
    log.set_verbosity(logging.WARNING)
    assert log.progress_bar(10, "x").disable  # quiet: no bars


def test_without_a_terminal_progress_is_a_message_at_an_interval(monkeypatch, capsys):
    # Under pytest standard error is not a terminal: a log file's view of a long epoch.
    monkeypatch.setattr(log, "PROGRESS_LOG_INTERVAL", 3600.0)
    bar = log.progress_bar(10, "Epoch1", unit="mb")
    bar.update(3)
    bar.close()
    assert not bar.disable and capsys.readouterr().out == ""  # nothing before the interval has passed
    monkeypatch.setattr(log, "PROGRESS_LOG_INTERVAL", 0.0)
    with log.progress_bar(10, "Epoch1", unit="mb", initial=2) as bar:
        bar.set_postfix_str("loss 6.1234", refresh=False)
        bar.update(3)
        bar.update(5)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["Epoch1: 5/10 mb (50%)", "Epoch1: 10/10 mb (100%)"]
    assert all(line.endswith("mb/s, loss 6.1234") for line in lines)
    assert log.progress_bar(10, "x", enabled=False).disable  # asked for no progress: none
