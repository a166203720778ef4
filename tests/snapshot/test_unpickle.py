"""Opening untrusted snapshot files: nothing runs, nothing explodes, every failure is one line.

Each malicious pickle is first shown to work against the plain ``pickle.loads`` (so the test
could fail), then fed to ``load_snapshot``, which must refuse it with a one-line
``InputError`` naming the file, and the side effect must not have happened.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import pickle
import struct
import sys
import tracemalloc
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layouts import scenario_snapshot

from vramlens.errors import InputError
from vramlens.snapshot import load_snapshot
from vramlens.snapshot._unpickle import _DataOnlyUnpickler, check_opcodes

PROBE = "vramlens_unpickle_probe"


class _Reduce:
    """Pickles as a call of ``func(*args)`` (what a malicious snapshot would hold)."""

    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _snapshot_with(payload: Any, protocol: int = 4) -> bytes:
    """A snapshot-shaped pickle with ``payload`` hidden in a trace entry."""
    snapshot = scenario_snapshot("2.1+")
    snapshot["device_traces"][0][0]["user_metadata"] = payload
    return pickle.dumps(snapshot, protocol=protocol)


def _refused(data: bytes, tmp_path: Path, name: str = "evil.pickle") -> InputError:
    """``load_snapshot`` on a file holding ``data``: the InputError it raises (asserted one line)."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        load_snapshot(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)), message
    return caught.value


@pytest.fixture
def probe() -> Any:
    module = types.ModuleType(PROBE)
    module.hit = False  # type: ignore[attr-defined]
    sys.modules[PROBE] = module
    yield module
    del sys.modules[PROBE]


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_os_system_is_refused_and_does_not_run(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    data = _snapshot_with(_Reduce(os.system, (f"touch {marker}",)), protocol)
    pickle.loads(data)  # the unsafe loader runs it: the payload is real
    assert marker.exists()
    marker.unlink()
    error = _refused(data, tmp_path)
    assert "refused" in str(error)
    assert not marker.exists()


def test_eval_is_refused_and_does_not_run(tmp_path: Path, probe: Any) -> None:
    data = _snapshot_with(_Reduce(eval, (f"setattr(__import__('sys').modules[{PROBE!r}], 'hit', True)",)))
    pickle.loads(data)
    assert probe.hit is True
    probe.hit = False
    _refused(data, tmp_path)
    assert probe.hit is False


def test_builtins_import_is_refused_and_imports_nothing(tmp_path: Path) -> None:
    name = "vramlens_probe_imported_module"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        data = _snapshot_with(_Reduce(builtins.__import__, (name,)))
        pickle.loads(data)
        assert marker.exists() and name in sys.modules
        marker.unlink()
        del sys.modules[name]
        _refused(data, tmp_path)
        assert not marker.exists() and name not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("data", "opcode"),
    [
        (b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.", "GLOBAL"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.", "STACK_GLOBAL"),
        (b"(S'id'\nios\nsystem\n.", "INST"),
        (b"\x80\x02}q\x00}b.", "BUILD"),
        (b"\x80\x02X\x01\x00\x00\x001Q.", "BINPERSID"),
        (b"P1\n.", "PERSID"),
        (b"\x80\x02\x82\x01.", "EXT1"),
        (b"\x80\x05\x97.", "NEXT_BUFFER"),
    ],
)
def test_every_code_path_opcode_is_refused(tmp_path: Path, data: bytes, opcode: str) -> None:
    assert opcode in str(_refused(data, tmp_path))


def test_the_unpickler_alone_refuses_globals_too() -> None:
    """Defence in depth: even without the opcode check, no global and no persistent id resolves."""
    for payload in (_Reduce(os.getcwd, ()), _Reduce(eval, ("1",))):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            _DataOnlyUnpickler(io.BytesIO(pickle.dumps(payload))).load()
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        _DataOnlyUnpickler(io.BytesIO(b"\x80\x02X\x01\x00\x00\x001Q.")).load()


