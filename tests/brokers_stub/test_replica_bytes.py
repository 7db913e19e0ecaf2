"""Stored record batches: a replica's sparse `.log` file of Kafka batches, its index, its
consistency with the JSON state across saves, flushes, truncations and crashes, and the
replication of the bytes from a leader to a follower."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import pytest
from structlog.testing import capture_logs

from brokers_stub import replica_bytes
from brokers_stub import replica_log as rl
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_bytes import Chunk
from brokers_stub.replica_files import ReplicaFiles
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replica_manager import ReplicaManager
from protocol.codec import decode_frame, encode_frame
from protocol.kafka.records import read_header
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse
from tests.brokers_stub.helpers import TOPIC, cluster, config
from tests.brokers_stub.test_replica_manager import EPOCHS, TP, Clock, manager

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (protocol.kafka.records)
_BEFORE_CRC = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic


def batch(base: int, count: int, epoch: int = 0, payload: bytes = b"") -> bytes:
    """A valid magic-2 batch of `count` records from `base` (its records are opaque bytes
    here: nothing below the header is parsed by the replica)."""
    payload = payload or bytes([base % 251]) * (20 + count)
    rest = _AFTER_CRC.pack(0, count - 1, 1000, 1000 + count, -1, -1, -1, count) + payload
    head = _BEFORE_CRC.pack(base, 4 + 1 + 4 + len(rest), epoch, 2)
    return head + struct.pack(">I", crc32c.crc32c(rest)) + rest


def bytes_file(d: Path, log: ReplicaLog) -> Path:
    return d / f"{log.topic}-{log.partition}.log"


def state(d: Path, log: ReplicaLog) -> dict[str, object]:
    return json.loads((d / f"{log.name}.json").read_bytes())  # type: ignore[no-any-return]


def read(log: ReplicaLog, d: Path, start: int, end: int, max_bytes: int = 1 << 20) -> list[Chunk]:
    return rl.read_chunks(log, d, start, end, max_bytes)


def mixed(d: Path) -> tuple[ReplicaLog, list[bytes]]:
    """0..4 native, 5..7 a batch, 8..9 a batch, 10..14 native, 15 a batch (LEO 16)."""
    log = ReplicaLog(topic="t", partition=0, leader_epochs=[(0, 0)])
    b1, b2, b3 = batch(5, 3), batch(8, 2), batch(15, 1)
    log.append(5)
    log.append(3, b1)
    log.append(2, b2)
    log.append(5)
    log.append(1, b3)
    return log, [b1, b2, b3]


# --- appending and reading ------------------------------------------------------------


def test_chunks_mix_stored_batches_and_no_bytes_ranges(tmp_path: Path) -> None:
    log, (b1, b2, b3) = mixed(tmp_path)
    expected = [
        Chunk(0, 5, None),
        Chunk(5, 3, b1),
        Chunk(8, 2, b2),
        Chunk(10, 5, None),
        Chunk(15, 1, b3),
    ]
    assert read(log, tmp_path, 0, 16) == expected  # queued bytes, not written yet
    rl.save(log, tmp_path)
    assert read(log, tmp_path, 0, 16) == expected  # from the file now
    assert bytes_file(tmp_path, log).read_bytes() == b1 + b2 + b3
    assert state(tmp_path, log)["log_bytes"] == len(b1 + b2 + b3) == log.log_bytes
    assert [(h.base_offset, h.next_offset) for h in log.batches()] == [(5, 8), (8, 10), (15, 16)]
    # A batch starting before `from_offset` comes whole; no-bytes ranges are split at
    # `from_offset` and `end_offset`.
    assert read(log, tmp_path, 6, 12) == [Chunk(5, 3, b1), Chunk(8, 2, b2), Chunk(10, 2, None)]
    assert read(log, tmp_path, 2, 4) == [Chunk(2, 2, None)]
    assert read(log, tmp_path, 16, 20) == []
    assert read(log, tmp_path, 3, 3) == []
    # Ends are capped at the LEO; a batch starting below `end_offset` comes whole.
    assert read(log, tmp_path, 12, 99) == [Chunk(12, 3, None), Chunk(15, 1, b3)]
    assert read(log, tmp_path, 5, 6) == [Chunk(5, 3, b1)]


def test_max_bytes_stops_before_exceeding_but_returns_the_first_chunk(tmp_path: Path) -> None:
    log, (b1, b2, _b3) = mixed(tmp_path)
    rl.save(log, tmp_path)
    # The first batch even if larger than max_bytes.
    assert read(log, tmp_path, 5, 16, max_bytes=1) == [Chunk(5, 3, b1)]
    # Exactly two batches' worth: stops before the third, the no-bytes range between
    # included (it counts no bytes).
    assert read(log, tmp_path, 5, 16, max_bytes=len(b1) + len(b2)) == [
        Chunk(5, 3, b1),
        Chunk(8, 2, b2),
        Chunk(10, 5, None),
    ]
    # A no-bytes first chunk, then a batch that does not fit: the range alone.
    assert read(log, tmp_path, 0, 16, max_bytes=len(b1) - 1) == [Chunk(0, 5, None)]
    assert read(log, tmp_path, 0, 16, max_bytes=0) == [Chunk(0, 5, None)]


def test_append_checks_the_batch_against_the_log(tmp_path: Path) -> None:
    log = ReplicaLog(topic="t", partition=0)
    log.append(4)
    with pytest.raises(ValueError, match="base offset"):
        log.append(2, batch(3, 2))
    with pytest.raises(ValueError, match="last offset delta"):
        log.append(3, batch(4, 2))
    with pytest.raises(ValueError, match="whole"):
        log.append(2, batch(4, 2)[:-1])
    with pytest.raises(ValueError, match="whole"):
        log.append(2, batch(4, 2)[:40])
    assert (log.log_end_offset, log.batches(), log.log_bytes) == (4, [], 0)
    log.append(2, bytearray(batch(4, 2)))  # any bytes-like
    assert log.log_end_offset == 6 and log.batches()[0].base_offset == 4


def test_a_replica_without_batches_has_no_bytes_file(tmp_path: Path) -> None:
    log = ReplicaLog(topic="t", partition=0)
    log.append(10)
    rl.save(log, tmp_path)
    rl.flush(log, tmp_path)
    assert "log_bytes" not in state(tmp_path, log)
    assert not bytes_file(tmp_path, log).exists()
    (again,), _ = rl.load_all(tmp_path)
    assert again.log_bytes == 0 and again.batches() == []
    assert read(again, tmp_path, 0, 10) == [Chunk(0, 10, None)]


# --- persistence ----------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    log, batches = mixed(tmp_path)
    rl.save(log, tmp_path)
    (loaded,), problems = rl.load_all(tmp_path)
    assert problems == [] and loaded == log
    assert loaded.batches() == log.batches()
    assert read(loaded, tmp_path, 0, 16) == read(log, tmp_path, 0, 16)
    assert loaded.take_load_note() is None
    # The loaded replica goes on appending where the file ends.
    b4 = batch(16, 4)
    loaded.append(4, b4)
    rl.save(loaded, tmp_path)
    assert bytes_file(tmp_path, log).read_bytes() == b"".join([*batches, b4])
    (again,), _ = rl.load_all(tmp_path)
    assert read(again, tmp_path, 16, 20) == [Chunk(16, 4, b4)]
    # `.log` files are no replicas of their own.
    assert [p.name for p in rl.replica_files(tmp_path)] == ["t-0.json"]


def test_flush_then_lose_unflushed_keeps_the_fsynced_batches(tmp_path: Path) -> None:
    log, (b1, b2, b3) = mixed(tmp_path)
    rl.flush(log, tmp_path)  # 0..15 fsynced
    b4, b5 = batch(16, 2), batch(19, 1)
    log.append(2, b4)
    log.append(1)
    log.append(1, b5)
    rl.save(log, tmp_path)
    assert bytes_file(tmp_path, log).stat().st_size == len(b1 + b2 + b3 + b4 + b5)

    files = ReplicaFiles(config(tmp_path / "b", 1), BrokerLog(1))
    files.dir.mkdir(parents=True)
    for name in ("t-0.json", "t-0.json.flushed", "t-0.log"):
        (files.dir / name).write_bytes((tmp_path / name).read_bytes())
    files.load(lose_unflushed=True)
    lost = files.logs[("t", 0)]
    assert (lost.log_end_offset, lost.flushed_offset, lost.log_bytes) == (16, 16, len(b1 + b2 + b3))
    assert [h.base_offset for h in lost.batches()] == [5, 8, 15]
    # The loss is durable: the file is cut and a second start sees the same.
    assert (files.dir / "t-0.log").read_bytes() == b1 + b2 + b3
    (again,), _ = rl.load_all(files.dir)
    assert again == lost and again.batches() == lost.batches()
    assert files.read(("t", 0), 0, 16, 1 << 20) == read(log, tmp_path, 0, 16)


def test_a_torn_last_batch_is_cut_and_reported(tmp_path: Path) -> None:
    log, (b1, b2, _b3) = mixed(tmp_path)
    rl.save(log, tmp_path)
    path = bytes_file(tmp_path, log)
    path.write_bytes(path.read_bytes()[:-3])  # the OS kept the state, not all the bytes

    (loaded,), _ = rl.load_all(tmp_path)
    # The records of the lost batch are gone, and so are the native ones after the last
    # complete batch: nothing tells them from lost bytes.
    assert (loaded.log_end_offset, loaded.log_bytes) == (10, len(b1 + b2))
    assert [h.base_offset for h in loaded.batches()] == [5, 8]
    note = loaded.take_load_note()
    assert note is not None and "cut back to 10" in note
    assert loaded.take_load_note() is None  # taken once


def test_a_bytes_file_shorter_than_the_state_cuts_the_replica_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    files = ReplicaFiles(config(data_dir, 1), BrokerLog(1))
    files.dir.mkdir(parents=True)
    log, (b1, _, _) = mixed(files.dir)
    log.leader_epochs = [(0, 0), (1, 12)]
    log.high_watermark = 16
    rl.save(log, files.dir)
    path = bytes_file(files.dir, log)
    path.write_bytes(path.read_bytes()[: len(b1) + 10])  # the second batch's header is torn

    with capture_logs() as logs:
        files.load(lose_unflushed=False)
    got = files.logs[("t", 0)]
    assert (got.log_end_offset, got.high_watermark, got.leader_epochs) == (8, 8, [(0, 0)])
    assert got.batches()[0].base_offset == 5 and len(got.batches()) == 1
    (warning,) = [e for e in logs if e["event"] == "lost unflushed data"]
    assert warning["log_level"] == "warning" and "cut back to 8" in warning["batches"]
    # Made durable at once: the file cut, the state saying so under both names.
    assert path.read_bytes() == b1
    flushed = json.loads((files.dir / "t-0.json.flushed").read_bytes())
    assert (flushed["log_end_offset"], flushed["log_bytes"]) == (8, len(b1))


def test_a_missing_bytes_file_loses_every_batch(tmp_path: Path) -> None:
    log, _ = mixed(tmp_path)
    rl.flush(log, tmp_path)
    bytes_file(tmp_path, log).unlink()
    (loaded,), _ = rl.load_all(tmp_path)
    assert (loaded.log_end_offset, loaded.batches()) == (0, [])
    assert loaded.take_load_note() is not None


def test_a_corrupt_batch_above_the_flushed_offset_is_cut(tmp_path: Path) -> None:
    log, (b1, b2, b3) = mixed(tmp_path)
    rl.save(log, tmp_path)  # nothing flushed: every batch is CRC-checked
    path = bytes_file(tmp_path, log)
    data = bytearray(path.read_bytes())
    data[len(b1) + len(b2) - 1] ^= 0xFF  # the second batch's last byte
    path.write_bytes(bytes(data))
    (loaded,), _ = rl.load_all(tmp_path)
    assert (loaded.log_end_offset, [h.base_offset for h in loaded.batches()]) == (8, [5])
    # Zeros where the bytes should be (a file extended but never written): cut too.
    path.write_bytes(b1 + bytes(len(b2) + len(b3)))
    (loaded,), _ = rl.load_all(tmp_path)
    assert loaded.log_end_offset == 8


def test_a_longer_bytes_file_is_cut_at_the_next_write(tmp_path: Path) -> None:
    log, (b1, b2, b3) = mixed(tmp_path)
    rl.save(log, tmp_path)
    path = bytes_file(tmp_path, log)
    with path.open("ab") as f:
        f.write(batch(16, 3))  # written, but the state was not
    (loaded,), _ = rl.load_all(tmp_path)
    assert loaded.log_end_offset == 16 and loaded.take_load_note() is None
    assert read(loaded, tmp_path, 15, 99) == [Chunk(15, 1, b3)]
    b4 = batch(16, 1, payload=b"new")
    loaded.append(1, b4)
    rl.save(loaded, tmp_path)
    assert path.read_bytes() == b1 + b2 + b3 + b4


def test_a_bytes_file_the_state_does_not_name_is_ignored(tmp_path: Path) -> None:
    """A state written before bytes were stored (no `log_bytes`), next to a `.log` file
    (a crash between the first batch's write and its state's): the file is not trusted,
    and goes at the next write."""
    legacy = {"topic": "t", "partition": 0, "log_end_offset": 7, "leader_epochs": [[1, 0]]}
    (tmp_path / "t-0.json").write_text(json.dumps(legacy))
    (tmp_path / "t-0.log").write_bytes(batch(0, 7))
    (log,), problems = rl.load_all(tmp_path)
    assert problems == [] and log.batches() == [] and log.take_load_note() is None
    assert read(log, tmp_path, 0, 7) == [Chunk(0, 7, None)]
    rl.save(log, tmp_path)
    assert not (tmp_path / "t-0.log").exists()
    assert state(tmp_path, log).get("log_bytes", 0) == 0
    rl.save(log, tmp_path)  # no byte state left: the state no longer names any
    assert "log_bytes" not in state(tmp_path, log)


# --- truncation -----------------------------------------------------------------------


def test_truncation_drops_batches_and_cuts_the_file(tmp_path: Path) -> None:
    log, (b1, b2, _) = mixed(tmp_path)
    rl.save(log, tmp_path)
    assert log.truncate_to(12)  # inside the native range after the second batch
    assert (log.log_end_offset, log.log_bytes) == (12, len(b1 + b2))
    rl.save(log, tmp_path)
    assert bytes_file(tmp_path, log).read_bytes() == b1 + b2
    # A batch straddling the offset goes whole: the LEO is then its base.
    assert log.truncate_to(9)
    assert (log.log_end_offset, [h.base_offset for h in log.batches()]) == (8, [5])
    rl.save(log, tmp_path)
    assert bytes_file(tmp_path, log).read_bytes() == b1
    (loaded,), _ = rl.load_all(tmp_path)
    assert (loaded.log_end_offset, loaded.batches()) == (8, log.batches())
    # To the first batch's base: no batch left, and no file.
    assert log.truncate_to(5)
    rl.save(log, tmp_path)
    assert not bytes_file(tmp_path, log).exists()
    assert read(log, tmp_path, 0, 5) == [Chunk(0, 5, None)]


def test_truncating_and_appending_in_one_save_writes_a_state_of_the_cut_log_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New bytes go where the file held others: a crash while they are written leaves a
    state describing the bytes before the cut, not one whose bytes were overwritten."""
    log, (b1, _b2, _b3) = mixed(tmp_path)
    rl.save(log, tmp_path)
    log.truncate_to(8)
    log.assign_epoch(1)
    log.append(1)
    n1 = batch(9, 2, epoch=1, payload=b"other")
    log.append(2, n1)

    def crash(*_: object, **__: object) -> None:
        raise OSError("crash while writing the bytes")

    monkeypatch.setattr(replica_bytes, "write_bytes", crash)
    with pytest.raises(OSError, match="crash"):
        rl.save(log, tmp_path)
    (crashed,), _ = rl.load_all(tmp_path)
    assert (crashed.log_end_offset, crashed.log_bytes) == (9, len(b1))
    assert crashed.take_load_note() is None  # consistent: nothing lost
    monkeypatch.undo()

    rl.save(log, tmp_path)
    assert bytes_file(tmp_path, log).read_bytes() == b1 + n1
    (loaded,), _ = rl.load_all(tmp_path)
    assert read(loaded, tmp_path, 0, 11) == [
        Chunk(0, 5, None),
        Chunk(5, 3, b1),
        Chunk(8, 1, None),
        Chunk(9, 2, n1),
    ]


