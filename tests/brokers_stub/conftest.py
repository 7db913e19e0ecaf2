"""Fixtures shared by the stub broker's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.brokers_stub.fake_controller import FakeController


@pytest.fixture
async def controller() -> AsyncIterator[FakeController]:
    """A scripted fake controller service, listening on a free port."""
    c = FakeController()
    await c.start()
    yield c
    await c.stop()
