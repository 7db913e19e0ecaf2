"""Metadata lifecycle benchmarks (issue 19): a huge delete, and a large reassignment.

(a) Delete a 100,000-partition topic (3 brokers, RF 3) on the real driver with a real
    SQLite log and the controller's metrics attached (as `serve` runs it): the time from
    submitting DeleteTopic until its RemoveTopicRecord is durable, applied to the image
    and told to the listeners (goal ≤ 1 s). Baselines from the same run: deleting a
    1-partition topic (the fixed cost), and creating the 100,000-partition topic (what
    the delete undoes). With METACTL_BENCH_PROFILE=DIR the delete runs under cProfile:
    DIR/delete.prof, and the top functions are printed.
(b) Reassign 10,000 partitions through the real controller service (a `python -m
    controller` process on a seeded SQLite log, `--insecure`, `--metrics`): one
    AlterPartitionReassignments moves every partition of a topic from [1,2,3] to
    [2,3,4], then the leader's AlterPartitions (16 connections) report broker 4 in sync,
    each completing its partition's move (leadership leaves broker 1). Meanwhile the four
    brokers heartbeat every 200 ms and an operator describes every 100 ms, from a process
    of their own (`large_cluster.ProbeProcess`), each request timed from when it was due.
    Heartbeat p99 per phase (goal ≤ 100 ms), and its ratio to the idle phase before.

Run: python bench/lifecycle.py [--sections a,b] [--delete-partitions 100000]
     [--reassign-partitions 10000]
Prints figures and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_ops import CONFIG, peak_rss_mib
from large_cluster import (
    GOAL_MS,
    ProbeProcess,
    pct,
    profile_process,
    scrape,
    seed_log,
    start_controller,
    summary,
    wait_metrics,
)
from prometheus_client import CollectorRegistry

from controller.runtime.driver import Controller
from controller.runtime.metrics import ControllerMetrics
from controller.runtime.process import freeze_heap
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import RpcClient
from protocol.messages.admin import (
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreateTopic,
    DeleteTopic,
    DeleteTopicResponse,
    Reassignment,
)
from protocol.messages.broker_controller import AlterPartition, IsrMember
from protocol.messages.internal import FenceBroker

DELETE_GOAL_S = 1.0


def brokers_and_topic(
    brokers: list[int], name: str, partitions: int, replicas: list[int], min_isr: int = 2
) -> list[MetadataRecord]:
    """Brokers registered and unfenced (broker i's epoch is 2 * its index), one topic of
    `partitions` on `replicas` led by the first, and a 3-partition `small` topic (what the
    operator probe describes)."""
    out: list[MetadataRecord] = []
    for i, b in enumerate(brokers):
        out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=f"b{b}-0", broker_epoch=2 * i))
        out.append(UnfenceBrokerRecord(broker_id=b, broker_epoch=2 * i))
    for topic, n, reps in ((name, partitions, replicas), ("small", 3, replicas)):
        out.append(TopicRecord(name=topic, topic_id=topic, partitions=n, min_isr=min_isr))
        out.extend(
            PartitionRecord(topic=topic, partition=i, replicas=reps, isr=reps, leader=reps[0],
                            min_isr=min_isr)
            for i in range(n)
        )  # fmt: skip
    return out


# --- (a) the delete --------------------------------------------------------------------


async def timed(ctl: Controller, request: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    r = await ctl.submit(request)
    return time.perf_counter() - began, r


async def bench_delete(partitions: int, tmp: Path) -> None:
    seed = brokers_and_topic([0, 1, 2], "huge", partitions, [0, 1, 2])
    image = replay(ClusterImage(), seed)
    store = await SqliteLogStore.open(tmp / "delete")
    for i in range(0, len(seed), 50_000):
        await store.append(seed[i : i + 50_000], timestamp_ms=0)
    del seed
    ctl = Controller(store, image, config=CONFIG)
    ctl.start()
    metrics = ControllerMetrics.attach(ctl, CollectorRegistry())
    processing: list[float] = []
    appends: list[float] = []
    ctl.event_listeners.append(lambda name, queued, took: processing.append(took))
    ctl.append_listeners.append(lambda seconds, n: appends.append(seconds))
    freeze_heap()

    # Baseline 1: a 1-partition topic's delete (the fixed cost of one event and append).
    await ctl.submit(CreateTopic(name="tiny", partitions=1, replication_factor=3))
    processing.clear()
    appends.clear()
    tiny, _ = await timed(ctl, DeleteTopic(name="tiny"))
    tiny_step, tiny_append = sum(processing), sum(appends)

    # The delete.
    processing.clear()
    appends.clear()
    start = store.end_offset
    prof_dir = os.environ.get("METACTL_BENCH_PROFILE")
    profiler = cProfile.Profile() if prof_dir else None
    if profiler is not None:
        profiler.enable()
    took, r = await timed(ctl, DeleteTopic(name="huge"))
    if profiler is not None:
        profiler.disable()
    assert isinstance(r, DeleteTopicResponse)
    step, append = sum(processing), sum(appends)
    records = store.end_offset - start
    gone = "huge" not in ctl.committed_image.topics and len(ctl.committed_image.partitions) == 3
    series = metrics.registry.get_sample_value(
        "metactl_potential_data_loss_events_total", {"topic": "huge", "strategy": "manual"}
    )
    deleted = metrics.registry.get_sample_value("metactl_topics_deleted_total")

    # Baseline 2: creating the same topic again (what the delete undoes), with MinISR 3.
    create, _ = await timed(
        ctl, CreateTopic(name="huge", partitions=partitions, replication_factor=3, min_isr=3)
    )
    # The metrics' worst case: every partition under MinISR and on an ELR (broker 2
    # fenced), so the health sets hold all of them when the topic goes.
    await ctl.submit(FenceBroker(broker_id=2))
    unhealthy = metrics.health.counts()
    processing.clear()
    appends.clear()
    took_unhealthy, _ = await timed(ctl, DeleteTopic(name="huge"))
    step_u, append_u = sum(processing), sum(appends)
    left = metrics.health.counts()
    await ctl.close()
    await store.close()
    print(f"(a) delete a {partitions:,}-partition topic (3 brokers, RF 3), real SQLite log:")
    print(
        f"    {took * 1000:8.1f} ms until durable, applied and told "
        f"(goal ≤ {DELETE_GOAL_S * 1000:.0f} ms): step {step * 1000:.1f} ms, append "
        f"{append * 1000:.1f} ms, listeners and the rest {(took - step - append) * 1000:.1f} "
        f"ms; {records} record(s)"
    )
    print(
        f"    image without it: {gone}; its data-loss series gone: {series is None}; "
        f"metactl_topics_deleted_total {deleted}"
    )
    print(
        f"    baselines: a 1-partition delete {tiny * 1000:.1f} ms (step "
        f"{tiny_step * 1000:.1f}, append {tiny_append * 1000:.1f}); creating the "
        f"{partitions:,}-partition topic {create * 1000:.0f} ms"
    )
    print(
        f"    ratios: delete / 1-partition delete {took / tiny:.1f}x; delete / create "
        f"{took / create:.3f}x"
    )
    print(
        f"    again with every partition under MinISR and on an ELR ({unhealthy}): "
        f"{took_unhealthy * 1000:.1f} ms (step {step_u * 1000:.1f}, append "
        f"{append_u * 1000:.1f}, listeners and the rest "
        f"{(took_unhealthy - step_u - append_u) * 1000:.1f}); {took_unhealthy / took:.2f}x "
        f"the healthy delete; health sets after: {left}"
    )
    if profiler is not None and prof_dir:
        report_profile(profiler, Path(prof_dir) / "delete.prof")


def report_profile(profiler: cProfile.Profile, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(out))
    print(f"    cProfile of the delete: {out}; top functions by cumulative and own time:")
    stats = pstats.Stats(str(out))
    stats.sort_stats("cumulative").print_stats(15)
    stats.sort_stats("tottime").print_stats(10)


# --- (b) the reassignment over TCP -----------------------------------------------------

MOVERS = 16  # connections sending the leader's AlterPartitions


async def complete_moves(
    address: str, topic: str, partitions: int, epochs: dict[int, int]
) -> tuple[int, list[str]]:
    """The leader (broker 1)'s AlterPartition for every partition: broker 4 is in sync.
    Returns (answered without error, a few of the errors)."""
    isr = [IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in (1, 2, 3, 4)]
    queue = list(range(partitions))
    ok = 0
    errors: list[str] = []

    async def mover() -> None:
        nonlocal ok
        async with RpcClient(address) as c:
            while queue:
                p = queue.pop()
                try:
                    await c.request(
                        AlterPartition(
                            topic=topic, partition=p, leader=1, broker_epoch=epochs[1],
                            partition_epoch=1, leader_epoch=0, isr=isr,
                        ),
                        timeout_s=600,
                    )  # fmt: skip
                    ok += 1
                except Exception as exc:
                    if len(errors) < 3:
                        errors.append(f"{topic}-{p}: {exc}")

    await asyncio.gather(*(mover() for _ in range(MOVERS)))
    return ok, errors


async def bench_reassign(partitions: int, tmp: Path) -> dict[str, Any]:
    brokers = [1, 2, 3, 4]
    data = tmp / "reassign"
    await seed_log(data, brokers_and_topic(brokers, "moving", partitions, [1, 2, 3]))
    epochs = {b: 2 * i for i, b in enumerate(brokers)}
    freeze_heap()
    proc, ready = start_controller(data, "--metrics", "127.0.0.1:0")
    address, metrics = ready["listen"], ready["metrics"]
    profiler = profile_process(proc.pid, "reassign")
    probes = ProbeProcess(address, epochs)
    phases: dict[str, float] = {}
    errors: list[str] = []
    completed = 0
    try:
        await probes.start()
        probes.enter("idle")
        await asyncio.sleep(3.0)  # the idle window: the baseline phase
        probes.enter("reassign")
        t = time.perf_counter()
        async with RpcClient(address) as admin:
            r = await admin.request(
                AlterPartitionReassignments(
                    reassignments=[
                        Reassignment(topic="moving", partition=p, replicas=[2, 3, 4])
                        for p in range(partitions)
                    ]
                ),
                timeout_s=600,
            )
        assert isinstance(r, AlterPartitionReassignmentsResponse)
        refused = [x for x in r.results if x.error_code is not None]
        phases["reassign_request_s"] = time.perf_counter() - t
        phases["reassigning_after_request"] = scrape(metrics)["metactl_partitions_reassigning"]
        probes.enter("complete")
        t = time.perf_counter()
        completed, errors = await complete_moves(address, "moving", partitions, epochs)
        phases["completions_sent_s"] = time.perf_counter() - t
        phases["until_none_reassigning_s"] = (time.perf_counter() - t) + await wait_metrics(
            metrics, "every move done", lambda m: m["metactl_partitions_reassigning"] == 0
        )
        m = scrape(metrics)
        phases["completed_total"] = m['metactl_reassignments_total{outcome="completed"}']
        probes.enter("after")
        await asyncio.sleep(1.0)  # a last window of probes after the work
    finally:
        results = await probes.close()
        rss = peak_rss_mib(proc.pid)
        if profiler is not None:
            import signal

            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    by_phase: dict[str, list[float]] = results["heartbeat_by_phase"]
    describe_by_phase: dict[str, list[float]] = results["describe_by_phase"]
    idle = pct(by_phase.get("idle", []), 99)
    print(
        f"(b) reassign {partitions:,} partitions [1,2,3] -> [2,3,4] through the real service "
        f"(4 brokers heartbeating every 200 ms, a describe every 100 ms):"
    )
    print(
        f"    the AlterPartitionReassignments took {phases['reassign_request_s']:.2f} s "
        f"({len(refused)} refused; {phases['reassigning_after_request']:.0f} reassigning); "
        f"{completed:,} completions sent by {MOVERS} connections in "
        f"{phases['completions_sent_s']:.2f} s; none reassigning after "
        f"{phases['until_none_reassigning_s']:.2f} s; metactl_reassignments_total"
        f'{{outcome="completed"}} {phases["completed_total"]:.0f}; controller peak RSS '
        f"{rss:.0f} MiB"
    )
    if errors:
        print(f"    completion errors (first {len(errors)}): {errors}")
    for phase in ("idle", "reassign", "complete", "after"):
        hb = by_phase.get(phase, [])
        ds = describe_by_phase.get(phase, [])
        ratio = pct(hb, 99) / idle if hb and idle else float("nan")
        print(
            f"    {phase:9s} heartbeat {summary(hb)}  p99/idle {ratio:5.1f}x;  "
            f"describe p99 {pct(ds, 99):7.2f} ms"
        )
    during = by_phase.get("reassign", []) + by_phase.get("complete", [])
    print(
        f"    during the whole move: heartbeat {summary(during)} (goal p99 ≤ {GOAL_MS:.0f} ms), "
        f"p99 / idle p99 {pct(during, 99) / idle:.1f}x"
    )
    return {"phases": phases, "heartbeat_p99_ms": pct(during, 99)}


def main() -> None:
    import logging

    from metactl.logs import configure

    configure(json=False, level=logging.WARNING)
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="a,b", help="which sections to run (default a,b)")
    ap.add_argument("--delete-partitions", type=int, default=100_000)
    ap.add_argument("--reassign-partitions", type=int, default=10_000)
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    with tempfile.TemporaryDirectory(prefix="metactl-bench-") as d:
        tmp = Path(d)
        if "a" in sections:
            asyncio.run(bench_delete(args.delete_partitions, tmp))
        if "b" in sections:
            asyncio.run(bench_reassign(args.reassign_partitions, tmp))


if __name__ == "__main__":
    main()
