"""The `describe` and `brokers` commands: committed state, page by page.

Online (`--bootstrap-controller`), each command asks for DescribeCluster v2 pages over
one connection, each page within the client's frame limit, and prints every page as it
arrives: no cluster size breaks them, and memory holds one page. Each page comes from one
committed image; a multi-page answer is not one snapshot (docs/protocol.md, Paging).
A controller that only speaks v1 gets one v1 request. Offline (`--data-dir`), the same
order is walked over the image the log replays to.

`describe` prints what `kafka-topics.sh --describe` prints: a summary line per topic
(Topic, TopicId, PartitionCount, ReplicationFactor, Configs), then a tab-indented line per
partition with Kafka's fields in Kafka's order (Topic, Partition, Leader, Replicas, Isr,
Adding Replicas and Removing Replicas while the partition is being reassigned, Elr,
LastKnownElr), then metactl's (LeaderEpoch, Recovery, and the partition's last unclean
recovery with its age while it is within `--recent-recoveries`, 24 h by default).
Kafka's filters (`--under-replicated-partitions`, `--under-min-isr-partitions`,
`--at-min-isr-partitions`, `--unavailable-partitions`) print only the matching partition
lines, without topic lines, as Kafka does. `brokers` prints FENCED as yes/no and, for a
fenced broker, why (e.g. its session expired). `topics describe` is `describe` itself,
and `topics list` (kafka-topics.sh --list) prints the topics' names (`add_topic_views`:
`ops.lifecycle_cmds` adds both to the `topics` group).

This module owns the two commands' arguments, paging loop and output; it decides nothing
about the cluster and writes nothing to it. The protocol client, the messages and the
offline replay are imported when a command runs, not to build its parser (issue 34).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import (
    InvalidConfigurationError,
    UnknownTopicOrPartitionError,
)
from metactl.numbers import int_arg
from ops.cli import HELP_FORMAT, examples
from ops.client import add_source_arguments, controller_address, security_from

if TYPE_CHECKING:
    import msgspec

    from controller.runtime.describe import DescribeNotes
    from metadata_image.image import ClusterImage
    from protocol.messages.admin import (
        BrokerDescription,
        DescribeClusterRequest,
        PartitionState,
        RecoverySummary,
        TopicDescription,
    )

# Copies of `controller.runtime.describe.PAGE_ITEMS` (the controller's page cap) and
# `RECOVERIES_WITHIN_MS` (its default age of a recovery shown) and of
# `metadata_log.records.NO_LEADER`, for the parser and the online output: their modules
# load the controller's code and every record type (tests/ops/test_cli_imports.py checks
# that they agree).
PAGE_ITEMS: Final = 2000
RECOVERIES_WITHIN_MS: Final = 24 * 3600 * 1000
NO_LEADER: Final = -1

PAGING = (
    "Answers come in pages of at most --page-size items (the controller caps a page at "
    f"{PAGE_ITEMS} and at its frame size), printed as they arrive. Each page is one "
    "committed state; different pages may show different ones."
)


def replication_factor(p: PartitionState) -> int:
    """Kafka's replication factor of a partition: while it is being reassigned, its
    replicas without the ones being added (TopicCommand.getReplicationFactor)."""
    return len(p.replicas) - len(p.adding_replicas)


# Kafka's partition filters: the flag's dest, and which partitions it keeps.
FILTERS: Final[dict[str, Callable[[PartitionState], bool]]] = {
    "under_replicated_partitions": lambda p: len(p.isr) < replication_factor(p),
    "under_min_isr_partitions": lambda p: len(p.isr) < p.min_isr,
    "at_min_isr_partitions": lambda p: len(p.isr) == p.min_isr,
    "unavailable_partitions": lambda p: p.leader == NO_LEADER,
}


def register(sub: Any) -> None:
    d = sub.add_parser(
        "describe",
        help="topics and partitions, like kafka-topics --describe",
        description="Topics and their partitions: leader, replicas, ISR, the replicas a "
        "reassignment is adding and removing, ELR, LastKnownELR, leader epoch, recovery "
        "state and any recent unclean recovery. " + PAGING,
        epilog=examples(
            "metactl describe",
            "metactl describe --topic demo --unavailable-partitions",
            "metactl describe --data-dir ./data --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_describe_arguments(d)
    d.set_defaults(func=cmd_describe)

    b = sub.add_parser(
        "brokers",
        help="registered brokers and their state",
        description="Registered brokers: epoch, fenced or not and why, controlled "
        "shutdown, heartbeat age, how the last registration went, endpoint. "
        + PAGING
        + " `brokers unregister --id N` removes a fenced broker's registration.",
        epilog=examples(
            "metactl brokers",
            "metactl brokers --principal viewer --json",
            "metactl brokers --data-dir ./data",
            "metactl brokers unregister --id 4",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_source_arguments(b)
    b.add_argument(
        "--json",
        action="store_true",
        help="one JSON object, streamed: brokers and offsets (default: a table)",
    )
    _page_size_arg(b)
    b.set_defaults(func=cmd_brokers)


def add_describe_arguments(d: argparse.ArgumentParser) -> None:
    """`describe`'s options (and `topics describe`'s, the same command): its sources,
    --topic, Kafka's filters, --recent-recoveries, --json and --page-size."""
    add_source_arguments(d)
    d.add_argument(
        "--topic", default=None, help="one topic (default: all; an unknown one is an error)"
    )
    filters = d.add_argument_group("filters (Kafka's; at most one; partition lines only)")
    only = filters.add_mutually_exclusive_group()
    only.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="partitions whose ISR is smaller than their replication factor (while "
        "reassigning, the replicas not being added, as Kafka counts it)",
    )
    only.add_argument(
        "--under-min-isr-partitions",
        action="store_true",
        help="partitions whose ISR is smaller than their MinISR (acks=all refused)",
    )
    only.add_argument(
        "--at-min-isr-partitions",
        action="store_true",
        help="partitions whose ISR is exactly their MinISR (one failure from refusing)",
    )
    only.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="partitions without a leader",
    )
    d.add_argument(
        "--recent-recoveries",
        default="24h",
        metavar="DURATION",
        help="show a partition's last unclean recovery and its age if it is at most this "
        "old, e.g. 30m, 24h, 7d; 0 hides them (default 24h)",
    )
    d.add_argument(
        "--json",
        action="store_true",
        help="one JSON object, streamed: partitions, topics and offsets (default: text)",
    )
    _page_size_arg(d)


