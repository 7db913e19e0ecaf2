"""The replica manager's follower side: fetching from the leaders, applying their answers.

`FollowerSide` runs a `fetcher.Fetcher` per leader this broker follows partitions from,
handing each the partitions it follows from that leader as the image moves
(`reconcile`), and applies the leaders' answers to the replica logs
(`apply_fetch_response`): truncates where the logs diverge
(`replication.follower_truncation`) and copies the rest (appending the record batches
the leader sent with their bytes, extending the log over the ranges it sent without
bytes, then taking its epoch history), then persists the replica through `ReplicaFiles`.

It must not lead (`leader_side`), create or delete replicas (`replica_lifecycle`), nor
run the fetch loops itself (`fetcher`).
"""

from __future__ import annotations

from collections.abc import Iterable

from brokers_stub.fetcher import Fetcher, FetchHost
from brokers_stub.replica_files import ReplicaFiles
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replication import follower_truncation
from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import NO_LEADER
from protocol.messages.replication import ReplicaFetchResponse


class FollowerSide:
    """The fetchers, by leader, and the answers they bring."""

    def __init__(self, host: FetchHost, *, files: ReplicaFiles) -> None:
        self.host = host  # what the fetchers fetch for
        self.broker_id = host.broker_id
        self.log = host.log
        self.files = files
        self.logs = files.logs
        self.fetchers: dict[int, Fetcher] = {}

    def close(self) -> None:
        """Cancel every fetcher's lanes (the replica manager awaits their tasks)."""
        for fetcher in self.fetchers.values():
            fetcher.close()
        self.fetchers.clear()

    def followed_partitions(self, image: ClusterImage) -> Iterable[PartitionState]:
        for p in image.partitions_of(self.broker_id):
            if p.leader not in (NO_LEADER, self.broker_id):
                yield p

    def reconcile(self, image: ClusterImage) -> None:
        """A fetcher for each leader of a partition this broker follows in `image`, each
        fetching exactly those partitions; the others closed."""
        wanted: dict[int, list[TopicPartition]] = {}
        for p in self.followed_partitions(image):
            wanted.setdefault(p.leader, []).append(p.tp)
        for leader_id in list(self.fetchers):
            if leader_id not in wanted:
                self.fetchers.pop(leader_id).close()
        for leader_id, tps in wanted.items():
            fetcher = self.fetchers.get(leader_id)
            if fetcher is None:
                fetcher = self.fetchers[leader_id] = Fetcher(self.host, leader_id)
            fetcher.assign(tps)

    def apply_fetch_response(
        self,
        tp: TopicPartition,
        sent_offset: int,
        resp: ReplicaFetchResponse,
        fetched_for: ReplicaLog | None = None,
    ) -> bool:
        """Apply a leader's answer to our fetch from `sent_offset` (for the replica
        `fetched_for`, if given); True if the replica changed (or changed while the fetch
        was out): the fetcher asks again at once. An answer for a replica that has been
        deleted meanwhile (or replaced: its topic was created again) is dropped."""
        log = self.logs.get(tp)
        if log is None or (fetched_for is not None and log is not fetched_for):
            return False
        if log.log_end_offset != sent_offset:
            return True  # the log changed while the fetch was out: ask again
        if resp.truncate_to is not None:
            point = follower_truncation(
                log.leader_epochs,
                log.log_end_offset,
                resp.leader_epochs,
                resp.log_end_offset,
                resp.truncate_to,
            )
            before = log.log_end_offset
            if log.truncate_to(point):
                self.files.save(tp)
                self.log.info(
                    "truncated diverging log",
                    partition=log.name,
                    log_end_offset_before=before,
                    log_end_offset=log.log_end_offset,
                    leader_truncate_to=resp.truncate_to,
                )
                return True
            return False
        appended = self._append_chunks(log, resp) if resp.chunks else False
        # With chunks, the log now ends where they do, which is the answer's
        # `log_end_offset`; without (an older leader's answer, or nothing new), the
        # records up to it are copied without bytes, as the leader has none.
        end = log.log_end_offset if resp.chunks else resp.log_end_offset
        changed = log.copy_from_leader(resp.leader_epochs, end) or appended
        changed |= log.advance_high_watermark(resp.high_watermark)
        if changed:
            self.files.save(tp)
        return changed

    def _append_chunks(self, log: ReplicaLog, resp: ReplicaFetchResponse) -> bool:
        """Append what the leader sent past our LEO: its batches with their bytes, its
        ranges without bytes as records without bytes. True if the log grew. Stops at a
        chunk that does not follow on (a leader bug: logged, the rest not copied)."""
        before = log.log_end_offset
        for base, count, data in resp.chunks:
            end = base + count
            leo = log.log_end_offset
            if end <= leo:
                continue  # we have it
            if base > leo or count <= 0:
                self.log.warning(
                    "replica fetch answer skips records; copied up to the gap",
                    partition=log.name,
                    log_end_offset=leo,
                    chunk_base_offset=base,
                    chunk_count=count,
                )
                break
            if data is None:
                log.append(end - leo)
                continue
            if base < leo:
                # A batch straddling our LEO: our log ends inside one of the leader's
                # batches (truncation points are batch boundaries, so it should not).
                # The leader's batch is the partition's: ours from its base goes.
                self.log.warning(
                    "log end inside a leader's batch; truncating to its base",
                    partition=log.name,
                    log_end_offset=leo,
                    batch_base_offset=base,
                )
                log.truncate_to(base)
                if log.log_end_offset != base:
                    break
            try:
                log.append(count, data)
            except ValueError as exc:
                self.log.warning(
                    "replica fetch answer carries a bad batch; copied up to it",
                    partition=log.name,
                    error=str(exc),
                )
                break
        return log.log_end_offset != before
