"""`resolve_log_dir`: a cluster data directory and the controller's own both work, and a
directory with no log is a named error naming both places tried."""

from __future__ import annotations

from pathlib import Path

import pytest

from metactl.errors import LogDirNotFoundError
from metadata_log.sqlite_format import LOG_FILE_NAME
from ops.paths import resolve_log_dir


def test_the_controller_dir_and_the_cluster_dir_both_resolve(tmp_path: Path) -> None:
    ctl = tmp_path / "controller"
    ctl.mkdir()
    (ctl / LOG_FILE_NAME).write_bytes(b"")
    assert resolve_log_dir(ctl) == ctl
    assert resolve_log_dir(tmp_path) == ctl
    assert resolve_log_dir(str(tmp_path)) == ctl


def test_a_log_in_the_given_dir_wins_over_a_controller_subdir(tmp_path: Path) -> None:
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / LOG_FILE_NAME).write_bytes(b"")
    (tmp_path / LOG_FILE_NAME).write_bytes(b"")
    assert resolve_log_dir(tmp_path) == tmp_path


def test_no_log_names_both_places(tmp_path: Path) -> None:
    (tmp_path / "controller").mkdir()  # a directory without the file is not a log
    with pytest.raises(LogDirNotFoundError) as exc:
        resolve_log_dir(tmp_path)
    assert exc.value.code == "LOG_DIR_NOT_FOUND"
    assert str(tmp_path) in exc.value.message
    assert str(tmp_path / "controller") in exc.value.message
