"""Every error class lives in metactl.errors with a code of its own, and ERRORS_BY_CODE
rebuilds each one (and its retriable flag) from the code that travels on the wire."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import brokers_stub
import controller
import metadata_image
import metadata_log
import ops
import protocol
import simulation
from metactl import errors
from metactl.errors import ERRORS_BY_CODE, MetactlError, error_for_code


def _import_all() -> None:
    """Load every project module, so an error class defined anywhere is a subclass here."""
    for pkg in (brokers_stub, controller, metadata_image, metadata_log, ops, protocol, simulation):
        for mod in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):
            if mod.name.endswith("__main__"):
                continue
            importlib.import_module(mod.name)


def _all_subclasses(cls: type[MetactlError]) -> list[type[MetactlError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def _project_errors() -> list[type[MetactlError]]:
    _import_all()
    # Tests may define their own subclasses; only the project's count.
    return [c for c in _all_subclasses(MetactlError) if not c.__module__.startswith("tests.")]


def test_every_error_class_lives_in_metactl_errors() -> None:
    misplaced = [f"{c.__module__}.{c.__qualname__}" for c in _project_errors()]
    misplaced = [name for name in misplaced if not name.startswith("metactl.errors.")]
    assert misplaced == []


def test_one_code_per_class_and_the_index_is_complete() -> None:
    classes = _project_errors()
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    for cls in classes:
        assert ERRORS_BY_CODE.get(cls.code) is cls, cls
    assert set(ERRORS_BY_CODE.values()) == set(classes)


@pytest.mark.parametrize("cls", [cls for _, cls in sorted(ERRORS_BY_CODE.items())])
def test_error_for_code_round_trips(cls: type[MetactlError]) -> None:
    err = error_for_code(cls.code, "boom", not cls.retriable)  # the class's flag wins
    assert err.code == cls.code
    assert err.retriable == cls.retriable
    assert "boom" in err.message
    if cls is not errors.CorruptLogError:  # needs a local path: rebuilt as a coded root
        assert type(err) is cls


@pytest.mark.parametrize("retriable", [True, False])
def test_an_unknown_code_keeps_the_senders_code_and_flag(retriable: bool) -> None:
    err = error_for_code("SOME_NEWER_ERROR", "from a newer peer", retriable)
    assert type(err) is MetactlError
    assert (err.code, err.retriable) == ("SOME_NEWER_ERROR", retriable)
    assert err.message == "from a newer peer"
    assert str(err) == "SOME_NEWER_ERROR: from a newer peer"
    assert MetactlError.code == "UNKNOWN_SERVER_ERROR"  # the class is untouched


def test_corrupt_message_has_one_owner() -> None:
    assert ERRORS_BY_CODE["CORRUPT_MESSAGE"] is errors.CorruptLogError
    assert errors.RecordDecodeError.code == "INVALID_RECORD"
