"""Saving and loading timelines (``.npz`` + JSON header): round trips and malformed files.

Malformed archives are written here with plain ``np.savez`` (not with ``save_timeline``), so
each one differs from a valid file in exactly one named way.
"""

from __future__ import annotations

import gc
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.trace.timeline_io import FORMAT, VERSION, load_timeline, save_timeline

DTYPES = {
    "time": np.int64,
    "nbytes": np.int64,
    "category": np.int8,
    "phase": np.int32,
    "module": np.int32,
    "stack": np.int32,
    "storage": np.int64,
}


ONE_NAME_TABLES: dict[str, Any] = {"phases": ("p",), "modules": ("m",), "stacks": ("s",)}


def code(category: Category) -> int:
    return list(Category).index(category)


def sample() -> Timeline:
    """Five events touching every column, table and field."""
    cats = [Category.PARAMETERS, Category.ACTIVATIONS, Category.KV_CACHE, Category.ACTIVATIONS, Category.RUNTIME]
    return Timeline(
        time=np.array([0, 15, 40, 41, 2**40], dtype=np.int64),
        nbytes=np.array([4000, 2**33, 512, -(2**33), 7], dtype=np.int64),
        category=np.array([code(c) for c in cats], dtype=np.int8),
        phase=np.array([0, 1, 1, 2, -1], dtype=np.int32),
        module=np.array([-1, 0, 1, 1, -1], dtype=np.int32),
        stack=np.array([0, 1, -1, -1, 0], dtype=np.int32),
        storage=np.array([0, 1, 2, 1, 2**50], dtype=np.int64),
        phases=("load", "prefill", "decode"),
        modules=("Model.layers.0", "Model.layers.0.self_attn \u00e9"),
        stacks=("a.py:1 in <module>", "a.py:1 in <module>\nb.py:20 in forward"),
        base_bytes=123_456,
        time_unit="ns",
        level="allocated",
        metadata={"source": "test", "nested": {"list": [1, 2.5, None, True], "text": "\u00fc"}, "count": 3},
    )


def assert_same(loaded: Timeline, original: Timeline) -> None:
    for name, dtype in DTYPES.items():
        column = getattr(loaded, name)
        assert column.dtype == dtype, name
        assert column.tolist() == getattr(original, name).tolist(), name
    for name in ("phases", "modules", "stacks", "base_bytes", "time_unit", "level", "metadata"):
        assert getattr(loaded, name) == getattr(original, name), name


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip_keeps_everything(tmp_path: Path, compress: bool) -> None:
    original = sample()
    written = save_timeline(original, tmp_path / "run.npz", compress=compress)
    assert written == tmp_path / "run.npz"
    assert written.is_file()
    loaded = load_timeline(written)
    assert_same(loaded, original)
    assert loaded.phases == ("load", "prefill", "decode")
    assert loaded.metadata["nested"] == {"list": [1, 2.5, None, True], "text": "\u00fc"}
    assert loaded.peak_bytes == 123_456 + 4000 + 2**33 + 512


def test_compressed_and_uncompressed_files_differ_on_disk(tmp_path: Path) -> None:
    timeline = Timeline(**{name: np.zeros(10_000, dtype=dtype) for name, dtype in DTYPES.items()}, **ONE_NAME_TABLES)
    plain = save_timeline(timeline, tmp_path / "plain.npz")
    packed = save_timeline(timeline, tmp_path / "packed.npz", compress=True)
    with zipfile.ZipFile(plain) as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
    with zipfile.ZipFile(packed) as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_DEFLATED}
    assert packed.stat().st_size < plain.stat().st_size
    assert_same(load_timeline(packed), timeline)
    assert_same(load_timeline(str(plain)), timeline)


def test_empty_timeline_round_trips(tmp_path: Path) -> None:
    empty = Timeline(**{name: np.zeros(0, dtype=dtype) for name, dtype in DTYPES.items()}, base_bytes=9)
    loaded = load_timeline(save_timeline(empty, tmp_path / "empty.npz"))
    assert_same(loaded, empty)
    assert loaded.peak_bytes == 9


@pytest.mark.parametrize("name", ["run", "run.timeline", "run.NPZ"])
def test_a_path_without_the_npz_suffix_returns_the_file_written(tmp_path: Path, name: str) -> None:
    written = save_timeline(sample(), tmp_path / name)
    assert written == tmp_path / f"{name}.npz"
    assert [p.name for p in tmp_path.iterdir()] == [f"{name}.npz"]
    assert_same(load_timeline(written), sample())


def test_a_string_path_is_accepted(tmp_path: Path) -> None:
    written = save_timeline(sample(), str(tmp_path / "run"))
    assert written == tmp_path / "run.npz"


# --- malformed files -------------------------------------------------------------------------------


