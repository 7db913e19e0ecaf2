"""Secure by default: every process and client command needs certificates or an explicit
`--insecure`, says what to do when it has neither (a named error, no traceback), and
finds its certificates in a documented order. The connection-limit flags map onto
`ServerLimits` with its defaults."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster.certs import default_names, init_certs
from metactl.errors import InvalidConfigurationError
from ops.cli import build_parser, main
from protocol.flags import (
    ENV_TLS_DIR,
    add_limit_arguments,
    add_tls_arguments,
    server_limits,
    tls_identity,
)
from protocol.limits import ServerLimits
from protocol.tls import CONTROLLER

REPO = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_TLS_DIR}
    env["PYTHONPATH"] = str(REPO)
    return env


def assert_says_what_to_do(err: str) -> None:
    assert err.startswith("error: INVALID_CONFIG: TLS is on by default"), err
    assert "metactl certs init --data-dir D" in err and "--insecure" in err
    assert "Traceback" not in err


# Every client command, produce and consume included: each exits with the usage status
# (2, docs/cli.md's one table).
CLIENT_COMMANDS = [
    ["describe", "--controller", "127.0.0.1:1"],
    ["brokers", "--controller", "127.0.0.1:1"],
    ["events", "--controller", "127.0.0.1:1"],
    ["topics", "create", "--controller", "127.0.0.1:1", "--topic", "t", "--partitions", "1"],
    ["elect", "--controller", "127.0.0.1:1", "--partition", "t-0", "--type", "preferred"],
    ["produce", "--controller", "127.0.0.1:1", "--topic", "t", "--count", "1",
     "--acked-log", "acked.jsonl"],
    ["consume", "--controller", "127.0.0.1:1", "--topic", "t"],
]  # fmt: skip


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=[" ".join(c[:2]) for c in CLIENT_COMMANDS])
def test_a_client_command_without_certificates_fails_with_a_named_error(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./data/certs here
    monkeypatch.delenv(ENV_TLS_DIR, raising=False)
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_says_what_to_do(err)
    assert "nothing in data/certs" in err


def test_the_real_cli_process_says_what_to_do(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ops.cli", "describe", "--controller", "127.0.0.1:1"],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert_says_what_to_do(r.stderr)


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "controller", "--data-dir", "ctl", "--listen", "127.0.0.1:0"],
        ["-m", "brokers_stub", "--id", "1", "--controller", "127.0.0.1:1", "--data-dir", "b1"],
    ],
    ids=["controller", "broker"],
)
def test_a_process_without_certificates_does_not_start(argv: list[str], tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=60,
    )
    assert r.returncode == 2 and "READY" not in r.stdout
    assert_says_what_to_do(r.stderr)
    assert f"nothing in {argv[argv.index('--data-dir') + 1]}/certs" in r.stderr


def test_tls_dir_and_insecure_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["describe", "--controller", "127.0.0.1:1", "--insecure", "--tls-dir", "x"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_tls_arguments(p, client=True)
    add_limit_arguments(p)
    return p.parse_args(argv)


def test_where_certificates_are_found(tmp_path: Path) -> None:
    flag, env, fallback = tmp_path / "flag", tmp_path / "env", tmp_path / "fallback"
    for d in (flag, env, fallback):
        init_certs(d, default_names([]))
    environ = {ENV_TLS_DIR: str(env)}

    def ca_of(args: argparse.Namespace, environ: dict[str, str]) -> Path:
        identity = tls_identity(args, CONTROLLER, fallbacks=[fallback], environ=environ)
        assert identity is not None
        return identity.ca.parent

    assert ca_of(parse("--tls-dir", str(flag)), environ) == flag  # the flag first
    assert ca_of(parse(), environ) == env  # then the environment
    assert ca_of(parse(), {}) == fallback  # then the command's fallback
    assert tls_identity(parse("--insecure"), CONTROLLER, environ=environ) is None
    # A fallback without a CA is skipped; then nothing is left.
    with pytest.raises(InvalidConfigurationError, match="no certificates were found"):
        tls_identity(parse(), CONTROLLER, fallbacks=[tmp_path / "nothing"], environ={})
    # An explicit directory is used as given: a missing one, or a missing file, is named.
    with pytest.raises(InvalidConfigurationError, match="does not exist"):
        tls_identity(parse("--tls-dir", str(tmp_path / "missing")), CONTROLLER, environ={})
    with pytest.raises(InvalidConfigurationError, match=r"broker-9\.pem is missing"):
        tls_identity(parse("--tls-dir", str(flag)), "broker-9", environ={})


def test_limit_flags_default_to_server_limits_and_refuse_nonsense() -> None:
    assert server_limits(parse()) == ServerLimits()
    limits = server_limits(
        parse("--max-connections", "10", "--max-connections-per-peer", "2",
              "--idle-timeout-ms", "1500", "--frame-deadline-ms", "250",
              "--handshake-timeout-ms", "100")
    )  # fmt: skip
    assert limits == ServerLimits(
        max_connections=10,
        max_connections_per_peer=2,
        idle_timeout_s=1.5,
        frame_deadline_s=0.25,
        handshake_timeout_s=0.1,
    )
    with pytest.raises(InvalidConfigurationError, match="--idle-timeout-ms must be >= 1"):
        server_limits(parse("--idle-timeout-ms", "0"))


def test_help_shows_the_flags_and_their_defaults() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["controller"]._actions[-1].choices["serve"]
    text = serve.format_help()
    for expected in (
        "--tls-dir DIR",
        "--insecure",
        "--max-connections N",
        "(default 1000)",
        "--max-connections-per-peer N",
        "(default 200)",
        "--idle-timeout-ms MS",
        "(default 600000)",
        "--frame-deadline-ms MS",
        "(default 30000)",
    ):
        assert expected in " ".join(text.split()), expected
    describe = sub.choices["describe"].format_help()
    assert "--principal NAME" in describe and "--insecure" in describe
