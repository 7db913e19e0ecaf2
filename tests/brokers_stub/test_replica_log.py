"""The replica state, its epoch-history operations, its file, and the small state files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brokers_stub import replica_log as rl
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.storage import (
    CLEAN_SHUTDOWN_FILE,
    read_metadata_offset,
    take_clean_shutdown_epoch,
    write_clean_shutdown,
    write_metadata_offset,
)

# --- epoch history --------------------------------------------------------------------


def test_epoch_at_and_last_written_epoch() -> None:
    h = [(0, 0), (2, 5), (3, 9)]
    assert rl.epoch_at(h, 0) == 0
    assert rl.epoch_at(h, 4) == 0
    assert rl.epoch_at(h, 5) == 2
    assert rl.epoch_at(h, 100) == 3
    assert rl.epoch_at([(1, 3)], 2) is None
    assert rl.last_written_epoch(h, 9) == 2  # epoch 3 has no record yet
    assert rl.last_written_epoch(h, 10) == 3
    assert rl.last_written_epoch(h, 0) == rl.NO_EPOCH
    assert rl.last_written_epoch([(0, 0)], 1) == 0  # epoch 0 is an epoch, not "none"


def test_assign_epoch_follows_kafka() -> None:
    assert rl.assign_epoch([], 0, 0) == [(0, 0)]
    assert rl.assign_epoch([(0, 0)], 1, 10) == [(0, 0), (1, 10)]
    # The same epoch again, at or after its start: no change.
    assert rl.assign_epoch([(0, 0), (1, 10)], 1, 12) == [(0, 0), (1, 10)]
    # A newer epoch at the same offset replaces an epoch that wrote nothing.
    assert rl.assign_epoch([(0, 0), (1, 10)], 2, 10) == [(0, 0), (2, 10)]


def test_truncate_history_drops_entries_at_or_after_the_offset() -> None:
    assert rl.truncate_history_to([(0, 0), (1, 5), (2, 8)], 5) == [(0, 0)]
    assert rl.truncate_history_to([(0, 0), (1, 5), (2, 8)], 6) == [(0, 0), (1, 5)]
    assert rl.truncate_history_to([(0, 0)], 0) == []


def test_end_offset_for_epoch() -> None:
    h = [(0, 0), (1, 5), (3, 9)]
    assert rl.end_offset_for_epoch(h, 12, 0) == (0, 5)
    assert rl.end_offset_for_epoch(h, 12, 1) == (1, 9)
    assert rl.end_offset_for_epoch(h, 12, 2) == (1, 9)  # unknown: the largest older one
    assert rl.end_offset_for_epoch(h, 12, 3) == (3, 12)  # the newest ends at the LEO
    assert rl.end_offset_for_epoch(h, 12, 7) == (3, 12)
    assert rl.end_offset_for_epoch([(4, 0)], 3, 2) == (rl.NO_EPOCH, 0)
    assert rl.end_offset_for_epoch([], 0, 2) == (rl.NO_EPOCH, 0)


def test_common_prefix() -> None:
    assert rl.common_prefix([(0, 0)], 10, [(0, 0)], 7) == 7
    assert rl.common_prefix([(0, 0)], 2, [(0, 0), (1, 1)], 2) == 1
    assert rl.common_prefix([(0, 0), (2, 5)], 10, [(0, 0), (1, 5), (3, 9)], 12) == 5
    assert rl.common_prefix([(1, 0)], 3, [(0, 0)], 3) == 0
    assert rl.common_prefix([], 0, [(0, 0)], 5) == 0


# --- the replica state ----------------------------------------------------------------


def test_lose_unflushed_keeps_only_what_was_fsynced() -> None:
    log = ReplicaLog(
        topic="t",
        partition=0,
        leader_epochs=[(0, 0), (1, 40), (2, 50), (3, 70)],
        log_end_offset=90,
        high_watermark=80,
        flushed_offset=50,
    )
    assert log.lose_unflushed()
    assert log.log_end_offset == 50
    assert log.high_watermark == 50
    # Entries starting above the flushed offset are gone; one starting at it stays.
    assert log.leader_epochs == [(0, 0), (1, 40), (2, 50)]
    assert not log.lose_unflushed()  # nothing more to lose


def test_lose_unflushed_with_nothing_flushed_empties_the_log() -> None:
    log = ReplicaLog(topic="t", partition=0, leader_epochs=[(0, 0), (1, 5)], log_end_offset=9)
    log.lose_unflushed()
    assert (log.log_end_offset, log.leader_epochs, log.high_watermark) == (0, [(0, 0)], 0)


def test_truncate_to_lowers_hw_and_flushed() -> None:
    log = ReplicaLog(
        topic="t",
        partition=0,
        leader_epochs=[(0, 0), (1, 5)],
        log_end_offset=10,
        high_watermark=8,
        flushed_offset=9,
    )
    assert log.truncate_to(5)
    assert (log.log_end_offset, log.high_watermark, log.flushed_offset) == (5, 5, 5)
    assert log.leader_epochs == [(0, 0)]
    assert not log.truncate_to(7)  # beyond the end: nothing to drop


def test_copy_from_leader_and_high_watermark() -> None:
    log = ReplicaLog(topic="t", partition=0, leader_epochs=[(0, 0)], log_end_offset=5)
    assert log.copy_from_leader([(0, 0), (1, 5)], 12)
    assert (log.log_end_offset, log.leader_epochs) == (12, [(0, 0), (1, 5)])
    assert log.advance_high_watermark(20)  # capped at the LEO
    assert log.high_watermark == 12
    assert not log.advance_high_watermark(3)  # never backwards


# --- files ----------------------------------------------------------------------------


def test_replica_file_round_trip(tmp_path: Path) -> None:
    log = ReplicaLog(
        topic="orders-eu",
        partition=3,
        leader_epochs=[(0, 0), (4, 17)],
        log_end_offset=30,
        high_watermark=25,
        flushed_offset=20,
    )
    rl.save(log, tmp_path)
    path = tmp_path / "orders-eu-3.json"
    assert json.loads(path.read_text())["flushed_offset"] == 20
    loaded, problems = rl.load_all(tmp_path)
    assert problems == []
    assert loaded == [log]

    rl.flush(log, tmp_path)
    assert log.flushed_offset == 30
    (again,), _ = rl.load_all(tmp_path)
    assert again.flushed_offset == 30
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_load_all_reports_bad_files_and_keeps_the_good(tmp_path: Path) -> None:
    rl.save(ReplicaLog(topic="a", partition=0, log_end_offset=3), tmp_path)
    (tmp_path / "b-0.json").write_text("{not json")
    (tmp_path / "c-0.json").write_text(json.dumps({"topic": "c"}))
    logs, problems = rl.load_all(tmp_path)
    assert [x.topic for x in logs] == ["a"]
    assert len(problems) == 2
    assert rl.load_all(tmp_path / "missing") == ([], [])


def _state(log: ReplicaLog) -> tuple[int, int, int, int]:
    return (log.seq, log.log_end_offset, log.high_watermark, log.flushed_offset)


def test_a_save_never_writes_into_the_fsynced_file(tmp_path: Path) -> None:
    """`flush` writes one file under two names; `save` replaces `<name>.json` by another
    file, so the fsynced one, under `<name>.json.flushed`, is never written through the
    page cache (an OS crash may empty a page-cache write)."""
    log = ReplicaLog(topic="t", partition=0, log_end_offset=5)
    rl.flush(log, tmp_path)
    path = tmp_path / "t-0.json"
    flushed = tmp_path / "t-0.json.flushed"
    assert path.stat().st_ino == flushed.stat().st_ino  # one file, two links
    durable = flushed.read_bytes()
    log.log_end_offset = 9
    rl.save(log, tmp_path)
    assert path.stat().st_ino != flushed.stat().st_ino
    assert flushed.read_bytes() == durable
    assert json.loads(path.read_bytes())["log_end_offset"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-0.json", "t-0.json.flushed"]


def test_load_takes_the_newest_complete_state_a_crash_left(tmp_path: Path) -> None:
    log = ReplicaLog(topic="t", partition=0, log_end_offset=5)
    rl.flush(log, tmp_path)  # seq 1, durable
    log.log_end_offset = 8
    rl.save(log, tmp_path)  # seq 2
    path = tmp_path / "t-0.json"
    tmp = tmp_path / ".t-0.json.tmp"
    newest = _state(log)

    # A process crash between the save's unlink and its rename: only the temporary
    # file holds the newest state, whole.
    path.rename(tmp)
    assert [_state(x) for x in rl.load_all(tmp_path)[0]] == [newest]
    tmp.rename(path)

    # A crash while the temporary file was written: cut short, it is ignored.
    tmp.write_bytes(path.read_bytes()[:20])
    assert [_state(x) for x in rl.load_all(tmp_path)[0]] == [newest]
    # ... and whole (written, not yet renamed): it is the newest.
    log.log_end_offset = 11
    tmp.write_bytes(json.dumps({**log.to_json(), "seq": 3}).encode())
    assert [x.log_end_offset for x in rl.load_all(tmp_path)[0]] == [11]
    tmp.unlink()

    # An OS crash that emptied the page-cache write: the fsynced state, not a problem.
    path.write_bytes(b"")
    (only,), problems = rl.load_all(tmp_path)
    assert problems == [] and _state(only) == (1, 5, 0, 5)

    # An OS crash that kept an older page-cache write under `<name>.json` than the
    # fsynced one: the higher sequence number wins, not the name.
    older = ReplicaLog(topic="t", partition=0, log_end_offset=4, seq=0)
    path.write_bytes(json.dumps(older.to_json()).encode())
    (only,), _ = rl.load_all(tmp_path)
    assert only.log_end_offset == 5 and only.flushed_offset == 5


def test_a_file_of_an_earlier_version_loads_and_remove_takes_every_name(tmp_path: Path) -> None:
    legacy = {"topic": "t", "partition": 0, "log_end_offset": 7, "leader_epochs": [[1, 0]]}
    (tmp_path / "t-0.json").write_text(json.dumps(legacy))  # no seq, no second name
    ((log,), problems) = rl.load_all(tmp_path)
    assert problems == [] and log.seq == 0 and log.log_end_offset == 7
    rl.flush(log, tmp_path)
    (tmp_path / ".t-0.json.tmp").write_text("{")  # what a crash may leave
    assert [p.name for p in rl.replica_files(tmp_path)] == ["t-0.json"]
    assert rl.remove(tmp_path, "t", 0) is True
    assert list(tmp_path.iterdir()) == []
    assert rl.remove(tmp_path, "t", 0) is False


def test_clean_shutdown_file_is_taken_once(tmp_path: Path) -> None:
    assert take_clean_shutdown_epoch(tmp_path) == (None, None)
    write_clean_shutdown(tmp_path, 42)
    assert json.loads((tmp_path / CLEAN_SHUTDOWN_FILE).read_text()) == {"broker_epoch": 42}
    assert take_clean_shutdown_epoch(tmp_path) == (42, None)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert take_clean_shutdown_epoch(tmp_path) == (None, None)


@pytest.mark.parametrize("content", ["garbage", '{"broker_epoch": "7"}', "[1]", '{"x": 1}'])
def test_an_unreadable_clean_shutdown_file_means_unclean(tmp_path: Path, content: str) -> None:
    (tmp_path / CLEAN_SHUTDOWN_FILE).write_text(content)
    epoch, problem = take_clean_shutdown_epoch(tmp_path)
    assert epoch is None
    assert problem is not None
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_metadata_offset_file(tmp_path: Path) -> None:
    assert read_metadata_offset(tmp_path) is None
    write_metadata_offset(tmp_path, 17)
    assert read_metadata_offset(tmp_path) == 17
    assert (tmp_path / "metadata_offset").read_text() == "17\n"
