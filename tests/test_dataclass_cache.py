"""vramlens/_dataclass_cache.py: dataclass methods compiled once, then read back, the same code."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from vramlens import _dataclass_cache
from vramlens._dataclass_cache import Store

SOURCE = """
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    x: int
    tags: tuple[str, ...] = ()
    extra: frozenset[int] = field(default_factory=frozenset)
"""
METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")


def _module(name: str) -> types.ModuleType:
    """A module named ``name`` that defines ``Point`` (registered while its classes are made)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(SOURCE, f"<{name}>", "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A store backed by a file in ``tmp_path``, in place of the process's."""
    fresh = Store(str(tmp_path / "__pycache__" / "_dataclass_methods.test.bin"))
    monkeypatch.setattr(_dataclass_cache, "_store", fresh)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    yield fresh


def test_the_process_routes_dataclasses_exec_through_the_store() -> None:
    assert dataclasses.exec is _dataclass_cache._exec  # type: ignore[attr-defined]
    assert _dataclass_cache._store is not None


def test_cached_methods_are_the_code_exec_makes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = _module("vramlens._probe_cached").Point
    passed = _module("elsewhere_probe").Point  # not a vramlens module: compiled, not stored
    assert set(store.used) == {"vramlens._probe_cached"}
    assert store.compiled == len(METHODS)
    monkeypatch.delattr(dataclasses, "exec")
    plain = _module("vramlens._probe_plain").Point  # dataclasses with the builtin exec
    for name in METHODS:
        assert getattr(cached, name).__code__ == getattr(plain, name).__code__, name
        assert getattr(passed, name).__code__ == getattr(plain, name).__code__, name
    assert cached.__init__.__annotations__ == plain.__init__.__annotations__ == passed.__init__.__annotations__
    assert cached.__init__.__annotations__["x"] is int  # types, not strings (no __future__ annotations)
    point = cached(x=1, tags=("a",))
    assert point == cached(x=1, tags=("a",)) and hash(point) == hash(cached(x=1, tags=("a",)))
    assert repr(point) == "Point(x=1, tags=('a',), extra=frozenset())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]


def test_a_second_process_reads_the_code_back(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _module("vramlens._probe_saved").Point
    store.save()
    assert store.path is not None and Path(store.path).is_file()
    again = Store(store.path)
    monkeypatch.setattr(_dataclass_cache, "_store", again)
    monkeypatch.setattr(_dataclass_cache, "compile", _refuse, raising=False)  # a hit compiles nothing
    second = _module("vramlens._probe_saved").Point
    assert again.compiled == 0
    for name in METHODS:
        assert getattr(second, name).__code__ == getattr(first, name).__code__, name
    assert second(x=3) == second(x=3) and second(x=3).extra == frozenset()


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("compiled although the store holds the code")


@pytest.mark.parametrize("content", [b"", b"\x00\x01\x02\x03garbage", b"not even a magic number"])
def test_a_damaged_or_foreign_file_is_ignored(store: Store, content: bytes) -> None:
    assert store.path is not None
    Path(store.path).parent.mkdir(parents=True)
    Path(store.path).write_bytes(content)
    point = _module("vramlens._probe_damaged").Point
    assert store.compiled == len(METHODS) and point(x=1).x == 1
    store.save()  # and the file is replaced by a good one
    reread = Store(store.path)
    reread.code("vramlens._probe_damaged", next(iter(store.used["vramlens._probe_damaged"])))
    assert reread.compiled == 0


def test_nothing_is_written_when_bytecode_writing_is_off(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _module("vramlens._probe_off")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    store.save()
    assert store.path is not None and not Path(store.path).exists()


def test_a_cold_process_writes_the_store_and_the_next_one_compiles_nothing(tmp_path: Path) -> None:
    """End to end, in fresh interpreters with the file in a pycache prefix of their own."""
    probe = (
        "import vramlens, vramlens.result.report as r, vramlens._dataclass_cache as c;"
        "print(c._store.compiled, c._store.path)"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {"PYTHONPATH": src, "PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"}
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert int(runs[0][0]) > 0 and runs[0][1].startswith(str(tmp_path)) and Path(runs[0][1]).is_file()
    assert int(runs[1][0]) == 0, "the second process compiled dataclass methods again"
