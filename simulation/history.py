"""``metactl simulate history``: a long, random, realistic history through the real core.

The simulator drives the controller's one pure event step (`controller.core.step.step`)
for each event, exactly as the driver does, with virtual time, and appends each event's
records to a real `SqliteLogStore` with the event's time as the batch timestamp. No
asyncio task per event and no driver: the core is pure, so this is the fast path to a
multi-million-record log.

What happens, as independent random (Poisson) processes over virtual time:

* controlled restarts (clean: controlled shutdown, clean re-registration, unfence),
* crashes (session-timeout fence, unclean re-registration, unfence),
* session blips (fence, then unfence with the same epoch),
* power outages: a run of neighbouring brokers crashes within seconds, as in 5.3.3,
  which empties ISRs and ELRs and leads to unclean recoveries,
* AlterPartition shrinks (a follower falls behind) and, once replicas have caught up,
  AlterPartition expansions (every few minutes, for partitions whose replicas are back),
* preferred-leader elections (an hourly sweep, like Kafka's auto leader rebalance),
* operators electing a replica of partitions that no policy recovers (``manual``
  topics, or a balanced recovery with an empty LastKnownELR).

Log inspections are answered at once with random log positions. Topics use the cluster
strategy (``balanced`` by default); about one in ten is ``proactive`` and one in twenty
``manual``. Everything is seeded: the same arguments give the same history (the order of
records within one batch follows the controller's own map iteration).

The configuration, the report and time parsing are `simulation.history_config`, and the
simulated cluster (the brokers, the random processes and the core step) is
`simulation.history_sim`; this module owns the event loop and the writing of the log.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from metadata_log.sqlite_format import resolve_log_path
from metadata_log.sqlite_store import SqliteLogStore
from simulation.history_config import DAY_MS, HistoryConfig, SimulationReport
from simulation.history_sim import _Sim

FLUSH_RECORDS: Final = 50_000


async def simulate_history(
    cfg: HistoryConfig,
    out: str | Path,
    progress: Callable[[str], None] | None = None,
) -> SimulationReport:
    """Write a simulated history to a new log in `out` (a data directory)."""
    path = _new_log_path(out)
    started = time.perf_counter()
    sim = _Sim(cfg)
    store = await SqliteLogStore.open(path)
    report = SimulationReport(path=str(store.path))
    last_progress = started
    day = -1
    try:
        sim.setup()
        while sim.queue:
            when, _, kind, arg = heapq.heappop(sim.queue)
            if when > sim.end:
                break
            sim.now = when
            sim.run_event(kind, arg)
            if sim.pending_count >= FLUSH_RECORDS:
                await _flush(store, sim, report)
                now = time.perf_counter()
                today = (sim.now - cfg.start_ms) // DAY_MS
                if progress is not None and (today != day or now - last_progress > 10):
                    day, last_progress = today, now
                    progress(
                        f"day {today + 1:.0f}/{math.ceil(cfg.days)}: {report.records:,} records, "
                        f"{report.records / (now - started):,.0f} records/s"
                    )
        await _flush(store, sim, report)
    finally:
        await store.close()
    report.elapsed_s = time.perf_counter() - started
    report.events = dict(sim.report_events)
    report.unclean_recoveries = sim.recoveries
    report.refused = sim.refused
    report.offline_at_end = len(sim.image.offline)
    return report


def _new_log_path(out: str | Path) -> Path:
    path = Path(out)
    if resolve_log_path(path).exists():
        raise FileExistsError(f"{path} already holds a metadata log; choose a new --out")
    return path


async def _flush(store: SqliteLogStore, sim: _Sim, report: SimulationReport) -> None:
    batches, sim.batches, sim.pending_count = sim.batches, [], 0
    if not batches:
        return
    appends = [store.append(records, timestamp_ms=ts) for records, ts in batches]
    await asyncio.gather(*appends)
    report.records += sum(len(r) for r, _ in batches)
    report.batches += len(batches)
