"""A new active controller's record (issue 33, item 4): the one step writes it from the
controller's own `ControllerActivated` event, replay keeps no controller in the image
(only the delta hears of it), a snapshot is the same with or without it, and a refused
activation (no term, no node) changes nothing."""

from __future__ import annotations

import msgspec
import pytest

from controller.core.controller_change import ControllerActivated
from controller.core.step import ControllerState, Rules, step
from metactl.errors import InvalidRequestError
from metadata_image.delta import MetadataDelta
from metadata_image.replay import apply, replay
from metadata_image.snapshot import image_from_records, image_to_records, to_snapshot
from metadata_image.transactions import LogReplay, replay_log
from metadata_log.records import (
    ControllerChangeRecord,
    NoOpRecord,
    decode_batch,
    decode_record,
    encode_batch,
    encode_record,
    record_type,
    to_builtins,
)
from protocol.messages.internal import Ack
from tests.controller.testkit import POLICIES, Cluster

RULES = Rules(Cluster().config, POLICIES)

TAKEOVER = ControllerActivated(
    node="c3",
    term=1234,
    address="127.0.0.1:9095",
    previous_node="c2",
    previous_term=1200,
    previous_reason="dead-active detection",
    previous_by="c1",
)


def _cluster_with_a_topic() -> Cluster:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2)
    return c


def test_the_step_writes_one_record_of_the_new_term_and_changes_no_state() -> None:
    c = _cluster_with_a_topic()
    before = c.image
    result = step(ControllerState(before), TAKEOVER, 0, RULES)
    assert result.records == [
        ControllerChangeRecord(
            node="c3",
            term=1234,
            address="127.0.0.1:9095",
            previous_node="c2",
            previous_term=1200,
            previous_reason="dead-active detection",
            previous_by="c1",
        )
    ]
    assert result.response == Ack()
    after = result.state.image
    assert after.end_offset == before.end_offset + 1
    # Nothing of the metadata moved: the same brokers, topics and partitions.
    assert msgspec.structs.replace(after, end_offset=before.end_offset) == before
    assert result.delta.controller_changes == result.records
    assert result.delta.records_by_type == {"ControllerChange": 1}
    assert not result.delta.partitions and not result.delta.brokers


def test_the_first_term_says_nothing_of_a_previous_one() -> None:
    result = step(
        ControllerState(Cluster().image), ControllerActivated(node="c1", term=17), 0, RULES
    )
    (record,) = result.records
    assert isinstance(record, ControllerChangeRecord)
    assert (record.node, record.term, record.previous_node, record.previous_reason) == (
        "c1",
        17,
        "",
        "",
    )
    # Defaults are omitted on the wire: the first term's record is small.
    assert b"previous" not in encode_record(record)


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (ControllerActivated(node="c1", term=0), "positive token"),
        (ControllerActivated(node="c1", term=-5), "positive token"),
        (ControllerActivated(node="", term=9), "names its node"),
    ],
)
def test_an_activation_without_a_term_or_a_node_is_refused(
    event: ControllerActivated, words: str
) -> None:
    state = ControllerState(_cluster_with_a_topic().image)
    with pytest.raises(InvalidRequestError, match=words):
        step(state, event, 0, RULES)


def test_the_record_round_trips_and_reads_as_json() -> None:
    record = ControllerChangeRecord(
        node="c2", term=99, previous_node="c1", previous_reason="resigned", previous_detail="x"
    )
    assert decode_record(encode_record(record)) == record
    assert decode_batch(encode_batch([record, NoOpRecord()])) == [record, NoOpRecord()]
    assert record_type(record) == "ControllerChange"
    row = to_builtins(record)
    assert row["type"] == "ControllerChange" and row["previous_detail"] == "x"
    assert row["previous_by"] == "" and row["v"] == 1


def test_replay_keeps_no_controller_and_a_snapshot_is_unchanged_by_it() -> None:
    c = _cluster_with_a_topic()
    before = c.image
    records = [
        ControllerChangeRecord(node="c1", term=10),
        ControllerChangeRecord(node="c2", term=20, previous_node="c1", previous_reason="resigned"),
    ]
    after = replay(before, records)
    assert after.end_offset == before.end_offset + 2
    same = msgspec.structs.replace(before, end_offset=after.end_offset)
    assert to_snapshot(after) == to_snapshot(same)
    again = image_from_records(image_to_records(after), after.end_offset)
    assert again == after
    assert not any(isinstance(r, ControllerChangeRecord) for r in image_to_records(after))
    # A committed log's reader replays it like any record.
    state = replay_log(LogReplay(before), records)
    assert state.image == after and state.transaction is None


def test_the_delta_collects_the_terms_in_log_order_across_updates() -> None:
    image = _cluster_with_a_topic().image
    first = ControllerChangeRecord(node="c1", term=10)
    second = ControllerChangeRecord(node="c2", term=20)
    image, delta = apply(image, [first])
    _, more = apply(image, [NoOpRecord(), second])
    merged = MetadataDelta().update(delta).update(more)
    assert merged.controller_changes == [first, second]
    assert merged.records_by_type == {"ControllerChange": 2, "NoOp": 1}
