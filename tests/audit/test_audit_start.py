"""What an audit says before Spark runs (issue 22): its first line at once, before the
session (and its JVM) is created, where progress is shown; and a machine without Java is
told so in one line naming the command that installs it, before anything starts. No JVM
is started here: the session is replaced by one that records what was printed before
it was asked for."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from metactl.errors import SparkJobFailedError
from ops.cli import main

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "simulation" / "scenarios" / "manual-operator-election.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("audit-start") / "data"
    assert main(["scenario", "run", str(SCENARIO), "--data-dir", str(d)]) == 0
    return d


class NoSession:
    """Stands in for `audit.spark.get_session`: records stderr as it was when the
    session was asked for (the event), then fails the audit as a Spark error would."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.asked = threading.Event()
        self.err_before = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.err_before = self.capsys.readouterr().err
        self.asked.set()
        raise SparkJobFailedError("no session in this test")


@pytest.mark.parametrize("progress", ["bars", "lines"])
def test_the_first_line_comes_before_the_session_is_created(
    data: Path,
    progress: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = NoSession(capsys)
    monkeypatch.setattr("audit.spark.get_session", session)
    capsys.readouterr()
    status = main(["audit", "all", "--data-dir", str(data), "--progress", progress])
    assert session.asked.is_set()
    assert session.err_before == "starting Spark (local[*])…\n"
    assert status == 1  # the stand-in's failure, as SPARK_JOB_FAILED
    assert capsys.readouterr().err.startswith("error: SPARK_JOB_FAILED: ")


def test_no_first_line_when_progress_is_off(
    data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    session = NoSession(capsys)
    monkeypatch.setattr("audit.spark.get_session", session)
    capsys.readouterr()
    # Off, and auto away from a terminal (pytest's captured stderr is not one).
    for extra in (["--progress", "off"], []):
        assert main(["audit", "offline", "--data-dir", str(data), *extra]) == 1
        assert session.asked.is_set() and session.err_before == ""
        session.asked.clear()
        capsys.readouterr()


def test_without_java_one_line_names_make_system(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    session = NoSession(capsys)
    monkeypatch.setattr("audit.spark.get_session", session)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no java (nor anything else) on it
    capsys.readouterr()
    assert main(["audit", "offline", "--data-dir", str(data), "--progress", "lines"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: JAVA_NOT_FOUND: no `java` on PATH") and err.count("\n") == 1
    assert "`make system`" in err
    assert not session.asked.is_set()  # refused before anything started
    # A JAVA_HOME without a java in it is named too.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert main(["audit", "offline", "--data-dir", str(data)]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"error: JAVA_NOT_FOUND: JAVA_HOME is {tmp_path}")