def test_a_cut_below_the_fsynced_bytes_is_made_durable_first(tmp_path: Path) -> None:
    log, (b1, _b2, _b3) = mixed(tmp_path)
    rl.flush(log, tmp_path)  # the durable state covers all three batches
    log.truncate_to(8)
    log.append(2, batch(8, 2, payload=b"replacement"))
    rl.save(log, tmp_path)
    # The fsynced state no longer covers bytes that were overwritten.
    flushed = json.loads((tmp_path / "t-0.json.flushed").read_bytes())
    assert (flushed["log_end_offset"], flushed["log_bytes"]) == (8, len(b1))
    assert state(tmp_path, log)["log_end_offset"] == 10
    # An OS crash that loses the page-cache state: the fsynced one describes the file.
    (tmp_path / "t-0.json").write_bytes(b"")
    (loaded,), _ = rl.load_all(tmp_path)
    assert (loaded.log_end_offset, loaded.take_load_note()) == (8, None)
    assert read(loaded, tmp_path, 5, 8) == [Chunk(5, 3, b1)]


def test_copy_from_a_shorter_leader_drops_the_batches_past_its_end(tmp_path: Path) -> None:
    log, (b1, _, _) = mixed(tmp_path)
    assert log.copy_from_leader([(0, 0)], 8)
    assert (log.log_end_offset, [h.base_offset for h in log.batches()]) == (8, [5])
    assert log.log_bytes == len(b1)


