"""The `describe` and `brokers` commands: committed state, page by page.

Online (`--controller`), each command asks for DescribeCluster v2 pages over one
connection, each page within the client's frame limit, and prints every page as it
arrives: no cluster size breaks them, and memory holds one page. Each page comes from one
committed image; a multi-page answer is not one snapshot (docs/protocol.md, Paging).
A controller that only speaks v1 gets one v1 request. Offline (`--data-dir`), the same
order is walked over the image the log replays to.

This module owns the two commands' arguments, paging loop and output; it decides nothing
about the cluster and writes nothing to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from controller.runtime.describe import (
    PAGE_ITEMS,
    broker_description,
    iter_brokers,
    iter_partitions,
    partition_state,
)
from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from metadata_log.records import NO_LEADER
from ops.client import CLI_RETRY, offline_image, security_from
from ops.cluster_cmds import DEFAULT_CONTROLLER
from protocol.client import RpcClient
from protocol.flags import add_tls_arguments
from protocol.messages import (
    BrokerDescription,
    DescribeClusterRequest,
    DescribeClusterResponse,
    PartitionState,
)

PAGING = (
    "Answers come in pages of at most --page-size items (the controller caps a page at "
    f"{PAGE_ITEMS} and at its frame size), printed as they arrive. Each page is one "
    "committed state; different pages may show different ones."
)


def register(sub: Any) -> None:
    d = sub.add_parser(
        "describe",
        help="partitions, like kafka-topics --describe",
        description="Partitions with leader, ISR, ELR, LastKnownELR and recovery state. " + PAGING,
    )
    _source_args(d)
    d.add_argument("--topic", default=None, help="one topic (unknown: an error)")
    d.add_argument("--json", action="store_true", help="one JSON object (streamed)")
    _page_size_arg(d)
    d.set_defaults(func=cmd_describe)

    b = sub.add_parser("brokers", help="registered brokers and their state", description=PAGING)
    _source_args(b)
    b.add_argument("--json", action="store_true", help="one JSON object (streamed)")
    _page_size_arg(b)
    b.set_defaults(func=cmd_brokers)


def _source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--controller", default=None, help=f"HOST:PORT (default {DEFAULT_CONTROLLER})")
    g.add_argument("--data-dir", type=Path, default=None, help="read a data directory offline")
    add_tls_arguments(p, client=True)


def _page_size_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--page-size",
        type=int,
        default=PAGE_ITEMS,
        metavar="N",
        help=f"items asked per request (default and controller maximum {PAGE_ITEMS})",
    )


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


# --- fetching -----------------------------------------------------------------------------


async def pages(
    client: RpcClient, request: DescribeClusterRequest
) -> AsyncIterator[DescribeClusterResponse]:
    """Every page of `request` (v2), in order, each sized to the client's frame limit.
    Raises the controller's coded error, or InvalidRequestError if a page makes no
    progress or goes back (a server bug), so a walk always ends."""
    request = msgspec.structs.replace(request, v=2, max_bytes=client.max_frame_bytes)
    last_tp: tuple[str, int] | None = None
    last_broker: int | None = None
    while True:
        try:
            r = await client.request(request)
        except UnsupportedVersionError:
            if request.cursor is not None or request.broker_cursor is not None:
                raise
            # A controller older than paging: one v1 answer (it may not fit a frame).
            r = await client.request(DescribeClusterRequest(topic=request.topic))
        if not isinstance(r, DescribeClusterResponse):
            raise InvalidRequestError(f"unexpected answer {type(r).__name__}")
        for p in r.partitions:
            if last_tp is not None and (p.topic, p.partition) <= last_tp:
                raise InvalidRequestError(f"the controller went back to {p.topic}-{p.partition}")
            last_tp = (p.topic, p.partition)
        for b in r.brokers:
            if last_broker is not None and b.broker_id <= last_broker:
                raise InvalidRequestError(f"the controller went back to broker {b.broker_id}")
            last_broker = b.broker_id
        yield r
        if r.next_cursor is None and r.next_broker_cursor is None:
            return
        if not r.partitions and not r.brokers:
            raise InvalidRequestError("the controller answered an empty page with a cursor")
        request = next_request(request, r)


def next_request(
    request: DescribeClusterRequest, r: DescribeClusterResponse
) -> DescribeClusterRequest:
    """The request for the page after `r`: each list from its cursor, and a list whose
    cursor is None is complete, so it is not asked for again (limit 0)."""
    return msgspec.structs.replace(
        request,
        cursor=r.next_cursor,
        broker_cursor=r.next_broker_cursor,
        partition_limit=0 if r.next_cursor is None else request.partition_limit,
        broker_limit=0 if r.next_broker_cursor is None else request.broker_limit,
    )


def _full(obj: msgspec.Struct) -> dict[str, Any]:
    """Every field, defaults included (the wire form omits them), without tag or version."""
    return {f: msgspec.to_builtins(getattr(obj, f)) for f in obj.__struct_fields__ if f != "v"}


def _ids(xs: list[int]) -> str:
    return ",".join(map(str, xs))


def recovery_state(p: PartitionState) -> str:
    if p.recovery_pending is not None:
        return f"recovery_pending(awaiting {_ids(p.recovery_pending) or 'operator'})"
    if p.recovering:
        return "recovering"
    return "offline" if p.leader == NO_LEADER else "ok"


def partition_line(p: PartitionState) -> str:
    leader = "none" if p.leader == NO_LEADER else str(p.leader)
    return (
        f"Topic: {p.topic}\tPartition: {p.partition}\tLeader: {leader}\t"
        f"LeaderEpoch: {p.leader_epoch}\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t"
        f"Elr: {_ids(p.elr)}\tLastKnownElr: {_ids(p.last_known_elr)}\t"
        f"MinIsr: {p.min_isr}\tRecovery: {recovery_state(p)}"
    )


BROKERS_HEADER = "{:>4} {:>8} {:>7} {:>9} {:>10} {:>9}  ENDPOINT".format(
    "ID", "EPOCH", "FENCED", "SHUTDOWN", "HEARTBEAT", "LAST REG"
)


def broker_line(b: BrokerDescription) -> str:
    age = "-" if b.last_heartbeat_age_ms is None else f"{b.last_heartbeat_age_ms / 1000:.1f}s"
    clean = "clean" if b.last_registration_clean else "UNCLEAN"
    return (
        f"{b.broker_id:>4} {b.epoch:>8} {b.fenced!s:>7} {b.controlled_shutdown!s:>9} "
        f"{age:>10} {clean:>9}  {b.endpoint}"
    )


# --- output ---------------------------------------------------------------------------------


class _Printer:
    """Streams one command's output: text lines, or one JSON object whose list is written
    item by item. Nothing is written before the first page, and a JSON object is closed
    only on success, so a failed command never leaves something that parses as whole.
    `offsets` are the pages' committed end offsets, in order."""

    def __init__(self, key: str, as_json: bool, header: str | None = None) -> None:
        self.key = key
        self.as_json = as_json
        self.header = header
        self.count = 0
        self.offsets: list[int] = []

    def page(
        self, items: Iterable[msgspec.Struct], line: Callable[[Any], str], offset: int
    ) -> None:
        out = sys.stdout
        if not self.offsets:
            if self.as_json:
                out.write(f'{{"{self.key}": [')
            elif self.header is not None:
                out.write(self.header + "\n")
        self.offsets.append(offset)
        for item in items:
            if self.as_json:
                out.write((", " if self.count else "") + json.dumps(_full(item)))
            else:
                out.write(line(item) + "\n")
            self.count += 1
        out.flush()

    def finish(self) -> None:
        if self.as_json:
            # end_offset: every item shows at least the log below it (the first page's);
            # last_end_offset: the newest state any item shows (the last page's).
            sys.stdout.write(
                f'], "end_offset": {self.offsets[0]}, "last_end_offset": {self.offsets[-1]}, '
                f'"pages": {len(self.offsets)}}}\n'
            )
        sys.stdout.flush()


