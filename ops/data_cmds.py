"""`metactl produce` and `metactl consume`: clients of the brokers' data plane.

`produce` finds each partition's leader in the controller's DescribeCluster, sends
batches of records to it (Produce, see docs/protocol.md), refreshes the metadata and
retries on NOT_LEADER_OR_FOLLOWER or a broken connection, retries every retriable error
with `RetryPolicy` backoff, and appends each acknowledged batch (topic, partition,
base_offset, count, leader_epoch, acks) to the acked log as one JSON line, written,
flushed and fsynced *before* it is counted as acknowledged. A batch refused for good is
counted by its error code. Exit status: 0 every batch acknowledged, 3 some refused; an
error before producing has its status from docs/cli.md's table (4 an unknown topic, 5
the controller unreachable, 2 bad arguments or configuration, 1 refused).

`consume --from-beginning` reads every partition's committed records (ReadLog) from its
current leader: the high watermark and the (offset, leader epoch) ranges below it, with
a digest; `--check-acked FILE` also says which acknowledged records are missing (a
record acknowledged at (o, e) survives iff the log holds offset o in epoch e). Exit
status: 0, 3 when a partition could not be read or an acknowledged record is missing,
and the table's for errors, as above.

Both use mutual TLS unless `--insecure` (`ops.client.security_from`): the controller
must prove it is `controller`, and each leader `broker-<id>`, the id DescribeCluster
names.

This module parses, calls and prints: producing and reading are `clients.producer` and
`clients.consumer`'s (imported when a command runs, not to build its parser: issue 34),
and what a broker answers is `brokers_stub.produce`'s business.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError, MetactlError
from metactl.numbers import decimal_arg, int_arg, long_arg
from ops.cli import EXIT_OK, HELP_FORMAT, examples
from ops.client import add_controller_arguments, controller_address, security_from

EXIT_INCOMPLETE: Final = 3  # the commands' own verdict (docs/cli.md)
# `clients.data.DATA_RETRY.attempts - 1`, copied for --help: the clients load the protocol
# client (tests/ops/test_cli_imports.py checks that they agree).
DEFAULT_RETRIES: Final = 11


def register(sub: Any) -> None:
    p = sub.add_parser(
        "produce",
        help="produce records to a topic and log every acknowledged batch",
        description="Send batches of records (offsets only, no bytes) to the partitions' "
        "leaders; append each acknowledged batch to --acked-log (fsynced) before counting "
        "it. Exit 0: all acknowledged; 3: some refused; otherwise docs/cli.md's table.",
        epilog=examples(
            "metactl produce --topic demo --acks all --count 10000 --acked-log acked.jsonl",
            "metactl produce --topic demo --count 1000 --rate 200 --batch 10 "
            "--acked-log acked.jsonl --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(p)
    p.add_argument("--topic", required=True, help="the topic to produce to (required)")
    p.add_argument(
        "--partition",
        type=int_arg,
        default=None,
        help="one partition (default: round-robin over all)",
    )
    p.add_argument(
        "--acks",
        choices=["all", "-1", "1"],
        default="all",
        help="all (-1): answered once committed; 1: once the leader appended (default all)",
    )
    p.add_argument("--count", type=long_arg, required=True, help="records to produce in all")
    p.add_argument("--batch", type=int_arg, default=100, help="records per batch (default 100)")
    p.add_argument("--rate", type=decimal_arg, default=None, help="records per second (no limit)")
    p.add_argument(
        "--in-flight", type=int_arg, default=1, help="batches sent concurrently (default 1)"
    )
    p.add_argument(
        "--timeout-ms", type=long_arg, default=None, help="acks=all commit timeout (broker default)"
    )
    p.add_argument(
        "--retries",
        type=int_arg,
        default=DEFAULT_RETRIES,
        help=f"retries of a batch refused with a retriable error (default {DEFAULT_RETRIES})",
    )
    p.add_argument("--acked-log", type=Path, required=True, help="JSON lines, appended")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_produce)

    c = sub.add_parser(
        "consume",
        help="read the committed records of a topic from the leaders",
        description="Read every partition's committed (offset, leader epoch) ranges up to "
        "the high watermark from its leader. Exit 3 if a partition could not be read or "
        "an acknowledged record (--check-acked) is missing.",
        epilog=examples(
            "metactl consume --topic demo --from-beginning",
            "metactl consume --topic demo --from-beginning --check-acked acked.jsonl --json",
        ),
        formatter_class=HELP_FORMAT,
    )
    add_controller_arguments(c)
    c.add_argument("--topic", required=True, help="the topic to read (required)")
    c.add_argument(
        "--partition", type=int_arg, default=None, help="one partition (default: every partition)"
    )
    c.add_argument(
        "--from-beginning",
        action="store_true",
        help="read from offset 0 (the only mode: accepted for kafka-console-consumer habits)",
    )
    c.add_argument(
        "--check-acked",
        type=Path,
        default=None,
        metavar="ACKED_LOG",
        help="say which records this produce --acked-log acknowledged are missing "
        "(default: no check)",
    )
    c.add_argument("--json", action="store_true", help="print the ranges as JSON")
    c.set_defaults(func=cmd_consume)


def cmd_produce(args: argparse.Namespace) -> int:
    for name in ("count", "batch", "in_flight"):
        if getattr(args, name) < 1:
            raise InvalidConfigurationError(f"--{name.replace('_', '-')} must be >= 1")
    if args.rate is not None and args.rate <= 0:
        raise InvalidConfigurationError("--rate must be > 0")
    if args.retries < 0:
        raise InvalidConfigurationError("--retries must be >= 0")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise InvalidConfigurationError("--timeout-ms must be >= 0")
    import asyncio
    import dataclasses

    from clients.data import DATA_RETRY
    from clients.producer import produce
    from protocol.messages.data import ACKS_ALL, ACKS_LEADER

    acks = ACKS_ALL if args.acks in ("all", "-1") else ACKS_LEADER
    controller = controller_address(args)
    security = security_from(args)
    summary = asyncio.run(
        produce(
            controller=controller,
            topic=args.topic,
            partition=args.partition,
            acks=acks,
            count=args.count,
            batch=args.batch,
            acked_log=args.acked_log,
            rate=args.rate,
            in_flight=args.in_flight,
            timeout_ms=args.timeout_ms,
            retry=dataclasses.replace(DATA_RETRY, attempts=args.retries + 1),
            security=security,
            timeout_s=args.timeout,
        )
    )
    if args.json:
        print(json.dumps(summary.to_json()))
    else:
        print(summary.line())
    return EXIT_INCOMPLETE if summary.refused else EXIT_OK


def cmd_consume(args: argparse.Namespace) -> int:
    import asyncio

    from clients.consumer import consume, digest, missing_records, ranges, read_acked_log
    from protocol.messages.data import ReadLogResponse

    acked = read_acked_log(args.check_acked, args.topic) if args.check_acked else None
    controller = controller_address(args)
    security = security_from(args)
    results = asyncio.run(
        consume(
            controller=controller,
            topic=args.topic,
            partition=args.partition,
            security=security,
            timeout_s=args.timeout,
        )
    )
    committed = {
        r.partition: ranges(r.leader_epochs, r.high_watermark)
        for _, r in results
        if isinstance(r, ReadLogResponse)
    }
    failed = [p.partition for p, r in results if isinstance(r, MetactlError)]
    missing = missing_records(acked, committed) if acked is not None else {}
    if args.json:
        parts: list[dict[str, Any]] = []
        for p, r in results:
            doc: dict[str, Any] = {"topic": p.topic, "partition": p.partition}
            if isinstance(r, MetactlError):
                doc["error"] = r.code
            else:
                rs = committed[r.partition]
                doc.update(
                    leader=p.leader,
                    leader_epoch=r.leader_epoch,
                    high_watermark=r.high_watermark,
                    log_end_offset=r.log_end_offset,
                    ranges=[list(x) for x in rs],
                    digest=digest(rs),
                )
                if acked is not None:
                    doc["missing_acked"] = missing.get(r.partition, 0)
            parts.append(doc)
        print(json.dumps({"topic": args.topic, "partitions": parts}))
    else:
        for p, r in results:
            head = f"Topic: {p.topic}\tPartition: {p.partition}\t"
            if isinstance(r, MetactlError):
                print(f"{head}Error: {r.code}: {r.message}")
                continue
            rs = committed[r.partition]
            extra = f"\tMissingAcked: {missing.get(r.partition, 0)}" if acked is not None else ""
            print(
                f"{head}Leader: {p.leader}\tLeaderEpoch: {r.leader_epoch}\t"
                f"HighWatermark: {r.high_watermark}\tRanges: {len(rs)}\t"
                f"Digest: {digest(rs)}{extra}"
            )
    return EXIT_INCOMPLETE if failed or any(missing.values()) else EXIT_OK
