"""What `metactl cluster up` is asked to run (`UpSettings`), checked before anything
starts: how many controllers, brokers and etcd members, and every port they get. The
controllers' native listeners from ``--listen`` on, their /metrics from ``--metrics`` on
and the brokers' /metrics after them; broker N's Kafka listener on
``--kafka-base-port`` + N - 1 and controller N's on that + `CONTROLLER_KAFKA_OFFSET` + N -
1 (docs/cli.md, "cluster up: its ports"). `UpSettings.check` refuses, INVALID_CONFIG
naming both, two processes on one fixed port.

Pure: it starts, binds and writes nothing (the supervisor, `localcluster.supervisor`,
does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from metactl.errors import InvalidConfigurationError
from protocol.address import parse_address

__all__ = ["CONTROLLER_KAFKA_OFFSET", "DEFAULT_KAFKA_BASE_PORT", "UpSettings", "port_plus"]

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
        self._check_ports()

    def _check_ports(self) -> None:
        """INVALID_CONFIG, naming both, if two processes would be given the same fixed
        port (by number: port 0, any free port, never collides), or a port past 65535."""
        wanted: list[tuple[str, str]] = []
        kafka_controllers: list[tuple[str, str]] = []  # checked after the brokers'
        for i in range(self.controllers):
            who = "the controller" if self.controllers == 1 else f"controller {i + 1}"
            wanted += [
                (port_plus(self.listen, i), f"{who}'s --listen"),
                (port_plus(self.metrics, i), f"{who}'s /metrics (--metrics)"),
            ]
            kafka = self.controller_kafka_listen(i)
            if kafka is not None:
                offset = f"--kafka-base-port + {CONTROLLER_KAFKA_OFFSET}"
                kafka_controllers.append((kafka, f"{who}'s Kafka listener ({offset})"))
        for b in range(1, self.brokers + 1):
            wanted.append((port_plus(self.metrics, self.controllers + b - 1),
                           f"broker {b}'s /metrics (--metrics)"))  # fmt: skip
            kafka = self.kafka_listen(b)
            if kafka is not None:
                wanted.append((kafka, f"broker {b}'s Kafka listener (--kafka-base-port)"))
        taken: dict[int, str] = {}
        for address, who in wanted + kafka_controllers:
            port = int(address.rpartition(":")[2])
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


def port_plus(address: str, n: int) -> str:
    """The n-th next port (port 0, any free port, stays 0 for every process)."""
    host, port = parse_address(address)
    return f"{host}:{port + n if port else 0}"
