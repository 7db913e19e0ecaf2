"""`metactl cluster up`: its arguments, its banner and its event feed (topics create and
elect are in ops/admin_cmds.py; describe and brokers in ops/describe_cmds.py; the
supervisor that starts and watches the processes in localcluster/supervisor.py).

`cluster up` makes the cluster's certificates in DATA_DIR/certs
(`localcluster.certs.init_certs`, kept across runs) and runs every process with mutual
TLS; `--insecure` runs everything in plaintext. Every broker also answers Kafka clients
(docs/kafka.md) on `--kafka-base-port` and up, and the banner prints a `kcat -L` line;
every controller answers Kafka admin clients (KIP-919) 100 ports above (19192 and up).
With `--etcd M --controllers N` the controllers share a metadata log on a local etcd
cluster (one active, the others hot standbys). It prints how to point the CLI at the
cluster, then the cluster's events (`metactl events --follow`'s lines), until Ctrl-C.

This module parses, calls `localcluster.supervisor.run_cluster` and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localcluster.settings import (
    CONTROLLER_KAFKA_OFFSET,
    DEFAULT_ETCD_BASE_PORT,
    DEFAULT_KAFKA_BASE_PORT,
    UpSettings,
)
from metactl.errors import MetactlError
from metactl.numbers import int_arg, int_flag
from ops.cli import EXIT_INTERRUPTED, EXIT_OK, HELP_FORMAT, examples
from ops.client import DEFAULT_CONTROLLER
from protocol.flags import ENV_TLS_DIR
from protocol.tls import ADMIN, CA_CERT, VIEWER, cert_path, key_path

if TYPE_CHECKING:  # the supervisor and the feed load when `cluster up` runs, not to parse
    from eventfeed.feed import Event
    from localcluster.etcd import LocalEtcd
    from localcluster.supervisor import ClusterUp


def register(sub: Any) -> None:
    up = sub.add_parser(
        "cluster",
        help="local clusters",
        description="Run a local cluster for trying metactl out.",
        epilog=examples("metactl cluster up", "metactl cluster up --controllers 3 --etcd 3"),
        formatter_class=HELP_FORMAT,
    )
    usub = up.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    u = usub.add_parser(
        "up",
        help="start a controller (or an HA quorum on etcd) and N brokers until Ctrl-C",
        description="Start the controller(s) and brokers as supervised child processes, "
        "create the demo topic, print how to use the cluster, then print its events as they "
        "commit. A child that dies is reported with the end of its log; Ctrl-C stops "
        "everything (brokers first). Logs are in DATA_DIR/logs.",
        epilog=examples(
            "metactl cluster up",
            "metactl cluster up --brokers 5 --data-dir /tmp/c --insecure",
            "metactl cluster up --controllers 3 --etcd 3",
        ),
        formatter_class=HELP_FORMAT,
    )
    u.add_argument("--brokers", type=int_arg, default=3, help="broker processes (default 3)")
    u.add_argument(
        "--controllers",
        type=int_arg,
        default=1,
        help="controller processes; more than one needs --etcd (default 1)",
    )
    u.add_argument(
        "--etcd",
        type=int_arg,
        default=0,
        metavar="MEMBERS",
        help="run the metadata log on a local etcd cluster of this many members, from "
        "Debian's etcd-server (default 0: the SQLite log in DATA_DIR/controller)",
    )
    u.add_argument(
        "--data-dir",
        type=Path,
        default=Path("./data"),
        help="where logs, certificates and every process's data go (default ./data)",
    )
    u.add_argument(
        "--listen",
        default=DEFAULT_CONTROLLER,
        help=f"the (first) controller's address; the others take the next ports "
        f"(default {DEFAULT_CONTROLLER})",
    )
    u.add_argument(
        "--metrics",
        default="127.0.0.1:9400",
        help="the (first) controller's /metrics address; the others take the next ports "
        "(default 127.0.0.1:9400)",
    )
    kafka = u.add_mutually_exclusive_group()
    kafka.add_argument(
        "--kafka-base-port",
        type=int_flag(0, 65535, name="port"),
        default=DEFAULT_KAFKA_BASE_PORT,
        metavar="PORT",
        help="broker N answers Kafka clients (docs/kafka.md) on PORT + N - 1, and "
        f"controller N Kafka admin clients (KIP-919) on PORT + {CONTROLLER_KAFKA_OFFSET} + "
        "N - 1, on the host of --listen, with the cluster's TLS; 0: any free port for each "
        f"(default {DEFAULT_KAFKA_BASE_PORT}: the controller's 9093 rules out Kafka's 9092 "
        "and up)",
    )
    kafka.add_argument(
        "--no-kafka",
        action="store_true",
        help="no Kafka listeners on the brokers or the controllers (default: one each)",
    )
    u.add_argument(
        "--etcd-base-port",
        type=int_flag(0, 65535, name="port"),
        default=None,
        metavar="PORT",
        help="with --etcd, etcd member N's client port is PORT + 2(N - 1) and its peer port "
        f"the next, on 127.0.0.1 (default {DEFAULT_ETCD_BASE_PORT} and up: below the "
        "kernel's ephemeral range, where no outgoing connection can hold one; 0: free ones "
        "the kernel picks). Chosen on the first start and kept in DATA_DIR/etcd/ports.json: "
        "the members' data remembers them; another PORT there is refused",
    )
    u.add_argument("--topic", default="demo", help="the demo topic's name (default demo)")
    u.add_argument(
        "--partitions", type=int_arg, default=6, help="the demo topic's partitions (default 6)"
    )
    u.add_argument(
        "--min-isr",
        type=int_arg,
        default=2,
        help="the demo topic's min.insync.replicas (default 2)",
    )
    u.add_argument(
        "--unclean-recovery-strategy",
        default="balanced",
        help="the controllers' unclean-recovery strategy (default balanced)",
    )
    u.add_argument(
        "--insecure",
        action="store_true",
        help="run everything without TLS (default: mutual TLS, certificates made in "
        "DATA_DIR/certs)",
    )
    u.add_argument(
        "--no-events",
        action="store_true",
        help="do not print the cluster's events in the foreground (default: print them)",
    )
    u.add_argument("--exit-after-ready", action="store_true", help=argparse.SUPPRESS)
    u.set_defaults(func=_cluster_up)


def _cluster_up(args: argparse.Namespace) -> int:
    settings = UpSettings(
        data_dir=Path(args.data_dir).resolve(),
        brokers=args.brokers,
        controllers=args.controllers,
        etcd=args.etcd,
        listen=args.listen,
        metrics=args.metrics,
        topic=args.topic,
        partitions=args.partitions,
        min_isr=args.min_isr,
        strategy=args.unclean_recovery_strategy,
        insecure=args.insecure,
        kafka_base_port=None if args.no_kafka else args.kafka_base_port,
        etcd_base_port=args.etcd_base_port,
    )
    from localcluster.supervisor import ClusterUp, run_cluster

    up = ClusterUp(settings)

    def announce(topic: str) -> None:
        print(banner(up, topic), flush=True)

    async def feed() -> None:
        await follow_cluster_events(up)

    ran = run_cluster(
        up,
        announce=announce,
        feed=None if args.no_events else feed,
        exit_after_ready=args.exit_after_ready,
    )
    return EXIT_OK if ran else EXIT_INTERRUPTED


def banner(up: ClusterUp, topic: str) -> str:
    """What `cluster up` prints once its cluster is ready (`topic`: what became of the
    demo topic), ending with the line after which its events follow."""
    settings = up.settings
    pids = ", ".join(f"{c.name}={c.proc.pid}" for c in up.children)
    where = (
        f"controller {up.bootstrap}"
        if settings.controllers == 1
        else f"{settings.controllers} controllers {up.bootstrap} on a {settings.etcd}-member etcd"
    )
    formatted = f"; formatted {', '.join(up.formatted)}" if up.formatted else ""
    return (
        f"metactl cluster up: {where}, {settings.brokers} brokers, "
        f"topic {settings.topic} {topic}\n"
        f"  storage:  cluster.id {up.cluster_id}{formatted}  (metactl storage info "
        f"--data-dir {up.controller_dir(0)}{up.etcd_flags_text})\n"
        + how_to(
            settings.data_dir,
            up.bootstrap,
            up.metrics[0],
            up.certs,
            up.etcd,
            broker_metrics=up.broker_metrics,
            prometheus=up.prometheus_config(),
            kafka=up.broker_kafka,
            controller_kafka=up.controller_kafka,
        )
        + f"  pids:     {pids}\nCtrl-C stops everything cleanly. Events follow:"
    )


async def follow_cluster_events(up: ClusterUp) -> None:
    """`metactl events --follow` in the foreground: from now on, one line per event;
    controllers that restart or fail over are followed (any of them serves it)."""
    from eventfeed.feed import Feed
    from eventfeed.follow import follow_events

    feed = Feed(since_ms=int(time.time() * 1000))

    def emit(events: list[Event]) -> None:
        for e in events:
            print(f"   {e.line()}", flush=True)

    while True:
        try:
            async with up.security.controller_client(up.bootstrap) as client:
                await follow_events(client, feed, emit, follow=True, timeout_s=10)
        except MetactlError:
            await asyncio.sleep(1.0)  # a controller is restarting: follow it again


def how_to(
    data: Path,
    address: str,
    metrics: str,
    certs: Path | None,
    etcd: LocalEtcd | None = None,
    *,
    broker_metrics: dict[int, str] | None = None,
    prometheus: Path | None = None,
    kafka: dict[int, str] | None = None,
    controller_kafka: dict[int, str] | None = None,
) -> str:
    """What `cluster up` prints after its first line: where things are, what to run. The
    commands name the `metactl` of this environment by its full path (`metactl_path`)."""
    from localcluster.supervisor import metactl_path

    me = metactl_path()
    log = etcd.url("metactl") if etcd is not None else str(data / "controller")
    scheme = "http" if certs is None else "https"
    brokers = ", ".join(
        f"{b}: {scheme}://{where}/metrics" for b, where in sorted((broker_metrics or {}).items())
    )
    lines = [f"  data:     {data}  (logs in {data / 'logs'})"]
    if etcd is not None:
        lines.append(f"  log:      {log}  ({len(etcd.members)}-member etcd in {data / 'etcd'})")
        etcd_tls = etcd.client_tls(ADMIN)
        if etcd_tls is not None:  # the offline tools reach etcd with the admin's certificate
            log += " " + " ".join(etcd_tls.flags())
            lines.append(f"            etcd: mutual TLS, its own CA in {etcd.tls_dir}")
    if certs is None:
        sec = "--insecure"
        lines += [
            "  security: none (--insecure): anyone may act as any broker or as an admin",
            f"  metrics:  http://{metrics}/metrics",
        ]
        if brokers:
            lines.append(f"            brokers {brokers}")
    else:
        sec = f"--tls-dir {certs}"
        ca, cert, key = certs / CA_CERT, cert_path(certs, VIEWER), key_path(certs, VIEWER)
        lines += [
            f"  security: mutual TLS; certificates in {certs} (the CLI acts as admin;",
            "            --principal viewer reads only). Instead of --tls-dir on every",
            f"            command: export {ENV_TLS_DIR}={certs}",
            f"  metrics:  https://{metrics}/metrics  (a client certificate of the CA)",
            *([f"            brokers {brokers}"] if brokers else []),
            f"            curl --cacert {ca} --cert {cert} --key {key} https://{metrics}/metrics",
        ]
    if prometheus is not None:
        missing = "" if shutil.which("prometheus") else "; not installed: `make system`"
        lines.append(
            f"            prometheus --config.file={prometheus}  (scrapes all of them; "
            f"dashboard and alerts: grafana/README.md{missing})"
        )
    if kafka:
        lines += kafka_lines(kafka, certs, controller_kafka)
    target = f"--bootstrap-controller {address} {sec}"
    lines += [
        f"  try:      {me} describe {target}",
        f"            {me} brokers {target}" + (" --principal viewer" if certs is not None else ""),
        f"            {me} events --follow {target}",
        f"            {me} log tail --data-dir {log}",
        "            kill -9 <a broker pid> and watch the events: fence, ELR, recovery",
        f"            {me} broker start --id <N> --data-dir {data}   (brings broker N back)",
        f"            {me} controller start --node-id c<N> --data-dir {data}"
        "   (brings controller N back)",
    ]
    return "\n".join(lines) + "\n"


def kafka_lines(
    kafka: dict[int, str], certs: Path | None, controllers: dict[int, str] | None = None
) -> list[str]:
    """The brokers' Kafka addresses, a `kcat -L` to paste (every broker as bootstrap: it
    works with any of them down, with the admin's certificate over TLS), then the
    controllers' Kafka addresses, if any (KIP-919: admin clients only; docs/kafka.md)."""
    where = ", ".join(f"{b}: {address}" for b, address in sorted(kafka.items()))
    kcat = ["kcat", "-L", "-b", ",".join(address for _, address in sorted(kafka.items()))]
    if certs is not None:
        for option, value in (
            ("security.protocol", "SSL"),
            ("ssl.ca.location", certs / CA_CERT),
            ("ssl.certificate.location", cert_path(certs, ADMIN)),
            ("ssl.key.location", key_path(certs, ADMIN)),
            ("ssl.endpoint.identification.algorithm", "none"),
        ):
            kcat += ["-X", f"{option}={value}"]
    missing = "" if shutil.which("kcat") else "  (kcat not installed: `make system`)"
    lines = [
        f"  kafka:    brokers {where}  (produce, consume, admin: docs/kafka.md)",
        f"            {shlex.join(kcat)}{missing}",
    ]
    if controllers:
        at = (
            f"controller {next(iter(controllers.values()))}"
            if len(controllers) == 1
            else "controllers "
            + ", ".join(f"{n}: {address}" for n, address in sorted(controllers.items()))
        )
        lines.append(
            f"            {at}  (KIP-919, bootstrap.controllers of admin clients: "
            "ApiVersions, admin APIs, DescribeQuorum)"
        )
    return lines