async def _online(args: argparse.Namespace, request: DescribeClusterRequest, out: _Printer) -> None:
    security = security_from(args)
    address = args.controller or DEFAULT_CONTROLLER
    async with security.controller_client(address, retry=CLI_RETRY) as client:
        async for r in pages(client, request):
            if out.key == "partitions":
                out.page(r.partitions, partition_line, r.committed_offset)
            else:
                out.page(r.brokers, broker_line, r.committed_offset)


async def _offline(data_dir: Path, topic: str | None, out: _Printer) -> None:
    image, end = await offline_image(data_dir)
    if out.key == "partitions":
        if topic is not None and topic not in image.topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic}")
        out.page((partition_state(p) for p in iter_partitions(image, topic)), partition_line, end)
    else:
        out.page((broker_description(b, None) for b in iter_brokers(image)), broker_line, end)


def _run(args: argparse.Namespace, request: DescribeClusterRequest, out: _Printer) -> int:
    if args.page_size < 1:
        return _fail(InvalidRequestError(f"--page-size must be at least 1, got {args.page_size}"))
    try:
        if args.data_dir is not None:
            asyncio.run(_offline(args.data_dir, getattr(args, "topic", None), out))
        else:
            asyncio.run(_online(args, request, out))
    except (MetactlError, OSError, TimeoutError) as exc:
        sys.stdout.write("\n" if out.as_json and out.offsets else "")
        sys.stdout.flush()
        return _fail(exc)
    out.finish()
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    request = DescribeClusterRequest(
        v=2, topic=args.topic, partition_limit=args.page_size, broker_limit=0
    )
    return _run(args, request, _Printer("partitions", args.json))


def cmd_brokers(args: argparse.Namespace) -> int:
    request = DescribeClusterRequest(v=2, partition_limit=0, broker_limit=args.page_size)
    return _run(args, request, _Printer("brokers", args.json, header=BROKERS_HEADER))
