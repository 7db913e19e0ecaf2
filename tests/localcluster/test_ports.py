"""`cluster up`'s Kafka ports (`localcluster.settings.UpSettings`): broker N on the
base + N - 1, controller N on the base + 100 + N - 1, on --listen's host; port 0 gives
each a free one; --no-kafka (None) none; two on one port is INVALID_CONFIG."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster.settings import CONTROLLER_KAFKA_OFFSET, DEFAULT_KAFKA_BASE_PORT, UpSettings
from metactl.errors import InvalidConfigurationError


def test_the_default_kafka_ports() -> None:
    s = UpSettings(Path("d"), brokers=3, controllers=3, etcd=3, listen="10.0.0.1:9093")
    assert [s.kafka_listen(b) for b in (1, 2, 3)] == [
        f"10.0.0.1:{DEFAULT_KAFKA_BASE_PORT + n}" for n in range(3)
    ]
    assert [s.controller_kafka_listen(i) for i in range(3)] == [
        "10.0.0.1:19192",
        "10.0.0.1:19193",
        "10.0.0.1:19194",
    ]
    assert CONTROLLER_KAFKA_OFFSET == 100
    s.check()  # nothing collides with the native, /metrics or broker ports


def test_port_0_and_no_kafka() -> None:
    free = UpSettings(Path("d"), kafka_base_port=0)
    assert (free.kafka_listen(2), free.controller_kafka_listen(0)) == ("127.0.0.1:0",) * 2
    free.check()  # port 0 never collides
    none = UpSettings(Path("d"), kafka_base_port=None)
    assert (none.kafka_listen(1), none.controller_kafka_listen(0)) == (None, None)


def test_a_controller_kafka_port_on_another_process_is_named() -> None:
    s = UpSettings(Path("d"), controllers=2, etcd=1, listen="127.0.0.1:19193")
    named = (
        r"port 19193 would be both controller 1's --listen and controller 2's Kafka "
        r"listener \(--kafka-base-port \+ 100\)"
    )
    with pytest.raises(InvalidConfigurationError, match=named):
        s.check()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {"brokers": 101},
            "port 19192 would be both broker 101's Kafka listener (--kafka-base-port) and "
            "the controller's Kafka listener (--kafka-base-port + 100): move one of them",
        ),
        (
            {"kafka_base_port": 65500},
            "the controller's Kafka listener (--kafka-base-port + 100) would be port 65600, "
            "past 65535",
        ),
    ],
)
def test_the_controllers_kafka_ports_are_checked(settings: dict[str, int], named: str) -> None:
    with pytest.raises(InvalidConfigurationError) as caught:
        UpSettings(Path("d"), **settings).check()  # type: ignore[arg-type]
    assert named in caught.value.message
