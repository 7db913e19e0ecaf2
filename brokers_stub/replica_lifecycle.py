"""The replica manager's lifecycle of replicas: which replicas this broker hosts.

Follows the metadata image: a replica is created for every partition assigned to this
broker (`create`), empty, as any new replica: a new topic's, a reassignment's adding
replica's, an added partition's. The metadata lifecycle reaches the replicas through
the deltas: a deleted topic's replicas (`MetadataDelta.removed_topics`) and a replica
this broker was reassigned away from stop being served and replicated and their files
are deleted; a topic created again under the same name has a new topic id, and a
replica recording another id than the topic's (left by a broker that was down during
the delete) is deleted, never served (`drop_stale`). A changed MinISR is in the
partition's state, which the high watermark and acks=all read: nothing to do here.

It must not lead or follow (`leader_side`, `follower_side`), and touches files only
through `ReplicaFiles`.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Final

from brokers_stub.leader_side import LeaderSide
from brokers_stub.logctx import BrokerLog
from brokers_stub.produce import ProduceWaiters
from brokers_stub.replica_files import ReplicaFiles
from brokers_stub.replica_log import ReplicaLog
from metactl.errors import MetactlError, NotLeaderOrFollowerError, UnknownTopicOrPartitionError
from metadata_image.delta import MetadataDelta
from metadata_image.image import EMPTY_INDEX, ClusterImage, common
from metadata_image.state import TopicPartition

# Why a replica is deleted (`ReplicaLifecycle._stale`).
TOPIC_DELETED: Final = "topic deleted"
TOPIC_RECREATED: Final = "another topic id: the topic was deleted and created again"
NOT_A_REPLICA: Final = "no longer a replica (reassigned)"


def gone_error(name: str, reason: str) -> MetactlError:
    """What a batch waiting on a replica that is deleted gets: the partition moved to
    other brokers (NOT_LEADER_OR_FOLLOWER: the client looks for the new leader), or
    it no longer exists (UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers a deleted topic)."""
    message = f"{name} is not served here any more: {reason}"
    if reason == NOT_A_REPLICA:
        return NotLeaderOrFollowerError(message)
    return UnknownTopicOrPartitionError(message)


class ReplicaLifecycle:
    """Creates the replicas the image gives this broker and deletes those it takes away."""

    def __init__(
        self,
        broker_id: int,
        log: BrokerLog,
        *,
        files: ReplicaFiles,
        leading: LeaderSide,
        waiters: ProduceWaiters,
    ) -> None:
        self.broker_id = broker_id
        self.log = log
        self.files = files
        self.logs = files.logs
        self.leading = leading
        self.waiters = waiters

    def create(self, image: ClusterImage, tp: TopicPartition, *, caught_up: bool) -> None:
        """Create the replica of `tp` if this broker hosts it and has none yet. A replica
        on disk without a topic id (written before ids were recorded) takes the topic's
        id once the image is caught up (`caught_up`: it is the image acted on): nothing
        deleted it since."""
        p = image.partitions.get(tp)
        t = image.topics.get(tp[0])
        if p is None or t is None or self.broker_id not in p.replicas:
            return
        log = self.logs.get(tp)
        if log is None:
            self.logs[tp] = ReplicaLog(topic=p.topic, partition=p.partition, topic_id=t.topic_id)
            self.files.save(tp)
            self.log.info(
                "replica created", partition=f"{p.topic}-{p.partition}", topic_id=t.topic_id
            )
        elif not log.topic_id and caught_up:
            log.topic_id = t.topic_id
            self.files.save(tp)

    def _stale(self, image: ClusterImage, tp: TopicPartition, removed: bool) -> str | None:
        """Why the replica of `tp` must go, judged on a caught-up image (None: it stays).
        `removed`: a delta since the replica was last judged deleted its topic's name,
        so a replica without a recorded id predates that deletion."""
        log = self.logs[tp]
        t = image.topics.get(tp[0])
        p = image.partitions.get(tp)
        if t is None or p is None:
            return TOPIC_DELETED
        if log.topic_id != t.topic_id and (log.topic_id or removed):
            return TOPIC_RECREATED
        if self.broker_id not in p.replicas:
            return NOT_A_REPLICA
        return None

    def drop_removed_ids(self, removed: dict[str, tuple[str, int]]) -> None:
        """Drop the replicas of topics a delta removed, by exact topic id: safe on any
        image, since an id is never used again."""
        self._drop(
            {
                tp: TOPIC_DELETED
                for tp, log in self.logs.items()
                if tp[0] in removed and log.topic_id and log.topic_id == removed[tp[0]][0]
            }
        )

    def drop_stale(self, image: ClusterImage, unseen: MetadataDelta | None) -> None:
        """Drop the replicas the caught-up `image` no longer gives this broker: those of
        the partitions `unseen` names, of the topics it removed (by name: an id of a
        topic deleted while deltas were folded may not be named), or, when everything
        may have changed (a start), every replica (Kafka's stray replicas)."""
        removed: set[str] = set()
        if unseen is None:
            candidates: set[TopicPartition] = set(self.logs)
        else:
            removed = set(unseen.removed_topics)
            candidates = set(common(unseen.partitions, self.logs.keys()))
            if removed:
                candidates.update(tp for tp in self.logs if tp[0] in removed)
        stale = {}
        for tp in candidates:
            reason = self._stale(image, tp, tp[0] in removed)
            if reason is not None:
                stale[tp] = reason
        self._drop(stale)

    def _drop(self, reasons: dict[TopicPartition, str]) -> None:
        """Stop serving and replicating these replicas and delete them: end each
        leadership (releasing its parked fetches), fail the batches waiting on it (an
        unknown partition, or NOT_LEADER_OR_FOLLOWER where it moved to other brokers),
        forget it and delete its file; then make the deletions durable at once. The
        fetcher lanes go at the next `FollowerSide.reconcile`; an answer in flight is not
        applied (`apply_fetch_response` checks the replica it fetched for)."""
        if not reasons:
            return
        summary: Counter[tuple[str, str, str]] = Counter()
        self.leading.forget(reasons.keys())
        for tp, reason in sorted(reasons.items()):
            log = self.files.delete(tp)
            self.waiters.fail(tp, functools.partial(gone_error, log.name, reason))
            summary[(tp[0], log.topic_id, reason)] += 1
        self.files.sync_dir()
        for (topic, topic_id, reason), n in sorted(summary.items()):
            self.log.info(
                "replicas deleted", topic=topic, topic_id=topic_id, reason=reason, partitions=n
            )

    def scope(self, image: ClusterImage, delta: MetadataDelta | None) -> set[TopicPartition]:
        """Our partitions a delta may concern (None: all of ours)."""
        mine = image.replicas_by_broker.get(self.broker_id)
        if mine is None:
            return set()
        if delta is None:
            return set(mine)
        if self.broker_id in delta.brokers:
            return set(mine)
        scope = set(common(delta.partitions, mine))
        for broker_id in delta.brokers:
            scope.update(common(mine, image.replicas_by_broker.get(broker_id, EMPTY_INDEX)))
        return scope
