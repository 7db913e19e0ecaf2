"""Operator commands: describe, brokers, topics create, elect, and `cluster up`.

Reading commands work against a running controller (`--controller HOST:PORT`) or offline
on a data directory (`--data-dir D`); changes always go through the controller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import msgspec

from controller.runtime.describe import describe_image
from metactl.errors import MetactlError
from metadata_image.image import parse_tp
from metadata_log.records import NO_LEADER
from ops.client import call, offline_image
from protocol.messages import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
    PartitionState,
)

DEFAULT_CONTROLLER = "127.0.0.1:9093"


def register(sub: Any) -> None:
    d = sub.add_parser("describe", help="partitions, like kafka-topics --describe")
    _source_args(d)
    d.add_argument("--topic", default=None)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_describe)

    b = sub.add_parser("brokers", help="registered brokers and their state")
    _source_args(b)
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_brokers)

    t = sub.add_parser("topics", help="topic administration")
    tsub = t.add_subparsers(dest="topics_command", metavar="SUBCOMMAND")
    c = tsub.add_parser("create", help="create a topic")
    c.add_argument("--controller", default=DEFAULT_CONTROLLER)
    c.add_argument("--topic", "--name", dest="name", required=True)
    c.add_argument("--partitions", type=int, default=None)
    c.add_argument("--replication-factor", type=int, default=None)
    c.add_argument("--replica-assignment", default=None, help="e.g. 1:2:3,2:3:1")
    c.add_argument("--min-isr", type=int, default=None)
    c.add_argument("--unclean-recovery-strategy", default=None)
    c.set_defaults(func=cmd_topics_create)

    e = sub.add_parser("elect", help="elect a leader (preferred, or unclean with --replica)")
    e.add_argument("--controller", default=DEFAULT_CONTROLLER)
    e.add_argument("--partition", required=True, help="TOPIC-N")
    e.add_argument("--type", choices=["preferred", "unclean"], required=True)
    e.add_argument("--replica", type=int, default=None)
    e.set_defaults(func=cmd_elect)

    up = sub.add_parser("cluster", help="local clusters")
    usub = up.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    u = usub.add_parser("up", help="start a controller and N brokers until Ctrl-C")
    u.add_argument("--brokers", type=int, default=3)
    u.add_argument("--data-dir", type=Path, default=Path("./data"))
    u.add_argument("--listen", default=DEFAULT_CONTROLLER)
    u.add_argument("--metrics", default="127.0.0.1:9400")
    u.add_argument("--topic", default="demo")
    u.add_argument("--partitions", type=int, default=6)
    u.add_argument("--min-isr", type=int, default=2)
    u.add_argument("--unclean-recovery-strategy", default="balanced")
    u.add_argument("--exit-after-ready", action="store_true", help=argparse.SUPPRESS)
    u.set_defaults(func=cmd_cluster_up)


def _source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--controller", default=None, help=f"HOST:PORT (default {DEFAULT_CONTROLLER})")
    g.add_argument("--data-dir", type=Path, default=None, help="read a data directory offline")


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def _ids(xs: list[int]) -> str:
    return ",".join(map(str, xs))


def _describe(args: argparse.Namespace) -> DescribeClusterResponse:
    if args.data_dir is not None:
        return asyncio.run(_offline_describe(args.data_dir, getattr(args, "topic", None)))
    r = asyncio.run(
        call(
            args.controller or DEFAULT_CONTROLLER,
            DescribeClusterRequest(topic=getattr(args, "topic", None)),
        )
    )
    assert isinstance(r, DescribeClusterResponse)
    return r


async def _offline_describe(data_dir: Path, topic: str | None) -> DescribeClusterResponse:
    image, end = await offline_image(data_dir)
    return describe_image(image, topic=topic, end_offset=end, committed_offset=end)


def _full(obj: msgspec.Struct) -> dict[str, Any]:
    """Every field, defaults included (the wire form omits them), without tag or version."""
    return {f: msgspec.to_builtins(getattr(obj, f)) for f in obj.__struct_fields__ if f != "v"}


def recovery_state(p: PartitionState) -> str:
    if p.recovery_pending is not None:
        return f"recovery_pending(awaiting {_ids(p.recovery_pending) or 'operator'})"
    if p.recovering:
        return "recovering"
    return "offline" if p.leader == NO_LEADER else "ok"


def cmd_describe(args: argparse.Namespace) -> int:
    try:
        r = _describe(args)
    except (MetactlError, OSError, TimeoutError) as exc:
        return _fail(exc)
    if args.json:
        print(
            json.dumps(
                {"partitions": [_full(p) for p in r.partitions], "end_offset": r.committed_offset}
            )
        )
        return 0
    for p in r.partitions:
        leader = "none" if p.leader == NO_LEADER else str(p.leader)
        print(
            f"Topic: {p.topic}\tPartition: {p.partition}\tLeader: {leader}\t"
            f"LeaderEpoch: {p.leader_epoch}\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\t"
            f"Elr: {_ids(p.elr)}\tLastKnownElr: {_ids(p.last_known_elr)}\t"
            f"MinIsr: {p.min_isr}\tRecovery: {recovery_state(p)}"
        )
    return 0


def cmd_brokers(args: argparse.Namespace) -> int:
    try:
        r = _describe(args)
    except (MetactlError, OSError, TimeoutError) as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps({"brokers": [_full(b) for b in r.brokers]}))
        return 0
    head = ("ID", "EPOCH", "FENCED", "SHUTDOWN", "HEARTBEAT", "LAST REG")
    print("{:>4} {:>8} {:>7} {:>9} {:>10} {:>9}  ENDPOINT".format(*head))
    for b in r.brokers:
        age = "-" if b.last_heartbeat_age_ms is None else f"{b.last_heartbeat_age_ms / 1000:.1f}s"
        clean = "clean" if b.last_registration_clean else "UNCLEAN"
        print(
            f"{b.broker_id:>4} {b.epoch:>8} {b.fenced!s:>7} {b.controlled_shutdown!s:>9} "
            f"{age:>10} {clean:>9}  {b.endpoint}"
        )
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    assignments = None
    if args.replica_assignment:
        assignments = [
            [int(x) for x in part.split(":")] for part in args.replica_assignment.split(",")
        ]
    spec = CreateTopic(
        name=args.name,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        assignments=assignments,
        min_isr=args.min_isr,
        recovery_strategy=args.unclean_recovery_strategy,
    )
    try:
        r = asyncio.run(call(args.controller, CreateTopicsRequest(topics=[spec])))
    except (MetactlError, OSError, TimeoutError) as exc:
        return _fail(exc)
    assert isinstance(r, CreateTopicsResponse)
    res = r.results[0]
    if res.error_code:
        print(f"error: {res.error_code}: {res.message}", file=sys.stderr)
        return 1
    print(f"Created topic {res.name} ({res.topic_id}) with assignments {res.assignments}")
    return 0


def cmd_elect(args: argparse.Namespace) -> int:
    try:
        topic, part = parse_tp(args.partition)
        r = asyncio.run(
            call(
                args.controller,
                ElectLeader(
                    topic=topic, partition=part, election_type=args.type, replica=args.replica
                ),
            )
        )
    except (MetactlError, OSError, TimeoutError, ValueError) as exc:
        return _fail(exc)
    assert isinstance(r, PartitionState)
    note = (
        " — potential data loss: reported as an unclean recovery" if args.type == "unclean" else ""
    )
    print(f"{args.partition}: leader {r.leader} (leader epoch {r.leader_epoch}){note}")
    return 0


# --- cluster up -------------------------------------------------------------------------


def _start(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen[str], IO[str]]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("a")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
    )
    return proc, log_file


def _await_ready(proc: subprocess.Popen[str], what: str, timeout_s: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} exited before it was ready (status {proc.wait()})")
        if line.startswith("READY"):
            return line.strip()
    raise RuntimeError(f"{what} was not ready within {timeout_s:.0f} s")


def cmd_cluster_up(args: argparse.Namespace) -> int:
    data: Path = args.data_dir.resolve()
    py = sys.executable
    procs: list[tuple[str, subprocess.Popen[str], IO[str]]] = []
    try:
        ctl, f = _start(
            [py, "-m", "controller", "--data-dir", str(data / "controller"),
             "--listen", args.listen, "--metrics", args.metrics,
             "--unclean-recovery-strategy", args.unclean_recovery_strategy],
            data / "logs" / "controller.log",
        )  # fmt: skip
        procs.append(("controller", ctl, f))
        ready = _await_ready(ctl, "controller")
        address = ready.split("listen=")[1].split()[0]
        metrics = ready.split("metrics=")[1].split()[0] if "metrics=" in ready else args.metrics
        for i in range(1, args.brokers + 1):
            b, f = _start(
                [py, "-m", "brokers_stub", "--id", str(i), "--controller", address,
                 "--data-dir", str(data / f"broker-{i}")],
                data / "logs" / f"broker-{i}.log",
            )  # fmt: skip
            procs.append((f"broker {i}", b, f))
        for name, p, _ in procs[1:]:
            _await_ready(p, name)
        asyncio.run(_await_active(address, args.brokers))
        spec = CreateTopic(
            name=args.topic,
            partitions=args.partitions,
            replication_factor=min(3, args.brokers),
            min_isr=args.min_isr,
        )
        r = asyncio.run(call(address, CreateTopicsRequest(topics=[spec])))
        assert isinstance(r, CreateTopicsResponse)
        res = r.results[0]
        created = "created" if not res.error_code else f"kept ({res.error_code})"
        me = "metactl"
        print(
            f"metactl cluster up: controller {address}, {args.brokers} brokers, "
            f"topic {args.topic} {created}\n"
            f"  data:     {data}  (logs in {data / 'logs'})\n"
            f"  metrics:  http://{metrics}/metrics\n"
            f"  try:      {me} describe --controller {address}\n"
            f"            {me} brokers --controller {address}\n"
            f"            {me} log tail --data-dir {data / 'controller'}\n"
            f"            kill -9 <a broker pid> and watch describe: fence, ELR, recovery\n"
            f"  pids:     " + ", ".join(f"{n}={p.pid}" for n, p, _ in procs) + "\n"
            "Ctrl-C stops everything cleanly.",
            flush=True,
        )
        if args.exit_after_ready:
            return 0
        stop = {"now": False}

        def _stop(signum: int, frame: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        while not stop["now"]:
            signal.pause()
        return 0
    except (MetactlError, OSError, RuntimeError) as exc:
        return _fail(exc)
    finally:
        _shutdown(procs)


async def _await_active(address: str, brokers: int, timeout_s: float = 60) -> None:
    """Brokers unfence once they have caught up with the log; wait for all of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await call(address, DescribeClusterRequest())
        assert isinstance(r, DescribeClusterResponse)
        if sum(1 for b in r.brokers if not b.fenced and not b.controlled_shutdown) >= brokers:
            return
        await asyncio.sleep(0.1)  # polling an observable state
    raise RuntimeError(f"brokers did not all become active within {timeout_s:.0f} s")


def _shutdown(procs: list[tuple[str, subprocess.Popen[str], IO[str]]]) -> None:
    """Brokers first (controlled shutdown needs the controller), then the controller."""
    brokers = [p for p in procs if p[0] != "controller"]
    controller = [p for p in procs if p[0] == "controller"]
    for group in (brokers, controller):
        for _, p, _ in group:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for name, p, f in group:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop within 30 s; killing it", file=sys.stderr)
                p.kill()
                p.wait()
            f.close()