def test_delete_removes_the_bytes_file(tmp_path: Path) -> None:
    files = ReplicaFiles(config(tmp_path, 1), BrokerLog(1))
    files.dir.mkdir(parents=True)
    log, _ = mixed(files.dir)
    files.logs[("t", 0)] = log
    files.save(("t", 0))
    files.flush_all()
    assert (files.dir / "t-0.log").exists()
    files.delete(("t", 0))
    assert list(files.dir.iterdir()) == []
    assert rl.remove(files.dir, "t", 0) is False


# --- replication ----------------------------------------------------------------------


def test_fetch_messages_carry_chunks_on_the_wire() -> None:
    b = batch(3, 2)
    resp = ReplicaFetchResponse(
        leader_epoch=1,
        log_end_offset=5,
        high_watermark=0,
        chunks=[(0, 3, None), (3, 2, b)],
    )
    out = decode_frame(encode_frame(7, resp)[4:]).body
    assert isinstance(out, ReplicaFetchResponse)
    assert [tuple(c) for c in out.chunks] == [(0, 3, None), (3, 2, b)]
    req = ReplicaFetchRequest(
        topic="t",
        partition=0,
        follower_id=2,
        follower_broker_epoch=1,
        fetch_offset=0,
        last_fetched_epoch=-1,
    )
    assert req.max_bytes == 1048576  # Kafka's replica.fetch.max.bytes
    back = decode_frame(encode_frame(8, req)[4:]).body
    assert isinstance(back, ReplicaFetchRequest) and back.max_bytes == 1048576


