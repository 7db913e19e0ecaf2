"""librdkafka through the brokers' Kafka listeners, next to metactl's own producer.

Starts a controller and three brokers (real processes on loopback, plaintext: the
figures compare the data paths, not TLS), creates one topic of `--partitions`
partitions, RF 3, MinISR 2, and produces `--records` records in each of four runs, in
this order, each on its own topic so that none reads another's log:

- metactl's own producer (`metactl produce`'s client) with acks=all, batches of
  `--batch` with `--in-flight` batches outstanding (count-only batches: no bytes);
- confluent-kafka (librdkafka) with acks=all, idempotent, records of `--size` bytes;
- librdkafka with acks=1;
- librdkafka with acks=all, not idempotent.

Prints records/s of each, the ratios the issue sets goals for (librdkafka acks=all over
the native acks=all, goal >= 0.8; librdkafka acks=all over acks=1, goal >= 0.5), and the
librdkafka runs' latency from `produce()` to the delivery report (p50 / p99 / max).
Asserts nothing: a machine differs from another by about 1.5x, so read the ratios.

Run: python bench/kafka_clients.py [--records 200000] [--size 100] [--partitions 6]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Producer

from produce import percentile, wait_for_leaders
from clients.controller import call
from clients.producer import produce
from localcluster.procs import await_active_brokers as _await_active
from localcluster.procs import await_ready as _await_ready
from localcluster.procs import shutdown as _shutdown
from localcluster.procs import start_process as _start
from protocol.messages.admin import CreateTopic, CreateTopicsRequest


def librdkafka_run(
    bootstrap: str, topic: str, records: int, size: int, partitions: int, **settings: Any
) -> tuple[float, list[float], int]:
    """(records/s, per-record latency in ms, delivery errors) of one librdkafka run."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000,
         "queue.buffering.max.messages": 1_000_000, **settings}
    )  # fmt: skip
    latencies: list[float] = []
    errors = 0
    payload = b"x" * size

    def report(err: Any, _msg: Any, *, sent: float) -> None:
        nonlocal errors
        if err is not None:
            errors += 1
        else:
            latencies.append((time.perf_counter() - sent) * 1000)

    start = time.perf_counter()
    for i in range(records):
        sent = time.perf_counter()
        while True:
            try:
                producer.produce(
                    topic,
                    value=payload,
                    partition=i % partitions,
                    on_delivery=functools.partial(report, sent=sent),
                )
                break
            except BufferError:
                producer.poll(0.01)  # the local queue is full: let deliveries drain
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    took = time.perf_counter() - start
    return (records - left - errors) / took, latencies, errors + left


async def bench(args: argparse.Namespace, root: Path) -> None:
    py = sys.executable
    procs: list[tuple[str, subprocess.Popen[str], IO[str]]] = []
    try:
        ctl, log = _start(
            [py, "-m", "controller", "--data-dir", str(root / "ctl"), "--listen", "127.0.0.1:0",
             "--log-level", "WARNING", "--insecure"],
            root / "ctl.log",
        )  # fmt: skip
        procs.append(("controller", ctl, log))
        address = _await_ready(ctl, "controller").split("listen=")[1].split()[0]
        kafka: list[str] = []
        for i in (1, 2, 3):
            cmd = [py, "-m", "brokers_stub", "--id", str(i), "--controller", address,
                   "--data-dir", str(root / f"b{i}"), "--log-level", "warning",
                   "--kafka-listen", "127.0.0.1:0", "--insecure"]  # fmt: skip
            procs.append((f"broker {i}", *_start(cmd, root / f"b{i}.log")))
        for name, p, _ in procs[1:]:
            line = _await_ready(p, name)
            kafka.append(line.split("kafka=")[1].split()[0])
        await _await_active(address, 3)
        bootstrap = ",".join(kafka)
        topics = ("native", "rdk-all-idem", "rdk-one", "rdk-all")
        specs = [
            CreateTopic(name=t, partitions=args.partitions, replication_factor=3, min_isr=2)
            for t in topics
        ]
        await call(address, CreateTopicsRequest(topics=specs))
        for t in topics:
            await wait_for_leaders(address, t, args.partitions)

        start = time.perf_counter()
        summary = await produce(
            controller=address, topic="native", partition=None, acks=-1, count=args.records,
            batch=args.batch, acked_log=root / "acked.jsonl", in_flight=args.in_flight,
        )  # fmt: skip
        native = summary.acked_records / (time.perf_counter() - start)
        print(f"native acks=all        : {native:,.0f} records/s ({summary.line()})")
        rates: dict[str, float] = {}
        runs = (
            ("librdkafka acks=all idempotent", "rdk-all-idem",
             {"acks": "all", "enable.idempotence": True}),
            ("librdkafka acks=1", "rdk-one", {"acks": "1"}),
            ("librdkafka acks=all", "rdk-all", {"acks": "all"}),
        )  # fmt: skip
        for label, topic, settings in runs:
            rate, lat, errors = librdkafka_run(
                bootstrap, topic, args.records, args.size, args.partitions, **settings
            )
            rates[label] = rate
            print(
                f"{label:31}: {rate:,.0f} records/s of {args.size} B; latency ms p50 "
                f"{percentile(lat, 50):.1f} p99 {percentile(lat, 99):.1f} max {max(lat):.1f}"
                f"; {errors} not delivered"
            )
        idem = rates["librdkafka acks=all idempotent"]
        print(f"librdkafka acks=all (idempotent) / native acks=all: {idem / native:.2f} (goal >= 0.8)")
        print(
            f"librdkafka acks=all / acks=1: {rates['librdkafka acks=all'] / rates['librdkafka acks=1']:.2f}"
            " (goal >= 0.5)"
        )
    finally:
        _shutdown(procs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=500, help="the native producer's batch")
    ap.add_argument("--in-flight", type=int, default=8, help="the native producer's")
    ap.add_argument("--partitions", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="metactl-kafka-bench-") as d:
        asyncio.run(bench(args, Path(d)))


if __name__ == "__main__":
    main()