def add_topic_views(tsub: Any) -> None:
    """`topics list` and `topics describe` (kafka-topics.sh --list and --describe) on the
    `topics` group's sub-commands: `describe` itself, and the topic names."""
    d = tsub.add_parser(
        "describe",
        help="topics and their partitions: the same as `metactl describe`",
        description="kafka-topics.sh --describe: the same command, options and output as "
        "`metactl describe`. " + PAGING,
        epilog=examples(
            "metactl topics describe --topic demo",
            "metactl topics --describe --topic demo --under-replicated-partitions",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_describe_arguments(d)
    d.set_defaults(func=cmd_describe)
    lst = tsub.add_parser(
        "list",
        help="topic names, one per line",
        description="kafka-topics.sh --list: every topic's name, one per line, in name "
        "order. " + PAGING,
        epilog=examples(
            "metactl topics list",
            "metactl topics --list --json",
            "metactl topics list --data-dir ./data",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_source_arguments(lst)
    lst.add_argument(
        "--json",
        action="store_true",
        help='one JSON object, {"topics": [...]} (default: a name per line)',
    )
    _page_size_arg(lst)
    lst.set_defaults(func=cmd_topics_list)


def _page_size_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--page-size",
        type=int_arg,
        default=PAGE_ITEMS,
        metavar="N",
        help=f"items asked per request (default and controller maximum {PAGE_ITEMS})",
    )


def _full(obj: msgspec.Struct) -> dict[str, Any]:
    """Every field, defaults included (the wire form omits them), without tag or version."""
    from msgspec import to_builtins

    return {f: to_builtins(getattr(obj, f)) for f in obj.__struct_fields__ if f != "v"}


def _ids(xs: Iterable[int]) -> str:
    return ",".join(map(str, xs))


def age_text(ms: int) -> str:
    """A duration the way an operator reads it: 4.2s, 3m12s, 2h05m, 3d04h."""
    s = ms // 1000
    if s < 60:
        return f"{ms / 1000:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def recovery_state(p: PartitionState) -> str:
    if p.recovery_pending is not None:
        return f"recovery_pending(awaiting {_ids(p.recovery_pending) or 'operator'})"
    if p.recovering:
        return "recovering"
    return "offline" if p.leader == NO_LEADER else "ok"


def recovery_note(r: RecoverySummary) -> str:
    """The last unclean recovery of a partition: whom it chose, from whom, how, when."""
    how = r.strategy + (f", {r.trigger}" if r.trigger else "")
    # Candidates in ascending order, as the event feed prints every set of brokers.
    pool = f" of [{_ids(sorted(r.candidates))}]" if r.candidates else ""
    return f"chose {r.chosen}{pool} ({how}) {age_text(r.age_ms)} ago — potential data loss"


def topic_line(t: TopicDescription) -> str:
    """Kafka's topic summary line."""
    configs = [f"min.insync.replicas={t.min_isr}"]
    if t.recovery_strategy:
        configs.append(f"unclean.recovery.strategy={t.recovery_strategy}")
    return (
        f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {t.partitions}\t"
        f"ReplicationFactor: {t.replication_factor}\tConfigs: {','.join(configs)}"
    )


def partition_line(p: PartitionState) -> str:
    """Kafka's partition line (its fields in its order, tab-indented), then metactl's."""
    leader = "none" if p.leader == NO_LEADER else str(p.leader)
    moving = ""
    if p.adding_replicas or p.removing_replicas:  # Kafka's columns, while reassigning
        moving = (
            f"Adding Replicas: {_ids(p.adding_replicas)}\t"
            f"Removing Replicas: {_ids(p.removing_replicas)}\t"
        )
    line = (
        f"\tTopic: {p.topic}\tPartition: {p.partition}\tLeader: {leader}\t"
        f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t{moving}Elr: {_ids(p.elr)}\t"
        f"LastKnownElr: {_ids(p.last_known_elr)}\tLeaderEpoch: {p.leader_epoch}\t"
        f"Recovery: {recovery_state(p)}"
    )
    if p.last_unclean_recovery is not None:
        line += f"\tLastUncleanRecovery: {recovery_note(p.last_unclean_recovery)}"
    return line


BROKERS_HEADER = "{:>4} {:>8}  {:<6} {:<8} {:>9}  {:<8}  {:<30} ENDPOINT".format(
    "ID", "EPOCH", "FENCED", "SHUTDOWN", "HEARTBEAT", "LAST REG", "STATE"
)


def broker_state(b: BrokerDescription) -> str:
    """What the broker is doing now, and for a fenced one why, when the controller knows."""
    if b.controlled_shutdown:
        return "controlled shutdown"
    if not b.fenced:
        return "active"
    if b.fenced_reason:
        from eventfeed.lines import fence_reason_text

        return f"fenced: {fence_reason_text(b.fenced_reason)}"
    return "fenced"


def broker_line(b: BrokerDescription) -> str:
    age = "-" if b.last_heartbeat_age_ms is None else f"{b.last_heartbeat_age_ms / 1000:.1f}s"
    clean = "clean" if b.last_registration_clean else "UNCLEAN"
    yes = {True: "yes", False: "no"}
    return (
        f"{b.broker_id:>4} {b.epoch:>8}  {yes[b.fenced]:<6} {yes[b.controlled_shutdown]:<8} "
        f"{age:>9}  {clean:<8}  {broker_state(b):<30} {b.endpoint}"
    )


# --- output ---------------------------------------------------------------------------------


class _Printer:
    """Streams one command's output: text lines, or one JSON object whose list is written
    item by item. Nothing is written before the first page, and a JSON object is closed
    only on success, so a failed command never leaves something that parses as whole.
    `offsets` are the pages' committed end offsets, in order. `keep` filters partitions
    (Kafka's filters: then no topic lines)."""

    def __init__(
        self,
        key: str,
        as_json: bool,
        header: str | None = None,
        keep: Callable[[PartitionState], bool] | None = None,
    ) -> None:
        self.key = key
        self.as_json = as_json
        self.header = header
        self.keep = keep
        self.count = 0  # items written
        self.seen = 0  # items received, filtered out or not
        self.offsets: list[int] = []
        self.topics: dict[str, TopicDescription] = {}
        self._last_topic: str | None = None

    def page(
        self,
        items: Iterable[Any],
        line: Callable[[Any], str],
        offset: int,
        topics: Iterable[TopicDescription] = (),
    ) -> None:
        out = sys.stdout
        if not self.offsets:
            if self.as_json:
                out.write(f'{{"{self.key}": [')
            elif self.header is not None:
                out.write(self.header + "\n")
        self.offsets.append(offset)
        for t in topics:
            self.topics.setdefault(t.name, t)
        for item in items:
            self.seen += 1
            if self.keep is not None and not self.keep(item):
                continue
            if self.as_json:
                out.write((", " if self.count else "") + json.dumps(_full(item)))
            else:
                topic = getattr(item, "topic", None)
                if self.keep is None and topic is not None and topic != self._last_topic:
                    summary = self.topics.get(topic)
                    out.write(
                        (topic_line(summary) if summary is not None else f"Topic: {topic}") + "\n"
                    )
                self._last_topic = topic
                out.write(line(item) + "\n")
            self.count += 1
        out.flush()

    def finish(self) -> None:
        if self.as_json:
            if not self.offsets:
                sys.stdout.write(f'{{"{self.key}": [')
                self.offsets.append(0)
            topics = ""
            if self.key == "partitions":
                topics = (
                    ', "topics": ['
                    + ", ".join(json.dumps(_full(t)) for t in self.topics.values())
                    + "]"
                )
            # end_offset: every item shows at least the log below it (the first page's);
            # last_end_offset: the newest state any item shows (the last page's).
            sys.stdout.write(
                f"]{topics}, "
                f'"end_offset": {self.offsets[0]}, "last_end_offset": {self.offsets[-1]}, '
                f'"pages": {len(self.offsets)}}}\n'
            )
        sys.stdout.flush()


async def _online(args: argparse.Namespace, request: DescribeClusterRequest, out: _Printer) -> None:
    from clients.admin import pages

    address = controller_address(args)
    security = security_from(args)
    async with security.controller_client(address) as client:
        async for r in pages(client, request, timeout_s=args.timeout):
            if out.key == "partitions":
                out.page(r.partitions, partition_line, r.committed_offset, r.topics)
            else:
                out.page(r.brokers, broker_line, r.committed_offset)
    if request.topic is not None and out.seen == 0:
        # A controller older than paging answers an unknown topic with no partitions.
        raise UnknownTopicOrPartitionError(f"unknown topic {request.topic}")


async def offline_view(data_dir: str | Path) -> tuple[ClusterImage, int, DescribeNotes]:
    """The committed image of the log in `data_dir` (a cluster's data directory or the
    controller's own), its end offset, and the notes its records after the newest
    snapshot give (recoveries with their commit times, fence reasons). A transaction
    counts once its end marker is read, an aborted one never."""
    from controller.runtime.describe import DescribeNotes
    from controller.runtime.loading import snapshot_image
    from metadata_image.transactions import EffectiveEntries, LogReplay, replay_log
    from metadata_log.batch_format import LogEntry
    from ops.paths import open_log

    notes = DescribeNotes()
    async with await open_log(data_dir) as store:
        state = LogReplay(await snapshot_image(store))  # LogError for a truncated log
        effective = EffectiveEntries[LogEntry]()
        async for chunk in store.iter_chunks(state.image.end_offset):
            state = replay_log(state, [e.record for e in chunk])
            for e in effective.add(chunk):
                notes.observe((e.record,), e.timestamp_ms)
        return state.image, store.end_offset, notes


async def _offline(args: argparse.Namespace, within_ms: int, out: _Printer) -> None:
    import time

    from controller.runtime.describe import (
        broker_description,
        iter_brokers,
        iter_partitions,
        partition_state,
        topic_description,
    )

    image, end, notes = await offline_view(args.data_dir)
    now = int(time.time() * 1000)
    topic = getattr(args, "topic", None)
    if out.key == "partitions":
        if topic is not None and topic not in image.topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic}")
        names = [topic] if topic is not None else sorted(image.topics)
        out.page(
            (
                partition_state(p, None, notes.recovery(p.tp, now, within_ms))
                for p in iter_partitions(image, topic)
            ),
            partition_line,
            end,
            [topic_description(image, name) for name in names],
        )
    else:
        reasons = notes.fenced_reasons
        out.page(
            (broker_description(b, None, reasons.get(b.broker_id)) for b in iter_brokers(image)),
            broker_line,
            end,
        )


def _run(
    args: argparse.Namespace, request: DescribeClusterRequest, out: _Printer, within_ms: int
) -> int:
    if args.page_size < 1:
        raise InvalidConfigurationError(f"--page-size must be at least 1, got {args.page_size}")
    import asyncio

    try:
        if args.data_dir is not None:
            asyncio.run(_offline(args, within_ms, out))
        else:
            asyncio.run(_online(args, request, out))
    except BaseException:
        # Whatever was streamed stays unclosed (a failed command never leaves whole
        # JSON), on a line of its own.
        sys.stdout.write("\n" if out.as_json and out.offsets else "")
        sys.stdout.flush()
        raise
    out.finish()
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from ops.times import parse_duration_ms
    from protocol.messages.admin import DescribeClusterRequest

    within_ms = parse_duration_ms(args.recent_recoveries, "--recent-recoveries")
    request = DescribeClusterRequest(
        v=2,
        topic=args.topic,
        partition_limit=args.page_size,
        broker_limit=0,
        recoveries_within_ms=None if within_ms == RECOVERIES_WITHIN_MS else within_ms,
    )
    keep = next((f for name, f in FILTERS.items() if getattr(args, name)), None)
    return _run(args, request, _Printer("partitions", args.json, keep=keep), within_ms)


def cmd_brokers(args: argparse.Namespace) -> int:
    from protocol.messages.admin import DescribeClusterRequest

    request = DescribeClusterRequest(v=2, partition_limit=0, broker_limit=args.page_size)
    out = _Printer("brokers", args.json, header=BROKERS_HEADER)
    return _run(args, request, out, 0)


def cmd_topics_list(args: argparse.Namespace) -> int:
    """Every topic's name, in name order (the controller pages partitions by topic name):
    each printed as its first page arrives; --json prints them once all have come."""
    if args.page_size < 1:
        raise InvalidConfigurationError(f"--page-size must be at least 1, got {args.page_size}")
    import asyncio

    names: list[str] = []

    def seen(name: str) -> None:
        if not names or names[-1] != name:
            names.append(name)
            if not args.json:
                print(name, flush=True)

    async def online() -> None:
        from clients.admin import pages
        from protocol.messages.admin import DescribeClusterRequest

        request = DescribeClusterRequest(v=2, partition_limit=args.page_size, broker_limit=0)
        address = controller_address(args)
        async with security_from(args).controller_client(address) as client:
            async for r in pages(client, request, timeout_s=args.timeout):
                for p in r.partitions:
                    seen(p.topic)

    async def offline() -> None:
        image, _end, _notes = await offline_view(args.data_dir)
        for name in sorted(image.topics):
            seen(name)

    asyncio.run(offline() if args.data_dir is not None else online())
    if args.json:
        print(json.dumps({"topics": names}))
    return 0
