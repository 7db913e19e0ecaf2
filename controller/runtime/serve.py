"""Process entry for the controller service: arguments, JSON logs, signals.

`python -m controller` and `metactl controller serve` both land here. SIGTERM or SIGINT
stops the service cleanly: in-flight commits finish and the log is closed. Mutual TLS is
on unless `--insecure` (certificates from `--tls-dir`, `$METACTL_TLS_DIR` or
`<data-dir>/certs`; the shared flags of `protocol.flags`), for the listener, the calls to
brokers and `/metrics`.

Before the log is opened, the data directory's identity (``meta.properties``) is checked
against it (`metadata_log.identity_check`): another cluster's directory, or a log that is
missing or empty although the identity says it was created, fails the start with a named
error and exit 1; a directory without identity is formatted (no log in it) or adopted (a
log from an earlier version). docs/operations.md, Storage identity.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from controller.core.config import ControllerConfig
from controller.core.work import WORK_BUDGET
from controller.runtime.ha_settings import HaSettings
from controller.runtime.quota import (
    DEFAULT_BURST_WINDOW_S,
    DEFAULT_MAX_PARTITIONS_PER_REQUEST,
    DEFAULT_MUTATION_RATE,
    MutationLimits,
)
from metactl.errors import InvalidConfigurationError, MetactlError
from metactl.logs import configure
from metactl.numbers import int_arg, int_flag, long_arg
from metactl.settings import layered, resolve_settings
from metadata_log.etcd import DEFAULT_LEASE_TTL_S
from metadata_log.etcd.tls import add_etcd_tls_arguments, etcd_tls_from
from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.flags import add_limit_arguments, add_tls_arguments, server_limits, tls_identity
from protocol.tls import CONTROLLER


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="the controller's directory: its SQLite log (unless --metadata-log says "
        "otherwise) and its certificates (DIR/certs)",
    )
    add_ha_arguments(p)
    p.add_argument(
        "--verify-log",
        choices=["tail", "full"],
        default="tail",
        help="before serving, check the CRCs of the log's last 64 batches (tail; replay "
        "checks what it reads) or of every batch and snapshot, logging progress (full) "
        "(default tail)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:9093",
        help="HOST:PORT to serve brokers and clients on; port 0 picks a free one "
        "(default 127.0.0.1:9093)",
    )
    p.add_argument(
        "--kafka-listen",
        metavar="HOST:PORT",
        default=None,
        help="also speak Kafka's wire protocol there, for admin clients that bootstrap "
        "from the controllers (KIP-919: the admin APIs, DescribeCluster, DescribeQuorum; "
        "docs/kafka.md); port 0 picks a free one (default: not served)",
    )
    p.add_argument(
        "--metrics",
        default=None,
        help="HOST:PORT to serve /metrics on (default: not served)",
    )
    p.add_argument(
        "--heartbeat-interval-ms",
        type=long_arg,
        default=2000,
        help="how often brokers are told to heartbeat (default 2000)",
    )
    p.add_argument(
        "--session-timeout-ms",
        type=long_arg,
        default=9000,
        help="a broker silent this long is fenced (default 9000)",
    )
    p.add_argument(
        "--unclean-recovery-strategy",
        default="balanced",
        help="unclean recovery for leaderless partitions without an eligible replica: "
        "balanced, proactive or manual, or a registered policy (default balanced)",
    )
    p.add_argument(
        "--unclean-recovery-window-ms",
        type=long_arg,
        default=1000,
        help="how long balanced recovery waits for more replicas' log information (default 1000)",
    )
    p.add_argument(
        "--default-min-isr",
        type=int_arg,
        default=1,
        help="seeds the cluster-default min.insync.replicas of a new cluster (default 1); "
        "afterwards `metactl configs --entity-default` changes it (docs/lifecycle.md)",
    )
    add_rule_mode_arguments(p)
    add_leader_balance_arguments(p)
    p.add_argument(
        "--max-frame-bytes",
        type=int_arg,
        default=DEFAULT_MAX_FRAME_BYTES,
        help=f"the largest request or answer frame (default {DEFAULT_MAX_FRAME_BYTES})",
    )
    add_mutation_arguments(p)
    p.add_argument(
        "--work-budget",
        type=positive_int,
        default=WORK_BUDGET,
        metavar="PARTITIONS",
        help="partitions one controller event may change, create or evaluate; larger work "
        "(a big broker's fence, a big topic) continues in slices inside one metadata "
        "transaction, with heartbeats answered between them (docs/design.md, The work "
        f"budget) (default {WORK_BUDGET:,})",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default INFO)",
    )
    add_tls_arguments(p)
    add_limit_arguments(p)
    layered(p)


def add_ha_arguments(p: argparse.ArgumentParser) -> None:
    """Where the metadata log is, and how this controller takes part in an etcd log's
    election (docs/ha.md)."""
    p.add_argument(
        "--metadata-log",
        metavar="URL",
        default=None,
        help="the metadata log: a SQLite path or sqlite:///path (one controller), or "
        "etcd://HOST:PORT[,HOST:PORT...]/PREFIX (controllers take turns: one active, the "
        "others hot standbys) (default: the SQLite log in --data-dir)",
    )
    p.add_argument(
        "--cluster-id",
        default=None,
        help="refuse a data directory (its meta.properties) or a log that belongs to "
        "another cluster; a new directory and a new log take this id (default: accept the "
        "directory's or the log's id; a new cluster gets a random one)",
    )
    p.add_argument(
        "--lease-ttl-s",
        type=int_arg,
        default=DEFAULT_LEASE_TTL_S,
        help="etcd logs: the leadership's TTL in whole seconds: the active controller "
        "rewrites the leadership key six times per TTL and steps down before its last "
        "heartbeat is a TTL old; a standby ends a term silent for this long "
        f"(default {DEFAULT_LEASE_TTL_S})",
    )
    p.add_argument(
        "--advertised-listener",
        metavar="HOST:PORT",
        default=None,
        help="etcd logs: the address standbys send clients to while this controller is "
        "active (default: the address --listen bound)",
    )
    p.add_argument(
        "--node-id",
        default=None,
        help="etcd logs: this controller's name in the leadership key and its logs "
        "(default: the advertised address)",
    )
    p.add_argument(
        "--dead-active-detection",
        choices=["enabled", "disabled"],
        default="enabled",
        help="etcd logs: a standby holds a connection to the active controller's "
        "advertised listener and, when that port refuses connections twice 0.1 s apart "
        "(the process died; its host is up), ends its term and takes over at once "
        "instead of after the TTL; a frozen or unreachable controller still costs "
        "the TTL (default enabled)",
    )
    add_etcd_tls_arguments(p)


def ha_settings(args: Any) -> HaSettings:
    ttl = getattr(args, "lease_ttl_s", DEFAULT_LEASE_TTL_S)
    if ttl < 1:
        raise InvalidConfigurationError(f"--lease-ttl-s must be at least 1, got {ttl}")
    return HaSettings(
        lease_ttl_s=ttl,
        advertised_listener=getattr(args, "advertised_listener", None),
        node_id=getattr(args, "node_id", None),
        cluster_id=getattr(args, "cluster_id", None),
        etcd_tls=etcd_tls_from(args),
        dead_active_detection=getattr(args, "dead_active_detection", "enabled") == "enabled",
    )


# An argparse type: a whole number of at least 1, read as Kafka reads an int
# (`metactl.numbers`); a bad one is a usage error.
positive_int = int_flag(minimum=1)


def add_mutation_arguments(p: argparse.ArgumentParser) -> None:
    """KIP-599's controller mutation quota and the partitions-per-request cap
    (controller/runtime/quota.py says why the defaults are what they are)."""
    p.add_argument(
        "--controller-mutation-rate",
        type=int_arg,
        default=DEFAULT_MUTATION_RATE,
        metavar="PARTITIONS_PER_S",
        help="partitions each principal (or, without TLS, each client host) may create or "
        "elect per second; over it, THROTTLING_QUOTA_EXCEEDED with a retry-after "
        f"(default {DEFAULT_MUTATION_RATE}; 0: no quota)",
    )
    p.add_argument(
        "--controller-mutation-burst-window-s",
        type=int_arg,
        default=DEFAULT_BURST_WINDOW_S,
        metavar="SECONDS",
        help="the quota's bucket holds rate x this many partitions "
        f"(default {DEFAULT_BURST_WINDOW_S})",
    )
    p.add_argument(
        "--max-partitions-per-request",
        type=int_arg,
        default=DEFAULT_MAX_PARTITIONS_PER_REQUEST,
        metavar="N",
        help="a CreateTopics creating more partitions in all is refused with "
        f"POLICY_VIOLATION (default {DEFAULT_MAX_PARTITIONS_PER_REQUEST:,})",
    )


def mutation_limits(args: Any) -> MutationLimits:
    """What `add_mutation_arguments` sets; InvalidConfigurationError if out of range."""
    return MutationLimits(
        rate=getattr(args, "controller_mutation_rate", DEFAULT_MUTATION_RATE),
        burst_window_s=getattr(args, "controller_mutation_burst_window_s", DEFAULT_BURST_WINDOW_S),
        max_partitions_per_request=getattr(
            args, "max_partitions_per_request", DEFAULT_MAX_PARTITIONS_PER_REQUEST
        ),
    )


def add_rule_mode_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose KIP-966 or the classic rules; shared by `controller serve`,
    `chaos run` and `simulate faults` (read them back with `rule_mode`)."""
    p.add_argument(
        "--eligible-leader-replicas",
        choices=["enabled", "disabled"],
        default="enabled",
        help="KIP-966 (enabled) or Kafka's classic ISR rules, for comparison (disabled) "
        "(default enabled); on a controller, seeds the eligible.leader.replicas.version "
        "level of a new cluster, which `metactl features` changes afterwards",
    )
    p.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="classic rules only: elect any live replica when no ISR member is live "
        "(a potential data-loss event)",
    )