def fetch(
    leader: ReplicaManager, follower: ReplicaManager, max_bytes: int = 1048576
) -> ReplicaFetchResponse:
    log = follower.logs[TP]
    sent = log.log_end_offset
    resp = leader.handle_fetch(
        ReplicaFetchRequest(
            topic=TOPIC,
            partition=0,
            follower_id=follower.broker_id,
            follower_broker_epoch=EPOCHS[follower.broker_id],
            fetch_offset=sent,
            last_fetched_epoch=log.last_fetched_epoch,
            max_bytes=max_bytes,
        )
    )
    # Through the wire codec, as a real fetch.
    body = decode_frame(encode_frame(1, resp)[4:]).body
    assert isinstance(body, ReplicaFetchResponse)
    follower.apply_fetch_response(TP, sent, body)
    return body


def append(m: ReplicaManager, count: int, payload: bytes = b"") -> bytes:
    """The leader appends a Kafka batch at its LEO in its epoch, and persists it."""
    log = m.logs[TP]
    data = batch(log.log_end_offset, count, log.last_leader_epoch, payload)
    log.append(count, data)
    m.files.save(TP)
    return data


def everything(m: ReplicaManager) -> list[Chunk]:
    log = m.logs[TP]
    return m.files.read(TP, 0, log.log_end_offset, 1 << 30)


