"""The results store: whole JSON lines appended durably, a torn last line (a kill inside a
write) ignored and cut off before the next append, and a key never written twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramlens.errors import InputError
from vramlens.experiments.store import ResultStore


def test_append_then_read_back_in_order(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.jsonl")
    assert store.rows() == [] and store.finished() == {}
    assert store.append({"key": "a", "value": 1})
    assert store.append({"key": "b", "value": 2})
    assert not store.append({"key": "a", "value": 3})  # already stored: nothing written
    assert [row["key"] for row in store.rows()] == ["a", "b"]
    assert store.finished()["a"]["value"] == 1
    assert store.path.read_text().count("\n") == 2


def test_a_torn_last_line_is_ignored_and_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"key": "a"}) + "\n" + '{"key": "b", "val')
    store = ResultStore(path)
    assert [row["key"] for row in store.rows()] == ["a"]
    store.append({"key": "b", "value": 2})
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b"]


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("hello\n")
    with pytest.raises(InputError, match=r"^--store: .* line 1 is not JSON; is it a results store\?"):
        ResultStore(path).rows()
    path.write_text('{"no": "key"}\n')
    with pytest.raises(InputError, match=r"line 1 has no run key"):
        ResultStore(path).rows()
    with pytest.raises(InputError, match=r"^--store: .* is a folder"):
        ResultStore(tmp_path)
    with pytest.raises(InputError, match=r"^--store: folder .* does not exist"):
        ResultStore(tmp_path / "missing" / "r.jsonl")
