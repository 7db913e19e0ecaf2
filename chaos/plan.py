"""The fault plan of a chaos run: what happens to which process, and when.

A plan is a list of `Step`s run in order. A step with `at_s` waits until that many
seconds after the fault phase began; a step with `down_s` (or a pause's `pause_s`)
restores its target in the background after that long, so the plan goes on. Operations:

- `kill`            SIGKILL a broker; `lossy` restarts it with `--lose-unflushed`
                    (its unflushed tail is gone: the page cache was lost too)
- `term`            SIGTERM a broker (controlled shutdown, clean restart)
- `pause`           SIGSTOP a broker for `pause_s`, then SIGCONT
- `restart`         start a broker that a step left down (lossy if it was killed lossily)
- `kill_controller` SIGKILL a controller, restart it after `down_s` (on its data dir)
- `pause_controller` SIGSTOP a controller for `pause_s`, then SIGCONT
- `kill_etcd`       SIGKILL an etcd member, restart it after `down_s` (on its data dir)
- `pause_etcd`      SIGSTOP an etcd member for `pause_s`, then SIGCONT
- `sleep`           wait `s` seconds (producers keep producing)

A controller fault names its target by `controller` (1, 2, ...) or by `role`: `active`
(the default: the one that holds the log's leadership when the step runs) or `standby`;
an etcd fault by `member` (1, 2, ...) or `role`: `leader` (the default: the member the
others follow, asked when the step runs) or `follower`.

`await_fenced` on a kill or term waits until the controller has fenced the broker (or
it has stopped) before the next step, which is how a schedule shrinks an ISR one member
at a time into the ELR.

`random_plan` draws a bounded plan from `random.Random(seed)`: at most (brokers-1)//2
brokers down or paused at once, except during an `outage` (RF brokers lossily killed
one after another, each after the previous one was fenced, then all restarted: the
correlated failure that empties an ISR and its ELR and forces an unclean recovery). At
most `lossy_kills` lossy kills in all. One controller fault at a time; with several
controllers, kills and pauses of the active controller and of standbys; with an etcd
cluster of 3 or more members, kills and pauses of its leader and of followers, at most
(members-1)//2 at a time (etcd keeps its quorum). A plan for one controller without
etcd is exactly what it was before these were added, seed for seed. `load_schedule`
reads a JSON file or a built-in name (`BUILTIN`).

Pure: no processes, no IO except reading the schedule file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metactl.errors import InvalidConfigurationError

OPS = (
    "kill", "term", "pause", "restart", "kill_controller", "pause_controller", "kill_etcd",
    "pause_etcd", "sleep",
)  # fmt: skip
CONTROLLER_OPS = ("kill_controller", "pause_controller")
ETCD_OPS = ("kill_etcd", "pause_etcd")
CONTROLLER_ROLES = ("active", "standby")
ETCD_ROLES = ("leader", "follower")


@dataclass(frozen=True, kw_only=True)
class Step:
    op: str
    broker: int | None = None
    controller: int | None = None  # a controller fault's target (1, 2, ...)
    member: int | None = None  # an etcd fault's target (1, 2, ...)
    role: str | None = None  # or by role: active/standby, leader/follower (see above)
    lossy: bool = False
    at_s: float | None = None
    down_s: float | None = None  # restore after this long (None: stays down)
    pause_s: float = 0.0
    s: float = 0.0  # sleep
    await_fenced: bool = False

    def kind(self) -> str:
        """The fault kind it counts as in the report (None for restart and sleep)."""
        if self.op == "kill":
            return "kill_lossy" if self.lossy else "kill"
        return self.op


def _outage(brokers: list[int], gap_s: float) -> list[Step]:
    steps = [Step(op="sleep", s=gap_s)]
    steps += [Step(op="kill", broker=b, lossy=True, await_fenced=True) for b in brokers]
    steps += [Step(op="restart", broker=b) for b in brokers]
    return steps


# Built-in schedules, by name. `outage` lossily kills brokers 1, 2, 3 one after the other
# (each once fenced), so that with RF 3 on 3 brokers every partition's ISR shrinks into
# its ELR and empties, then restarts them all: unclean registrations move the ELR into
# the LastKnownELR and a balanced unclean recovery follows.
BUILTIN: dict[str, list[Step]] = {
    "outage": _outage([1, 2, 3], 3.0),
    "controller-and-outage": [
        Step(op="sleep", s=2.0),
        Step(op="kill_controller", down_s=1.0),
        *_outage([1, 2, 3], 2.0),
    ],
    # For --controllers 3 --etcd 3: the active controller killed, the etcd leader paused,
    # the outage (its unclean recoveries committed by the term then active), and that
    # active controller killed too, so that the metric must be summed over terms.
    "ha-outage": [
        Step(op="sleep", s=2.0),
        Step(op="kill_controller", role="active", down_s=1.0),
        Step(op="sleep", s=1.5),
        Step(op="pause_etcd", role="leader", pause_s=3.0),
        *_outage([1, 2, 3], 1.0),
        Step(op="sleep", s=4.0),
        Step(op="kill_controller", role="active", down_s=1.0),
        Step(op="sleep", s=2.0),
    ],
}


def parse_steps(doc: Any, source: str) -> list[Step]:
    items = doc.get("steps") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise InvalidConfigurationError(
            f"{source}: a schedule is a list of steps or {{'steps': [...]}}"
        )
    fields = set(Step.__dataclass_fields__)
    out = []
    for i, item in enumerate(items):
        where = f"{source}: step {i + 1}"
        if not isinstance(item, dict) or item.get("op") not in OPS:
            raise InvalidConfigurationError(f"{where}: 'op' must be one of {', '.join(OPS)}")
        unknown = set(item) - fields
        if unknown:
            raise InvalidConfigurationError(
                f"{where}: unknown field(s) {', '.join(sorted(unknown))}"
            )
        try:
            step = Step(**item)
        except TypeError as exc:
            raise InvalidConfigurationError(f"{where}: {exc}") from None
        if step.op in ("kill", "term", "pause", "restart") and not isinstance(step.broker, int):
            raise InvalidConfigurationError(f"{where}: {step.op} needs an integer 'broker'")
        roles = CONTROLLER_ROLES if step.op in CONTROLLER_OPS else ETCD_ROLES
        if step.role is not None and (
            step.op not in CONTROLLER_OPS + ETCD_OPS or step.role not in roles
        ):
            raise InvalidConfigurationError(
                f"{where}: 'role' of {step.op} must be one of {', '.join(roles)}"
                if step.op in CONTROLLER_OPS + ETCD_OPS
                else f"{where}: {step.op} takes no 'role'"
            )
        out.append(step)
    return out


def load_schedule(spec: str) -> list[Step]:
    """`builtin:NAME` or a JSON file."""
    if spec.startswith("builtin:"):
        name = spec.removeprefix("builtin:")
        if name not in BUILTIN:
            names = ", ".join(sorted(BUILTIN))
            raise InvalidConfigurationError(f"no built-in schedule {name!r} (known: {names})")
        return list(BUILTIN[name])
    try:
        doc = json.loads(Path(spec).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidConfigurationError(f"cannot read the schedule {spec}: {exc}") from None
    return parse_steps(doc, spec)


def check_brokers(steps: list[Step], brokers: int, controllers: int = 1, etcd: int = 0) -> None:
    """Every target a schedule names exists in the run."""
    for s in steps:
        if s.broker is not None and not 1 <= s.broker <= brokers:
            raise InvalidConfigurationError(
                f"the schedule names broker {s.broker}; ids are 1..{brokers}"
            )
        if s.controller is not None and not 1 <= s.controller <= controllers:
            raise InvalidConfigurationError(
                f"the schedule names controller {s.controller}; there are {controllers}"
            )
        if s.op in ETCD_OPS and not etcd:
            raise InvalidConfigurationError(f"the schedule has {s.op} but no --etcd cluster")
        if s.member is not None and not 1 <= s.member <= etcd:
            raise InvalidConfigurationError(
                f"the schedule names etcd member {s.member}; there are {etcd}"
            )


def random_plan(
    rng: random.Random,
    *,
    brokers: int,
    rf: int,
    duration_s: float,
    lossy_kills: int,
    session_s: float,
    controller_kills: bool = True,
    controllers: int = 1,
    etcd: int = 0,
) -> list[Step]:
    """A bounded, seeded fault plan for `duration_s` seconds of faults."""
    steps: list[Step] = []
    busy: dict[int, float] = {}  # broker -> when it is back (with a restart allowance)
    controller_back = 0.0
    etcd_back: list[float] = []  # when each etcd fault in progress is over
    etcd_max = max(0, (etcd - 1) // 2)  # members down or paused at once: etcd keeps quorum
    ha = controllers > 1 or etcd > 0
    outage_until = 0.0
    budget = lossy_kills
    max_down = max(1, (brokers - 1) // 2)
    t = min(2.0, duration_s / 10)
    while True:
        t += rng.uniform(0.4, 1.6)
        if t > duration_s - 1.0:
            return steps
        down = {b for b, back in busy.items() if back > t}
        free = [b for b in range(1, brokers + 1) if b not in down]
        kinds = ["kill", "term", "pause"]
        weights = [2.0, 2.0, 2.0]
        if budget > 0:
            kinds.append("kill_lossy")
            weights.append(2.0)
        if controller_kills:
            kinds.append("kill_controller")
            weights.append(1.0)
            if ha:
                kinds.append("pause_controller")
                weights.append(1.0)
        if etcd_max:
            kinds += ["kill_etcd", "pause_etcd"]
            weights += [1.0, 1.0]
        stagger = session_s + 0.7
        if budget >= rf and brokers >= rf and t + rf * stagger + 4.0 < duration_s:
            kinds.append("outage")
            weights.append(1.0)
        kind = rng.choices(kinds, weights)[0]
        if kind == "kill_controller" and not ha:
            if controller_back > t:
                continue
            down_s = round(rng.uniform(0.5, 2.0), 2)
            steps.append(Step(op="kill_controller", at_s=round(t, 2), down_s=down_s))
            controller_back = t + down_s + 2.0
            continue
        if kind in CONTROLLER_OPS:
            if controller_back > t:
                continue
            role = "active" if controllers == 1 or rng.random() < 2 / 3 else "standby"
            if kind == "kill_controller":
                down_s = round(rng.uniform(0.5, 2.0), 2)
                steps.append(Step(op=kind, role=role, at_s=round(t, 2), down_s=down_s))
                controller_back = t + down_s + 2.5
            else:
                # Shorter and longer than the lease: a term that goes on, or a zombie.
                pause_s = round(rng.uniform(0.5, 5.0), 2)
                steps.append(Step(op=kind, role=role, at_s=round(t, 2), pause_s=pause_s))
                controller_back = t + pause_s + 2.5
            continue
        if kind in ETCD_OPS:
            etcd_back = [back for back in etcd_back if back > t]
            if len(etcd_back) >= etcd_max:
                continue
            role = "leader" if rng.random() < 0.5 else "follower"
            if kind == "kill_etcd":
                down_s = round(rng.uniform(0.5, 3.0), 2)
                steps.append(Step(op=kind, role=role, at_s=round(t, 2), down_s=down_s))
                etcd_back.append(t + down_s + 3.0)
            else:
                pause_s = round(rng.uniform(1.0, 5.0), 2)
                steps.append(Step(op=kind, role=role, at_s=round(t, 2), pause_s=pause_s))
                etcd_back.append(t + pause_s + 1.0)
            continue
        if outage_until > t:
            continue
        if kind == "outage":
            if down:
                continue
            targets = rng.sample(range(1, brokers + 1), rf)
            end = t + rf * stagger + rng.uniform(0.5, 1.5)
            for i, b in enumerate(targets):
                at = t + i * stagger
                steps.append(
                    Step(op="kill", broker=b, lossy=True, at_s=round(at, 2),
                         down_s=round(end - at, 2))
                )  # fmt: skip
                busy[b] = end + 2.0
            budget -= rf
            outage_until = end + 2.0
            t = end
            continue
        if len(down) >= max_down or not free:
            continue
        b = rng.choice(free)
        if kind == "pause":
            pause_s = round(session_s * rng.uniform(1.3, 2.5), 2)
            steps.append(Step(op="pause", broker=b, at_s=round(t, 2), pause_s=pause_s))
            busy[b] = t + pause_s + 1.0
            continue
        down_s = round(rng.uniform(0.5, 3.0), 2)
        if kind == "kill_lossy":
            budget -= 1
        op = "term" if kind == "term" else "kill"
        steps.append(
            Step(op=op, broker=b, lossy=kind == "kill_lossy", at_s=round(t, 2), down_s=down_s)
        )
        busy[b] = t + down_s + (session_s if op == "term" else 0.0) + 2.0
