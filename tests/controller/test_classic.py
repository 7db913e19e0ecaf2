"""Kafka's classic, pre-KIP-966 rules (`--eligible-leader-replicas disabled`), kept so that
the safety comparison can run both on the same faults; and classic unclean election."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from controller.core.config import ControllerConfig
from controller.core.recovery.builtin import CLASSIC_UNCLEAN
from controller.core.recovery.tracker import PendingRecovery
from controller.runtime.serve import add_arguments, config_from
from controller.runtime.serve import main as serve_main
from metactl.errors import InvalidConfigurationError
from metactl.settings import resolve
from metadata_log.records import NO_LEADER, ElectionKind, LeaderRecoveryState, UncleanRecoveryRecord

from .testkit import Cluster

CLASSIC = ControllerConfig(eligible_leader_replicas=False)
CLASSIC_UNCLEAN_ON = ControllerConfig(eligible_leader_replicas=False, unclean_leader_election=True)


def cluster(config: ControllerConfig) -> Cluster:
    c = Cluster(config)
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    return c


def test_unclean_leader_election_needs_the_classic_rules() -> None:
    with pytest.raises(InvalidConfigurationError, match="classic-mode"):
        ControllerConfig(unclean_leader_election=True)


def test_no_elr_below_min_isr_and_the_last_isr_member_stays() -> None:
    c = cluster(CLASSIC)
    c.alter([1, 3])
    c.alter([1])  # below MinISR: KIP-966 would put 3 in the ELR
    assert c.p().isr == {1} and not c.p().elr and not c.p().last_known_elr
    c.fence(1)
    p = c.p()
    assert p.leader == NO_LEADER and p.isr == {1} and not p.elr
    assert not c.tracker.pending  # no KIP-966 recovery starts: the ISR is not empty


def test_a_fenced_follower_still_leaves_the_isr() -> None:
    c = cluster(CLASSIC)
    c.fence(3)
    assert c.p().isr == {1, 2} and c.p().leader == 1 and not c.p().elr


def test_the_last_isr_member_is_elected_again_even_after_an_unclean_restart() -> None:
    # The "last replica standing" loss: no Unclean Exclusion without an ELR.
    c = cluster(CLASSIC)
    c.alter([1])
    c.fence(1)
    c.register(1, clean=False)
    assert c.p().leader == NO_LEADER
    c.unfence(1)
    p = c.p()
    assert p.leader == 1 and p.isr == {1}
    assert p.recovery_state is LeaderRecoveryState.RECOVERED  # nothing reported
    assert not any(isinstance(r, UncleanRecoveryRecord) for r in c.log)


def test_with_elr_the_same_faults_keep_the_lossy_replica_out() -> None:
    c = cluster(ControllerConfig())
    c.alter([1, 3])
    c.alter([1])
    c.fence(1)  # 3 is elected from the ELR (case B)
    c.register(1, clean=False)
    c.unfence(1)
    assert c.p().leader == 3 and 1 not in c.p().isr and 1 in c.p().last_known_elr


def test_classic_unclean_election_elects_the_first_live_replica_at_once() -> None:
    c = cluster(CLASSIC_UNCLEAN_ON)
    c.alter([1])
    c.fence(1)
    recovery = [r for r in c.log if isinstance(r, UncleanRecoveryRecord)]
    assert len(recovery) == 1
    r = recovery[0]
    assert (r.strategy, r.chosen, r.candidates, r.trigger) == (
        "unclean_leader_election",
        2,
        [],
        "no_live_isr_member",
    )
    p = c.p()
    assert p.leader == 2 and p.isr == {2}
    assert p.recovery_state is LeaderRecoveryState.RECOVERING
    assert c.last is not None and not c.last.inspections  # nobody's log is asked for
    assert [e.kind for e in c.last.delta.elections] == [ElectionKind.UNCLEAN_RECOVERY]


def test_classic_unclean_election_waits_for_a_live_replica() -> None:
    c = cluster(CLASSIC_UNCLEAN_ON)
    c.fence(2)
    c.fence(3)
    assert c.p().isr == {1}
    c.fence(1)
    assert c.p().leader == NO_LEADER and c.p().isr == {1}
    assert ("t", 0) in c.tracker.pending  # waiting: nobody is live
    c.register(3, clean=False)
    c.unfence(3)
    assert c.p().leader == 3 and c.p().recovery_state is LeaderRecoveryState.RECOVERING
    assert not c.tracker.pending


def test_a_live_isr_member_is_a_clean_leader_not_an_unclean_one() -> None:
    c = cluster(CLASSIC_UNCLEAN_ON)
    c.alter([1])
    c.fence(1)  # unclean: 2 is elected
    assert c.p().leader == 2
    image, p = c.image, c.p()
    assert CLASSIC_UNCLEAN.trigger(image, p) is None  # it has a leader
    c.fence(2)  # the ISR is {2}: fenced, stays; 3 is live, so unclean again
    assert c.p().leader == 3
    c.register(2, clean=True)
    c.unfence(2)
    assert CLASSIC_UNCLEAN.window_ms(1000) is None
    assert CLASSIC_UNCLEAN.candidates(c.image, c.p()) == frozenset()


def test_the_classic_policy_does_not_act_while_an_isr_member_is_live() -> None:
    c = cluster(CLASSIC_UNCLEAN_ON)
    pending = PendingRecovery(
        topic="t", partition=0, strategy=CLASSIC_UNCLEAN.name, trigger="x", since_ms=0,
        started_ms=0, deadline_ms=None,
    )  # fmt: skip
    # A leaderless view of a partition whose ISR member 1 is live: no trigger.
    leaderless = msgspec.structs.replace(c.p(), leader=NO_LEADER)
    assert CLASSIC_UNCLEAN.trigger(c.image, leaderless) is None
    assert CLASSIC_UNCLEAN.decide(c.image, leaderless, pending, 0).broker_id == 1  # type: ignore[union-attr]


def test_serve_refuses_unclean_election_with_elr_on_as_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve_main(["--data-dir", str(tmp_path), "--listen", "127.0.0.1:0",
                       "--unclean-leader-election"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "INVALID_CONFIG" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def test_serve_flags_select_the_classic_rules() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--data-dir", "d", "--eligible-leader-replicas", "disabled",
                         "--unclean-leader-election"])  # fmt: skip
    # What the entry point does before reading them: --config and METACTL_* fill the rest.
    assert config_from(resolve(p, args, {})) == CLASSIC_UNCLEAN_ON
    assert config_from(resolve(p, p.parse_args(["--data-dir", "d"]), {})) == ControllerConfig()
