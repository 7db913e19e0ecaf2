"""The image's active-broker set, kept incrementally by the builder, against the set
recomputed from scratch (every registered, unfenced broker not in controlled shutdown).

The builder looks again only at the brokers a batch touched (`BrokerChanges`,
`active_after`); a broker change it missed would leave a broker in the set that no longer
leads, or out of it while eligible. Random batches of broker records, applied one batch
per image as the controller and the tailers do, must keep the two equal after every
batch, and a snapshot of the image must rebuild the same set.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_image.builder import active_after
from metadata_image.image import ClusterImage
from metadata_image.replay import apply, replay
from metadata_image.snapshot import image_from_records, image_to_records
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

CONTROLLER = settings.get_profile("metactl-controller")
BROKERS = range(5)

# An operation on a broker: ("register", b, fenced) | ("fence", b, stale)
# | ("unfence", b, stale) | ("change", b, fenced, shutdown) | ("unregister", b)
operation = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("fence"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(st.just("unfence"), st.sampled_from(BROKERS), st.booleans()),
    st.tuples(
        st.just("change"),
        st.sampled_from(BROKERS),
        st.none() | st.booleans(),
        st.none() | st.booleans(),
    ),
    st.tuples(st.just("unregister"), st.sampled_from(BROKERS)),
)
batches = st.lists(st.lists(operation, max_size=8), max_size=12)


def from_scratch(image: ClusterImage) -> frozenset[int]:
    return frozenset(bid for bid, b in image.brokers.items() if b.active)


def to_records(image: ClusterImage, ops: list[tuple[object, ...]]) -> list[MetadataRecord]:
    """The operations as records that replay onto `image` (an operation on a broker not
    registered by then is left out: replay refuses it, by name)."""
    epochs = {bid: b.epoch for bid, b in image.brokers.items()}
    offset = image.end_offset
    out: list[MetadataRecord] = []
    for op in ops:
        kind, bid = op[0], op[1]
        assert isinstance(bid, int)
        epoch = epochs.get(bid)
        if kind == "register":
            out.append(
                RegisterBrokerRecord(
                    broker_id=bid,
                    incarnation_id=f"i{bid}-{offset}",
                    broker_epoch=offset,
                    fenced=bool(op[2]),
                )
            )
            epochs[bid] = offset
        elif epoch is None:
            continue
        elif kind in ("fence", "unfence"):
            stale = epoch - 1 if op[2] else epoch  # a stale epoch changes nothing
            cls = FenceBrokerRecord if kind == "fence" else UnfenceBrokerRecord
            out.append(cls(broker_id=bid, broker_epoch=stale))
        elif kind == "change":
            fenced, shutdown = op[2], op[3]
            assert fenced is None or isinstance(fenced, bool)
            assert shutdown is None or isinstance(shutdown, bool)
            out.append(
                BrokerRegistrationChangeRecord(
                    broker_id=bid,
                    broker_epoch=epoch,
                    fenced=fenced,
                    in_controlled_shutdown=shutdown,
                )
            )
        else:
            out.append(UnregisterBrokerRecord(broker_id=bid, broker_epoch=epoch))
            del epochs[bid]
        offset += 1
    return out


@settings(CONTROLLER)
@given(batches)
def test_the_incremental_active_set_equals_the_one_from_scratch(
    ops: list[list[tuple[object, ...]]],
) -> None:
    image = ClusterImage()
    for batch in ops:
        records = to_records(image, batch)
        after, delta = apply(image, records)
        assert after.active == from_scratch(after)
        assert replay(image, records).active == after.active  # without a delta, the same
        # What the delta names is what may have changed: no other broker moved in or out.
        assert after.active ^ image.active <= delta.brokers | delta.unregistered
        image = after
    rebuilt = image_from_records(list(image_to_records(image)), image.end_offset)
    assert rebuilt.active == image.active == from_scratch(image)


def test_each_way_a_touched_broker_can_go() -> None:
    """Joins, leaves, both in one batch, stays in, stays out, and a removed broker that
    was not active."""
    register = [
        RegisterBrokerRecord(broker_id=b, incarnation_id=f"i{b}", broker_epoch=b, fenced=b != 2)
        for b in range(4)
    ]
    image = replay(ClusterImage(), register)
    assert image.active == {2}
    records: list[MetadataRecord] = [
        UnfenceBrokerRecord(broker_id=0, broker_epoch=0),  # joins
        BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=1, fenced=True),  # stays out
        RegisterBrokerRecord(broker_id=2, incarnation_id="j2", broker_epoch=4, fenced=False),
        UnregisterBrokerRecord(broker_id=3, broker_epoch=3),  # was out, gone
    ]
    after = replay(image, records)
    assert after.active == {0, 2} == from_scratch(after)
    left = replay(after, [FenceBrokerRecord(broker_id=2, broker_epoch=4)])
    assert left.active == {0}
    swapped = replay(
        left,
        [
            UnregisterBrokerRecord(broker_id=0, broker_epoch=0),  # leaves
            UnfenceBrokerRecord(broker_id=1, broker_epoch=1),  # joins, in the same batch
        ],
    )
    assert swapped.active == {1} == from_scratch(swapped)


def test_an_unchanged_set_is_the_same_object() -> None:
    """No broker moved in or out: the set is not copied (a cluster of 1,000 brokers)."""
    active = frozenset(range(1000))
    image = replay(
        ClusterImage(),
        [
            RegisterBrokerRecord(broker_id=b, incarnation_id="i", broker_epoch=b, fenced=False)
            for b in range(1000)
        ],
    )
    assert image.active == active
    again = replay(image, [UnfenceBrokerRecord(broker_id=7, broker_epoch=7)])
    assert again.active is image.active
    assert active_after(active, image.brokers, set()) is active
