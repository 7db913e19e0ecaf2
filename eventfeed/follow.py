"""The committed metadata log followed from a running controller, through a `Feed`.

`follow_events` tails the controller's committed log as a broker does: FetchMetadata from
the feed's next offset (or the controller's snapshot, for a truncated log), then, with
`follow`, long polls for what commits next. Any controller of a quorum serves it
(standbys answer the fetch too). Used by `metactl events` and `cluster up`'s foreground.
It reads only, and prints nothing: its caller's `emit` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from clients.controller import ask
from eventfeed.feed import Event, Feed
from metactl.errors import MetactlError
from protocol.client import RpcClient
from protocol.messages.broker_controller import FetchMetadataRequest, FetchMetadataResponse

# The long poll of a --follow (the controller caps it at 10 s; brokers use 500 ms).
FOLLOW_WAIT_MS: Final = 500
READ_RECORDS: Final = 10_000


async def follow_events(
    client: RpcClient,
    feed: Feed,
    emit: Callable[[list[Event]], None],
    *,
    follow: bool,
    timeout_s: float,
) -> None:
    """Read the committed log from the controller (any of a quorum: standbys serve the
    fetch too) through `feed`, from `feed.next_offset` (0 for a new feed: a feed followed
    again after an error continues where it stopped), handing each answer's events to
    `emit`; with `follow`, long-poll for new commits until cancelled."""
    while True:
        wait = FOLLOW_WAIT_MS if follow else 0
        request = FetchMetadataRequest(
            from_offset=feed.next_offset, max_records=READ_RECORDS, max_wait_ms=wait
        )
        r = await ask(client, request, timeout_s + wait / 1000)
        if not isinstance(r, FetchMetadataResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__} from {client.address}")
        if r.snapshot is not None:
            feed.reset(r.snapshot.records, r.snapshot.offset)
            continue
        emit(feed.add(r.records))
        if not follow and feed.next_offset >= r.end_offset:
            return
