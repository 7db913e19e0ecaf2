"""The committed metadata log as one readable line per event (`metactl events`, and
`metactl cluster up`'s foreground).

`Feed` takes log entries (offset, timestamp, record) in order, from the controller's
FetchMetadata answers or from a data directory, and returns `Event`s: a line such as
"broker 2 fenced (session expired)", "demo-3 leader 1→2 (isr)" or "demo-0 UNCLEAN
RECOVERY: chose 2 of LastKnownELR [2,3] (balanced) — potential data loss". It keeps the
image the records build, because a line says what changed ("1→2") and the record says
only the new value.

A metadata transaction (KIP-868) takes effect whole: its records give lines only once its
end marker is read, and an aborted or unfinished one gives none
(`metadata_image.transactions.EffectiveEntries` says which entries take effect).
Records older than `since_ms` are replayed without lines. Transaction markers, no-ops
and the PartitionRecords of a topic creation or growth (summed up by the topic's line)
give no line of their own.

Lines are worded by `eventfeed.lines` against `eventfeed.view`; `iso_ms` shows their
times. Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from eventfeed.lines import describe_record
from eventfeed.view import Kip966Seen, View
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.snapshot import image_from_records
from metadata_image.state import TopicPartition
from metadata_image.transactions import EffectiveEntries
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    record_type,
)


class Entry(Protocol):
    """A committed record and where it is: a store's LogEntry or a FetchedRecord."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp_ms(self) -> int: ...

    @property
    def record(self) -> MetadataRecord: ...


@dataclass(frozen=True)
class Event:
    offset: int
    timestamp_ms: int
    type: str  # the record's type tag, e.g. "PartitionChange"
    text: str
    record: MetadataRecord

    def line(self) -> str:
        """The event as the terminal shows it: the UTC time, then the text."""
        return f"{iso_ms(self.timestamp_ms)}  {self.text}"


def iso_ms(timestamp_ms: int) -> str:
    when = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


SILENT_LOSS_NOTE: Final = (
    " — elected from the ISR it stayed in after an UNCLEAN restart (classic rules): "
    "acknowledged records it lost are gone, silently"
)


class StaleIsr:
    """Under the classic rules, the ISR places brokers kept through an UNCLEAN restart
    (partition -> brokers): electing one of them is the silent-loss path (README, "Does
    it keep acknowledged data?"), which the election's line says. A place ends when the
    broker leaves that ISR (it rejoins only once caught up) or is elected."""

    def __init__(self) -> None:
        self.places: dict[TopicPartition, set[int]] = {}

    def take(self, r: MetadataRecord, before: View) -> bool:
        """Note `r` (told against `before`); True if it elects a broker from such a place."""
        if isinstance(r, RegisterBrokerRecord):
            if not r.clean and before.has_broker(r.broker_id) and before.classic(r.broker_id):
                for tp in before.isrs_of(r.broker_id):
                    self.places.setdefault(tp, set()).add(r.broker_id)
            return False
        if isinstance(r, PartitionChangeRecord):
            tp = (r.topic, r.partition)
            held = self.places.get(tp)
            if not held:
                return False
            elected = r.leader is not None and r.leader in held
            if elected:
                held.discard(r.leader)
            if r.isr is not None:
                held &= set(r.isr)
            if not held:
                del self.places[tp]
            return elected
        if isinstance(r, RemoveTopicRecord):
            for tp in [tp for tp in self.places if tp[0] == r.name]:
                del self.places[tp]
        return False


class Feed:
    """Turns committed entries into events, keeping the image they build.

    `next_offset` is the offset of the next entry to read (after the last one added, or
    the start image's end): a reader that stops (an error, a reconnection) continues from
    it with the same feed, and tells nothing twice."""

    def __init__(self, image: ClusterImage | None = None, *, since_ms: int | None = None) -> None:
        self.since_ms = since_ms
        self.start(image if image is not None else ClusterImage())

    def start(self, image: ClusterImage) -> None:
        """Start (again) from `image`, e.g. a snapshot's: lines are told against it, and
        whatever was read before is forgotten."""
        self.image = image
        self.next_offset = image.end_offset
        self._effective = EffectiveEntries[Entry]()  # holds an open transaction
        self._pending: list[MetadataRecord] = []  # taken, not yet replayed into the image
        self._kip966 = Kip966Seen(image)
        self._view = View(image, self._kip966)
        self._stale = StaleIsr()

    def reset(self, records: Iterable[MetadataRecord], end_offset: int) -> None:
        """Start again from a snapshot (FetchMetadata's answer for a truncated log)."""
        self.start(image_from_records(records, end_offset))

    def add(self, entries: Iterable[Entry]) -> list[Event]:
        """The events of these entries (read in log order), in log order."""
        batch = entries if isinstance(entries, list) else list(entries)
        if batch:
            self.next_offset = batch[-1].offset + 1
        out: list[Event] = []
        for e in self._effective.add(batch):
            self._take(e, out)
        self._flush()
        return out

    def _take(self, e: Entry, out: list[Event]) -> None:
        r = e.record
        quiet = self.since_ms is not None and e.timestamp_ms < self.since_ms
        text = None if quiet or type(r) in _SILENT else describe_record(r, self._view)
        if self._stale.take(r, self._view) and text is not None:
            text += SILENT_LOSS_NOTE
        self._kip966.take(r)
        self._pending.append(r)
        if not self._view.note(r):
            self._flush()
        if text is not None:
            out.append(Event(e.offset, e.timestamp_ms, record_type(r), text, r))

    def _flush(self) -> None:
        if self._pending:
            self.image = replay(self.image, self._pending)
            self._pending = []
            self._view = View(self.image, self._kip966)


# Records that never give a line of their own (describe_record says None for them).
_SILENT: Final = frozenset(
    (
        PartitionRecord,
        NoOpRecord,
        BeginTransactionRecord,
        EndTransactionRecord,
        AbortTransactionRecord,
    )
)
