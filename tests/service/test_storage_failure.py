"""A single controller whose SQLite log stops taking writes (issue 21 item 7): it steps
down at once and answers writes with FATAL_STORAGE_ERROR (never accepting what it cannot
make durable), reopens the log a bounded number of times, and either becomes active again
or marks itself failed, so that `controller serve` exits 1 with the error. The fault is a
real SQLite one: `PRAGMA query_only` on the writer's connection makes every write fail
with SQLITE_READONLY, as a read-only file does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime import service as service_module
from controller.runtime.service import ControllerService
from metactl.errors import FatalStorageError, LogSchemaError, StorageError
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from protocol.address import parse_address
from protocol.client import NO_RETRY, RpcClient
from protocol.messages.broker_controller import RegisterBroker, RegisterBrokerResponse
from tests.brokers_stub.helpers import eventually


async def make_read_only(svc: ControllerService) -> None:
    store = svc.store
    assert isinstance(store, SqliteLogStore)
    await store._write(lambda conn: conn.execute("PRAGMA query_only = ON"), "testing")


async def register(conn: RpcClient, broker_id: int) -> RegisterBrokerResponse:
    r = await conn.request(RegisterBroker(broker_id=broker_id, incarnation_id=f"i{broker_id}"))
    assert isinstance(r, RegisterBrokerResponse)
    return r


@pytest.fixture(autouse=True)
def quick_reopen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "STORAGE_REOPEN_BACKOFF_S", 0.05)


async def test_a_failed_log_steps_down_then_reopens_and_serves(tmp_path: Path) -> None:
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=ControllerConfig())
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address), retry=NO_RETRY)
    try:
        await register(conn, 1)
        await make_read_only(svc)
        with pytest.raises(StorageError):
            await register(conn, 2)  # its append fails: nothing acknowledged
        await eventually(lambda: svc.acting, timeout_s=30, what="active again")
        assert svc.storage_failure is None and not svc.failed.is_set()
        r = await register(conn, 2)  # the reopened log takes writes
        assert r.broker_epoch > 0
        assert 2 in svc.controller.committed_image.brokers
    finally:
        await conn.close()
        await svc.stop()


async def test_a_log_that_cannot_be_reopened_fails_the_service(tmp_path: Path) -> None:
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=ControllerConfig())
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address), retry=NO_RETRY)
    try:
        await register(conn, 1)
        # The file the log is reopened from is no longer a database (the open connection
        # keeps writing to the old inode until the fault).
        path = tmp_path / LOG_FILE_NAME
        path.rename(tmp_path / "moved-away.sqlite")
        path.write_bytes(b"not a database" * 100)
        await make_read_only(svc)
        with pytest.raises(StorageError):
            await register(conn, 2)
        async with asyncio.timeout(30):
            await svc.failed.wait()
        assert isinstance(svc.storage_failure, LogSchemaError)  # "not a metadata log"
        assert not svc.acting
        with pytest.raises(FatalStorageError, match="stopped taking writes"):
            await register(conn, 3)  # a write is refused by name, not redirected
    finally:
        await conn.close()
        await svc.stop()


async def test_a_log_deleted_while_serving_is_not_reopened_as_a_new_one(tmp_path: Path) -> None:
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=ControllerConfig())
    await svc.start()
    conn = await RpcClient.open(*parse_address(svc.address), retry=NO_RETRY)
    try:
        await register(conn, 1)
        (tmp_path / LOG_FILE_NAME).rename(tmp_path / "moved-away.sqlite")
        await make_read_only(svc)
        with pytest.raises(StorageError):
            await register(conn, 2)
        async with asyncio.timeout(30):
            await svc.failed.wait()
        assert svc.storage_failure is not None
        assert not (tmp_path / LOG_FILE_NAME).exists()  # no empty cluster was created
    finally:
        await conn.close()
        await svc.stop()
