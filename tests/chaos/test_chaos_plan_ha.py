"""The HA fault plan of `metactl chaos run --controllers N --etcd M` (`chaos.plan`):
its faults on controllers and etcd members, their bounds, the schedule format for them,
and the port plan (`chaos.processes.port_plan`). Pure: no processes.
"""

from __future__ import annotations

import itertools
import random

import pytest

from chaos.plan import (
    BUILTIN,
    CONTROLLER_OPS,
    ETCD_OPS,
    Step,
    check_brokers,
    parse_steps,
    random_plan,
)
from chaos.processes import port_plan
from metactl.errors import InvalidConfigurationError


def plan(seed: int, controllers: int = 1, etcd: int = 0) -> list[Step]:
    return random_plan(
        random.Random(seed),
        brokers=5,
        rf=3,
        duration_s=600,
        lossy_kills=25,
        session_s=1.5,
        controllers=controllers,
        etcd=etcd,
    )


def test_one_controller_without_etcd_has_no_ha_faults() -> None:
    for seed in range(10):
        assert not [s for s in plan(seed) if s.op in ETCD_OPS or s.op == "pause_controller"]
        assert all(s.role is None for s in plan(seed))


def test_ha_plans_aim_at_every_role_within_bounds() -> None:
    steps = [s for seed in range(5) for s in plan(seed, controllers=3, etcd=3)]
    roles = {(s.op, s.role) for s in steps if s.op in CONTROLLER_OPS + ETCD_OPS}
    assert roles == {
        ("kill_controller", "active"), ("kill_controller", "standby"),
        ("pause_controller", "active"), ("pause_controller", "standby"),
        ("kill_etcd", "leader"), ("kill_etcd", "follower"),
        ("pause_etcd", "leader"), ("pause_etcd", "follower"),
    }  # fmt: skip
    for seed in range(5):
        p = plan(seed, controllers=3, etcd=3)
        ha = [s for s in p if s.op in CONTROLLER_OPS + ETCD_OPS]
        assert len(ha) >= 40  # 600 s: the goal for a 10-minute run
        for ops in (CONTROLLER_OPS, ETCD_OPS):
            # One at a time (3 members keep a quorum with one down): each is over before
            # the next begins.
            spans = [
                (s.at_s or 0.0, (s.at_s or 0.0) + (s.down_s or s.pause_s)) for s in p if s.op in ops
            ]
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_no_etcd_faults_without_a_quorum_to_keep() -> None:
    for seed in range(5):
        assert not [s for s in plan(seed, controllers=3, etcd=1) if s.op in ETCD_OPS]


def test_schedule_steps_name_roles_and_targets() -> None:
    steps = parse_steps(
        [
            {"op": "kill_controller", "role": "standby", "down_s": 1},
            {"op": "pause_etcd", "member": 2, "pause_s": 3},
        ],
        "s.json",
    )
    assert steps[0].role == "standby" and steps[1].member == 2
    with pytest.raises(InvalidConfigurationError, match="must be one of leader, follower"):
        parse_steps([{"op": "kill_etcd", "role": "active"}], "s.json")
    with pytest.raises(InvalidConfigurationError, match="takes no 'role'"):
        parse_steps([{"op": "kill", "broker": 1, "role": "leader"}], "s.json")
    with pytest.raises(InvalidConfigurationError, match="no --etcd"):
        check_brokers(BUILTIN["ha-outage"], 3)
    check_brokers(BUILTIN["ha-outage"], 3, controllers=3, etcd=3)
    with pytest.raises(InvalidConfigurationError, match="controller 4"):
        check_brokers([Step(op="kill_controller", controller=4)], 3, controllers=3)


def test_port_plan_pins_every_port_from_the_base() -> None:
    p = port_plan(30_000, controllers=3, etcd=3, brokers=5)
    assert p.controllers == [(30_000, 30_001), (30_002, 30_003), (30_004, 30_005)]
    assert p.etcd_base == 30_006  # 30006..30011: client and peer port of each member
    assert p.brokers == {1: 30_012, 2: 30_013, 3: 30_014, 4: 30_015, 5: 30_016}
    single = port_plan(30_000, controllers=1, etcd=0, brokers=3)
    assert single.etcd_base is None and single.brokers[1] == 30_002
    with pytest.raises(InvalidConfigurationError, match="--base-port 65530"):
        port_plan(65_530, controllers=3, etcd=3, brokers=5)
    free = port_plan(None, controllers=3, etcd=3, brokers=5)
    assert len({port for pair in free.controllers for port in pair}) == 6
    assert free.etcd_base is None and set(free.brokers.values()) == {0}
