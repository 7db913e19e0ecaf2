"""Issue 21's two storage rows on the etcd log, with real processes. Prints figures;
asserts nothing.

1. **Standby restarts and offline dumps under writes.** Three controllers on a local
   3-member etcd (tests/e2e/ha.py's `HaCluster`, plaintext, lease 2 s) and one broker; a
   writer creates topics through every controller's address at about `--rate` writes/s
   (each an acknowledged metadata write). Meanwhile, concurrently:
   * `--restarts` times: SIGKILL a standby (the two in turn), start it again on its data
     directory, and wait for its `READY controller ... role=standby` line, the signal
     the HA tests use (printed once it has replayed the log and follows it by watch);
     then one DescribeCluster on it must show at least the log end read just before
     its start (it follows the log);
   * `--dumps` times: `metactl log dump --data-dir etcd://HOST:PORT,.../PREFIX` as a
     subprocess of the real CLI (`python -m ops.cli`), its offsets checked contiguous.
   Counted: restarts that fail (exit before READY, another role, not following), dumps
   that fail (exit status, the error's code, a gap in the offsets), and CORRUPT_MESSAGE
   anywhere (dumps' stderr, controller logs). Goal (issue 21): 0 false CORRUPT_MESSAGE
   of 100 (was 3 of 23 restarts and 5 of 10 dumps; this bench on the tree before the
   one-revision reads, 3c575bc^: 5 of 100 restarts and 13 of 100 dumps).
2. **`cluster up` resumed.** `metactl cluster up --controllers 3 --etcd 3 --data-dir D`
   (the real CLI as a subprocess: 3 brokers, mutual TLS, etcd with TLS and client
   certificates, as a user runs it; only `--listen`/`--metrics` are pinned to a block of
   free ports, the same in every round, and the Kafka listeners take any free ports),
   until it prints `Ctrl-C stops everything cleanly.`; a topic `keep-<round>` is created
   through it, every earlier round's topic must be described, and `metactl log verify`
   (the command the banner prints, with the admin's etcd certificate) must pass with an
   end offset no smaller than the last round's; then SIGINT, a clean exit (status 0,
   every child gone), and the same again on D, `--rounds` times after the first start.
   Goal (issue 21): 10 resumes of 10 (was 0 of 1; this bench on the tree before
   ports.json, f7b4aeb^: 0 of 2, etcd never healthy).

Run: python bench/ha_storage.py [--restarts 100] [--dumps 100] [--rate 40] [--rounds 10]
[--only restarts|up]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tests.e2e.ha as ha_processes
from protocol.messages.unions import Message
from tests.e2e.cluster import Process, free_block
from tests.e2e.ha import LEASE_TTL_S, HaCluster, Writer
from tests.processes import alive

# Broker sessions as Kafka's defaults (9 s), as bench/etcd_leader_loss.py has them: the
# stub broker applying thousands of new topics on a loaded 2-core machine may miss the
# HA tests' 1.5 s session, and every CreateTopics fails while it is fenced.
BROKER_SESSION_MS = 9000
BROKER_HEARTBEAT_MS = 500
vars(ha_processes).update(SESSION_MS=BROKER_SESSION_MS, HEARTBEAT_MS=BROKER_HEARTBEAT_MS)
REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "ops.cli"]
READY_TIMEOUT_S = 120.0
UP_READY_TIMEOUT_S = 300.0
UP_STOP_TIMEOUT_S = 90.0
CORRUPT = "CORRUPT_MESSAGE"
ERROR_CODE = re.compile(r"error: ([A-Z_]+)")


def clean_env() -> dict[str, str]:
    """This environment without the variables that would point the CLI at other
    certificates (METACTL_TLS_DIR, METACTL_ETCD_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METACTL_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def summary(xs: list[float]) -> str:
    if not xs:
        return "none"
    return (
        f"p50 {statistics.median(xs):.2f} s, max {max(xs):.2f} s, "
        f"mean {statistics.fmean(xs):.2f} s (n={len(xs)})"
    )


def error_code(text: str) -> str:
    found = ERROR_CODE.search(text)
    return found.group(1) if found else (text.strip().splitlines() or ["no output"])[-1][:80]


# --- 1. standby restarts and dumps under writes ----------------------------------------------


class RateWriter(Writer):
    """The HA tests' writer, paced to `rate` writes/s: each write starts on a fixed grid
    of 1/`rate` s (a slow write is made up by the next ones starting at once; more than
    a second behind, the grid starts again from now rather than bursting)."""

    def __init__(self, bootstrap: str, rate: float) -> None:
        super().__init__(bootstrap, prefix="w")
        self.interval = 1.0 / rate
        self._next = 0.0

    async def one(self, name: str, timeout_s: float = 5.0) -> Message:
        now = time.monotonic()
        self._next = now if not self._next else self._next + self.interval
        if self._next < now - 1.0:
            self._next = now
        await asyncio.sleep(max(self._next - now, 0.0))  # the writer's pacing
        return await super().one(name, timeout_s)


@dataclass
class RestartStats:
    ready_s: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    corrupt: int = 0
    not_following: int = 0


@dataclass
class DumpStats:
    seconds: list[float] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    corrupt: int = 0


def log_since(path: Path, offset: int) -> str:
    """What a log file holds from `offset` on."""
    return path.read_bytes()[offset:].decode(errors="replace")


def spawn_controller(c: HaCluster, address: str) -> Process:
    """HaCluster.start_controller's process, started from this (the main) thread without
    waiting for READY: `setpriv --pdeathsig` signals a child when the thread that
    started it ends, so no worker thread may start one."""
    return c.start_controller(address, ready=False)


async def restarts(c: HaCluster, n: int, stats: RestartStats) -> None:
    for k in range(n):
        info, _ = await c.leader()
        assert info is not None
        standbys = [a for a in c.addresses if a != info.address]
        victim = standbys[k % len(standbys)]
        old = c.controllers[victim]
        old.signal(signal.SIGKILL)
        await asyncio.to_thread(old.wait)
        old.close()
        log = c.root / "logs" / f"controller-{c.addresses.index(victim) + 1}.log"
        before = log.stat().st_size if log.exists() else 0
        end = (await c.describe(info.address)).end_offset
        started = time.monotonic()
        p = spawn_controller(c, victim)
        try:
            await asyncio.to_thread(p.await_ready, READY_TIMEOUT_S)
        except RuntimeError as exc:
            text = log_since(log, before)
            code = error_code(text) if "exited" in str(exc) else "NOT_READY_IN_TIME"
            stats.failures[code] += 1
            stats.corrupt += CORRUPT in text
            print(f"  restart {k + 1}: {exc}: {code}", flush=True)
            p.close()
            spawn_controller(c, victim)  # back, for the next rounds
            await asyncio.to_thread(c.controllers[victim].await_ready, READY_TIMEOUT_S)
            continue
        stats.ready_s.append(time.monotonic() - started)
        if "role=standby" not in p.ready_line:
            stats.failures[f"ready as {p.ready_line.split()[-1]}"] += 1
            continue
        try:
            d = await c.describe(victim)
            if d.end_offset < end:
                stats.not_following += 1
        except Exception as exc:  # counted and named, not raised
            stats.failures[f"describe: {getattr(exc, 'code', type(exc).__name__)}"] += 1
        if (k + 1) % 10 == 0:
            print(
                f"  restarts {k + 1}/{n}: last ready in {stats.ready_s[-1]:.2f} s",
                flush=True,
            )


async def dumps(url: str, n: int, stats: DumpStats) -> None:
    for k in range(n):
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *CLI, "log", "dump", "--data-dir", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=clean_env(), cwd=REPO,
        )  # fmt: skip
        out, err = await proc.communicate()
        stats.seconds.append(time.monotonic() - started)
        text = err.decode(errors="replace")
        if proc.returncode != 0:
            code = error_code(text)
            stats.failures[f"exit {proc.returncode} {code}"] += 1
            stats.corrupt += CORRUPT in text
            print(f"  dump {k + 1}: exit {proc.returncode}: {text.strip()[:300]}", flush=True)
            continue
        offsets = [int(line.split(None, 1)[0]) for line in out.decode().splitlines() if line]
        stats.records.append(len(offsets))
        if not offsets or offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            stats.failures["offsets not contiguous"] += 1
        if (k + 1) % 10 == 0:
            print(
                f"  dumps {k + 1}/{n}: last {len(offsets):,} records in {stats.seconds[-1]:.2f} s",
                flush=True,
            )


