"""Suite-wide fixtures. Kept minimal: each test directory owns its own helpers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from controller.runtime.process import configure_process
from localcluster.etcd import LocalEtcd

# What the controller's entry point sets for its process, set once for the test process.
configure_process()


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """CLI entry points configure structlog for their process; undo that after each test
    so that one test's log level or stream never leaks into the next."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    """One real etcd member on loopback for the whole run (Debian's etcd-server, which
    `make test` installs); tests keep apart by key prefix."""
    cluster = LocalEtcd(tmp_path_factory.mktemp("etcd"), 1).start()
    try:
        yield cluster
    finally:
        cluster.stop()
