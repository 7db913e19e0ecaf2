"""Fixtures of the audit tests: ONE local Spark session for the whole test run, and logs.

`spark` is session-scoped and shared: any test directory that needs Spark should use
this fixture (``from tests.audit.conftest import spark`` in its own conftest, or move it
to a common conftest) rather than start another JVM; it is stopped once, at the end of
the run. Logs with known answers are written once per session: the shipped scenarios
(real controller, real log), a small simulated history, crafted logs that break each
invariant, and a real cluster's log (real processes) with a topic deleted and created
again and a clean stop at its end (`tests.audit.real_logs`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit.cds import ENV_SWITCH
from tests.audit.logs import SCENARIOS, crafted_violations, run_scenario_log
from tests.audit.real_logs import StoppedLog, stopped_log

# No class-data sharing archive for the suite's JVMs (the one in the pytest process, the
# audits it runs as subprocesses): each would write ~160 MB to the user's cache at its
# exit. tests/audit/test_cds.py turns it on, with a cache directory of its own.
os.environ[ENV_SWITCH] = "off"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] session for every test (UI off, 4 shuffle partitions)."""
    from audit.spark import get_session

    session = get_session(
        "local[2]", app_name="metactl-audit-tests", shuffle_partitions=4, driver_memory="2g"
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def scenario_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every shipped scenario run once into its own data directory (named after it)."""
    root = tmp_path_factory.mktemp("scenarios")
    return {name: run_scenario_log(path, root / name) for name, path in SCENARIOS.items()}


@pytest.fixture(scope="session")
def crafted_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log whose partitions each break one rule (see `tests.audit.logs`)."""
    path = tmp_path_factory.mktemp("crafted") / "crafted"
    asyncio.run(crafted_violations(path))
    return path


@pytest.fixture(scope="session")
def sim_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A small simulated day: 5 brokers, 60 partitions, busy enough for recoveries."""
    from simulation.history import simulate_history
    from simulation.history_config import HistoryConfig

    path = tmp_path_factory.mktemp("sim") / "sim"
    cfg = HistoryConfig(brokers=5, partitions=60, days=1.0, seed=7, intensity=4.0, outages=2.0)
    report = asyncio.run(simulate_history(cfg, path))
    return path, report


@pytest.fixture(scope="session")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> StoppedLog:
    """A real cluster's log: a topic deleted and created again, an outage left open, and
    a clean stop at the end (`tests.audit.real_logs`)."""
    return stopped_log(tmp_path_factory.mktemp("stopped") / "stopped")
