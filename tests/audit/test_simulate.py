"""`simulation.history`: seeded, healthy, and it exercises what the audits look for."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from audit.logread import iter_batches, log_info
from metadata_log.records import decode_batch, encode_record, record_type
from simulation.history import simulate_history
from simulation.history_config import HistoryConfig

pytestmark = pytest.mark.slow


def _history(path: Path) -> list[tuple[int, list[bytes]]]:
    """Batches as (timestamp, sorted encoded records): order within a batch may vary."""
    info = log_info(path)
    return [
        (ts, sorted(encode_record(r) for r in decode_batch(payload)))
        for chunk in iter_batches(info.path, 0, info.end_offset)
        for _base, _count, ts, payload in chunk
    ]


def test_same_seed_same_history(tmp_path: Path) -> None:
    cfg = HistoryConfig(brokers=4, partitions=12, days=0.5, seed=11, intensity=4.0, outages=4.0)
    reports = [asyncio.run(simulate_history(cfg, tmp_path / name)) for name in ("a", "b")]
    assert reports[0].records == reports[1].records > 0
    assert _history(tmp_path / "a") == _history(tmp_path / "b")
    other = HistoryConfig(brokers=4, partitions=12, days=0.5, seed=12, intensity=4.0, outages=4.0)
    asyncio.run(simulate_history(other, tmp_path / "c"))
    assert _history(tmp_path / "c") != _history(tmp_path / "a")


def test_the_history_has_what_audits_look_for(sim_log: tuple[Path, object]) -> None:
    path, _ = sim_log
    info = log_info(path)
    types: Counter[str] = Counter()
    elections: Counter[str] = Counter()
    for chunk in iter_batches(info.path, 0, info.end_offset):
        for _base, _count, _ts, payload in chunk:
            for r in decode_batch(payload):
                types[record_type(r)] += 1
                kind = getattr(r, "election", None)
                if kind is not None:
                    elections[str(kind)] += 1
    assert {"RegisterBroker", "FenceBroker", "UnfenceBroker", "BrokerRegistrationChange"} <= set(
        types
    )
    assert types["UncleanRecovery"] > 0 and types["PartitionChange"] > types["Partition"] == 60
    assert {"isr", "preferred", "unclean_recovery"} <= set(elections)
