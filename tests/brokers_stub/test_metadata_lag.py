"""The broker's metadata lag (records and seconds) follows what its fetches report."""

from __future__ import annotations

from pathlib import Path

from brokers_stub.logctx import BrokerLog
from brokers_stub.metadata import MetadataFollower
from metadata_log.records import RegisterBrokerRecord
from protocol.client import RpcClient
from protocol.messages.broker_controller import FetchedRecord, FetchMetadataResponse


def _follower(tmp_path: Path) -> MetadataFollower:
    return MetadataFollower(
        RpcClient("127.0.0.1:1"), tmp_path, BrokerLog(1), max_wait_ms=0, request_timeout_ms=100
    )


def _reg(offset: int) -> FetchedRecord:
    return FetchedRecord(
        offset, 0, RegisterBrokerRecord(broker_id=offset, incarnation_id="x", broker_epoch=offset)
    )


def test_lag_is_zero_when_caught_up_and_counts_records_behind(tmp_path: Path) -> None:
    f = _follower(tmp_path)
    assert f.lag() == (0, 0.0)
    f._apply(FetchMetadataResponse(records=[_reg(0), _reg(1)], end_offset=5))
    records, seconds = f.lag()
    assert records == 3 and seconds >= 0.0
    first_since = f.lagging_since
    assert first_since is not None
    f._apply(FetchMetadataResponse(records=[_reg(2)], end_offset=5))
    assert f.lag()[0] == 2 and f.lagging_since == first_since  # still the same episode
    f._apply(FetchMetadataResponse(records=[_reg(3), _reg(4)], end_offset=5))
    assert f.lag() == (0, 0.0) and f.lagging_since is None