def log_lines(root: Path, needle: str) -> int:
    return sum(
        line.count(needle)
        for path in (root / "logs").glob("controller-*.log")
        for line in path.read_text(errors="replace").splitlines()
    )


async def standby_restarts_and_dumps(root: Path, args: argparse.Namespace) -> None:
    print(
        f"1. {args.restarts} standby restarts and {args.dumps} `metactl log dump --data-dir "
        f"etcd://...` under ~{args.rate:g} writes/s (3 controllers, 3-member etcd, lease "
        f"{LEASE_TTL_S} s, 1 broker)",
        flush=True,
    )
    c = HaCluster(root / "restarts")
    # Listeners below the ephemeral range: HaCluster's free ports are in it, and one was
    # taken by an outgoing connection (etcd's, a client's) before its controller bound it.
    base = free_block(len(c.addresses))
    c.addresses = [f"127.0.0.1:{base + i}" for i in range(len(c.addresses))]
    c.start()
    try:
        await c.wait_leader()
        c.start_broker(1)
        await c.wait_until(lambda d: any(not b.fenced for b in d.brokers), "broker 1 active")
        writer = RateWriter(c.bootstrap, args.rate).start()
        await writer.acks_after(0, 5)
        rs, ds = RestartStats(), DumpStats()
        t0 = time.monotonic()
        acked0 = len(writer.acked)
        failed0 = len(writer.failed)
        tasks = [
            asyncio.create_task(restarts(c, args.restarts, rs)),
            asyncio.create_task(dumps(c.url, args.dumps, ds)),
        ]
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - t0
        acked = len(writer.acked) - acked0
        refused = Counter(f.rpartition(": ")[2] for f in writer.failed[failed0:])
        await writer.stop()
        written = await c.log_written_once()
        corrupt_logs = log_lines(c.root, CORRUPT)
        replay_errors = log_lines(c.root, "cannot be replayed")
        restart_failures = sum(rs.failures.values()) + rs.not_following
        dump_failures = sum(ds.failures.values())
        print(f"   over {elapsed:.0f} s: writes acknowledged {acked} ({acked / elapsed:.1f}/s)")
        print(
            "   writes refused or failed: "
            + (", ".join(f"{k} {v}" for k, v in refused.most_common()) or "none")
        )
        print(
            f"   standby restarts: {args.restarts - restart_failures} of {args.restarts} "
            f"ready as a following standby; failures {restart_failures} "
            f"({dict(rs.failures) or 'none'}, not following {rs.not_following}); "
            f"CORRUPT_MESSAGE {rs.corrupt}"
        )
        print(f"     start -> READY role=standby: {summary(rs.ready_s)}")
        print(
            f"   log dumps: {args.dumps - dump_failures} of {args.dumps} complete and "
            f"contiguous; failures {dump_failures} ({dict(ds.failures) or 'none'}); "
            f"CORRUPT_MESSAGE {ds.corrupt}"
        )
        if ds.records:
            print(
                f"     each: {summary(ds.seconds)}; records dumped "
                f"{min(ds.records):,}..{max(ds.records):,}"
            )
        print(
            f"   controller logs: {corrupt_logs} line(s) naming CORRUPT_MESSAGE, "
            f"{replay_errors} 'cannot be replayed'"
        )
        print(f"   the log after the run: verifies, every batch key written once, end {written:,}")
        hit = rs.corrupt + ds.corrupt
        other = restart_failures + dump_failures - hit
        print(
            f"   => CORRUPT_MESSAGE: {hit} of {args.restarts + args.dumps} restarts and dumps "
            f"({rs.corrupt} restarts, {ds.corrupt} dumps; goal 0), {corrupt_logs} controller "
            f"log line(s); other failures: {other}",
            flush=True,
        )
    finally:
        c.stop()


