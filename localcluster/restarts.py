"""Bringing a child of a running `cluster up` back: `metactl broker start --id N` and
`metactl controller start --node-id cN`, asked through the control socket
(`localcluster.control`).

`Restarts.answer` is the control socket's handler: ``{"start_broker": N}`` or
``{"start_controller": "cN"}``. The child is started again with the command line
`cluster up` recorded for it (its ports pinned to those it bound first, so it comes back
where the brokers, the other controllers and Prometheus look), as `cluster up`'s own
supervised child (its death reported, stopped in order on Ctrl-C), and the answer comes
once it is ready (its READY line). A controller of a quorum on etcd comes back a
standby. Refusals are named: an id the cluster does not run is INVALID_CONFIG, one that
runs (or is being started) INVALID_REQUEST, one that does not get ready
CLUSTER_START_FAILED with the end of its log.

It starts processes only through the supervisor's `spawn`; it decides nothing else.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from localcluster.children import Child
from metactl.errors import InvalidConfigurationError, InvalidRequestError

if TYPE_CHECKING:
    from localcluster.supervisor import ClusterUp

__all__ = ["Restarts"]


class Restarts:
    """The restarts of one `cluster up`'s children."""

    def __init__(self, up: ClusterUp) -> None:
        self.up = up
        self._restarting: set[str] = set()  # children being started again, by name

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The control socket's answer to one request."""
        broker, node = request.get("start_broker"), request.get("start_controller")
        if isinstance(broker, int) and not isinstance(broker, bool):
            child = await self.broker(broker)
        elif isinstance(node, str):
            child = await self.controller(node)
        else:
            raise InvalidRequestError(f"unknown control request {request!r}")
        return {"ok": True, "pid": child.proc.pid, "ready": child.ready, "log": str(child.log_path)}

    async def broker(self, broker_id: int) -> Child:
        """Broker `broker_id` started again with its recorded command line."""
        up = self.up
        cmd = up.broker_cmds.get(broker_id)
        if cmd is None:
            ids = ", ".join(map(str, sorted(up.broker_cmds))) or "none"
            raise InvalidConfigurationError(
                f"this cluster runs brokers {ids}: there is no broker {broker_id} to start"
            )
        child = await self._restart(f"broker {broker_id}", "broker", cmd, "broker start")
        up.note_broker_ready(child, child.ready)
        up.write_record()
        return child

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
