"""A bounded fuzz smoke set (issue 11), the everyday slice of bench/fuzz_wire.py.

(a) arbitrary bytes and (b) structure-aware mutations of a valid frame of every wire
request type (bench/wire_cases.py: re-encoded MessagePack trees, invalid UTF-8, deep
nesting, wrong types, retagged and re-versioned messages) go through `decode_frame`: only
a coded MetactlError with a decode code may come out, and a decoded frame re-encodes to
itself. (c) The same mutations go over real TCP to a real ControllerService (SQLite log,
seeded cluster, frozen virtual time): every answer is the request's response or a coded
ErrorResponse under its correlation id, never UNKNOWN_SERVER_ERROR, a rejected request
leaves the log end offset unchanged, and no traceback reaches the log.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.wire_cases import WireTarget, check_codec, mutate, seed_messages, seed_payloads
from metactl.logs import configure

SEEDS = seed_payloads()
SEED_IDS = [type(m).__name__ for m in seed_messages()] + ["FenceBroker", "UnfenceBroker",
                                                          "ControlledShutdown"]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_to_a_frame_or_a_coded_error(raw: bytes) -> None:
    check_codec(raw)


@pytest.mark.parametrize("seed", SEEDS, ids=SEED_IDS)
@settings(max_examples=40, deadline=None)
@given(rnd=st.randoms(use_true_random=True))
def test_mutated_frames_of_every_request_type_decode_or_get_a_coded_error(
    seed: bytes, rnd: random.Random
) -> None:
    check_codec(mutate(seed, rnd, SEEDS))


def test_the_seeds_are_valid_frames_of_every_request_type() -> None:
    decoded = [check_codec(s) for s in SEEDS]
    assert decoded[: len(seed_messages())] == SEED_IDS[: len(seed_messages())]
    assert decoded[len(seed_messages()) :] == ["INVALID_REQUEST"] * 3  # internal events


def test_mutations_through_the_real_controller_over_tcp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = io.StringIO()
    configure(json=True, level=logging.INFO, stream=out)
    caplog.set_level(logging.WARNING)
    answers: Counter[str] = Counter()
    with asyncio.Runner() as runner:
        target = WireTarget(tmp_path)
        runner.run(target.start())
        try:

            @settings(
                max_examples=400,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(seed=st.sampled_from(SEEDS), rnd=st.randoms(use_true_random=True))
            def one(seed: bytes, rnd: random.Random) -> None:
                payload = seed if rnd.random() < 0.1 else mutate(seed, rnd, SEEDS)
                outcome = runner.run(target.exchange(payload, timeout_s=10))
                answers["rejected" if outcome.rejected else "accepted"] += 1

            one()
            for payload in SEEDS:  # each request type at least once, unmutated
                outcome = runner.run(target.exchange(payload, timeout_s=10))
                answers["rejected" if outcome.rejected else "accepted"] += 1
        finally:
            runner.run(target.stop())
    # Both kinds were exercised, so the state check ran on rejections next to changes.
    assert answers["accepted"] and answers["rejected"]
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert not [e for e in events if {"exception", "exc_info", "stack"} & e.keys()]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
