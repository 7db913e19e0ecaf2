"""The fault schedules of ``metactl simulate faults``: what one seeded run is made of.

A `Schedule` is everything one run needs besides the controller's `Mode`: the cluster
shape, each broker's flush interval, the background network (drop rate, delay bound and
so reordering), the list of `Fault`s: lossy kills (SIGKILL with the page cache lost),
plain kills (SIGKILL, page cache kept), controlled shutdowns, and network partitions (a
broker cut off from the controller, from the other brokers, or from everyone, or one
broker-to-broker link cut), and the list of lifecycle `Op`s an operator runs meanwhile:
min.insync.replicas changes of the topic and of the cluster default (raised, lowered,
above the replication factor, the topic's own deleted), reassignments and their
cancels, partition additions, topic deletes (each re-created after a while) and
unregistrations. `generate` derives a schedule from a seed alone, so every mode (classic
or ELR, any strategy) runs the very same schedules for a given seed; the faults and the
ops come from separate random streams, so `lifecycle_ops=0` gives exactly the faults of
the default.

Schedules are msgspec Structs, so a failing one is written as JSON and replayed with
``metactl simulate faults --replay FILE`` (`dump_replay`, `load_replay`).

This module owns the schedule format and its generation. It must not run anything: the
cluster lives in `simulation.faults_sim`, the runs and the report in `simulation.faults`.
Everything random comes from `random.Random` seeded with a string, never from the clock
or from hash order.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

FaultKind = Literal["lossy_kill", "kill", "shutdown", "isolate", "cut", "failover"]
IsolateScope = Literal["controller", "brokers", "all"]
OpKind = Literal[
    "topic_min_isr",
    "cluster_min_isr",
    "reassign",
    "cancel_reassignment",
    "add_partitions",
    "delete_topic",
    "unregister",
    "elr_feature_cycle",
]

LIFECYCLE_OPS: Final = 4  # lifecycle ops per generated schedule (--lifecycle-ops)
FAILOVERS: Final = 1  # controller failovers per generated schedule (--failovers)
ARM_MS: Final = 5_000  # a mid-transaction failover waits this long for a transaction

REPLAY_FORMAT: Final = "metactl-faults-schedule"


class Fault(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One injected fault. `for_ms`: how long the broker stays down (kills, shutdowns:
    counted from when it stops), the partition lasts (isolate, cut), or no controller is
    active (failover: from the active controller's death to the takeover).

    A `failover` (broker 0: the controller) kills the active controller; a standby takes
    over `for_ms` later from the durable log. With `mid_transaction` the controller dies
    instead between the first and the second slice of the next metadata transaction it
    opens (within `ARM_MS`; at its end if none opens), so that the log ends inside a
    transaction that the new controller must abort."""

    at_ms: int
    kind: FaultKind
    broker: int
    for_ms: int
    scope: IsolateScope | None = None  # isolate: from whom
    peer: int | None = None  # cut: the broker at the other end of the link
    mid_transaction: bool = False  # failover: die inside the next transaction


