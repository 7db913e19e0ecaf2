"""ListPartitionReassignments v2 pages (issue 30, item 6): every partition being
reassigned exactly once, in (topic, partition) order, each page within its byte limit,
whether the controller sorts the few or walks the topics a bounded stretch per page; v1
answers whole or refuses by name."""

from __future__ import annotations

import msgspec
import pytest

from controller.runtime import admin_views
from controller.runtime.admin_views import list_reassignments
from metactl.errors import FrameTooLargeError, InvalidRequestError
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.admin import DescribeCursor, ListPartitionReassignmentsRequest


def image() -> ClusterImage:
    records: list[MetadataRecord] = []
    for b in (1, 2, 3):
        records += [
            RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}", broker_epoch=b),
            UnfenceBrokerRecord(broker_id=b, broker_epoch=b),
        ]
    for name in ("a", "b", "c"):
        records.append(TopicRecord(name=name, topic_id=name, partitions=40))
        records += [
            PartitionRecord(topic=name, partition=i, replicas=[1, 2] if i % 3 else [1],
                            isr=[1], leader=1, adding_replicas=[2] if i % 3 else [])
            for i in range(40)
        ]  # fmt: skip
    return replay(ClusterImage(), records)


def walk(img: ClusterImage, req: ListPartitionReassignmentsRequest) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    while True:
        page = list_reassignments(img, req, max_bytes=1 << 20)
        assert req.max_bytes is None or len(msgspec.msgpack.encode(page)) + 16 <= req.max_bytes
        out += [(o.topic, o.partition) for o in page.reassignments]
        if page.next_cursor is None:
            return out
        assert req.cursor is None or (page.next_cursor.topic, page.next_cursor.partition) > (
            req.cursor.topic,
            req.cursor.partition,
        )
        req = msgspec.structs.replace(req, cursor=page.next_cursor)


@pytest.mark.parametrize(("sort_below", "scan"), [(4000, 50_000), (0, 50_000), (0, 7)])
def test_pages_hold_every_partition_once_in_order(
    monkeypatch: pytest.MonkeyPatch, sort_below: int, scan: int
) -> None:
    monkeypatch.setattr(admin_views, "_SORT_BELOW", sort_below)
    monkeypatch.setattr(admin_views, "LIST_SCAN", scan)
    img = image()
    want = sorted(img.reassigning)
    assert len(want) == 78
    assert walk(img, ListPartitionReassignmentsRequest(v=2, max_bytes=600)) == want
    assert walk(img, ListPartitionReassignmentsRequest(v=2, limit=5)) == want
    only = ListPartitionReassignmentsRequest(v=2, topics=["c", "nosuch", "a"], limit=9)
    assert walk(img, only) == [tp for tp in want if tp[0] in ("a", "c")]
    start = ListPartitionReassignmentsRequest(v=2, cursor=DescribeCursor(topic="b", partition=7))
    assert walk(img, start) == [tp for tp in want if tp >= ("b", 7)]


def test_v1_answers_whole_or_refuses_by_name() -> None:
    img = image()
    whole = list_reassignments(img, ListPartitionReassignmentsRequest(), max_bytes=1 << 20)
    assert len(whole.reassignments) == 78 and whole.next_cursor is None
    with pytest.raises(FrameTooLargeError):
        list_reassignments(img, ListPartitionReassignmentsRequest(), max_bytes=1000)


@pytest.mark.parametrize(
    "req",
    [
        ListPartitionReassignmentsRequest(v=2, limit=0),
        ListPartitionReassignmentsRequest(v=2, max_bytes=0),
        ListPartitionReassignmentsRequest(v=2, cursor=DescribeCursor(topic="a", partition=-1)),
    ],
)
def test_bad_paging_fields_are_invalid_requests(req: ListPartitionReassignmentsRequest) -> None:
    with pytest.raises(InvalidRequestError):
        list_reassignments(image(), req, max_bytes=1 << 20)
