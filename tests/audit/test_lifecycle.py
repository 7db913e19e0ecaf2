"""`audit.lifecycle`: topic generations and the final clean shutdown, record by record.

No Spark and no log here: the rule's cases fed as the audit schema's rows. The same rule
over a real cluster's log is `tests/audit/test_real_log.py`.
"""

from __future__ import annotations

import random

import pyarrow as pa

from audit.lifecycle import LifecycleTracker, Stop
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

C = "c"


def _feed(*events: tuple[str, int, object]) -> LifecycleTracker:
    """(record type, broker, reason) rows at offsets 0, 1, 2, ... and times 1000 + 10*i."""
    t = LifecycleTracker()
    for i, (rt, broker, reason) in enumerate(events):
        t.broker(C, i, 1000 + 10 * i, rt, broker, reason)
    return t


UP = [("RegisterBroker", b, None) for b in (1, 2, 3)]
CS = "BrokerRegistrationChange", "controlled_shutdown"


def _cs(b: int) -> tuple[str, int, object]:
    return CS[0], b, CS[1]


def test_every_broker_shut_down_cleanly_is_a_stop_from_the_first() -> None:
    stops = _feed(*UP, _cs(2), _cs(1), _cs(3)).result().stops
    assert stops == {C: Stop(3, 1030)}


def test_a_broker_that_died_before_does_not_prevent_the_stop() -> None:
    # Broker 3 fenced (a crash) first, then 1 and 2 stop cleanly: a stop from 1's.
    life = _feed(*UP, ("FenceBroker", 3, "session_timeout"), _cs(1), _cs(2)).result()
    assert life.stops == {C: Stop(4, 1040)}


def test_a_broker_failing_during_the_stop_starts_it_again() -> None:
    # 1 shuts down (maintenance), then 2 crashes, then 3 stops: only 3's shutdown is the
    # cluster's stop; the crash's outages are outages.
    life = _feed(*UP, _cs(1), ("FenceBroker", 2, "session_timeout"), _cs(3)).result()
    assert life.stops == {C: Stop(5, 1050)}
    # A broker fenced while already shutting down (it outlived its bound) changes nothing.
    life = _feed(*UP, _cs(1), _cs(2), ("FenceBroker", 1, "session_timeout"), _cs(3)).result()
    assert life.stops == {C: Stop(3, 1030)}


def test_no_stop_while_a_broker_is_up_or_after_a_crash_of_all() -> None:
    assert _feed(*UP, _cs(1), _cs(2)).result().stops == {}  # 3 still up
    crash = [("FenceBroker", b, "session_timeout") for b in (1, 2, 3)]
    assert _feed(*UP, *crash).result().stops == {}  # nobody shut down cleanly
    fenced = [("BrokerRegistrationChange", b, "fenced") for b in (1, 2, 3)]
    assert _feed(*UP, *fenced).result().stops == {}
    # A rolling restart: 1 shuts down, registers again, unfences; no stop at the end.
    again = [_cs(1), ("RegisterBroker", 1, None), ("UnfenceBroker", 1, None)]
    assert _feed(*UP, *again).result().stops == {}
    # ... and a stop after it starts at the stop's first shutdown, not the restart's.
    assert _feed(*UP, *again, _cs(3), _cs(1), _cs(2)).result().stops == {C: Stop(6, 1060)}
    # An unregistered broker is not waited for.
    gone = ("UnregisterBroker", 3, None)
    assert _feed(*UP, gone, _cs(1), _cs(2)).result().stops == {C: Stop(4, 1040)}


def test_decoded_records_and_rows_give_the_same_lifecycle() -> None:
    records = [
        RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=0),
        UnfenceBrokerRecord(broker_id=1, broker_epoch=0),
        RegisterBrokerRecord(broker_id=2, incarnation_id="b", broker_epoch=2),
        BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=False),
        TopicRecord(name="t", topic_id="t1", partitions=1),
        TopicRecord(name="t", topic_id="t1", partitions=2),  # grown: the same topic
        RemoveTopicRecord(topic_id="t1", name="t"),
        TopicRecord(name="t", topic_id="t2", partitions=1),
        FenceBrokerRecord(broker_id=2, broker_epoch=2),
        RegisterBrokerRecord(broker_id=2, incarnation_id="c", broker_epoch=9),
        UnregisterBrokerRecord(broker_id=2, broker_epoch=9),
        BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=0, in_controlled_shutdown=True),
    ]
    by_record = LifecycleTracker()
    by_record.feed_batch(C, 0, 5000, records)
    reasons = {2: None, 3: "unfenced", 8: "session_timeout", 11: "controlled_shutdown"}
    names = {4: ("t", "t1"), 5: ("t", "t1"), 6: ("t", "t1"), 7: ("t", "t2")}
    types = [type(r).__name__.removesuffix("Record") for r in records]
    table = pa.table(
        {
            "cluster": [C] * len(records),
            "offset": list(range(len(records))),
            "timestamp": pa.array([5_000_000] * len(records)).cast(pa.timestamp("us", tz="UTC")),
            "record_type": types,
            "topic": [names.get(i, (None, None))[0] for i in range(len(records))],
            "topic_id": [names.get(i, (None, None))[1] for i in range(len(records))],
            "broker": [getattr(r, "broker_id", None) for r in records],
            "reason": [reasons.get(i) for i in range(len(records))],
        }
    )
    by_row = LifecycleTracker()
    by_row.feed_table(table)
    a, b = by_record.result(), by_row.result()
    assert a == b
    assert a.generations == {(C, "t"): ((4, "t1"), (7, "t2"))}
    assert a.removed == {(C, "t1"): (6, 5000)}
    assert a.stops == {C: Stop(11, 5000)}  # 2 unregistered, 1 shut down cleanly


def test_topic_ids_agree_with_one_lookup_at_a_time() -> None:
    t = LifecycleTracker()
    rng = random.Random(3)
    for i, (name, topic_id) in enumerate(
        [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("a", "a3"), ("b", "b2")]
    ):
        t.topic(C, i * 100, name, topic_id)
    life = t.result()
    rows = [
        (rng.choice([C, "other"]), rng.choice("abcd"), rng.randrange(-5, 700)) for _ in range(500)
    ]
    clusters, names, offsets = zip(*rows, strict=True)
    got = life.topic_ids(pa.array(clusters), pa.array(names), list(offsets)).to_pylist()
    assert got == [life.topic_id_at(c, n, o) for c, n, o in rows]
    assert life.topic_id_at(C, "a", 250) == "a2" and life.topic_id_at(C, "a", 50) == "a1"
    assert life.topic_id_at(C, "c", 299) == "" and life.topic_id_at("other", "a", 650) == ""
    assert set(got) >= {"a1", "a2", "a3", "b1", "b2", "c1", ""}
    assert life.shared(C, "a") and not life.shared(C, "c")
    assert life.partition_label(C, "a", "a2", 3) == "a-3 (topic id a2)"
    assert life.partition_label(C, "c", "c1", 0) == "c-0"
