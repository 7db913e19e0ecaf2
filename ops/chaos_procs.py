"""The real processes of a chaos run: one controller and N brokers, each in its own
process group, started, signalled, restarted and always stopped.

Every process is started with `start_new_session=True`, so its process group id is its
pid and a terminal's Ctrl-C never reaches it directly; `stop_all` (always called from a
`finally`) resumes what is paused, asks everything to stop (SIGTERM, brokers first) and
SIGKILLs what is still alive after a grace period. `pids` lists every pid ever started,
so that a caller can check none is left.

A broker killed with page-cache loss is restarted with `--lose-unflushed`: the stub
broker applies that flag when it loads its replicas at start (it drops every replica's
data above its last fsynced offset), so a "lossy" kill is SIGKILL + a restart with the
flag, and a plain kill (the OS kept the page cache) is SIGKILL + a restart without it.

The processes run with `--insecure` (plaintext, no principals): the chaos runner's
clients, its /metrics scrapes and its faults are about replication and recovery, not
authentication (`metactl cluster up` and tests/e2e run with mutual TLS).

This module owns process lifecycles only: it must not decide which fault comes when
(`chaos_plan`) or talk the metadata protocol (`chaos`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ops.procs import await_ready, start_process

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Short timeouts so that fences, elections and recoveries happen within seconds."""

    heartbeat_ms: int = 200
    session_ms: int = 1500
    flush_ms: int = 500
    replica_lag_ms: int = 1000
    recovery_window_ms: int = 500


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str] | None = None
    log_file: IO[str] | None = None
    state: str = "down"  # down | starting | up | paused

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    async def wait_exit(self, timeout_s: float) -> int | None:
        p = self.popen
        if p is None:
            return None
        try:
            return await asyncio.to_thread(p.wait, timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def release(self) -> None:
        """Close the pipes of an exited process."""
        if self.popen is not None and self.popen.stdout is not None:
            self.popen.stdout.close()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


@dataclass
class Processes:
    root: Path
    address: str  # the controller's HOST:PORT, kept across its restarts
    metrics: str  # the controller's /metrics HOST:PORT, kept too
    brokers: int
    strategy: str
    elr: bool
    unclean_leader_election: bool
    timing: Timing = field(default_factory=Timing)
    controller: Proc = field(default_factory=lambda: Proc("controller"))
    broker: dict[int, Proc] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.broker = {i: Proc(f"broker-{i}") for i in range(1, self.brokers + 1)}

    # --- commands -----------------------------------------------------------------------

    def controller_cmd(self) -> list[str]:
        t = self.timing
        cmd = [
            sys.executable, "-m", "controller", "--data-dir", str(self.root / "controller"),
            "--listen", self.address, "--metrics", self.metrics,
            "--heartbeat-interval-ms", str(t.heartbeat_ms),
            "--session-timeout-ms", str(t.session_ms),
            "--unclean-recovery-strategy", self.strategy,
            "--unclean-recovery-window-ms", str(t.recovery_window_ms),
            "--eligible-leader-replicas", "enabled" if self.elr else "disabled",
            "--insecure",
        ]  # fmt: skip
        if self.unclean_leader_election:
            cmd.append("--unclean-leader-election")
        return cmd

    def broker_cmd(self, broker_id: int, *, lose_unflushed: bool) -> list[str]:
        t = self.timing
        cmd = [
            sys.executable, "-m", "brokers_stub", "--id", str(broker_id),
            "--controller", self.address, "--data-dir", str(self.root / f"broker-{broker_id}"),
            "--heartbeat-interval-ms", str(t.heartbeat_ms),
            "--session-timeout-ms", str(t.session_ms),
            "--flush-interval-ms", str(t.flush_ms),
            "--replica-lag-time-max-ms", str(t.replica_lag_ms),
            "--insecure",
        ]  # fmt: skip
        if lose_unflushed:
            cmd.append("--lose-unflushed")
        return cmd

    # --- lifecycle ----------------------------------------------------------------------

    async def _launch(self, proc: Proc, cmd: list[str]) -> None:
        proc.release()
        proc.popen, proc.log_file = start_process(cmd, self.root / "logs" / f"{proc.name}.log")
        self.pids.append(proc.popen.pid)
        proc.state = "starting"
        try:
            await asyncio.to_thread(await_ready, proc.popen, proc.name, READY_TIMEOUT_S)
        except BaseException:
            # Not ready (or cancelled): do not leave it half-started.
            proc.signal(signal.SIGKILL)
            raise
        proc.state = "up"

    async def start_controller(self) -> None:
        await self._launch(self.controller, self.controller_cmd())

    async def start_broker(self, broker_id: int, *, lose_unflushed: bool = False) -> None:
        cmd = self.broker_cmd(broker_id, lose_unflushed=lose_unflushed)
        await self._launch(self.broker[broker_id], cmd)

    async def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL or SIGTERM) and wait until the process has exited."""
        if proc.state == "paused":
            proc.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        proc.signal(sig)
        if await proc.wait_exit(30.0) is None:
            proc.signal(signal.SIGKILL)
            await proc.wait_exit(10.0)
        proc.state = "down"
        proc.release()

    def pause(self, proc: Proc) -> None:
        proc.signal(signal.SIGSTOP)
        proc.state = "paused"

    def resume(self, proc: Proc) -> None:
        proc.signal(signal.SIGCONT)
        proc.state = "up"

    def started_pids(self) -> dict[str, int]:
        out = {}
        for p in (self.controller, *self.broker.values()):
            if p.pid is not None and p.alive():
                out[p.name] = p.pid
        return out

    async def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every process: resume, SIGTERM (brokers, then the controller), SIGKILL
        after `grace_s`. Safe to call more than once and after a partial start."""
        for group in (list(self.broker.values()), [self.controller]):
            for p in group:
                if p.alive():
                    p.signal(signal.SIGCONT)
                    p.signal(signal.SIGTERM)
            for p in group:
                if p.alive() and await p.wait_exit(grace_s) is None:
                    p.signal(signal.SIGKILL)
                    await p.wait_exit(5.0)
                p.state = "down"
                p.release()
