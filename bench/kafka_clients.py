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

librdkafka's settings (`RDK_SETTINGS`, printed) are tuned for throughput as a Kafka user
would (linger.ms, batch size); each librdkafka producer is warmed up first (connected,
metadata and producer id fetched: one record per partition delivered) so that its run
measures producing, not librdkafka's start-up.

Prints, per run, records/s and the CPU seconds the run cost the client process (the
bench: librdkafka's threads and the Python loop producing, or the native client) and the
three brokers together: on a small machine they share the cores, so read the CPU beside
the rate. Then the ratios the issue sets goals for (librdkafka acks=all over the native
acks=all, goal >= 0.8; librdkafka acks=all over acks=1, goal >= 0.5).

Latency, from `produce()` to the delivery report (librdkafka's `Message.latency()`),
p50 / p99 / max, twice per librdkafka configuration: in the throughput run, where every
record is enqueued at once, so it mostly measures the client's queue; and in a run of
`--paced-records` records at `--paced-rate` records/s (0: none), which measures the
brokers' answer plus linger.ms. Asserts nothing: a machine differs from another by about
1.5x, so read the ratios.

Run: python bench/kafka_clients.py [--records 200000] [--size 100] [--partitions 6]
     [--paced-rate 20000] [--paced-records 20000]
     [--profile DIR]  (the brokers under cProfile: `python -m pstats DIR/broker-1.prof`)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import confluent_kafka
from confluent_kafka import Producer
from produce import percentile, wait_for_leaders

from clients.controller import call
from clients.producer import produce
from localcluster.procs import await_active_brokers as _await_active
from localcluster.procs import await_ready as _await_ready
from localcluster.procs import shutdown as _shutdown
from localcluster.procs import start_process as _start
from protocol.messages.admin import CreateTopic, CreateTopicsRequest

# librdkafka's settings in every run (printed by the bench), tuned for throughput as a
# Kafka user would: linger long enough to fill batches (librdkafka's default, 5 ms, sends
# a few hundred records per batch at these rates), batches up to message.max.bytes.
RDK_SETTINGS: dict[str, Any] = {
    "linger.ms": 20,
    "batch.num.messages": 100_000,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Run:
    """What one librdkafka run measured: records/s, and each record's latency from
    `produce()` to its delivery report (librdkafka's own `Message.latency()`), in ms."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0

    def report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors += 1
        else:
            self.latencies.append(msg.latency() * 1000)

    def line(self) -> str:
        lat = self.latencies or [float("nan")]
        return f"p50 {percentile(lat, 50):.1f} p99 {percentile(lat, 99):.1f} max {max(lat):.1f} ms"


def warm_producer(bootstrap: str, topic: str, partitions: int, **settings: Any) -> Producer:
    """A librdkafka producer connected to every broker, with the topic's metadata (and,
    idempotent, its producer id): one record per partition produced and delivered, so
    the runs measure producing, not starting up (librdkafka's idempotent producer waits
    500 ms for its producer id when no broker is up yet, its PID timer)."""
    producer = Producer({"bootstrap.servers": bootstrap, **RDK_SETTINGS, **settings})
    for i in range(partitions):
        producer.produce(topic, b"warm-up", partition=i)
    if producer.flush(30):
        raise RuntimeError(f"{topic}: the warm-up records were not delivered")
    return producer


def librdkafka_run(
    producer: Producer,
    topic: str,
    records: int,
    size: int,
    partitions: int,
    *,
    rate: float | None = None,
) -> tuple[float, Run]:
    """(records/s, what the run measured) of producing `records` records: all at once
    (`rate` None: the client's queue fills, so latency mostly measures the queue), or
    paced at `rate` records/s (latency then measures the brokers, not the queue)."""
    run = Run()
    payload = b"x" * size
    produce, poll, report = producer.produce, producer.poll, run.report
    start = time.perf_counter()
    step = 1000 if rate is None else max(1, int(rate / 1000))  # records per ms when paced
    for first in range(0, records, step):
        if rate is not None:
            wait = start + first / rate - time.perf_counter()
            if wait > 0:
                poll(wait)  # serves delivery reports while it waits
        for i in range(first, min(records, first + step)):
            while True:
                try:
                    produce(topic, payload, partition=i % partitions, on_delivery=report)
                    break
                except BufferError:
                    poll(0.01)  # the local queue is full: let deliveries drain
        poll(0)
    left = producer.flush(120)
    took = time.perf_counter() - start
    run.errors += left
    return (records - run.errors) / took, run


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
            prof = (
                ["-m", "cProfile", "-o", str(args.profile / f"broker-{i}.prof")]
                if args.profile
                else []
            )
            cmd = [py, *prof, "-m", "brokers_stub", "--id", str(i), "--controller", address,
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

        brokers = [p.pid for name, p, _ in procs if name.startswith("broker")]

        def cpu() -> tuple[float, float]:
            """(this process's CPU seconds, librdkafka's threads included; the brokers')"""
            return time.process_time(), sum(cpu_seconds(pid) for pid in brokers)

        def cpu_line(before: tuple[float, float], took: float) -> str:
            client, brokers_cpu = (b - a for a, b in zip(before, cpu(), strict=True))
            return f"CPU s: client {client:.2f}, brokers {brokers_cpu:.2f}, in {took:.2f} s"

        print(
            f"{args.records:,} records per run, {args.partitions} partitions, RF 3, MinISR 2; "
            f"librdkafka {confluent_kafka.libversion()[0]}: "
            + ", ".join(f"{k}={v}" for k, v in RDK_SETTINGS.items())
        )
        before, start = cpu(), time.perf_counter()
        summary = await produce(
            controller=address, topic="native", partition=None, acks=-1, count=args.records,
            batch=args.batch, acked_log=root / "acked.jsonl", in_flight=args.in_flight,
        )  # fmt: skip
        took = time.perf_counter() - start
        native = summary.acked_records / took
        print(
            f"native acks=all                : {native:,.0f} records/s "
            f"({summary.line()}; batches of {args.batch}, {args.in_flight} in flight, "
            f"no bytes); {cpu_line(before, took)}"
        )
        rates: dict[str, float] = {}
        runs = (
            ("librdkafka acks=all idempotent", "rdk-all-idem",
             {"acks": "all", "enable.idempotence": True}),
            ("librdkafka acks=1", "rdk-one", {"acks": "1"}),
            ("librdkafka acks=all", "rdk-all", {"acks": "all"}),
        )  # fmt: skip
        paced: list[str] = []
        for label, topic, settings in runs:
            producer = warm_producer(bootstrap, topic, args.partitions, **settings)
            before, start = cpu(), time.perf_counter()
            rate, run = librdkafka_run(producer, topic, args.records, args.size, args.partitions)
            took = time.perf_counter() - start
            rates[label] = rate
            print(
                f"{label:31}: {rate:,.0f} records/s of {args.size} B; {run.errors} not "
                f"delivered; {cpu_line(before, took)}; all enqueued at once: latency "
                f"{run.line()}"
            )
            if args.paced_rate > 0:
                _, slow = librdkafka_run(
                    producer, topic, args.paced_records, args.size, args.partitions,
                    rate=args.paced_rate,
                )  # fmt: skip
                paced.append(
                    f"{label:31}: at {args.paced_rate:,.0f} records/s latency {slow.line()}"
                    f"; {slow.errors} not delivered"
                )
            del producer  # destroyed: its connections closed before the brokers stop
        print(*paced, sep="\n")
        idem = rates["librdkafka acks=all idempotent"] / native
        ratio = rates["librdkafka acks=all"] / rates["librdkafka acks=1"]
        print(f"librdkafka acks=all (idempotent) / native acks=all: {idem:.2f} (goal >= 0.8)")
        print(f"librdkafka acks=all / acks=1: {ratio:.2f} (goal >= 0.5)")
    finally:
        _shutdown(procs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=500, help="the native producer's batch")
    ap.add_argument("--in-flight", type=int, default=8, help="the native producer's")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument(
        "--paced-rate",
        type=float,
        default=20_000,
        help="records/s of each librdkafka latency run (0: none)",
    )
    ap.add_argument("--paced-records", type=int, default=20_000)
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the brokers under cProfile, writing DIR/broker-<id>.prof when they stop",
    )
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metactl-kafka-bench-") as d:
        asyncio.run(bench(args, Path(d)))


if __name__ == "__main__":
    main()