def rule_mode(args: Any) -> dict[str, bool]:
    """The `ControllerConfig` fields `add_rule_mode_arguments` sets."""
    return {
        "eligible_leader_replicas": args.eligible_leader_replicas == "enabled",
        "unclean_leader_election": args.unclean_leader_election,
    }


def add_leader_balance_arguments(p: argparse.ArgumentParser) -> None:
    """Kafka's automatic preferred-leader balance, by Kafka's names and defaults
    (controller/core/leader_balance.py; docs/lifecycle.md, Automatic leader balance)."""
    p.add_argument(
        "--auto-leader-rebalance-enable",
        choices=["true", "false"],
        default="true",
        help="move leadership back to each partition's preferred replica (the first) "
        "without an operator's `elect`, as Kafka's auto.leader.rebalance.enable "
        "(default true)",
    )
    p.add_argument(
        "--leader-imbalance-check-interval-seconds",
        type=positive_int,
        default=300,
        metavar="SECONDS",
        help="a balance check runs this long after a partition is seen led by another "
        "replica than its preferred one, and again after a check that leaves one so "
        "(default 300)",
    )
    p.add_argument(
        "--leader-imbalance-per-broker-percentage",
        type=int_flag(minimum=0, maximum=100),
        default=10,
        metavar="PERCENT",
        help="a check moves leadership back to a broker only when the share of the "
        "partitions it is preferred for that it does not lead is above this (default 10)",
    )


