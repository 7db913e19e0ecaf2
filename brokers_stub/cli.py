"""The broker's command-line arguments, shared by `metactl broker run` and
`python -m brokers_stub`, and the function both call to run the process.

Owns argument names, their defaults and the mapping to `BrokerConfig`; the process
itself lives in `broker.py`. The security and connection-limit flags are the shared ones
of `protocol.flags`: mutual TLS as `broker-<id>` unless `--insecure`, with certificates
from `--tls-dir`, `$METACTL_TLS_DIR` or `<data-dir>/certs`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from pathlib import Path

import structlog

from brokers_stub.config import BrokerConfig
from metactl.errors import MetactlError
from metactl.logs import configure
from metactl.numbers import int_arg, long_arg
from metactl.settings import layered, resolve_settings
from protocol.address import parse_address
from protocol.flags import add_limit_arguments, add_tls_arguments, server_limits, tls_identity
from protocol.tls import broker_principal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", dest="broker_id", type=int_arg, required=True, help="broker id")
    parser.add_argument(
        "--controller",
        "--bootstrap-controller",
        dest="controller",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the controller, or every controller of an HA quorum (Kafka's "
        "controller.quorum.bootstrap.servers): requests go to the active one, following "
        "NOT_CONTROLLER hints and failing over when one is unreachable",
    )
    parser.add_argument(
        "--data-dir", type=Path, required=True, help="directory for replicas and state files"
    )
    parser.add_argument(
        "--cluster-id",
        default=None,
        help="refuse a data directory of another cluster (its meta.properties); a directory "
        "not yet told its cluster records this id (default: accept the directory's)",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to answer GetReplicaLogInfo, ReplicaFetch, Produce and ReadLog "
        "(default: 127.0.0.1:0)",
    )
    parser.add_argument(
        "--kafka-listen",
        default=None,
        metavar="HOST:PORT",
        help="also answer Kafka clients here (Kafka's wire protocol: ApiVersions, Metadata, "
        "DescribeTopicPartitions; docs/kafka.md), with the same TLS as --listen "
        "(default: no Kafka listener)",
    )
    parser.add_argument("--rack", default=None, help="rack of this broker")
    parser.add_argument(
        "--heartbeat-interval-ms",
        type=long_arg,
        default=2000,
        help="how often to heartbeat the controller (default 2000)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=long_arg,
        default=9000,
        help="the controller's session timeout: how long a shutdown waits for it (default 9000)",
    )
    parser.add_argument(
        "--lose-unflushed",
        action="store_true",
        help="at start, drop every replica's data above its last flushed offset "
        "(simulates losing the page cache in an unclean shutdown)",
    )
    parser.add_argument(
        "--flush-interval-ms",
        type=long_arg,
        default=1000,
        help="fsync changed replicas this often (Kafka's flush.ms; default 1000)",
    )
    parser.add_argument(
        "--flush-messages",
        type=int_arg,
        default=None,
        metavar="N",
        help="also fsync a replica as soon as N records are unflushed (Kafka's "
        "flush.messages; default off). Acknowledgements never wait for a flush",
    )
    parser.add_argument(
        "--max-batch-records",
        type=int_arg,
        default=10_000,
        help="largest Produce batch accepted, in records (default 10000)",
    )
    parser.add_argument(
        "--replica-lag-time-max-ms",
        type=long_arg,
        default=3000,
        help="a follower this far behind leaves the ISR (Kafka's replica.lag.time.max.ms; "
        "default 3000)",
    )
    parser.add_argument(
        "--fetch-interval-ms",
        type=long_arg,
        default=100,
        help="a follower's pause after a refused fetch, or one that brought nothing new "
        "without being long-polled; the fetch round of partitions beyond 32 per leader "
        "(default 100)",
    )
    parser.add_argument(
        "--metrics", default=None, metavar="HOST:PORT", help="serve Prometheus metrics here"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least level logged (default info)",
    )
    add_tls_arguments(parser)
    add_limit_arguments(parser)
    layered(parser)  # --config FILE and METACTL_* variables (docs/configuration.md)


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    """The broker's configuration; InvalidConfigurationError for bad security or limit
    flags (its TLS files are loaded here, so a bad one fails before anything starts),
    ValueError for the rest."""
    config = BrokerConfig(
        broker_id=args.broker_id,
        controller=args.controller,
        data_dir=args.data_dir,
        listen=args.listen,
        kafka_listen=_kafka_listen(args.kafka_listen),
        rack=args.rack,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        session_timeout_ms=args.session_timeout_ms,
        lose_unflushed=args.lose_unflushed,
        flush_interval_ms=args.flush_interval_ms,
        flush_messages=args.flush_messages,
        max_batch_records=args.max_batch_records,
        replica_lag_time_max_ms=args.replica_lag_time_max_ms,
        fetch_interval_ms=args.fetch_interval_ms,
        metrics=args.metrics,
        limits=server_limits(args),
    )
    tls = tls_identity(
        args, broker_principal(config.broker_id), fallbacks=[config.data_dir / "certs"]
    )
    config = dataclasses.replace(config, tls=tls)
    _ = config.server_ssl, config.client_ssl  # load the TLS files now
    return config


def _kafka_listen(value: str | None) -> str | None:
    """--kafka-listen checked as a HOST:PORT (InvalidRequestError, a MetactlError, if not)."""
    if value is None:
        return None
    host, port = parse_address(value)
    return f"{host}:{port}"


def run(args: argparse.Namespace) -> int:
    """Run the broker until it stops; return its exit status."""
    if not resolve_settings(args):
        return 2
    configure(json=True, level=getattr(logging, str(args.log_level).upper()))
    try:
        config = config_from_args(args)
    except (ValueError, MetactlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Storage identity (docs/operations.md): before anything reads the directory.
    from brokers_stub.identity_check import check_broker_storage

    try:
        cluster_id = getattr(args, "cluster_id", None)
        identity = check_broker_storage(
            config.data_dir, broker_id=config.broker_id, cluster_id=cluster_id
        )
    except (MetactlError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if config.tls is None:
        structlog.get_logger("metactl.broker").warning(
            "TLS is off (--insecure): anyone may act as the controller or as another broker",
            broker=config.broker_id,
        )
    from brokers_stub.broker import Broker

    config = dataclasses.replace(config, cluster_id=identity.cluster_id)
    return asyncio.run(Broker(config).run())
