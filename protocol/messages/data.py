"""The data plane, client to broker: Produce to a partition's leader (acks=all or 1) and
ReadLog, what a consumer can read of a partition.

Data only: no IO, no rules.
"""

# ruff: noqa: RUF012 (a default of [] on a msgspec Struct is a fresh list each time; ruff
# sees no Struct because `Msg` is defined in another module)

from __future__ import annotations

from protocol.messages.base import Msg

# --- client -> broker (the data plane) ----------------------------------------------------

ACKS_ALL = -1  # Produce.acks: answered once the high watermark covers the batch
ACKS_LEADER = 1  # Produce.acks: answered once the leader has appended the batch


class ProduceRequest(Msg, tag="Produce", frozen=True):
    """A batch of `count` records for one partition, sent to its leader. Records carry no
    bytes: a record is identified by its (offset, leader epoch)."""

    topic: str
    partition: int
    acks: int = ACKS_ALL  # ACKS_ALL (-1) or ACKS_LEADER (1)
    count: int = 1
    timeout_ms: int | None = None  # for acks=all; None: the broker's request timeout


class ProduceResponse(Msg, tag="ProduceResponse", frozen=True):
    """The batch holds offsets base_offset .. base_offset+count-1, all in leader_epoch."""

    topic: str
    partition: int
    base_offset: int
    count: int
    leader_epoch: int
    high_watermark: int = 0  # the leader's, when it answered


class ReadLogRequest(Msg, tag="ReadLog", frozen=True):
    """What a consumer can read of one partition: its committed records, from the leader."""

    topic: str
    partition: int


class ReadLogResponse(Msg, tag="ReadLogResponse", frozen=True):
    topic: str
    partition: int
    leader_epoch: int  # the leader's current epoch
    high_watermark: int  # records [0, high_watermark) are committed and readable
    log_end_offset: int
    # (epoch, start offset), oldest first, only entries starting below the high watermark:
    # the record at offset o < high_watermark has the epoch of the last entry starting <= o.
    leader_epochs: list[tuple[int, int]] = []
