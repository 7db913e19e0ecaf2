"""Shared record builders, hypothesis strategies and a store whose writes fail on demand
(`FailingStore`) for the metadata log tests and the tests of its readers and writers."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import IO

from hypothesis import strategies as st

from metactl.errors import StorageError
from metadata_log.batch_format import StoredBatch
from metadata_log.records import (
    ChangeReason,
    ElectionKind,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
)
from metadata_log.sqlite_store import SqliteLogStore

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class FailingStore(SqliteLogStore):
    """A real SQLite store whose medium refuses chosen writes (as a full disk does)."""

    writes = 0
    fail_on: frozenset[int] = frozenset()

    async def _write_batches(self, batches: list[StoredBatch]) -> None:
        self.writes += 1
        if self.writes in self.fail_on:
            raise StorageError("injected: the disk refused the write")
        await super()._write_batches(batches)


def change(i: int, topic: str = "orders") -> PartitionChangeRecord:
    return PartitionChangeRecord(
        topic=topic,
        partition=i % 16,
        reason=ChangeReason.ALTER_PARTITION,
        partition_epoch=i,
        leader_epoch=i // 16,
        isr=[1 + i % 3, 1 + (i + 1) % 3],
        broker=1 + i % 3,
    )


def mixed(i: int) -> MetadataRecord:
    """A deterministic record of one of several types."""
    kind = i % 4
    if kind == 0:
        return RegisterBrokerRecord(broker_id=i % 5, incarnation_id=f"inc-{i}", broker_epoch=i)
    if kind == 1:
        return TopicRecord(name=f"topic-{i}", topic_id=f"id-{i}", partitions=1 + i % 8, min_isr=2)
    if kind == 2:
        return PartitionRecord(topic=f"topic-{i}", partition=i % 8, replicas=[1, 2], isr=[1, 2])
    return change(i)


def records(n: int, first: int = 0) -> list[MetadataRecord]:
    return [mixed(first + i) for i in range(n)]


def crash_batch(i: int) -> list[MetadataRecord]:
    """Batch number `i` of the crash test writer: its content follows from `i` alone."""
    return [change(i * 10 + k, topic=f"crash-{i}") for k in range(1 + i % 7)]


class LineReader:
    """Reads a child's stdout on a thread, so a test can wait for a line with a bound.

    The bound only turns a hung child into a failure instead of a hung test run; the
    lines themselves are the synchronisation.
    """

    def __init__(self, stream: IO[str], what: str) -> None:
        self.what = what
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # EOF

    def next(self, timeout: float = 60.0) -> str:
        """The next line without its newline; AssertionError at EOF or after `timeout` s."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.what} printed nothing for {timeout} s") from None
        assert line, f"{self.what} exited before printing the expected line"
        return line.rstrip("\n")


# --- hypothesis ----------------------------------------------------------------------------

_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_small = st.integers(min_value=-1, max_value=10_000)
_text = st.text(max_size=30)
_ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=6)

record_strategy: st.SearchStrategy[MetadataRecord] = st.one_of(
    st.builds(
        TopicRecord,
        name=_text,
        topic_id=_text,
        partitions=_small,
        min_isr=_small,
        recovery_strategy=st.none() | _text,
    ),
    st.builds(
        PartitionRecord,
        topic=_text,
        partition=_small,
        replicas=_ids,
        isr=_ids,
        elr=_ids,
        last_known_elr=_ids,
        leader=_small,
        leader_epoch=_ints,
        partition_epoch=_ints,
        recovery_state=st.sampled_from(LeaderRecoveryState),
    ),
    st.builds(
        PartitionChangeRecord,
        topic=_text,
        partition=_small,
        reason=st.sampled_from(ChangeReason),
        partition_epoch=_ints,
        leader_epoch=_ints,
        election=st.none() | st.sampled_from(ElectionKind),
        leader=st.none() | _small,
        isr=st.none() | _ids,
        elr=st.none() | _ids,
        broker=st.none() | _small,
    ),
    st.builds(
        RegisterBrokerRecord,
        broker_id=_small,
        incarnation_id=_text,
        broker_epoch=_ints,
        rack=st.none() | _text,
        previous_epoch=st.none() | _ints,
        clean=st.booleans(),
        fenced=st.booleans(),
    ),
    st.builds(FenceBrokerRecord, broker_id=_small, broker_epoch=_ints, reason=_text),
    st.builds(
        UncleanRecoveryRecord,
        topic=_text,
        partition=_small,
        strategy=_text,
        candidates=st.lists(
            st.builds(
                RecoveryCandidate,
                broker_id=_small,
                last_leader_epoch=_ints,
                log_end_offset=_ints,
            ),
            max_size=4,
        ),
        chosen=_small,
    ),
    st.just(NoOpRecord()),
)