def _traced_peak(action: Any) -> int:
    """Peak bytes the Python allocators handed out while ``action`` ran (tracemalloc)."""
    tracemalloc.start()
    with contextlib.suppress(Exception):
        action()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def _rss() -> int:
    """Resident bytes of this process (Linux /proc; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


GIB = 1 << 30
BOMBS = {
    "BINUNICODE8": b"\x80\x04\x8d" + struct.pack("<Q", GIB),
    "BINBYTES8": b"\x80\x04\x8e" + struct.pack("<Q", GIB),
    "BYTEARRAY8": b"\x80\x05\x96" + struct.pack("<Q", GIB),
    "BINBYTES": b"\x80\x03B" + struct.pack("<I", GIB),
    "BINUNICODE": b"\x80\x03X" + struct.pack("<I", GIB),
    "FRAME": b"\x80\x04\x95" + struct.pack("<Q", GIB),
}


@pytest.mark.parametrize("opcode", sorted(BOMBS))
def test_length_bomb_is_refused_without_allocating(tmp_path: Path, opcode: str) -> None:
    data = BOMBS[opcode] + b"x" * 90 + b"."  # ~100 bytes claiming 1 GiB
    before = _rss()
    error = _refused(data, tmp_path, "bomb.pickle")
    assert opcode in str(error) and str(GIB) in str(error)
    assert _traced_peak(lambda: load_snapshot(data)) < 1 << 20
    assert _rss() - before < 64 << 20


def test_plain_pickle_does_allocate_the_claimed_size() -> None:
    """The control for the test above: CPython's own unpickler allocates a BINBYTES8 claim
    before reading it (virtual memory only, so this costs nothing), so tracemalloc sees it."""
    data = BOMBS["BINBYTES8"] + b"x" * 90 + b"."
    assert _traced_peak(lambda: pickle.loads(data)) >= GIB


def test_memo_index_bomb_is_refused(tmp_path: Path) -> None:
    # LONG_BINPUT 2**26 in a 10-byte file: CPython 3.11 would zero a 1 GiB memo table.
    data = b"\x80\x02]r" + struct.pack("<I", 1 << 26) + b"."
    assert "memo index" in str(_refused(data, tmp_path))
    assert "memo index" in str(_refused(b"(lp67108864\n.", tmp_path))
    assert _traced_peak(lambda: load_snapshot(data)) < 1 << 20


def test_a_flat_trace_sharing_one_long_stack_everywhere_is_refused(tmp_path: Path) -> None:
    """No nesting at all, yet 8 * 10**8 values: one frames list of 20,000 references to one frame
    dict, shared by 6,000 trace entries (a 200 KB file; the budget is 2**24 values)."""
    frames = [{"filename": "a.py", "line": 1, "name": "f"}] * 20_000
    entries = [{"action": "alloc", "addr": 0, "size": 512, "frames": frames} for _ in range(6_000)]
    data = pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4)
    assert len(data) < 300_000 and len(pickle.loads(data)["device_traces"][0]) == 6_000
    assert "billion laughs" in str(_refused(data, tmp_path))


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.99])
def test_truncated_pickle_is_one_line_error(tmp_path: Path, cut: float) -> None:
    data = pickle.dumps(scenario_snapshot("2.1+"), protocol=4)
    error = _refused(data[: int(len(data) * cut)], tmp_path, "truncated.pickle")
    assert "truncated" in str(error)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01garbage",
        os.urandom(4096),
        b"\x80\x09}.",
        b"\x80\x02}q\x00h\x05.",
        b"\x80\x02(J\x01\x00\x00\x00s.",
    ],
)
def test_garbage_is_one_line_error(tmp_path: Path, data: bytes) -> None:
    _refused(data, tmp_path, "garbage.pickle")


def test_missing_directory_and_unknown_source_types() -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_snapshot("/nonexistent/dir/snap.pickle")
    with pytest.raises(InputError, match="cannot read"):
        load_snapshot(Path(__file__).parent)
    if Path("/dev/zero").exists():  # endless: must not be read at all
        with pytest.raises(InputError, match="not a regular file"):
            load_snapshot("/dev/zero")
    with pytest.raises(InputError, match="source: int"):
        load_snapshot(42)  # type: ignore[arg-type]


def test_json_snapshot_file_and_bytes_read(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(scenario_snapshot("json"))
    from_file, from_bytes = load_snapshot(path), load_snapshot(path.read_bytes())
    assert from_file.layout == from_bytes.layout == "2.1+"
    assert from_file.timeline().peak_bytes == from_bytes.timeline().peak_bytes == 15644


@pytest.mark.parametrize("text", ["{", '{"segments": [}', "[" * 100_000 + "]" * 100_000])
def test_bad_json_is_one_line_error(tmp_path: Path, text: str) -> None:
    assert "JSON" in str(_refused(text.encode(), tmp_path, "bad.json"))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_of_a_real_snapshot_reads(protocol: int) -> None:
    data = pickle.dumps(scenario_snapshot("2.1+"), protocol=protocol)
    check_opcodes(data, "x")
    assert load_snapshot(data).timeline().end_bytes == 10948


def test_long_strings_and_big_integers_take_the_slow_path() -> None:
    snapshot = scenario_snapshot("2.1+")
    snapshot["device_traces"][0][1]["user_metadata"] = "vramlens;module=" + "m" * 5000
    snapshot["device_traces"][0][1]["compile_context"] = "x" * 70_000  # outside a frame in protocol 4
    snapshot["segments"][0]["extra"] = [2**200, -(2**70), 1.5, None, True, "é" * 100]
    timeline = load_snapshot(pickle.dumps(snapshot, protocol=4)).timeline()
    assert timeline.modules[0] == "m" * 5000


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_snapshots_never_escape_as_other_errors(data: st.DataObject) -> None:
    raw = bytearray(pickle.dumps(scenario_snapshot(data.draw(st.sampled_from(["2.1+", "2.0"]))), protocol=4))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        load_snapshot(bytes(raw)).timeline()
    except InputError as error:
        assert "\n" not in str(error)


def test_json_loads_keeps_integers_exact() -> None:
    big = 0xFFFF_8000_0000_1234
    snapshot = json.loads(scenario_snapshot("json"))
    snapshot["device_traces"][0][1]["addr"] = big
    assert int(load_snapshot(json.dumps(snapshot).encode()).trace(0).addr[1]) == big