def leader_balance(args: Any) -> dict[str, Any]:
    """The `ControllerConfig` fields `add_leader_balance_arguments` sets."""
    return {
        "auto_leader_rebalance_enable": args.auto_leader_rebalance_enable == "true",
        "leader_imbalance_check_interval_seconds": args.leader_imbalance_check_interval_seconds,
        "leader_imbalance_per_broker_percentage": args.leader_imbalance_per_broker_percentage,
    }


def config_from(args: Any) -> ControllerConfig:
    return ControllerConfig(
        unclean_recovery_strategy=args.unclean_recovery_strategy,
        unclean_recovery_window_ms=args.unclean_recovery_window_ms,
        broker_session_timeout_ms=args.session_timeout_ms,
        broker_heartbeat_interval_ms=args.heartbeat_interval_ms,
        default_min_insync_replicas=args.default_min_isr,
        **rule_mode(args),
        **leader_balance(args),
    )


async def serve(args: Any) -> int:
    # The service and the process set-up load here, not to build the parser (`metactl
    # controller --help`, `simulate` and `chaos` take this module's arguments).
    from controller.runtime.process import freeze_heap
    from controller.runtime.service import ControllerService

    try:
        config = config_from(args)
        service = ControllerService(
            args.data_dir,
            args.listen,
            config=config,
            max_frame_bytes=args.max_frame_bytes,
            metrics=getattr(args, "metrics", None),
            tls=tls_identity(args, CONTROLLER, fallbacks=[args.data_dir / "certs"]),
            limits=server_limits(args),
            mutation_limits=mutation_limits(args),
            verify_log=getattr(args, "verify_log", "tail"),
            metadata_log=getattr(args, "metadata_log", None),
            ha=ha_settings(args),
            work_budget=getattr(args, "work_budget", WORK_BUDGET),
            kafka_listen=getattr(args, "kafka_listen", None),
        )
    except MetactlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()  # on failure it closes what it opened, so the process exits
    except (MetactlError, OSError) as exc:  # e.g. CORRUPT_MESSAGE (file, offset); port in use
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    freeze_heap()  # the loaded image is long-lived
    metrics = service.metrics_address
    print(
        f"READY controller listen={service.address} role={service.role}"
        + (f" metrics={metrics}" if metrics else "")
        + (f" kafka={service.kafka_address}" if service.kafka_address else ""),
        flush=True,
    )
    stopped = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(service.failed.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    failed.cancel()
    await service.stop()
    if service.storage_failure is not None:
        print(f"error: {service.storage_failure}", file=sys.stderr, flush=True)
        return 1
    return 0


def run(args: Any) -> int:
    if not resolve_settings(args):  # --config file and METACTL_* variables under the flags
        return 2
    from controller.runtime.process import configure_process

    configure(json=True, level=getattr(logging, str(args.log_level).upper(), logging.INFO))
    configure_process()
    return asyncio.run(serve(args))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controller", description="metactl controller")
    add_arguments(p)
    return run(p.parse_args(argv))
