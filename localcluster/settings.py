"""What `metactl cluster up` is asked to run (`UpSettings`), checked before anything
starts: how many controllers, brokers and etcd members, and every port they get. The
controllers' native listeners from ``--listen`` on, their /metrics from ``--metrics`` on
and the brokers' /metrics after them; broker N's Kafka listener on
``--kafka-base-port`` + N - 1 and controller N's on that + `CONTROLLER_KAFKA_OFFSET` + N -
1; etcd member N's client port on ``--etcd-base-port`` + 2(N - 1) and its peer port the
next (`DEFAULT_ETCD_BASE_PORT` on a first start without the flag; the ports an etcd
directory keeps after that, `localcluster.etcd`). Every default is below the kernel's
ephemeral range, which no outgoing connection's port can then be in (docs/cli.md,
"cluster up: its ports"). `UpSettings.check` refuses, INVALID_CONFIG naming both, two
processes on one fixed port; `UpSettings.listeners` names the flag that moves each.

Pure: it starts, binds and writes nothing (the supervisor, `localcluster.supervisor`,
does; `localcluster.ports` looks at what holds a port).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metactl.errors import InvalidConfigurationError
from protocol.address import parse_address

__all__ = [
    "CONTROLLER_KAFKA_OFFSET",
    "DEFAULT_ETCD_BASE_PORT",
    "DEFAULT_KAFKA_BASE_PORT",
    "PlannedPort",
    "UpSettings",
    "port_plus",
]

# Broker N's Kafka listener is on this port + N - 1. Not Kafka's 9092 and up: the
# controller's default address is 127.0.0.1:9093 (Kafka's controller port, and the
# CLI's default), which broker 2 would take, and with --controllers 3 the controllers
# hold 9093-9095. 19092 and up (Redpanda's external Kafka port) clear the controllers'
# 9093 block and the /metrics 9400 block, and a Kafka of one's own on 9092.
DEFAULT_KAFKA_BASE_PORT: Final = 19092
# Controller N's Kafka listener (KIP-919) on the base port + this + N - 1: 19192 and up
# by default, clear of the brokers' block (up to 100 brokers) and of everything above;
# one flag moves every Kafka listener, and port 0 gives each a free one.
CONTROLLER_KAFKA_OFFSET: Final = 100
# Etcd member N's client port on this + 2(N - 1), its peer port the next: 12379-12384 for
# three members (etcd's own 2379/2380, moved up by 10000). Below the kernel's ephemeral
# range (32768-60999 by default), so no outgoing connection of any process is ever given
# one of them (issue 33: kept ports the kernel had chosen, held by other processes'
# connections, failed restarts); clear of the 9093 and 9400 blocks, the Kafka block
# (19092-19291) and the tests' ports (20000-32000, tests/e2e/cluster.py).
DEFAULT_ETCD_BASE_PORT: Final = 12379
ETCD_HOST: Final = "127.0.0.1"  # etcd members listen on loopback only


@dataclass(frozen=True)
class UpSettings:
    data_dir: Path
    brokers: int = 3
    controllers: int = 1
    etcd: int = 0
    listen: str = "127.0.0.1:9093"
    metrics: str = "127.0.0.1:9400"
    topic: str = "demo"
    partitions: int = 6
    min_isr: int = 2
    strategy: str = "balanced"
    insecure: bool = False
    # Broker N's Kafka listener on this port + N - 1, controller N's on this port +
    # CONTROLLER_KAFKA_OFFSET + N - 1 (0: any free port for each; None: no Kafka
    # listeners), on the host of `listen`.
    kafka_base_port: int | None = DEFAULT_KAFKA_BASE_PORT
    # --etcd-base-port: None (not given): `DEFAULT_ETCD_BASE_PORT` on a first start, and
    # the kept ports of an etcd directory that has started before; 0: free ports chosen
    # by the kernel on a first start (in its ephemeral range), kept after; N: N and up,
    # which a directory that kept others refuses (INVALID_CONFIG naming the flag).
    etcd_base_port: int | None = None

    @property
    def etcd_pinned_base_port(self) -> int | None:
        """`LocalEtcd`'s `base_port`: the flag's port, which a directory must have."""
        return self.etcd_base_port or None

    @property
    def etcd_first_base_port(self) -> int | None:
        """`LocalEtcd`'s `default_base_port`: where a first start takes its ports
        without the flag (None: free ones, for --etcd-base-port 0)."""
        if self.etcd_base_port is None:
            return DEFAULT_ETCD_BASE_PORT
        return self.etcd_base_port or None

    def kafka_listen(self, broker_id: int) -> str | None:
        """Broker `broker_id`'s --kafka-listen (None without Kafka listeners)."""
        return self._kafka_port(broker_id - 1)

    def controller_kafka_listen(self, index: int) -> str | None:
        """The `index`-th controller's (from 0) --kafka-listen (None without Kafka
        listeners)."""
        return self._kafka_port(CONTROLLER_KAFKA_OFFSET + index)

    def _kafka_port(self, n: int) -> str | None:
        if self.kafka_base_port is None:
            return None
        host, _ = parse_address(self.listen)
        return port_plus(f"{host}:{self.kafka_base_port}", n)

    def check(self) -> None:
        if self.brokers < 1 or self.controllers < 1 or self.etcd < 0:
            raise InvalidConfigurationError(
                "--brokers and --controllers must be at least 1, --etcd at least 0"
            )
        if self.controllers > 1 and self.etcd == 0:
            raise InvalidConfigurationError(
                f"{self.controllers} controllers need a shared log: add --etcd 3 (or 1)"
            )
        parse_address(self.listen)
        parse_address(self.metrics)
        self._check_etcd_base_port()
        self._check_ports()

    def _check_etcd_base_port(self) -> None:
        base = self.etcd_base_port
        if base is None:
            return
        if not self.etcd:
            raise InvalidConfigurationError(
                f"--etcd-base-port {base} without --etcd: there are no etcd members to "
                "give ports to (add --etcd 3, or drop the flag)"
            )
        if 0 < base < 1024:
            raise InvalidConfigurationError(
                f"--etcd-base-port {base}: etcd's ports must be 1024 or above (0: free "
                f"ones; default {DEFAULT_ETCD_BASE_PORT})"
            )

    def planned(self) -> list[PlannedPort]:
        """Every process's port as the flags give it, in the order a clash is told:
        controllers, brokers, the controllers' Kafka listeners, etcd members (a first
        start's: a directory that has started before keeps its own, `localcluster.etcd`)."""
        wanted: list[PlannedPort] = []
        kafka_controllers: list[PlannedPort] = []  # after the brokers'
        for i in range(self.controllers):
            who = "the controller" if self.controllers == 1 else f"controller {i + 1}"
            wanted += [
                PlannedPort(port_plus(self.listen, i), f"{who}'s --listen", "--listen"),
                PlannedPort(
                    port_plus(self.metrics, i), f"{who}'s /metrics (--metrics)", "--metrics"
                ),
            ]
            kafka = self.controller_kafka_listen(i)
            if kafka is not None:
                offset = f"--kafka-base-port + {CONTROLLER_KAFKA_OFFSET}"
                kafka_controllers.append(
                    PlannedPort(kafka, f"{who}'s Kafka listener ({offset})", "--kafka-base-port")
                )
        for b in range(1, self.brokers + 1):
            metrics = port_plus(self.metrics, self.controllers + b - 1)
            wanted.append(PlannedPort(metrics, f"broker {b}'s /metrics (--metrics)", "--metrics"))
            kafka = self.kafka_listen(b)
            if kafka is not None:
                who = f"broker {b}'s Kafka listener (--kafka-base-port)"
                wanted.append(PlannedPort(kafka, who, "--kafka-base-port"))
        return wanted + kafka_controllers + self._etcd_planned()

    def _etcd_planned(self) -> list[PlannedPort]:
        base = self.etcd_first_base_port
        if base is None:  # free ones: none collides
            return []
        return [
            PlannedPort(
                f"{ETCD_HOST}:{base + 2 * m + n}",
                f"etcd member {m + 1}'s {kind} port (--etcd-base-port)",
                "--etcd-base-port",
            )
            for m in range(self.etcd)
            for n, kind in ((0, "client"), (1, "peer"))
        ]

    def listeners(self) -> list[PlannedPort]:
        """The fixed ports the controllers and brokers listen on (not port 0, not
        etcd's: `LocalEtcd` checks the ones its directory keeps), each with its flag."""
        return [p for p in self.planned() if p.port and p.flag != "--etcd-base-port"]

    def _check_ports(self) -> None:
        """INVALID_CONFIG, naming both, if two processes would be given the same fixed
        port (by number: port 0, any free port, never collides), or a port past 65535."""
        taken: dict[int, str] = {}
        for planned in self.planned():
            port, who = planned.port, planned.who
            if port > 65535:
                raise InvalidConfigurationError(
                    f"{who} would be port {port}, past 65535: choose a lower port"
                )
            if port and port in taken:
                raise InvalidConfigurationError(
                    f"port {port} would be both {taken[port]} and {who}: move one of them "
                    "(port 0 takes any free port)"
                )
            taken.setdefault(port, who)


@dataclass(frozen=True)
class PlannedPort:
    """A port a process of `cluster up` is given, and the flag that moves it."""

    address: str  # HOST:PORT (port 0: any free port)
    who: str  # "controller 2's --listen", "etcd member 1's client port (--etcd-base-port)"
    flag: str  # --listen, --metrics, --kafka-base-port or --etcd-base-port

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


def port_plus(address: str, n: int) -> str:
    """The n-th next port (port 0, any free port, stays 0 for every process)."""
    host, port = parse_address(address)
    return f"{host}:{port + n if port else 0}"
