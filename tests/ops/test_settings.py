"""Settings from a TOML file, METACTL_* variables and flags (`metactl.settings`), on the
real `controller serve` and `broker run` parsers, and a real controller process started
from a file."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from brokers_stub.cli import add_arguments as broker_arguments
from controller.runtime.serve import add_arguments as serve_arguments
from metactl.errors import InvalidConfigurationError
from metactl.settings import resolve

REPO = Path(__file__).resolve().parents[2]


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    serve_arguments(p)
    return p


def parse(
    p: argparse.ArgumentParser, argv: list[str], env: dict[str, str] | None = None
) -> argparse.Namespace:
    return resolve(p, p.parse_args(argv), env or {})


def write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "settings.toml"
    f.write_text(text)
    return str(f)


def test_flags_override_variables_override_the_file_over_defaults(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        'data-dir = "/from/file"\nheartbeat_interval_ms = 500\nsession-timeout-ms = 4000\n'
        'verify-log = "full"\ninsecure = true\n',
    )
    p = serve_parser()
    args = parse(
        p,
        ["--config", f, "--session-timeout-ms", "7000"],
        {"METACTL_HEARTBEAT_INTERVAL_MS": "700", "METACTL_UNRELATED": "x"},
    )
    assert args.data_dir == Path("/from/file")  # file
    assert args.heartbeat_interval_ms == 700  # variable over file
    assert args.session_timeout_ms == 7000  # flag over file
    assert args.verify_log == "full" and args.insecure is True
    assert args.listen == "127.0.0.1:9093" and args.metrics is None  # defaults
    # A flag equal to the default still wins over the file (it was given).
    args = parse(p, ["--config", f, "--heartbeat-interval-ms", "2000"])
    assert args.heartbeat_interval_ms == 2000


def test_without_a_file_nothing_changes() -> None:
    args = parse(serve_parser(), ["--data-dir", "d"])
    assert args.data_dir == Path("d") and args.session_timeout_ms == 9000


@pytest.mark.parametrize(
    ("text", "env", "words"),
    [
        ("no-such-option = 1\n", {}, "unknown setting(s) no-such-option"),
        ('data-dir = "d"\nsession-timeout-ms = "soon"\n', {}, "session-timeout-ms in"),
        ('data-dir = "d"\nverify-log = "half"\n', {}, "'half' is not one of tail, full"),
        ('data-dir = "d"\ninsecure = "maybe"\n', {}, "expected true or false"),
        ('data-dir = "d"\nlisten = ["a", "b"]\n', {}, "expected a single value"),
        ("", {}, "--data-dir is required"),
        ('data-dir = "d"\n', {"METACTL_SESSION_TIMEOUT_MS": "x"}, "$METACTL_SESSION_TIMEOUT_MS"),
        ("data-dir = \n", {}, "is not valid TOML"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, text: str, env: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigurationError) as e:
        parse(serve_parser(), ["--config", write(tmp_path, text)], env)
    assert words in e.value.message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigurationError, match="cannot read --config"):
        parse(serve_parser(), ["--config", str(tmp_path / "nope.toml")])


def test_broker_run_reads_its_required_settings_from_the_file(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    broker_arguments(p)
    f = write(tmp_path, 'id = 3\ncontroller = "h1:1,h2:2"\ndata-dir = "/b"\n')
    args = parse(p, ["--config", f])
    assert (args.broker_id, args.controller, args.data_dir) == (3, "h1:1,h2:2", Path("/b"))


def test_a_controller_process_starts_from_a_file(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        f'data-dir = "{tmp_path / "ctl"}"\nlisten = "127.0.0.1:0"\ninsecure = true\n',
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller", "--config", f],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("READY controller listen=127.0.0.1:")
        assert (tmp_path / "ctl" / "metadata.log.sqlite").exists()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    bad = subprocess.run(
        [sys.executable, "-m", "controller", "--config", write(tmp_path, "typo = 1\n")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: INVALID_CONFIG: unknown setting")
    assert "Traceback" not in bad.stderr


def test_docs_configuration_lists_every_key() -> None:
    from metactl.settings import _options, keys_of

    doc = (REPO / "docs" / "configuration.md").read_text()
    assert "%(" not in doc  # argparse's placeholders, copied unexpanded (issue 22)
    for add in (serve_arguments, broker_arguments):
        p = argparse.ArgumentParser()
        add(p)
        for a in _options(p):
            assert any(f"`{k}`" in doc for k in keys_of(a)), keys_of(a)