class Op(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One operator request, at `at_ms`, straight to the controller (as `metactl
    configs/topics/reassign/brokers` would send it). What it names may be gone by then
    (a partition of a deleted topic, a broker that is active): the controller refuses it
    and the run counts the refusal.

    - `topic_min_isr`: set the topic's min.insync.replicas to `value`, or delete it
      (`value` None: the topic follows the cluster default again);
    - `cluster_min_isr`: set the cluster default to `value` (even to the same value);
    - `reassign`: move `partition` to `replicas`; `cancel_reassignment`: cancel it;
    - `add_partitions`: grow the topic by `value` partitions;
    - `delete_topic`: delete the topic, and create it again `for_ms` later (new id,
      producers carry on against it);
    - `unregister`: unregister `broker` (refused unless it is fenced then);
    - `elr_feature_cycle`: switch eligible.leader.replicas.version to the other level
      (a downgrade to 0 where the ELR is on, an upgrade to 1 where it is off), and back
      `for_ms` later, so that the run ends under the mode's own rules. The window under
      the other rules is where an upgrade meets what the classic rules left behind (an
      ISR kept with a fenced last member)."""

    at_ms: int
    kind: OpKind
    value: int | None = None
    partition: int | None = None
    replicas: list[int] | None = None
    broker: int | None = None
    for_ms: int | None = None


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    seed: int  # seeds the network and the producers of the run
    brokers: int
    partitions: int
    faults: list[Fault]
    flush_ms: list[int]  # per broker (index 0 is broker 1): the OS/log flush interval
    drop: float = 0.0  # probability that a message is lost
    max_delay_ms: int = 20  # each message takes 1..max_delay_ms (so messages reorder)
    replication_factor: int = 3
    min_isr: int = 2
    fault_window_ms: int = 30_000  # faults happen before this; then everything heals
    heal_ms: int = 20_000  # after the window: restart everything, let it settle
    settle_ms: int = 5_000  # after the operator's elections, before the check
    ops: list[Op] = []  # lifecycle operations in the fault window (none in old replays)


class Mode(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's configuration for a run, and the test-only mutants."""

    strategy: str = "balanced"
    eligible_leader_replicas: bool = True
    unclean_leader_election: bool = False
    # Mutant (a): a broker restarting after a kill presents its previous broker epoch as
    # if it had shut down cleanly, which defeats Unclean Exclusion (section 5.1.2).
    lie_clean_shutdown: bool = False
    # Mutant (b): leaders advance the high watermark with min.insync.replicas taken as 1.
    hw_ignores_min_isr: bool = False
    # Mutant (c): a follower joins the ISR on being caught up at its last fetch, without
    # its log reaching the leader's high watermark (`replication.join_floor`). This was
    # the broker stub's rule until this simulator found the loss it allows.
    isr_join_ignores_hw: bool = False
    # The controller's work budget (partitions per event; None: the controller's default,
    # `controller.core.work.WORK_BUDGET`). A small one slices fences, shutdowns, unclean
    # registrations and creates into metadata transactions (KIP-868) even in these small
    # clusters, which a `mid_transaction` failover needs.
    work_budget: int | None = None

    @property
    def label(self) -> str:
        if not self.eligible_leader_replicas:
            unclean = "on" if self.unclean_leader_election else "off"
            name = f"classic, unclean election {unclean}"
        else:
            name = f"ELR, {self.strategy}"
        mutants = [
            m
            for m, on in (
                ("lie-clean-shutdown", self.lie_clean_shutdown),
                ("hw-ignores-min-isr", self.hw_ignores_min_isr),
                ("isr-join-ignores-hw", self.isr_join_ignores_hw),
            )
            if on
        ]
        if self.work_budget is not None:
            name += f", work budget {self.work_budget}"
        return name + (f" [mutant: {', '.join(mutants)}]" if mutants else "")


def schedule_seed(seed: int, index: int) -> int:
    """The seed of schedule `index` of a run seeded with `seed` (stable across versions
    of Python: string seeds are hashed with SHA-512, not `hash`)."""
    return random.Random(f"metactl-faults:{seed}:{index}").getrandbits(48)


def generate(
    seed: int, lossy_kills: int = 2, lifecycle_ops: int = LIFECYCLE_OPS, failovers: int = FAILOVERS
) -> Schedule:
    """A random schedule: 3-4 brokers, 1-2 partitions (RF 3, MinISR 2), `lossy_kills`
    lossy kills and 2-5 other faults in a 30 s window, `lifecycle_ops` lifecycle
    operations (`generate_ops`) and `failovers` controller failovers
    (`generate_failovers`; from a stream of their own, so `failovers=0` gives exactly the
    schedules of before).

    Half of the lossy kills are aimed at a broker other than one already partitioned
    away, while the partition lasts: that is how an ISR shrinks to its last member and
    then loses it (the Last Replica Standing problem). Half of the rest follow the
    previous lossy kill within 2 s (correlated failures, as in a power outage).
    """
    rnd = random.Random(f"metactl-faults-schedule:{seed}")
    brokers = rnd.choice((3, 3, 4))
    partitions = rnd.choice((1, 2))
    window = 30_000
    start = 2_000
    faults: list[Fault] = []
    for _ in range(rnd.randint(2, 5)):
        at = rnd.randrange(start, window)
        b = rnd.randint(1, brokers)
        roll = rnd.random()
        if roll < 0.45:
            scope: IsolateScope = rnd.choice(("controller", "brokers", "brokers", "all"))
            faults.append(
                Fault(
                    at_ms=at,
                    kind="isolate",
                    broker=b,
                    scope=scope,
                    for_ms=rnd.randint(3_000, 15_000),
                )
            )
        elif roll < 0.65:
            peer = rnd.choice([x for x in range(1, brokers + 1) if x != b])
            faults.append(
                Fault(at_ms=at, kind="cut", broker=b, peer=peer, for_ms=rnd.randint(3_000, 15_000))
            )
        elif roll < 0.85:
            faults.append(
                Fault(at_ms=at, kind="shutdown", broker=b, for_ms=rnd.randint(1_000, 10_000))
            )
        else:
            faults.append(Fault(at_ms=at, kind="kill", broker=b, for_ms=rnd.randint(1_000, 10_000)))
    previous: Fault | None = None
    for _ in range(lossy_kills):
        partitioned = [f for f in faults if f.kind in ("isolate", "cut")]
        roll = rnd.random()
        if partitioned and roll < 0.5:
            anchor = rnd.choice(partitioned)
            at = anchor.at_ms + rnd.randint(3_000, max(3_000, anchor.for_ms))
            b = rnd.choice([x for x in range(1, brokers + 1) if x != anchor.broker])
        elif previous is not None and roll < 0.75:
            at = previous.at_ms + rnd.randint(0, 2_000)
            b = rnd.randint(1, brokers)
        else:
            at = rnd.randrange(start, window)
            b = rnd.randint(1, brokers)
        down = rnd.randint(1_000, 15_000)
        previous = Fault(at_ms=min(at, window - 1), kind="lossy_kill", broker=b, for_ms=down)
        faults.append(previous)
    faults.sort(key=lambda f: (f.at_ms, f.broker, f.kind))
    flush_ms = [rnd.randint(1_000, 10_000) for _ in range(brokers)]
    drop = rnd.choice((0.0, 0.0, 0.01, 0.05))
    max_delay_ms = rnd.choice((5, 20, 100))
    ops = generate_ops(
        seed, lifecycle_ops, brokers=brokers, partitions=partitions, faults=faults, window=window
    )
    if failovers:
        faults = sorted(
            faults + generate_failovers(seed, failovers, start=start, window=window),
            key=lambda f: (f.at_ms, f.broker, f.kind),
        )
    return Schedule(
        seed=seed,
        brokers=brokers,
        partitions=partitions,
        faults=faults,
        flush_ms=flush_ms,
        drop=drop,
        max_delay_ms=max_delay_ms,
        fault_window_ms=window,
        ops=ops,
    )


def generate_failovers(seed: int, count: int, *, start: int, window: int) -> list[Fault]:
    """`count` controller failovers in the fault window, from their own random stream:
    the active controller dies, and a standby takes over 0.5-3 s later (a lease TTL of
    about 2 s plus the takeover, as measured with real processes, docs/ha.md); half of
    them strike inside the next metadata transaction (`Fault.mid_transaction`)."""
    rnd = random.Random(f"metactl-faults-failovers:{seed}")
    return [
        Fault(
            at_ms=rnd.randrange(start, window),
            kind="failover",
            broker=0,
            for_ms=rnd.randint(500, 3_000),
            mid_transaction=rnd.random() < 0.5,
        )
        for _ in range(count)
    ]


def generate_ops(
    seed: int, count: int, *, brokers: int, partitions: int, faults: list[Fault], window: int
) -> list[Op]:
    """`count` lifecycle operations in the fault window, from their own random stream.

    Half of them are aimed into a fault (between its start and its end: a reassignment
    or a MinISR change while a broker is down or cut off, where the rules are tested);
    the rest fall anywhere in the window. A reassignment names a new set of replicas
    (same replication factor mostly, sometimes one more or one less) in a random order,
    so the leader may have to move; a third of them are cancelled 0.5-5 s later. A
    delete is followed by the re-create 0-3 s later. An unregistration is aimed at a
    killed broker, between 9.5 s after the kill (its session has expired) and its
    restart, in whichever order they come; unless it is fenced then, the controller
    refuses it."""
    rnd = random.Random(f"metactl-faults-ops:{seed}")
    ids = list(range(1, brokers + 1))
    # Weights: reassignments most, then MinISR changes; a delete makes every record
    # acknowledged before it unverifiable, so it is the rarest.
    kinds: list[OpKind] = [
        *("topic_min_isr",) * 3,
        *("cluster_min_isr",) * 3,
        *("reassign",) * 6,
        *("add_partitions",) * 2,
        "delete_topic",
        *("unregister",) * 2,
        *("elr_feature_cycle",) * 2,
    ]
    ops: list[Op] = []
    for _ in range(count):
        kind = rnd.choice(kinds)
        if faults and rnd.random() < 0.5:
            f = rnd.choice(faults)
            at = f.at_ms + rnd.randint(0, f.for_ms)
        else:
            at = rnd.randrange(2_000, window)
        at = min(at, window - 1)
        if kind in ("topic_min_isr", "cluster_min_isr"):
            # Raise, lower, or above the replication factor; a topic's own value may go.
            values: list[int | None] = [1, 2, 3, 4]
            if kind == "topic_min_isr":
                values.append(None)
            ops.append(Op(at_ms=at, kind=kind, value=rnd.choice(values)))
        elif kind == "reassign":
            rf = min(brokers, max(1, 3 + rnd.choice((0, 0, 0, 0, -1, 1))))
            target = rnd.sample(ids, rf)
            part = rnd.randrange(partitions)
            ops.append(Op(at_ms=at, kind="reassign", partition=part, replicas=target))
            if rnd.random() < 1 / 3:
                cancel = min(at + rnd.randint(500, 5_000), window - 1)
                ops.append(Op(at_ms=cancel, kind="cancel_reassignment", partition=part))
        elif kind == "add_partitions":
            ops.append(Op(at_ms=at, kind="add_partitions", value=1))
        elif kind == "delete_topic":
            ops.append(Op(at_ms=at, kind="delete_topic", for_ms=rnd.randint(0, 3_000)))
        elif kind == "elr_feature_cycle":
            ops.append(Op(at_ms=at, kind=kind, for_ms=rnd.randint(1_000, 15_000)))
        else:
            kills = [f for f in faults if f.kind in ("kill", "lossy_kill")]
            if kills:
                f = rnd.choice(kills)
                # Fenced 7-10 s after the kill (a 9 s session, checked every second).
                low, high = sorted((f.for_ms, 9_500))
                at = min(f.at_ms + rnd.randint(low, high), window - 1)
                ops.append(Op(at_ms=at, kind="unregister", broker=f.broker))
            else:
                ops.append(Op(at_ms=at, kind="unregister", broker=rnd.choice(ids)))
    ops.sort(key=lambda o: (o.at_ms, o.kind))
    return ops


# --- replay files -----------------------------------------------------------------------


class ReplayFile(msgspec.Struct, kw_only=True):
    format: str
    version: int
    mode: Mode
    schedule: Schedule
    found: dict[str, Any] = {}  # what the run that wrote the file found (informative)


def dump_replay(path: Path, mode: Mode, schedule: Schedule, found: dict[str, Any]) -> None:
    doc = ReplayFile(format=REPLAY_FORMAT, version=1, mode=mode, schedule=schedule, found=found)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")


def load_replay(path: Path) -> ReplayFile:
    doc = msgspec.json.decode(path.read_bytes(), type=ReplayFile)
    if doc.format != REPLAY_FORMAT or doc.version != 1:
        raise ValueError(f"{path}: not a version 1 {REPLAY_FORMAT} file")
    return doc
