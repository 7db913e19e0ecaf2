"""`metactl events [--follow] [--since 10m] [--json]`: the committed log, one line per event.

Online, the command tails the controller's committed log as a broker does: FetchMetadata
from offset 0 (or the controller's snapshot), then long polls for what commits next.
Offline (`--data-dir`) it reads the log file, and with `--follow` waits for the running
controller's next commits. Either way `eventfeed.feed.Feed` turns records into lines,
applying a metadata transaction whole.

Without `--since`, every event of the log is shown, except with `--follow`, which starts
from now. Ctrl-C ends a `--follow` (status 130, as any interrupted command). An online
`--follow` outlives the controller it follows: it learns the quorum's other controllers
from it, and when it dies goes on at another from the last offset it printed (a note on
stderr when that took more than one request's retries), so a failover shows as its own
line ("controller c3 active (term 1234); c2 lost it (dead-active detection)") and
nothing is printed twice or skipped.

This module owns the command's flags, the offline reading and printing; the lines are
`eventfeed`'s, and the online reading `eventfeed.follow`'s (imported when the command
runs, not to build its parser: issue 34).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_source_arguments, controller_address, security_from

if TYPE_CHECKING:
    from eventfeed.feed import Event, Feed


def register(sub: Any) -> None:
    e = sub.add_parser(
        "events",
        help="the committed log as one readable line per event (fences, leaders, recoveries)",
        description="The committed metadata log as one line per event: broker fences, "
        "registrations and unregistrations, leader changes and why, ISR/ELR changes, topics "
        "created, grown and deleted, config and feature-level changes and the ELRs they "
        "clear, reassignments (adding, removing, complete, cancelled), and every unclean "
        "recovery, flagged as potential data loss; on etcd, each new active controller and "
        "how the last one lost it. A metadata transaction appears whole once committed. From "
        "the controller (--bootstrap-controller; --follow goes on at another controller of "
        "the quorum when it dies) or offline (--data-dir).",
        epilog=examples(
            "metactl events --follow",
            "metactl events --since 10m --bootstrap-controller 127.0.0.1:9093",
            "metactl events --data-dir ./data --json | jq .text",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_source_arguments(e)
    e.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing events as they commit, until Ctrl-C (default: stop at the end)",
    )
    e.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only events at or after WHEN: a duration back from now (30s, 10m, 2h, 1d) or "
        "an ISO 8601 time (default: the whole log; with --follow, from now)",
    )
    e.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per event: offset, timestamp_ms, time, type, text, record "
        "(default: text lines)",
    )
    e.set_defaults(func=cmd_events)


def _print(events: list[Event], as_json: bool) -> None:
    from eventfeed.feed import iso_ms
    from metadata_log.records import to_builtins

    out = sys.stdout
    for ev in events:
        if as_json:
            row = {
                "offset": ev.offset,
                "timestamp_ms": ev.timestamp_ms,
                "time": iso_ms(ev.timestamp_ms),
                "type": ev.type,
                "text": ev.text,
                "record": to_builtins(ev.record),
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            out.write(ev.line() + "\n")
    out.flush()


async def _online(args: argparse.Namespace, feed: Feed) -> None:
    from eventfeed.follow import follow_events, follow_quorum

    address = controller_address(args)
    security = security_from(args)
    if args.follow:
        # Outlives the controller it follows: goes on at another of the quorum.
        await follow_quorum(
            security.controller_client, address, feed, lambda events: _print(events, args.json),
            timeout_s=args.timeout, note=_note,
        )  # fmt: skip
        return
    async with security.controller_client(address) as client:
        await follow_events(
            client, feed, lambda events: _print(events, args.json), follow=False,
            timeout_s=args.timeout,
        )  # fmt: skip


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr, flush=True)


async def _offline(args: argparse.Namespace, feed: Feed) -> None:
    from controller.runtime.loading import snapshot_image  # offline only: not at start-up
    from ops.paths import open_log

    async with await open_log(args.data_dir) as store:
        if store.start_offset > 0:  # records were deleted before a snapshot: start from it
            feed.start(await snapshot_image(store))  # LogError if there is none
        while True:
            async for chunk in store.iter_chunks(feed.next_offset):
                _print(feed.add(chunk), args.json)
            if not args.follow:
                return
            await store.wait_for(feed.next_offset)


def cmd_events(args: argparse.Namespace) -> int:
    import asyncio

    from eventfeed.feed import Feed
    from ops.times import parse_since

    now = int(time.time() * 1000)
    since = parse_since(args.since, now) if args.since is not None else None
    if since is None and args.follow:
        since = now
    feed = Feed(since_ms=since)
    if args.data_dir is not None:
        asyncio.run(_offline(args, feed))
    else:
        asyncio.run(_online(args, feed))
    return EXIT_OK