# --- 2. cluster up, Ctrl-C, cluster up again ---------------------------------------------------


def metactl(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean_env(),
        timeout=timeout_s,
        check=False,
    )


class Up:
    """One `metactl cluster up` process; its stdout read by a thread, line by line."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=clean_env(),
            start_new_session=True,  # as a terminal runs it: its children have their own
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.banner: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # read to the end: the event feed never blocks
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def await_banner(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                return False
            if line is None:
                return False
            self.banner.append(line)
            if line.startswith("Ctrl-C stops"):
                return True

    def command(self, name: str) -> list[str]:
        """The banner's `metactl <name> ...` suggestion, as arguments after `metactl`."""
        for line in self.banner:
            text = line.split(":", 1)[1] if line.startswith("  try:") else line
            with contextlib.suppress(ValueError):
                words = shlex.split(text)
                if len(words) > 1 and Path(words[0]).name == "metactl" and words[1] == name:
                    return words[1:]
        raise LookupError(f"no `metactl {name}` in the banner")

    def pids(self) -> dict[str, int]:
        line = next(x for x in self.banner if x.startswith("  pids:"))
        pairs = (p.strip().split("=") for p in line.split(":", 1)[1].split(", "))
        return {k: int(v) for k, v in pairs}

    def interrupt(self, timeout_s: float) -> int | None:
        """SIGINT (what Ctrl-C sends to the terminal's foreground group), then its exit
        status (None: still running after `timeout_s`, then SIGKILLed)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None


@dataclass
class Round:
    n: int
    started: str = ""  # wall-clock time of the start
    ready_s: float | None = None
    kept: bool = False
    verify_end: int | None = None
    exit_status: int | None = None
    stop_s: float = 0.0
    leftovers: int = 0
    why: str = ""


def children_gone(pids: dict[str, int], bound_s: float = 30.0) -> int:
    """How many of `pids` are still alive after `bound_s` (SIGKILLed then)."""
    deadline = time.monotonic() + bound_s
    while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling other processes' exits
    left = [p for p in pids.values() if alive(p)]
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return len(left)


def check_log_kept(up: Up, r: Round, n: int, last_end: int) -> None:
    """Create this round's topic, describe every round's, verify the whole log (the
    banner's own commands, so with its certificates); `r.kept` if all of it held."""
    describe = up.command("describe")
    at = describe[describe.index("--bootstrap-controller") :]
    made = metactl("topics", "create", "--topic", f"keep-{n}", "--partitions", "1",
                   "--replication-factor", "1", *at)  # fmt: skip
    if made.returncode != 0:
        r.why += f" topics create: {made.stderr.strip()[:200]}"
    d = metactl(*describe)
    missing = [t for t in range(n + 1) if f"Topic: keep-{t}\t" not in d.stdout]
    if d.returncode != 0 or missing:
        r.why += f" describe {d.returncode}: missing keep-{missing} {d.stderr.strip()[:200]}"
    v = metactl("log", "verify", *up.command("log")[2:])  # log tail --data-dir URL ...
    found = re.search(r"offsets \[\d+, (\d+)\)", v.stdout)
    if v.returncode != 0 or found is None:
        r.why += f" log verify {v.returncode}: {v.stderr.strip()[:200]}"
    else:
        r.verify_end = int(found.group(1))
    r.kept = not r.why and r.verify_end is not None and r.verify_end >= last_end


def one_round(data: Path, n: int, listen: int, metrics: int, last_end: int) -> Round:
    r = Round(n, time.strftime("%H:%M:%S"))
    cmd = [*CLI, "cluster", "up", "--controllers", "3", "--etcd", "3", "--data-dir", str(data),
           "--listen", f"127.0.0.1:{listen}", "--metrics", f"127.0.0.1:{metrics}",
           "--kafka-base-port", "0"]  # fmt: skip
    started = time.monotonic()
    up = Up(cmd)
    pids: dict[str, int] = {}
    try:
        if not up.await_banner(UP_READY_TIMEOUT_S):
            status = up.proc.poll()
            r.why = f"not ready (exit {status}): " + " | ".join(up.err[-3:])
            return r
        r.ready_s = time.monotonic() - started
        pids = up.pids()
        try:
            check_log_kept(up, r, n, last_end)
        except (LookupError, ValueError, subprocess.TimeoutExpired) as exc:
            r.why += f" {type(exc).__name__}: {exc}"
    finally:
        stopping = time.monotonic()
        r.exit_status = up.interrupt(UP_STOP_TIMEOUT_S)
        r.stop_s = time.monotonic() - stopping
        r.leftovers = children_gone(pids)
    return r


def cluster_up_rounds(root: Path, rounds: int) -> None:
    print(
        f"2. `metactl cluster up --controllers 3 --etcd 3 --data-dir D` (3 brokers, mutual "
        f"TLS, etcd over TLS), SIGINT, again on D: 1 first start + {rounds} resumes",
        flush=True,
    )
    data = root / "up"
    base = free_block(3 + 6)  # 3 listeners, then /metrics of 3 controllers and 3 brokers
    listen, metrics = base, base + 3
    results: list[Round] = []
    last_end = 0
    for n in range(rounds + 1):
        r = one_round(data, n, listen, metrics, last_end)
        results.append(r)
        if r.verify_end is not None:
            last_end = max(last_end, r.verify_end)
        ready = f"ready in {r.ready_s:.1f} s" if r.ready_s is not None else "NOT READY"
        print(
            f"   {'start ' if n == 0 else 'resume'} {n:>2} at {r.started}: "
            f"{ready}; previous topics kept: {'yes' if r.kept else 'NO'}; log end "
            f"{r.verify_end}; SIGINT -> exit {r.exit_status} in {r.stop_s:.1f} s; "
            f"children left {r.leftovers}" + (f"; {r.why.strip()}" if r.why else ""),
            flush=True,
        )
    resumes = results[1:]
    good = [r for r in resumes if r.ready_s is not None and r.kept]
    clean = [r for r in results if r.exit_status == 0 and r.leftovers == 0]
    starts = [r.ready_s for r in results if r.ready_s is not None]
    print(f"   start -> ready: {summary(starts)}")
    stops = [r.stop_s for r in results if r.ready_s is not None]
    print(f"   SIGINT -> exit (the rounds that were ready): {summary(stops)}")
    print(
        f"   => resumes that reached ready and kept the log: {len(good)} of {len(resumes)} "
        f"(goal {len(resumes)} of {len(resumes)}); clean exits {len(clean)} of {len(results)}",
        flush=True,
    )


def git(*args: str) -> str:
    r = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, check=False)
    return r.stdout.strip() + "\n" if r.returncode == 0 else "?"


def fmt_load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ha-storage-") as d:
        root = Path(d)
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--short", "--untracked-files=no").count("\n")
        print(
            f"python {sys.version.split()[0]}; tree {head} with {dirty} modified file(s); "
            f"load average {fmt_load()}",
            flush=True,
        )
        if args.only in (None, "restarts"):
            await standby_restarts_and_dumps(root, args)
            print(f"   load average {fmt_load()}", flush=True)
        if args.only in (None, "up"):
            cluster_up_rounds(root, args.rounds)
            print(f"   load average {fmt_load()}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--restarts", type=int, default=100, help="standby restarts (default 100)")
    ap.add_argument("--dumps", type=int, default=100, help="log dumps (default 100)")
    ap.add_argument("--rate", type=float, default=40.0, help="writes/s (default 40)")
    ap.add_argument("--rounds", type=int, default=10, help="cluster up resumes (default 10)")
    ap.add_argument("--only", choices=("restarts", "up"), default=None, help="one part only")
    args: Any = ap.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
