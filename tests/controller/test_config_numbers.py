"""`min.insync.replicas` is read as Kafka reads an INT config (issue 30, item 8): an
optional sign and the digits 0-9, trimmed as Java's `String.trim`, within Java's int.
Python's `int()` takes `1_0` as 10, and `１０` and ` 10\\u3000` too; each is INVALID_CONFIG
here, through the one step, for a topic and for the cluster default, and the record
written for a value taken is its canonical decimal."""

from __future__ import annotations

import pytest

from metactl.errors import MetactlError
from metadata_log.records import MIN_ISR_CONFIG, ConfigRecord
from protocol.messages.admin import AlterConfigs
from tests.controller.testkit import Cluster


def with_elr() -> Cluster:
    """t-0 on [1, 2, 3], MinISR 2, with 3 fenced."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    c.fence(3)
    return c


def refused(c: Cluster, request: AlterConfigs) -> str:
    before = c.image
    with pytest.raises(MetactlError) as info:
        c.submit(request)
    assert c.image is before  # a refusal changes nothing
    return info.value.code


REFUSED = [
    "1_0",  # Python's int() takes it as 10
    "0x10",
    "0o7",
    "1e1",
    "1.0",
    "３",  # fullwidth 3: Python's int() takes it (and Java's parseInt; metactl does not)
    "٣",  # Arabic-Indic 3
    " 1 0",
    "+",
    "-",
    "",
    "  ",
    "+-3",
    "2147483648",  # Java's int ends at 2147483647
    "99999999999999999999",
    "three",
]


@pytest.mark.parametrize("kind", ["topic", "broker"])
@pytest.mark.parametrize("text", REFUSED)
def test_a_value_kafka_does_not_parse_is_invalid_config(kind: str, text: str) -> None:
    c = with_elr()
    request = AlterConfigs(
        resource_type=kind,
        resource_name="t" if kind == "topic" else "",
        set_configs={MIN_ISR_CONFIG: text},
    )
    assert refused(c, request) == "INVALID_CONFIG"


@pytest.mark.parametrize("text", ["\u00a03", "3\u3000"])
def test_a_blank_java_does_not_trim_is_refused(text: str) -> None:
    """A no-break or an ideographic space: Python's int() takes them, Java's trim does not
    remove them. The request's own check refuses unprintable text first (INVALID_REQUEST);
    `metactl.numbers` would refuse them too (tests/ops/test_numbers.py)."""
    c = with_elr()
    request = AlterConfigs(
        resource_type="topic", resource_name="t", set_configs={MIN_ISR_CONFIG: text}
    )
    assert refused(c, request) in ("INVALID_REQUEST", "INVALID_CONFIG")


@pytest.mark.parametrize("text", ["3", "+3", "03", "+003", " 3", "3 ", "  3  "])
def test_a_value_kafka_parses_is_taken_and_written_canonically(text: str) -> None:
    c = with_elr()
    result = c.submit(
        AlterConfigs(resource_type="topic", resource_name="t", set_configs={MIN_ISR_CONFIG: text})
    )
    assert c.image.topics["t"].min_isr == 3
    configs = [r for r in result.records if isinstance(r, ConfigRecord)]
    assert [r.value for r in configs] == ["3"]
