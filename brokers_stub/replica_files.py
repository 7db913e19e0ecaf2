"""The replica logs this broker hosts, and their files under `<data-dir>/replicas`.

`ReplicaFiles` holds the one map of replica logs by partition that the rest of the
replica manager reads and changes, and keeps their files (a replica's state, and the
`.log` file of its stored record batches, if it has any: see `replica_log`): reads them
all at start-up (dropping what was never fsynced after an unclean stop,
`lose_unflushed`, and making durable a replica `load` found had lost batch bytes),
writes a changed replica through the page cache or fsyncs it once `flush_messages`
records are unflushed (Kafka's flush.messages, off by default), fsyncs the changed ones
every flush interval and all of them at shutdown, reads stored batches for a Fetch or a
follower (`read`), and deletes a replica's files.

It must not decide which replicas exist or what their logs hold (`replica_lifecycle`,
`leader_side`, `follower_side` and `replication.py` do), and writes no other files.
"""

from __future__ import annotations

from pathlib import Path

from brokers_stub import replica_log as rl
from brokers_stub.config import BrokerConfig
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_bytes import Chunk
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.storage import REPLICAS_DIR, fsync_dir
from metadata_image.state import TopicPartition


class ReplicaFiles:
    """The hosted replica logs, by partition, and their files."""

    def __init__(self, config: BrokerConfig, log: BrokerLog) -> None:
        self.config = config
        self.log = log
        self.dir: Path = config.data_dir / REPLICAS_DIR
        self.logs: dict[TopicPartition, ReplicaLog] = {}
        self._unflushed: set[TopicPartition] = set()

    def load(self, *, lose_unflushed: bool) -> None:
        """Read every replica file; with `lose_unflushed`, drop what was never fsynced."""
        self.dir.mkdir(parents=True, exist_ok=True)
        logs, problems = rl.load_all(self.dir)
        for problem in problems:
            self.log.error("unreadable replica file ignored", problem=problem)
        for log in logs:
            tp = (log.topic, log.partition)
            self.logs[tp] = log
            note = log.take_load_note()
            if note is not None:
                # An OS crash kept the state but not all the batch bytes it covers.
                self.log.warning("lost unflushed data", partition=log.name, batches=note)
                if not lose_unflushed:
                    rl.flush(log, self.dir)  # the surviving state is on disk
            if lose_unflushed:
                before = (log.log_end_offset, len(log.leader_epochs))
                if log.lose_unflushed():
                    self.log.warning(
                        "lost unflushed data",
                        partition=log.name,
                        log_end_offset_before=before[0],
                        log_end_offset=log.log_end_offset,
                        epochs_dropped=before[1] - len(log.leader_epochs),
                    )
                rl.flush(log, self.dir)  # the surviving state is on disk
        self.log.info(
            "replicas loaded",
            replicas={
                log.name: [log.last_leader_epoch, log.log_end_offset] for log in self.logs.values()
            },
        )

    def save(self, tp: TopicPartition) -> None:
        """Write the replica through the page cache, or fsync it once `flush_messages`
        records are unflushed (Kafka's flush.messages)."""
        log = self.logs[tp]
        every = self.config.flush_messages
        if every is not None and log.log_end_offset - log.flushed_offset >= every:
            rl.flush(log, self.dir)
            self._unflushed.discard(tp)
        else:
            rl.save(log, self.dir)
            self._unflushed.add(tp)

    def flush_changed(self) -> None:
        for tp in sorted(self._unflushed):
            log = self.logs.get(tp)
            if log is not None:
                rl.flush(log, self.dir)
        self._unflushed.clear()

    def flush_all(self) -> None:
        for tp in sorted(self.logs):
            rl.flush(self.logs[tp], self.dir)
        self._unflushed.clear()

    def read(
        self, tp: TopicPartition, from_offset: int, end_offset: int, max_bytes: int
    ) -> list[Chunk]:
        """The replica's log from the chunk holding `from_offset` up to `end_offset`
        (the high watermark for a consumer, the LEO for a follower), within `max_bytes`
        of batch bytes but at least the first chunk (`replica_log.read_chunks`)."""
        return rl.read_chunks(self.logs[tp], self.dir, from_offset, end_offset, max_bytes)

    def delete(self, tp: TopicPartition) -> ReplicaLog:
        """Forget the replica of `tp` and delete its files (durable at `sync_dir`)."""
        log = self.logs.pop(tp)
        self._unflushed.discard(tp)
        try:
            rl.remove(self.dir, tp[0], tp[1])
        except OSError as exc:
            self.log.error("replica file not deleted", partition=log.name, error=str(exc))
        return log

    def sync_dir(self) -> None:
        """Make the deletions durable (one directory fsync for a batch of them)."""
        try:
            fsync_dir(self.dir)
        except OSError as exc:
            self.log.error("replica deletions not synced", error=str(exc))