def header(n: int = 2, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "events": n,
        "categories": [c.value for c in Category],
        "phases": ["load"],
        "modules": [],
        "stacks": [],
        "base_bytes": 0,
        "time_unit": "event",
        "level": "tensor",
        "metadata": {},
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not ...}


def good_columns(n: int = 2) -> dict[str, np.ndarray]:
    columns = {name: np.zeros(n, dtype=dtype) for name, dtype in DTYPES.items()}
    for name in ("module", "stack"):
        columns[name] -= 1
    columns["nbytes"] += 8
    return columns


def write(path: Path, head: Any = None, raw_header: bytes | None = None, **columns: Any) -> Path:
    """An archive with ``head`` (JSON-encoded) or ``raw_header`` bytes, and the given columns."""
    entries: dict[str, Any] = dict(columns)
    if raw_header is not None:
        entries["header"] = np.frombuffer(raw_header, dtype=np.uint8)
    elif head is not None:
        entries["header"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
    np.savez(path, **entries)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        load_timeline(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_the_hand_written_archive_is_valid(tmp_path: Path) -> None:
    loaded = load_timeline(write(tmp_path / "ok.npz", header(), **good_columns()))
    assert loaded.nbytes.tolist() == [8, 8]
    assert loaded.phases == ("load",)


def test_a_file_that_is_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "notes.npz"
    path.write_text("these are not the bytes you are looking for\nsecond line\n")
    assert "not a readable vramlens timeline" in load_error(path)


def test_a_missing_file(tmp_path: Path) -> None:
    assert "not a readable vramlens timeline" in load_error(tmp_path / "absent.npz")


def truncated(tmp_path: Path, keep: float) -> Path:
    full = save_timeline(sample(), tmp_path / "full.npz").read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(full[: int(len(full) * keep)])
    return path


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_a_truncated_file(tmp_path: Path, keep: float) -> None:
    path = truncated(tmp_path, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # see test_a_truncated_file_is_closed_again
        assert "not a readable vramlens timeline" in load_error(path)
        gc.collect()


def test_a_truncated_file_is_closed_again(tmp_path: Path) -> None:
    path = truncated(tmp_path, 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_error(path)
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


def test_a_corrupted_stored_member(tmp_path: Path) -> None:
    path = save_timeline(sample(), tmp_path / "bad.npz")
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("nbytes.npy")
    raw = bytearray(path.read_bytes())
    raw[info.header_offset + 30 + len(info.filename) + info.compress_size - 1] ^= 0xFF  # last data byte
    path.write_bytes(bytes(raw))
    assert "CRC" in load_error(path)


def test_a_corrupted_compressed_member(tmp_path: Path) -> None:
    n = 5000
    big = Timeline(
        **{name: (np.arange(n) % 3).astype(dtype) for name, dtype in DTYPES.items()},
        phases=("a", "b", "c"),
        modules=("a", "b", "c"),
        stacks=("a", "b", "c"),
    )
    path = save_timeline(big, tmp_path / "bad.npz", compress=True)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("time.npy")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename)
    raw[start + 40 : start + 44] = bytes(b ^ 0xFF for b in raw[start + 40 : start + 44])
    path.write_bytes(bytes(raw))
    load_error(path)


def test_a_plain_npy_file(tmp_path: Path) -> None:
    path = tmp_path / "array.npy"
    np.save(path, np.arange(4))
    load_error(path)


def test_missing_header(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "x.npz", **good_columns()))
    assert "no 'header' entry" in message


def test_wrong_format_string(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "x.npz", header(format="other.timeline"), **good_columns()))
    assert "header.format must be 'vramlens.timeline'" in message


def test_header_that_is_not_an_object(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "x.npz", [FORMAT, VERSION], **good_columns()))
    assert "header.format" in message


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_unsupported_version(tmp_path: Path, version: Any) -> None:
    message = load_error(write(tmp_path / "x.npz", header(version=version), **good_columns()))
    assert f"header.version {version!r} is not supported; accepted: 1" in message


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00", b""])
def test_header_that_is_not_json(tmp_path: Path, raw: bytes) -> None:
    message = load_error(write(tmp_path / "x.npz", raw_header=raw, **good_columns()))
    assert "header is not JSON" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [("events", ...), ("events", "2"), ("categories", ...), ("phases", "load"), ("base_bytes", 1.5), ("metadata", [])],
)
def test_header_fields_of_the_wrong_kind_are_named(tmp_path: Path, key: str, value: Any) -> None:
    message = load_error(write(tmp_path / "x.npz", header(**{key: value}), **good_columns()))
    assert f"header.{key} is missing or not a" in message


def test_header_tables_must_hold_strings(tmp_path: Path) -> None:
    message = load_error(write(tmp_path / "x.npz", header(modules=["a", 3]), **good_columns()))
    assert "header.modules must be a list of strings" in message


@pytest.mark.parametrize("name", list(DTYPES))
def test_a_missing_column(tmp_path: Path, name: str) -> None:
    columns = good_columns()
    del columns[name]
    message = load_error(write(tmp_path / "x.npz", header(), **columns))
    assert f"column {name!r} is missing" in message


