"""Broker to broker: a follower's ReplicaFetch to its leader (the simulated replication)
and the leader's answer.

Data only: no IO, no rules.
"""

# ruff: noqa: RUF012 (a default of [] on a msgspec Struct is a fresh list each time; ruff
# sees no Struct because `Msg` is defined in another module)

from __future__ import annotations

from protocol.messages.base import Msg


class ReplicaFetchRequest(Msg, tag="ReplicaFetch", frozen=True):
    topic: str
    partition: int
    follower_id: int
    follower_broker_epoch: int
    fetch_offset: int  # the follower's log end offset
    last_fetched_epoch: int  # the leader epoch of the follower's last record (-1: empty log)
    # Long poll (Kafka's replica.fetch.wait.max.ms): how long the leader may hold the fetch
    # while it has nothing new for the follower. 0, the default (and what an older follower
    # sends, as it omits the field): answer at once. An older leader ignores it.
    max_wait_ms: int = 0
    # The topic id of the follower's replica (KIP-516): a leader whose replica has another
    # id (the topic was deleted and created again) refuses with INCONSISTENT_TOPIC_ID, so
    # a follower never copies another topic's records. "" (an older follower): unchecked.
    topic_id: str = ""
    # The partition's leader epoch as the follower's metadata shows it (Kafka's
    # current_leader_epoch): a leader at a newer epoch refuses with FENCED_LEADER_EPOCH
    # (a replica removed by a reassignment, or one behind on metadata, copies nothing),
    # one at an older epoch with UNKNOWN_LEADER_EPOCH (it has not seen that metadata yet).
    # -1 (an older follower, which omits the field): unchecked.
    current_leader_epoch: int = -1
    # How many bytes of record batches the answer may carry (Kafka's
    # replica.fetch.max.bytes); the first batch is sent even if larger. An older
    # follower omits it and gets the default. An older leader ignores it.
    max_bytes: int = 1048576


class ReplicaFetchResponse(Msg, tag="ReplicaFetchResponse", frozen=True):
    leader_epoch: int
    log_end_offset: int
    high_watermark: int
    # Where the follower must truncate to before copying (its log diverged), if anywhere.
    truncate_to: int | None = None
    leader_epochs: list[tuple[int, int]] = []  # (epoch, start offset), oldest first
    # The log from the follower's fetch offset, contiguously: (base offset, record count,
    # the stored batch's bytes or None for records without bytes). In an answer that
    # does not truncate, `log_end_offset` is where the chunks end (the leader's LEO, or
    # less when `max_bytes` cut the answer short). None (an older leader, or records
    # that have no bytes up to the LEO): the follower copies `log_end_offset`, without
    # bytes.
    chunks: list[tuple[int, int, bytes | None]] = []
