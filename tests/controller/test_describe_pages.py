"""DescribeCluster paging (controller/runtime/describe.py) over real images: every item
exactly once and in order, every frame within its limit, one topic read without touching
the others, v1 answered whole or refused, and a cursor anywhere (even between items).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import immutables
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.admin import next_request
from controller.runtime.describe import PAGE_ITEMS, describe_page, iter_partitions
from metactl.errors import FrameTooLargeError, InvalidRequestError, UnknownTopicOrPartitionError
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.codec import encode_frame
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse, DescribeCursor

BIG_CID = 2**63  # a correlation id that takes msgpack's widest integer


def image_with(topics: dict[str, int], brokers: int = 3, rf: int = 3) -> ClusterImage:
    records: list[MetadataRecord] = []
    for b in range(1, brokers + 1):
        records.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=b))
        records.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=b))
    for name, n in topics.items():
        records.append(TopicRecord(name=name, topic_id=f"id-{name}", partitions=n, min_isr=1))
        for i in range(n):
            replicas = [(i + j) % brokers + 1 for j in range(min(rf, brokers))]
            records.append(
                PartitionRecord(
                    topic=name, partition=i, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
    return replay(ClusterImage(), records)


def page(
    image: ClusterImage, request: DescribeClusterRequest, max_bytes: int
) -> DescribeClusterResponse:
    r = describe_page(image, request, max_bytes=max_bytes, end_offset=7, committed_offset=7)
    assert len(encode_frame(BIG_CID, r)) - 4 <= max_bytes  # the payload fits the limit
    return r


def walk(
    image: ClusterImage, request: DescribeClusterRequest, max_bytes: int
) -> Iterator[DescribeClusterResponse]:
    for _ in range(len(image.partitions) + len(image.brokers) + 1):  # a walk must end
        r = page(image, request, max_bytes)
        yield r
        if r.next_cursor is None and r.next_broker_cursor is None:
            return
        assert r.partitions or r.brokers  # progress on every page
        request = next_request(request, r)
    raise AssertionError("the pages never ended")


def every(image: ClusterImage, topic: str | None = None) -> list[tuple[str, int]]:
    return sorted(tp for tp in image.partitions if topic is None or tp[0] == topic)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    limit=st.integers(1, 50) | st.none(),
    # The least that holds the envelope, one partition and its topic's summary.
    max_bytes=st.integers(700, 20_000),
    brokers=st.integers(1, 12),
)
def test_pages_hold_every_partition_and_broker_once_in_order_within_the_limit(
    counts: list[int], limit: int | None, max_bytes: int, brokers: int
) -> None:
    image = image_with({f"t{i}-{n}": n for i, n in enumerate(counts)}, brokers=brokers)
    request = DescribeClusterRequest(v=2, partition_limit=limit, broker_limit=limit)
    got = list(walk(image, request, max_bytes))
    assert [(p.topic, p.partition) for r in got for p in r.partitions] == every(image)
    assert [b.broker_id for r in got for b in r.brokers] == sorted(image.brokers.keys())
    if limit is not None:
        assert all(len(r.partitions) <= limit and len(r.brokers) <= limit for r in got)
    assert all(r.v == 2 and r.committed_offset == 7 for r in got)


def test_a_page_is_cut_by_bytes_with_the_cursor_at_the_first_partition_left() -> None:
    image = image_with({"a": 300})
    r = page(image, DescribeClusterRequest(v=2, broker_limit=0), 8_000)
    assert 0 < len(r.partitions) < 300 and r.brokers == []
    assert r.next_cursor == DescribeCursor(topic="a", partition=len(r.partitions))
    assert r.next_broker_cursor is None  # brokers were not asked for


def test_the_page_size_is_capped_by_the_controller() -> None:
    image = image_with({"a": PAGE_ITEMS + 5}, rf=1)
    r = page(image, DescribeClusterRequest(v=2, partition_limit=10**6), 8 * 1024 * 1024)
    assert len(r.partitions) == PAGE_ITEMS
    assert r.next_cursor == DescribeCursor(topic="a", partition=PAGE_ITEMS)


def test_a_cursor_between_items_starts_at_the_next_one() -> None:
    image = image_with({"a": 3, "c": 2})
    # A topic that does not exist (between a and c) and a partition past a's end.
    for cursor in (DescribeCursor(topic="b", partition=0), DescribeCursor(topic="a", partition=9)):
        r = page(image, DescribeClusterRequest(v=2, cursor=cursor), 100_000)
        assert [(p.topic, p.partition) for p in r.partitions] == [("c", 0), ("c", 1)]
    r = page(image, DescribeClusterRequest(v=2, broker_cursor=2, partition_limit=0), 100_000)
    assert [b.broker_id for b in r.brokers] == [2, 3] and r.partitions == []


def test_one_topic_pages_through_its_own_partitions_only() -> None:
    image = image_with({"a": 5, "b": 7, "c": 5})
    request = DescribeClusterRequest(v=2, topic="b", partition_limit=3, broker_limit=0)
    got = list(walk(image, request, 100_000))
    assert [len(r.partitions) for r in got] == [3, 3, 1]
    assert [(p.topic, p.partition) for r in got for p in r.partitions] == every(image, "b")
    with pytest.raises(InvalidRequestError):  # a cursor into another topic
        page(
            image,
            msgspec.structs.replace(request, cursor=DescribeCursor(topic="a", partition=0)),
            100_000,
        )


class Counting:
    """A read-only view of an image map that counts lookups and full walks."""

    def __init__(self, inner: immutables.Map[Any, Any]) -> None:
        self.inner = inner
        self.gets = 0
        self.walks = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.gets += 1
        return self.inner.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.gets += 1
        return self.inner[key]

    def __contains__(self, key: Any) -> bool:
        self.gets += 1
        return key in self.inner

    def __iter__(self) -> Iterator[Any]:
        self.walks += 1
        return iter(self.inner)

    def keys(self) -> Any:
        self.walks += 1
        return self.inner.keys()

    def values(self) -> Any:
        self.walks += 1
        return self.inner.values()

    def items(self) -> Any:
        self.walks += 1
        return self.inner.items()

    def __len__(self) -> int:
        return len(self.inner)


def test_describing_one_topic_never_walks_the_other_partitions() -> None:
    image = image_with({"a": 2000, "b": 4, "c": 2000}, rf=1)
    counting = Counting(image.partitions)
    spy = msgspec.structs.replace(image, partitions=counting)  # a read-only stand-in
    r = page(spy, DescribeClusterRequest(v=2, topic="b"), 100_000)
    assert [p.partition for p in r.partitions] == [0, 1, 2, 3]
    # Its 4 partitions, and partition 0 again for the summary's replication factor.
    assert counting.walks == 0 and counting.gets == 5
    counting.gets = 0
    assert [p.partition for p in iter_partitions(spy, "b", ("b", 2))] == [2, 3]
    assert counting.walks == 0 and counting.gets == 2


def test_v1_answers_everything_or_refuses_with_message_too_large() -> None:
    image = image_with({"a": 40, "b": 2})
    r = page(image, DescribeClusterRequest(), 1_000_000)
    assert r.v == 1 and len(r.partitions) == 42 and len(r.brokers) == 3
    assert r.next_cursor is None and r.next_broker_cursor is None
    assert page(image, DescribeClusterRequest(topic="nope"), 1_000_000).partitions == []
    with pytest.raises(FrameTooLargeError) as e:
        describe_page(
            image, DescribeClusterRequest(), max_bytes=2_000, end_offset=0, committed_offset=0
        )
    assert "DescribeCluster v2 pages it" in e.value.message and "42 partitions" in e.value.message


def test_v2_unknown_topic_and_an_item_too_large_are_named_errors() -> None:
    image = image_with({"a": 1})
    with pytest.raises(UnknownTopicOrPartitionError):
        describe_page(
            image,
            DescribeClusterRequest(v=2, topic="nope"),
            max_bytes=10**6,
            end_offset=0,
            committed_offset=0,
        )
    with pytest.raises(FrameTooLargeError):
        describe_page(
            image, DescribeClusterRequest(v=2), max_bytes=200, end_offset=0, committed_offset=0
        )


def test_an_empty_cluster_is_one_empty_page() -> None:
    r = page(ClusterImage(), DescribeClusterRequest(v=2), 10_000)
    assert r.partitions == [] and r.brokers == [] and r.next_cursor is None


@pytest.mark.parametrize(
    "bad",
    [
        {"partition_limit": -1},
        {"broker_limit": -1},
        {"max_bytes": 0},
        {"cursor": DescribeCursor(topic="a", partition=-1)},
    ],
)
def test_negative_limits_and_cursors_are_invalid_requests(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as e:
        page(image_with({"a": 1}), DescribeClusterRequest(v=2, **bad), 10_000)
    assert next(iter(bad)).split(".")[0] in e.value.message
