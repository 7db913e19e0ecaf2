"""Bounded work for every request: how many items one request may carry, and how large
its answer may grow (docs/protocol.md, Bounded requests; docs/design.md, The work
budget).

Kafka bounds few of its admin requests by item count; metactl bounds each that carries a
list, so that no request holds the single-threaded controller for long (its
validation, its steps and its answer's encoding are each O(items)) and no answer exceeds
the frame limit (`--max-frame-bytes`), which its client could not read. Every cap is
checked by the service before anything is submitted, so a refused request changes
nothing: `INVALID_REQUEST` naming the cap, or `MESSAGE_TOO_LARGE` when the answer the
request could get would not fit the frame limit. Neither is retriable: the same request
would be refused again.

The answer's bound is worked out from the request alone: each item's answer is its
names, an error code, a message of at most `MAX_RESULT_MESSAGE` bytes (longer ones are
clipped, `clip`) and, for a create, its assignment. At the default frame limit
(8 MiB) the largest request each cap admits has an answer well inside it; a controller
given a smaller `--max-frame-bytes` refuses a large request up front rather than
answer it with a frame the client cannot read.

`encoded_size` measures an answer's frame, for the answers not bounded up front.

Pure: no IO, no clock. The API handlers own the checks' order (after admission:
authorization first).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from metactl.errors import FrameTooLargeError, InvalidRequestError
from protocol.messages.unions import Message

MAX_ALTER_PARTITION_ITEMS: Final = 10_000
"""Items one AlterPartitions request may carry (brokers send at most 5,000): more is
INVALID_REQUEST, so that no request commits more than its answer can carry back."""

MAX_REASSIGNMENT_ITEMS: Final = 10_000
"""Partitions one AlterPartitionReassignments may name (Kafka: no cap; `metactl reassign`
sends 1,000 per request). Ten work budgets: its validation is one step of about 50 ms,
its reassignments ten slices, and its answer at most 6.3 MB with the longest names."""

MAX_TOPICS_PER_REQUEST: Final = 10_000
"""Topics one CreateTopics, DeleteTopics or CreatePartitionsBatch may name, and the
topics filter of one ListPartitionReassignments (Kafka: no cap). A CreateTopics is also
bounded by its partitions (`--max-partitions-per-request`), but a topic asking for none
costs nothing there and is still refused by name, one answer each."""

MAX_CONFIG_ENTRIES: Final = 100
"""Config names one IncrementalAlterConfigs may set and delete in all (Kafka: no cap;
metactl keeps one config, min.insync.replicas)."""

MAX_RESULT_MESSAGE: Final = 256
"""Bytes (UTF-8) of an item's error message in an answer of many items (longer ones, e.g.
naming a 30,000-replica list, are clipped): what keeps an answer's bound linear in its
items."""

ITEM_OVERHEAD: Final = 128
"""Bytes an item's answer takes besides its names and message: map keys, an error code,
a topic id (36 characters) and integers, with room to spare."""

INT_BYTES: Final = 5
"""The most bytes msgpack takes for an int32 (a broker id, a partition number)."""

ENVELOPE: Final = 256
"""The answer's frame around its items: header, tag, version, list headers."""


def check_count(what: str, count: int, cap: int) -> None:
    """INVALID_REQUEST when a request carries more than `cap` items."""
    if count > cap:
        raise InvalidRequestError(f"{count:,} {what} in one request: at most {cap:,}")


def check_answer(what: str, item_bytes: Iterable[int], max_frame_bytes: int) -> None:
    """MESSAGE_TOO_LARGE when the answer of items of these sizes may exceed the frame."""
    bound = ENVELOPE + sum(item_bytes)
    if bound > max_frame_bytes:
        raise FrameTooLargeError(
            f"the answer to this {what} may take {bound:,} bytes, over the "
            f"{max_frame_bytes:,}-byte frame limit: send fewer items per request"
        )


def result_bytes(name: str) -> int:
    """The most one item's answer takes without an assignment: its name, an error code
    and a clipped message."""
    return len(name.encode()) + MAX_RESULT_MESSAGE + ITEM_OVERHEAD


def assignment_bytes(partitions: int, replication_factor: int) -> int:
    """The most `partitions` new partitions' replica lists take in an answer."""
    return partitions * (INT_BYTES + max(0, replication_factor) * INT_BYTES)


def clip(message: str) -> str:
    """An item's error message as an answer of many items carries it: at most
    `MAX_RESULT_MESSAGE` bytes, a clipped one ending in "..."."""
    raw = message.encode()
    if len(raw) <= MAX_RESULT_MESSAGE:
        return message
    return raw[: MAX_RESULT_MESSAGE - 3].decode(errors="ignore") + "..."


# Bytes of a frame besides its body: the length header and the correlation id.
FRAME_OVERHEAD: Final = 16
_encoder: Final = msgspec.msgpack.Encoder()


def encoded_size(body: Message) -> int:
    """The bytes of `body`'s frame on the wire (what the frame limit bounds)."""
    return len(_encoder.encode(body)) + FRAME_OVERHEAD