async def test_a_follower_copies_the_batches_and_truncates_them(tmp_path: Path) -> None:
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1, 2], min_isr=1)
    for m in (leader, f2):
        m.on_metadata(image, None, True)
    a = append(leader, 3)
    leader.logs[TP].append(4)  # native records: no bytes
    leader.files.save(TP)
    b = append(leader, 2)
    c = append(leader, 5)

    # A small max_bytes: the first batch only (and the native range after it, which
    # counts no bytes); then one batch again.
    resp = fetch(leader, f2, max_bytes=1)
    assert (resp.log_end_offset, resp.chunks) == (7, [(0, 3, a), (3, 4, None)])
    assert f2.logs[TP].log_end_offset == 7
    resp = fetch(leader, f2, max_bytes=len(b))
    assert (resp.log_end_offset, resp.chunks) == (9, [(7, 2, b)])
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 14
    assert (
        everything(f2)
        == everything(leader)
        == [
            Chunk(0, 3, a),
            Chunk(3, 4, None),
            Chunk(7, 2, b),
            Chunk(9, 5, c),
        ]
    )
    assert f2.logs[TP].batches() == leader.logs[TP].batches()
    assert (f2.replicas_dir / f"{TOPIC}-0.log").read_bytes() == a + b + c
    fetch(leader, f2)  # the high watermark follows
    assert f2.logs[TP].high_watermark == 14

    # Broker 2 leads epoch 1 from 14 and appends; broker 1, which took more batches in
    # epoch 0 that nobody else has, follows, truncates them, and copies the new ones.
    stale = append(leader, 2, payload=b"epoch 0, lost")
    image = cluster(EPOCHS, replicas=[1, 2], leader=2, isr=[1, 2], leader_epoch=1, min_isr=1)
    for m in (leader, f2):
        m.on_metadata(image, None, True)
    new1, f1 = f2, leader
    fresh = append(new1, 3, payload=b"epoch 1")
    resp = fetch(new1, f1)
    assert resp.truncate_to == 14 and resp.chunks == []
    assert f1.logs[TP].log_end_offset == 14
    assert stale not in (f1.replicas_dir / f"{TOPIC}-0.log").read_bytes()
    fetch(new1, f1)
    assert f1.logs[TP].log_end_offset == 17
    assert everything(f1) == everything(new1)
    assert everything(f1)[-1] == Chunk(14, 3, fresh)
    assert (f1.replicas_dir / f"{TOPIC}-0.log").read_bytes() == a + b + c + fresh
    assert f1.logs[TP].leader_epochs == [(0, 0), (1, 14)]

    # A restart keeps it all.
    again = manager(tmp_path, 1, clock)
    assert everything(again) == everything(new1)


