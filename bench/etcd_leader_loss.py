"""Losing the etcd leader under a controller quorum: the write gap and whether the
controllers fail over (issue 21, item 5). Prints figures; asserts nothing.

The cluster is what `metactl cluster up --controllers 3 --etcd 3` runs: a local 3-member
etcd cluster (`ops.etcd_local.LocalEtcd`, so its timing flags) and three controllers on
one metadata log in it with the default 2 s lease, plus one broker (tests/e2e/ha.py's
`HaCluster`). A writer keeps creating topics through every controller's address (each
an acknowledged metadata write). Each trial finds the etcd leader through the members'
status API and either SIGKILLs it (restarted on its data directory once the trial is
over) or SIGSTOPs it for `--pause-s` seconds and resumes it. It reports:

* the **write gap**: the longest time between two acknowledged writes from 1 s before
  the fault to `--window-s` after it (a pause: after the resume);
* whether a **controller failover** happened: the leadership key's token (its create
  revision, one per term) changed during the trial.

Goal (issue 21): a gap of at most 2 s and no failover. A follower member is measured too,
for comparison (one of each by default).

Run: python bench/etcd_leader_loss.py [--trials 5] [--pause-s 5] [--window-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ops.chaos_procs import member_status
from tests.e2e.ha import HaCluster, Writer


def etcd_leader(c: HaCluster) -> int | None:
    """The index of the etcd member the others follow (None: no answer, an election)."""
    ids: dict[int, str] = {}
    leader = None
    for i, m in enumerate(c.etcd.members):
        if not m.running:
            continue
        status = member_status(m.client_url, context=getattr(m, "ssl_context", None))
        if status is not None:
            ids[i] = status[0]
            if status[1] != "0":
                leader = status[1]
    return next((i for i, mid in ids.items() if mid == leader), None)


async def settled(c: HaCluster, writer: Writer, *, quiet_s: float = 3.0) -> int:
    """Until every member is healthy, a leader is known and the writer has acknowledged
    writes for `quiet_s` without a gap of a second; the etcd leader's index."""
    async with asyncio.timeout(120):
        while True:
            healthy = all(m.healthy() for m in c.etcd.members)
            leader = etcd_leader(c)
            now = time.monotonic()
            recent = [t for t in writer.acked_at if t > now - quiet_s]
            steady = len(recent) > 3 and max(b - a for a, b in itertools.pairwise(recent)) < 1.0
            if healthy and leader is not None and steady:
                return leader
            await asyncio.sleep(0.2)  # polling observable state between trials


def gap(acked_at: list[float], start: float, end: float) -> float:
    """The longest time between consecutive acknowledgements in [start, end] (the bounds
    count as acknowledgements: no write at all is a gap as long as the window)."""
    times = [start, *[t for t in acked_at if start < t < end], end]
    return max(b - a for a, b in itertools.pairwise(times))


async def trial(
    c: HaCluster, writer: Writer, how: str, target: str, *, pause_s: float, window_s: float
) -> tuple[float, bool, str]:
    leader = await settled(c, writer)
    n = len(c.etcd.members)
    i = leader if target == "leader" else (leader + 1) % n
    m = c.etcd.members[i]
    assert m.proc is not None
    _, token = await c.leader()
    fault = time.monotonic()
    if how == "kill":
        os.killpg(m.proc.pid, signal.SIGKILL)
        m.proc.wait()
        await asyncio.sleep(window_s)  # the window the gap is measured in
        end = fault + window_s
    else:
        os.killpg(m.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(pause_s)  # the pause
        os.killpg(m.proc.pid, signal.SIGCONT)
        await asyncio.sleep(window_s)
        end = fault + pause_s + window_s
    _, after = await c.leader()
    measured = gap(writer.acked_at, fault - 1.0, end)
    if how == "kill":
        c.etcd.start_member(i)
    return measured, after != token, m.name


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        c = HaCluster(Path(d)).start()
        try:
            await c.wait_leader()
            c.start_broker(1)
            await c.wait_until(lambda d: any(not b.fenced for b in d.brokers), "broker 1 active")
            writer = Writer(c.bootstrap).start()
            await writer.acks_after(0, 5)
            cmd = c.etcd._command(c.etcd.members[0])
            timing = [
                f"{flag} {cmd[i + 1]}"
                for i, flag in enumerate(cmd)
                if flag in ("--heartbeat-interval", "--election-timeout")
            ]
            print(
                "etcd: 3 members, "
                + (", ".join(timing) or "etcd's default timing (100 ms, 1000 ms)")
                + "; controllers: 3, lease TTL 2 s"
            )
            for target, trials in (("leader", args.trials), ("follower", args.follower_trials)):
                for how in ("kill", "stop"):
                    gaps, failovers = [], 0
                    for _ in range(trials):
                        g, failed_over, name = await trial(
                            c, writer, how, target, pause_s=args.pause_s, window_s=args.window_s
                        )
                        gaps.append(g)
                        failovers += failed_over
                        print(
                            f"  {how} {target} ({name}): write gap {g:.2f} s, "
                            f"controller failover: {'yes' if failed_over else 'no'}",
                            flush=True,
                        )
                    if gaps:
                        what = "SIGKILL" if how == "kill" else f"SIGSTOP {args.pause_s:g} s"
                        print(
                            f"{what} of the etcd {target}, {trials} trials: write gap p50 "
                            f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s; "
                            f"controller failovers {failovers} of {trials} "
                            "(goal: <= 2 s, none)",
                            flush=True,
                        )
            await writer.stop()
            print(f"writes acknowledged {len(writer.acked)}, attempts failed {len(writer.failed)}")
        finally:
            c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="per fault kind on the leader")
    ap.add_argument("--follower-trials", type=int, default=1, help="per fault kind")
    ap.add_argument("--pause-s", type=float, default=5.0)
    ap.add_argument("--window-s", type=float, default=8.0)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
