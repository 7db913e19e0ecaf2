"""Bringing a child of a running `cluster up` back: `metactl broker start --id N` and
`metactl controller start --node-id cN`; and restarting a running broker for `metactl
roll`; all asked through the control socket (`localcluster.control`).

`Restarts.answer` is the control socket's handler:

* ``{"start_broker": N}`` or ``{"start_controller": "cN"}``: the child is started again
  with the command line `cluster up` recorded for it (its ports pinned to those it bound
  first, so it comes back where the brokers, the other controllers and Prometheus look),
  as `cluster up`'s own supervised child (its death reported, stopped in order on
  Ctrl-C), and the answer comes once it is ready (its READY line). A controller of a
  quorum on etcd comes back a standby.
* ``{"restart_broker": N}`` (`metactl roll`'s step): broker N, running, is stopped
  cleanly (SIGTERM: its controlled shutdown; SIGKILL if it outlives the stop bound, as
  on Ctrl-C), its exit awaited, then started again as above; the answer adds how it
  stopped (``"stopped": {"pid", "status", "exit", "clean", "seconds"}``). The restart
  runs as a task of `cluster up`'s own, not of the asking connection: a client that goes
  away (Ctrl-C, kill -9) never leaves the broker down.
* ``{"await_broker": N}``: waits for a restart of broker N in progress, if any, then
  answers whether it runs (``"running"``, ``"pid"``): how an interrupted roll makes sure
  of the broker it was restarting.

Refusals are named: an id the cluster does not run is INVALID_CONFIG; one that runs (for
a start), does not run (for a restart) or is being started or restarted already
INVALID_REQUEST; one that does not get ready CLUSTER_START_FAILED with the end of its
log. Once `cluster up` stops (`close`), work in progress is cancelled and nothing more is
started.

It starts processes only through the supervisor's `spawn`, and stops only the broker it
is asked to restart; it decides nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from localcluster.children import STOP_TIMEOUT_S, Child, exit_text
from metactl.errors import InvalidConfigurationError, InvalidRequestError

if TYPE_CHECKING:
    from localcluster.supervisor import ClusterUp

__all__ = ["Restarts"]

T = TypeVar("T")


def _an_id(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class Restarts:
    """The restarts of one `cluster up`'s children."""

    def __init__(self, up: ClusterUp) -> None:
        self.up = up
        self._restarting: set[str] = set()  # children being started again, by name
        self._rolling: dict[int, asyncio.Task[dict[str, Any]]] = {}  # broker restarts
        self._tasks: set[asyncio.Task[Any]] = set()  # all the work in progress
        self._closed = False

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The control socket's answer to one request."""
        if self._closed:
            raise InvalidRequestError("cluster up is stopping")
        broker, node = request.get("start_broker"), request.get("start_controller")
        restart, wait = request.get("restart_broker"), request.get("await_broker")
        if _an_id(broker):
            child = await self._run(self.broker(broker))
        elif isinstance(node, str):
            child = await self._run(self.controller(node))
        elif _an_id(restart):
            return await self.restart_broker(restart)
        elif _an_id(wait):
            return await self.await_broker(wait)
        else:
            raise InvalidRequestError(f"unknown control request {request!r}")
        return ready(child)

    async def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` as a task of `cluster up`'s (`close` cancels it), which goes on if the
        asking connection goes away."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def close(self) -> None:
        """No more work; the work in progress cancelled (`cluster up` is stopping, and
        stops every child in order itself)."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def broker(self, broker_id: int, by: str = "broker start") -> Child:
        """Broker `broker_id` started again with its recorded command line."""
        up = self.up
        cmd = self._broker_cmd(broker_id, "start")
        child = await self._restart(f"broker {broker_id}", "broker", cmd, by)
        up.note_broker_ready(child, child.ready)
        up.write_record()
        return child

    def _broker_cmd(self, broker_id: int, what: str) -> list[str]:
        cmd = self.up.broker_cmds.get(broker_id)
        if cmd is None:
            ids = ", ".join(map(str, sorted(self.up.broker_cmds))) or "none"
            raise InvalidConfigurationError(
                f"this cluster runs brokers {ids}: there is no broker {broker_id} to {what}"
            )
        return cmd

    async def restart_broker(self, broker_id: int) -> dict[str, Any]:
        """Broker `broker_id` stopped cleanly and started again (`metactl roll`)."""
        self._broker_cmd(broker_id, "restart")
        name = f"broker {broker_id}"
        if broker_id in self._rolling or name in self._restarting:
            raise InvalidRequestError(f"{name} is being restarted already")
        alive = [c for c in self.up.named(name) if c.proc.poll() is None]
        if not alive:
            raise InvalidRequestError(
                f"{name} is not running: `metactl broker start --id {broker_id}` starts it"
            )
        task = asyncio.create_task(self._stop_and_start(broker_id, alive[0]))
        self._rolling[broker_id] = task
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if self._rolling.get(broker_id) is t:
                del self._rolling[broker_id]

        task.add_done_callback(done)
        return await asyncio.shield(task)

    async def await_broker(self, broker_id: int) -> dict[str, Any]:
        """Once a restart of broker `broker_id` in progress (if any) has ended: whether it
        runs, and its pid."""
        self._broker_cmd(broker_id, "await")
        task = self._rolling.get(broker_id)
        if task is not None:
            with contextlib.suppress(Exception):  # its own asker hears how it went
                await asyncio.shield(task)
        alive = [c for c in self.up.named(f"broker {broker_id}") if c.proc.poll() is None]
        return {"ok": True, "running": bool(alive), "pid": alive[0].proc.pid if alive else None}

    async def _stop_and_start(self, broker_id: int, child: Child) -> dict[str, Any]:
        stopped = await self._stop(child, "roll")
        started = await self.broker(broker_id, by="roll")
        return {**ready(started), "stopped": stopped}

    async def _stop(self, child: Child, by: str) -> dict[str, Any]:
        """`child` stopped as Ctrl-C stops it (SIGTERM; SIGKILL after the bound), its exit
        awaited: how it ended, and how long it took."""
        child.reported = True  # its end is this stop, not a death to report
        pid = child.proc.pid
        kind = " (controlled shutdown)" if child.kind == "broker" else ""
        print(f"   {child.name} stopping for `metactl {by}`{kind}, pid {pid}…", flush=True)
        began = time.monotonic()
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
        killed = False
        try:
            status = await asyncio.to_thread(child.proc.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"   {child.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it",
                  flush=True)  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            status = await asyncio.to_thread(child.proc.wait)
            killed = True
        seconds = time.monotonic() - began
        print(f"   {child.name} stopped ({seconds:.1f} s, {exit_text(status)})", flush=True)
        return {
            "pid": pid,
            "status": exit_text(status),
            "exit": status,
            "clean": status == 0 and not killed,
            "seconds": round(seconds, 3),
        }

    async def controller(self, node_id: str) -> Child:
        """Controller `node_id` ("c2": controller 2, as `cluster up` numbers them and
        names them with --node-id on etcd) started again with its recorded command line."""
        up = self.up
        numbers = {f"c{n}": n for n in up.controller_cmds}
        n = numbers.get(node_id)
        if n is None:
            ids = ", ".join(sorted(numbers, key=numbers.__getitem__)) or "none"
            raise InvalidConfigurationError(
                f"this cluster runs controllers {ids}: there is no controller {node_id!r} to start"
            )
        name = up.controller_name(n)
        child = await self._restart(name, "controller", up.controller_cmds[n], "controller start")
        up.note_controller_ready(n, child.ready)
        up.write_record()
        return child

    async def _restart(self, name: str, kind: str, cmd: list[str], by: str) -> Child:
        """`name` started again with `cmd`, and ready: INVALID_REQUEST while it runs or is
        being started; CLUSTER_START_FAILED if it does not get ready."""
        up = self.up
        alive = [c for c in up.named(name) if c.proc.poll() is None]
        if alive:
            pid = alive[0].proc.pid
            stop = "a controlled shutdown" if kind == "broker" else "a clean stop"
            raise InvalidRequestError(
                f"{name} is running (pid {pid}): stop it first (kill {pid} for {stop}, "
                f"kill -9 {pid} for a crash)"
            )
        if name in self._restarting:
            raise InvalidRequestError(f"{name} is being started already")
        for report in up.deaths():  # its death, if not told yet, before its restart
            print(report, flush=True)
        self._restarting.add(name)
        try:
            for old in up.named(name):
                up.children.remove(old)
                if old.proc.stdout is not None:
                    old.proc.stdout.close()
                if old.log_file is not None:
                    old.log_file.close()
            # Spawned from the event loop's thread, which lives as long as `cluster up`
            # (`setpriv --pdeathsig` follows the thread that forks).
            child = up.spawn(name, kind, cmd)
            print(f"   {name} started again by `metactl {by}` (pid {child.proc.pid})", flush=True)
            await asyncio.to_thread(up.await_ready, child)
            return child
        finally:
            self._restarting.discard(name)


def ready(child: Child) -> dict[str, Any]:
    """The answer for a child started and ready."""
    return {"ok": True, "pid": child.proc.pid, "ready": child.ready, "log": str(child.log_path)}