async def test_an_answer_without_chunks_copies_records_without_bytes(tmp_path: Path) -> None:
    """An older leader answers its LEO and no chunks: the follower copies as before."""
    clock = Clock()
    f2 = manager(tmp_path, 2, clock)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1, 2], min_isr=1)
    f2.on_metadata(image, None, True)
    old = ReplicaFetchResponse(
        leader_epoch=0, log_end_offset=6, high_watermark=4, leader_epochs=[(0, 0)]
    )
    assert f2.apply_fetch_response(TP, 0, old)
    log = f2.logs[TP]
    assert (log.log_end_offset, log.high_watermark, log.batches()) == (6, 4, [])
    assert not (f2.replicas_dir / f"{TOPIC}-0.log").exists()


async def test_a_follower_stops_at_a_gap_in_the_chunks(tmp_path: Path) -> None:
    clock = Clock()
    f2 = manager(tmp_path, 2, clock)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1, 2], min_isr=1)
    f2.on_metadata(image, None, True)
    bad = ReplicaFetchResponse(
        leader_epoch=0,
        log_end_offset=9,
        high_watermark=0,
        leader_epochs=[(0, 0)],
        chunks=[(0, 2, None), (4, 5, batch(4, 5))],  # 2..3 missing
    )
    with capture_logs() as logs:
        assert f2.apply_fetch_response(TP, 0, bad)
    assert f2.logs[TP].log_end_offset == 2  # copied up to the gap, no further
    assert any("skips records" in e["event"] for e in logs)


async def test_a_leader_answer_stays_within_the_frame_budget(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock, max_frame_bytes=4096)
    f2 = manager(tmp_path, 2, clock)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1, 2], min_isr=1)
    for m in (leader, f2):
        m.on_metadata(image, None, True)
    big = [append(leader, 1, payload=bytes(900)) for _ in range(6)]
    resp = fetch(leader, f2)  # asks for 1 MiB: gets half the leader's frame limit
    assert sum(len(c[2] or b"") for c in resp.chunks) <= 2048
    assert [c[2] for c in resp.chunks] == big[:2]
    assert read_header(big[0]) is not None
    assert resp.log_end_offset == 2 < leader.logs[TP].log_end_offset
