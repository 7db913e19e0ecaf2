"""The committed metadata log followed from a running controller, through a `Feed`.

`follow_events` tails the controller's committed log as a broker does: FetchMetadata from
the feed's next offset (or the controller's snapshot, for a truncated log), then, with
`follow`, long polls for what commits next. Any controller of a quorum serves it
(standbys answer the fetch too, from the committed log they tail).

`follow_quorum` is a `--follow` that outlives the controller it follows: it learns every
controller of the quorum from the one it was given (DescribeQuorum lists the controllers
recorded in etcd), and when a fetch fails (the controller died, or a standby has not
read as far yet) it goes on at another controller from the feed's next offset: the
offset after the last record it handed over, so nothing is told twice and nothing is
skipped. What any controller serves is committed, so nothing it tells is undone.

Used by `metactl events` and `cluster up`'s foreground. It reads only, and prints
nothing: its caller's `emit` (and `note`) do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from clients.controller import ask
from eventfeed.feed import Event, Feed
from metactl.errors import MetactlError, OffsetOutOfRangeError
from protocol.client import Endpoints, RpcClient
from protocol.messages.admin import DescribeQuorumRequest, DescribeQuorumResponse
from protocol.messages.broker_controller import FetchMetadataRequest, FetchMetadataResponse

__all__ = ["FOLLOW_WAIT_MS", "follow_events", "follow_quorum"]

# The long poll of a --follow (the controller caps it at 10 s; brokers use 500 ms).
FOLLOW_WAIT_MS: Final = 500
READ_RECORDS: Final = 10_000
# After a failed fetch, the next controller is tried this long later, doubling to the cap
# while every controller fails (none reachable: a cluster restarting, say).
RETRY_S: Final = 0.2
RETRY_CAP_S: Final = 2.0
# How long the quorum's membership may take to be told (DescribeQuorum, per controller).
DISCOVER_TIMEOUT_S: Final = 2.0


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


async def follow_quorum(
    connect: Callable[[str], RpcClient],
    bootstrap: str,
    feed: Feed,
    emit: Callable[[list[Event]], None],
    *,
    timeout_s: float,
    note: Callable[[str], None] | None = None,
) -> None:
    """Follow the committed log (`follow_events` with `follow`) until cancelled, from any
    controller of the quorum: those in `bootstrap` (HOST:PORT[,...]) and those they say
    are recorded (DescribeQuorum). A fetch that fails with a retriable error, or a
    standby's "beyond the committed end" (it has not read that far yet), moves to the
    next controller, which goes on from `feed.next_offset`; `note` hears of each such
    move. A non-retriable error (TLS refused, say) is raised. `connect` makes a client for
    an address list (the caller's TLS)."""
    known = [a.strip() for a in bootstrap.split(",") if a.strip()]
    current = known[0]
    delay = RETRY_S
    reached = False  # a controller answered: from then on, failures are ridden out

    def answered(events: list[Event]) -> None:
        nonlocal reached
        reached = True
        emit(events)

    while True:
        found = await discover(connect, [current, *known])
        reached = reached or bool(found)
        known = _merge(known, found)
        start = known.index(current) if current in known else 0
        order = known[start:] + known[:start]
        client = connect(",".join(order))
        offset = feed.next_offset
        try:
            async with client:
                await follow_events(client, feed, answered, follow=True, timeout_s=timeout_s)
        except MetactlError as exc:
            if not reached or not (exc.retriable or isinstance(exc, OffsetOutOfRangeError)):
                raise  # never reached (a wrong address), or not a controller's absence
            # A network failure or NOT_CONTROLLER has moved the client to the next
            # controller already; a standby behind the feed is left here.
            current = client.address
            if isinstance(exc, OffsetOutOfRangeError) or not isinstance(client.target, Endpoints):
                current = _after(order, current)
            if note is not None:
                note(
                    f"the controller stopped answering ({exc.code}: {exc.message}); "
                    f"following {current} from offset {feed.next_offset}"
                )
        if feed.next_offset > offset:
            delay = RETRY_S  # it made progress: the next failure is a new one
        await asyncio.sleep(delay)  # a retry's backoff, not a poll
        delay = min(RETRY_CAP_S, delay * 2)


async def discover(connect: Callable[[str], RpcClient], addresses: list[str]) -> list[str]:
    """The controllers the first of `addresses` that answers DescribeQuorum knows: itself
    and those recorded in etcd ([] from a single controller's answer on SQLite, or when
    none answers within `DISCOVER_TIMEOUT_S` each)."""
    for address in dict.fromkeys(addresses):
        try:
            async with connect(address) as client:
                r = await client.request(DescribeQuorumRequest(), DISCOVER_TIMEOUT_S)
        except MetactlError:
            continue
        if isinstance(r, DescribeQuorumResponse):
            return [r.address, *(c.address for c in r.controllers if c.address)]
    return []


def _merge(known: list[str], found: list[str]) -> list[str]:
    """`known`, then what `found` adds (well-formed addresses only), in order."""
    out = list(known)
    for address in found:
        if address not in out:
            try:
                Endpoints([address])
            except MetactlError:
                continue
            out.append(address)
    return out


def _after(order: list[str], failed: str) -> str:
    """The controller after `failed` in `order` (the first if `failed` is not in it)."""
    if failed not in order:
        return order[0]
    return order[(order.index(failed) + 1) % len(order)]
