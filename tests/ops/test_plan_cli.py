"""`metactl plan restart` and `metactl plan roll` against a live controller (real TCP):
the tables, `--json`, the verdict exit status (3: not safe / blocked), and the named
errors with their statuses."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse
from tests.service.test_operator_cli import metactl, register


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[str]:
    """Brokers 1-3; t: [1,2,3], [2,3,1] at MinISR 2; b: [1,2] at MinISR 2 (RF = MinISR:
    neither 1 nor 2 can go without taking b-0 under MinISR)."""
    svc = ControllerService(
        tmp_path, "127.0.0.1:0", config=ControllerConfig(broker_session_timeout_ms=3_600_000)
    )
    await svc.start()
    host, port = parse_address(svc.address)
    conn = await RpcClient.open(host, port)
    for b in (1, 2, 3):
        await register(conn, b, f"i{b}")
    r = await conn.request(
        CreateTopicsRequest(
            topics=[
                CreateTopic(name="t", assignments=[[1, 2, 3], [2, 3, 1]], min_isr=2),
                CreateTopic(name="b", assignments=[[1, 2]], min_isr=2),
            ]
        )
    )
    assert isinstance(r, CreateTopicsResponse) and all(t.error_code is None for t in r.results)
    await conn.close()
    yield svc.address
    await svc.stop()


async def test_plan_restart_tables_json_and_verdict(service: str) -> None:
    rc, out, err = await metactl("plan", "restart", "--broker", "3", "--controller", service)
    assert (rc, err) == (0, ""), err
    assert out.startswith("Restart of broker 3, planned from the committed log at offset ")
    assert "it hosts 2 partition(s) and leads 0." in out
    assert "CLEAN restart: controlled shutdown of broker 3; clean registration" in out
    assert "UNCLEAN restart (a crash): fence of broker 3 (its session timed out)" in out
    assert out.count("Under MinISR while it is down (acks=all refused): 0") == 2

    rc, out, err = await metactl("plan", "restart", "--broker", "1", "--controller", service)
    assert rc == 3 and err == ""  # not safe: b-0 goes under MinISR
    lines = out.splitlines()
    at = lines.index("  Under MinISR while it is down (acks=all refused): 1")
    assert lines[at + 1].split() == [
        "PARTITION", "MINISR", "LEADER", "ISR", "ELR", "LASTKNOWNELR", "NOTE"
    ]  # fmt: skip
    assert lines[at + 2].split() == ["b-0", "2", "1→2", "1,2→2", "1", "-"]

    rc, out, _ = await metactl(
        "plan", "restart", "--broker", "1", "--json", "--limit", "0", "--controller", service
    )
    doc = json.loads(out)
    assert rc == 3 and doc["broker_id"] == 1 and doc["leads"] == 2
    assert doc["clean"]["under_min_isr"] == {"count": 1, "partitions": []}
    assert doc["unclean"]["kind"] == "unclean"


async def test_plan_roll_tables_json_and_verdict(service: str) -> None:
    rc, out, err = await metactl("plan", "roll", "--controller", service)
    assert rc == 3 and err == "", err  # blocked: 1 and 2
    assert "restart these 1 broker(s) one at a time" in out
    assert "step 1 awaits broker 3 back in: t 0,1" in out
    assert "BLOCKED: broker(s) 1,2 cannot be restarted" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("b-0"))
    assert row.split() == ["b-0", "2", "1", "1,2", "1,2", "1,2"]

    rc, out, _ = await metactl("plan", "roll", "--json", "--controller", service)
    doc = json.loads(out)
    assert rc == 3
    assert [s["broker_id"] for s in doc["steps"]] == [3]
    assert doc["steps"][0]["awaits"] == [{"topic": "t", "partitions": [0, 1]}]
    assert doc["blocked"] == [1, 2] and doc["blocking"][0]["blocks"] == [1, 2]


async def test_plan_errors_are_one_line_with_the_table_status(service: str) -> None:
    rc, _, err = await metactl("plan", "restart", "--broker", "9", "--controller", service)
    assert rc == 4 and err.startswith("error: BROKER_ID_NOT_REGISTERED: ")
    assert err.count("\n") == 1
    rc, _, err = await metactl("plan", "roll", "--limit", "-1", "--controller", service)
    assert rc == 1 and err.startswith("error: INVALID_REQUEST: ")
    rc, _, err = await metactl("plan", "restart", "--controller", service)
    assert rc == 2 and "--broker" in err


def test_the_tables_say_what_each_recovery_needs() -> None:
    """The notes of a restart plan's unclean-recovery and ELR rows, from plans made in
    this process (tests/planning derives the plans themselves)."""
    from ops.plan_cmds import restart_lines, roll_lines
    from planning.restart import plan_restart
    from planning.roll import plan_roll
    from tests.controller.testkit import Cluster

    c = Cluster()
    c.start(1, 2)
    c.create("bal", assignments=[[1]], min_isr=1)
    c.create("pro", assignments=[[1]], min_isr=1, recovery_strategy="proactive")
    c.create("man", assignments=[[1]], min_isr=1, recovery_strategy="manual")
    text = "\n".join(restart_lines(plan_restart(c.image, 1, rules=c.rules, now_ms=0)))
    clean, unclean = text.split("UNCLEAN restart")
    assert "1 elected from the ELR on broker 1's return" in clean
    assert (
        "proactive: inspects 1 for 1000 ms, then elects the best log "
        "(unless broker 1 is back first)" in clean
    )
    assert "bal-0" in unclean and "balanced: waits for the logs of 1, then elects" in unclean
    assert "manual: only an operator's unclean election (metactl elect)" in unclean
    assert "proactive: inspects 1 for 1000 ms, then elects the best log\n" in unclean + "\n"
    roll = "\n".join(roll_lines(plan_roll(c.image, rules=c.rules, now_ms=0)))
    assert "BLOCKED: broker(s) 1 cannot be restarted" in roll
    assert roll.splitlines()[0].startswith("Roll planned from the committed log at offset ")