@pytest.mark.parametrize("name", list(DTYPES))
def test_a_column_with_the_wrong_dtype(tmp_path: Path, name: str) -> None:
    columns = good_columns()
    columns[name] = columns[name].astype(np.float64 if name != "time" else np.int32)
    message = load_error(write(tmp_path / "x.npz", header(), **columns))
    assert f"column {name!r} must be {np.dtype(DTYPES[name]).name}[2]" in message


@pytest.mark.parametrize("name", list(DTYPES))
def test_a_column_with_the_wrong_length(tmp_path: Path, name: str) -> None:
    columns = good_columns()
    columns[name] = np.concatenate([columns[name], columns[name][:1]])
    message = load_error(write(tmp_path / "x.npz", header(), **columns))
    assert f"column {name!r} must be" in message


def test_a_two_dimensional_column(tmp_path: Path) -> None:
    columns = good_columns()
    columns["storage"] = columns["storage"].reshape(1, 2)
    message = load_error(write(tmp_path / "x.npz", header(), **columns))
    assert "column 'storage' must be int64[2]" in message


@pytest.mark.parametrize("bad", [3, -1])
def test_category_codes_outside_the_header_table(tmp_path: Path, bad: int) -> None:
    columns = good_columns()
    columns["category"][1] = bad
    message = load_error(write(tmp_path / "x.npz", header(categories=["parameters", "gradients", "other"]), **columns))
    assert "column 'category' has codes outside header.categories" in message


def test_phase_codes_outside_the_header_table(tmp_path: Path) -> None:
    columns = good_columns()
    columns["phase"][0] = 1  # header has one phase
    with pytest.raises(InputError, match=r"timeline\.phase"):
        load_timeline(write(tmp_path / "x.npz", header(), **columns))


def test_categories_are_read_by_name_and_unknown_names_load_as_other(tmp_path: Path) -> None:
    columns = good_columns(4)
    columns["category"] = np.array([0, 1, 2, 3], dtype=np.int8)
    names = ["gradients", "future_category", "parameters", "kv_cache"]
    loaded = load_timeline(write(tmp_path / "x.npz", header(4, categories=names), **columns))
    assert [CATEGORY_ORDER[c] for c in loaded.category.tolist()] == [
        Category.GRADIENTS,
        Category.OTHER,
        Category.PARAMETERS,
        Category.KV_CACHE,
    ]
    assert loaded.breakdown_at() == {
        Category.GRADIENTS: 8,
        Category.OTHER: 8,
        Category.PARAMETERS: 8,
        Category.KV_CACHE: 8,
    }


# --- pickles are never loaded --------------------------------------------------------------------


class Payload:
    """Unpickling this object creates ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.makedirs, (str(self.path),))


def object_array(path: Path) -> np.ndarray:
    array = np.empty(2, dtype=object)
    array[0] = array[1] = Payload(path)
    return array


def test_the_payload_would_run_if_unpickled(tmp_path: Path) -> None:
    sentinel = tmp_path / "control-sentinel"
    path = write(tmp_path / "control.npz", header(), **{**good_columns(), "time": object_array(sentinel)})
    with np.load(path, allow_pickle=True) as archive:
        archive["time"]
    assert sentinel.exists()


@pytest.mark.parametrize("entry", ["time", "nbytes", "header"])
def test_a_pickled_object_array_is_refused_and_never_run(tmp_path: Path, entry: str) -> None:
    sentinel = tmp_path / "sentinel"
    entries: dict[str, Any] = {**good_columns(), entry: object_array(sentinel)}
    path = tmp_path / "evil.npz"
    write(path, None if entry == "header" else header(), **entries)
    load_error(path)
    assert not sentinel.exists()


def test_a_bare_pickle_file_is_refused_and_never_run(tmp_path: Path) -> None:
    import pickle

    sentinel = tmp_path / "sentinel"
    path = tmp_path / "evil.npz"
    path.write_bytes(pickle.dumps(Payload(sentinel)))
    load_error(path)
    assert not sentinel.exists()


def test_the_stream_column_round_trips_and_is_optional(tmp_path: Path) -> None:
    import dataclasses

    plain = sample()
    assert load_timeline(save_timeline(plain, tmp_path / "plain.npz")).stream is None
    streamed = dataclasses.replace(plain, stream=np.array([0, 1, 2, 1, 0], dtype=np.int8))
    loaded = load_timeline(save_timeline(streamed, tmp_path / "streamed.npz"))
    assert loaded.stream is not None and loaded.stream.dtype == np.int8
    assert loaded.stream.tolist() == [0, 1, 2, 1, 0]
    with pytest.raises(InputError, match=r"timeline\.stream"):
        dataclasses.replace(plain, stream=np.zeros(3, dtype=np.int8))
