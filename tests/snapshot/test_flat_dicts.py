"""The opcode check's regex over runs of flat dicts (``_flat_dicts``) changes nothing but speed.

The reference is the same check with that regex matching nothing (each ``EMPTY_DICT`` read
alone, then the opcode-by-opcode pattern), as it was before: on every layout and protocol, on
fuzzed snapshots (bytes changed, cut, inserted) and on malicious ones, both accept the same
files and refuse the others with the same one-line message.
"""

from __future__ import annotations

import pickle
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layouts import LAYOUTS, scenario_snapshot, synthetic_snapshot

from vramlens.errors import InputError
from vramlens.snapshot import _unpickle, load_snapshot
from vramlens.snapshot._flat_dicts import flat_dicts
from vramlens.snapshot._unpickle import check_opcodes

PROBE = "vramlens_flat_dicts_probe"


def _outcome(data: bytes) -> str:
    """``ok`` or the one-line message of the check's refusal."""
    try:
        check_opcodes(data, "x")
    except InputError as error:
        message = str(error)
        assert "\n" not in message
        return message
    return "ok"


def _both(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The outcome with the regex and without it."""
    fast = _outcome(data)
    with monkeypatch.context() as patch:
        patch.setattr(_unpickle, "flat_dicts", lambda short: re.compile(b""))
        return fast, _outcome(data)


def _pickles() -> Iterator[bytes]:
    """Every layout in every protocol, and a synthetic snapshot with 2,500 entries (list batches)."""
    for layout in LAYOUTS:
        snapshot = scenario_snapshot(layout)
        if isinstance(snapshot, str):
            snapshot = {"json": snapshot}
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            yield pickle.dumps(snapshot, protocol=protocol)
    for protocol in (2, 4, 5):
        yield pickle.dumps(synthetic_snapshot(2_500, tagged=True), protocol=protocol)


def test_the_regex_reads_most_of_a_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pattern does match trace entries as pickle.dump writes them (else it were no speedup)."""
    data = pickle.dumps(synthetic_snapshot(5_000, tagged=True), protocol=4)
    read: list[int] = []
    pattern = flat_dicts(63)

    class Recording:
        def match(self, data: bytes, pos: int) -> re.Match[bytes] | None:
            found = pattern.match(data, pos)
            read.append(found.end() - pos if found else 0)
            return found

    monkeypatch.setattr(_unpickle, "flat_dicts", lambda short: Recording())
    check_opcodes(data, "x")
    assert sum(read) > 0.8 * len(data)  # the rest: segments, and the entries where a stack first appears


@pytest.mark.parametrize("index", range(len(list(_pickles()))))
def test_every_layout_and_protocol_same_outcome(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    data = list(_pickles())[index]
    fast, reference = _both(data, monkeypatch)
    assert fast == reference == "ok"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_snapshots_same_outcome(data: st.DataObject) -> None:
    snapshot = data.draw(st.sampled_from([scenario_snapshot("2.1+"), synthetic_snapshot(60, tagged=True)]))
    raw = bytearray(pickle.dumps(snapshot, protocol=data.draw(st.sampled_from([2, 4, 5]))))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        change = data.draw(st.sampled_from(["set", "insert", "delete", "cut"]))
        if change == "set":
            raw[at] = data.draw(st.integers(0, 255))
        elif change == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=9))
        elif change == "delete":
            del raw[at : at + data.draw(st.integers(1, 9))]
        else:
            del raw[at:]
        if not raw:
            raw.append(0x2E)
    with pytest.MonkeyPatch.context() as patch:
        fast = _outcome(bytes(raw))
        patch.setattr(_unpickle, "flat_dicts", lambda short: re.compile(b""))
        assert _outcome(bytes(raw)) == fast


class _Reduce:
    """Pickles as a call of ``func(*args)``."""

    def __init__(self, func: Any, args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _hit() -> None:
    sys.modules[PROBE].hit = True  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", ["addr", "frames", "user_metadata", "action"])
def test_a_call_inside_a_run_of_entries_is_refused_and_does_not_run(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A REDUCE hidden in the 900th of 2,000 flat entries: the run stops there, the check refuses."""
    import types

    module = types.ModuleType(PROBE)
    module.hit = False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PROBE, module)
    snapshot = synthetic_snapshot(2_000, tagged=True)
    snapshot["device_traces"][0][900][key] = _Reduce(_hit, ())
    data = pickle.dumps(snapshot, protocol=4)
    path = tmp_path / "evil.pickle"
    path.write_bytes(data)
    with pytest.raises(InputError) as caught:
        load_snapshot(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)) and "refused" in message
    assert not module.hit
    fast, reference = _both(data, monkeypatch)
    assert fast == reference != "ok"


def test_a_length_bomb_inside_a_run_of_entries_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BINUNICODE claiming 1 GiB as the value of the 900th of 2,000 entries."""
    snapshot = synthetic_snapshot(2_000, tagged=True)
    snapshot["device_traces"][0][900]["compile_context"] = "BOMB"
    data = pickle.dumps(snapshot, protocol=4)
    bomb = data.replace(b"\x8c\x04BOMB", b"X\x00\x00\x00\x40", 1)
    fast, reference = _both(bomb, monkeypatch)
    assert fast == reference and "declares 1073741824 bytes" in fast
