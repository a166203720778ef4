"""Opening snapshot files without running code: a validated, restricted unpickler, and JSON.

A ``_dump_snapshot`` pickle holds only dicts, lists, tuples, strings, numbers, booleans and
None (torch/csrc/cuda/memory_snapshot.cpp, ``torch.cuda.memory._dump_snapshot``). So:

1. the whole file is read into memory (only regular files, at most 4 GiB: :mod:`vramlens._files`);
2. :func:`check_opcodes` walks every pickle opcode before anything is built and refuses
   (one-line :class:`InputError`) any opcode that imports, calls or builds objects
   (``GLOBAL``, ``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``,
   persistent ids, extension codes, out-of-band buffers), any length field that claims more
   bytes than remain (a "length bomb": CPython's C unpickler allocates a ``BINBYTES8`` claim
   before reading it) and any memo index beyond half the file's size (``LONG_BINPUT`` 2**27
   in a 10-byte file makes CPython 3.11 zero a 2 GiB memo table; a genuine pickle needs at least
   two bytes per memo entry, so the memo stays under 8 bytes per byte of file). The walk runs
   in the ``re`` engine over runs of common opcodes and of flat dicts (trace entries, frames:
   :mod:`vramlens.snapshot._flat_dicts`; 0.2 s for 10**6 entries) and in Python only for the rare ones;
3. the C unpickler then runs with ``find_class`` and ``persistent_load`` raising, as a second
   line of defence, with the cyclic garbage collector paused (it would otherwise rescan the
   millions of new dicts many times over).

4. what was built is walked once (:func:`vramlens._untrusted.check_tree`): a cycle, nesting
   over 64 levels or more values than :func:`expanded_budget` (shared references counted once
   per place, the "billion laughs" of pickles) is refused, so no later walk can blow up.

JSON snapshots (MemoryViz accepts them too) are parsed with :func:`vramlens._untrusted.load_json`.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import pickletools
import re
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from vramlens._files import LIMITS, read_regular
from vramlens._untrusted import check_tree, load_json
from vramlens.errors import InputError
from vramlens.snapshot._flat_dicts import EMPTY_DICT, flat_dicts

__all__ = ["check_opcodes", "decode", "expanded_budget", "paused_gc", "read_source"]

#: Opcodes a snapshot pickle may use (pickletools names): containers, strings, numbers, memo.
_ALLOWED = frozenset(
    {
        "MARK",
        "STOP",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "EMPTY_DICT",
        "DICT",
        "EMPTY_LIST",
        "LIST",
        "APPEND",
        "APPENDS",
        "SETITEM",
        "SETITEMS",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "MEMOIZE",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "PROTO",
        "FRAME",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "GET",
        "BINGET",
        "LONG_BINGET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
    }
)
#: Allowed opcodes that need a check the fast path cannot make (end, protocol, memo index, frame).
_CHECKED = frozenset({"STOP", "PROTO", "FRAME", "LONG_BINPUT", "PUT"})
#: Opcodes that build something whose items get hashed (tuples, frozensets, set items): allowed
#: only with numbers and strings as items (:func:`_flat_units`). Hashing a tuple walks it, and a
#: tuple of shared tuples nested 40 deep, 200 bytes of pickle, would take 2**40 steps to hash
#: (as a dict key, while the unpickler builds the dict). Real snapshots' tuples are pool ids.
_HASHED = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "FROZENSET", "ADDITEMS"})
#: Length-prefixed strings up to this many bytes are matched by the fast path.
_SHORT = 63
_WIDTH = {
    pickletools.TAKEN_FROM_ARGUMENT1: 1,
    pickletools.TAKEN_FROM_ARGUMENT4: 4,
    pickletools.TAKEN_FROM_ARGUMENT4U: 4,
    pickletools.TAKEN_FROM_ARGUMENT8U: 8,
}
_LINE = -1
_COUNTED = -2
#: Runs of the fast path a tuple or set opcode may look back over (:func:`_rescan`).
_RESCAN_RUNS = 16
#: Expanded values a snapshot may stand for: at least this many, else this many per byte
#: (:func:`expanded_budget`).
_MIN_EXPANDED = 1 << 24
_EXPANSION = 256


@cache
def _opcodes() -> dict[int, tuple[str, int, int, bool]]:
    """Opcode byte -> ``(name, size, width, signed)`` from this Python's pickletools table:
    ``size`` >= 0 fixed argument bytes, ``_LINE`` up to a newline, ``_COUNTED`` a ``width``-byte
    little-endian length (``signed`` or not) followed by that many bytes."""
    table: dict[int, tuple[str, int, int, bool]] = {}
    for info in pickletools.opcodes:
        n = 0 if info.arg is None else info.arg.n
        if n in _WIDTH:
            entry = (info.name, _COUNTED, _WIDTH[n], n == pickletools.TAKEN_FROM_ARGUMENT4)
        else:
            entry = (info.name, n if n >= 0 else _LINE, 0, False)
        table[info.code.encode("latin-1")[0]] = entry
    return table


def _below_power_of_two(bits: int) -> bytes:
    """A regex matching a 4-byte little-endian integer below ``2**bits`` (bits <= 32)."""
    full, partial = divmod(bits, 8)
    pattern = b"." * full
    if full < 4:
        pattern += b"[\\x00-" + re.escape(bytes([(1 << partial) - 1])) + b"]" + b"\\x00" * (3 - full)
    return pattern


@cache
def _fast_path(memo_bits: int, flat_units: bool = False) -> re.Pattern[bytes]:
    """A regex matching a run of common, unconditionally safe opcodes with their arguments,
    ``LONG_BINPUT`` included while its index is below ``2**memo_bits`` (a power of two within
    the file's memo bound, so protocol-2 pickles, which memoise every object that way, stay fast).
    With ``flat_units``, tuples and sets of scalars (:func:`_flat_units`) are matched too: that
    pattern tries a tuple at every opcode and runs about 9 times slower, so :func:`check_opcodes`
    uses it only to re-read a run that stopped at a tuple or set opcode. Without it, the run
    stops at ``EMPTY_DICT``, where :func:`~vramlens.snapshot._flat_dicts.flat_dicts` goes on.

    ``BINGET`` and ``LONG_BINGET`` come first as literals (they are most of a snapshot's
    opcodes: repeated keys, shared stacks); ``.`` under DOTALL is sre's fastest any-byte."""
    fixed: dict[int, bytearray] = {}
    counted = bytearray()
    for code, (name, size, width, _) in _opcodes().items():
        if name not in _ALLOWED or name in _CHECKED or name in _HASHED or (code == EMPTY_DICT and not flat_units):
            continue
        if size == _COUNTED and width == 1:
            counted.append(code)
        elif size >= 0:
            fixed.setdefault(size, bytearray()).append(code)

    def run(codes: bytearray, size: int) -> bytes:
        """One of ``codes`` followed by ``size`` argument bytes."""
        return b"[" + re.escape(bytes(codes)) + b"]" + (b".{%d}" % size if size else b"")

    lengths = b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(_SHORT + 1))
    parts = [
        *(_flat_units() if flat_units else []),
        b"h.",
        b"j.{4}",
        run(fixed[1], 1),
        run(fixed[0], 0),
        run(fixed[4], 4),
    ]
    parts += [run(counted, 0) + b"(?:" + lengths + b")", run(fixed[2], 2), run(fixed[8], 8)]
    parts.append(b"r" + _below_power_of_two(memo_bits))
    body = b"(?:" + b"|".join(parts) + b")"
    # Possessive (3.11+) keeps no backtracking state; 3.10 gets bounded runs instead.
    return re.compile(body + (b"*+" if sys.version_info >= (3, 11) else b"{0,4096}"), re.DOTALL)


def _flat_units() -> list[bytes]:
    """Regexes of a tuple, frozenset or set update whose items are all scalars (numbers,
    strings, bytes, None, booleans), each optionally memoised: the only way the fast path
    passes those opcodes (anywhere else they are refused)."""
    one = b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(_SHORT + 1))
    four = b"|".join(re.escape(n.to_bytes(4, "little")) + b".{%d}" % n for n in range(_SHORT + 1))
    scalar = b"(?:[N\x88\x89]|K.|M..|J.{4}|G.{8}|[\x8a\x8cCU](?:" + one + b")|[XB](?:" + four + b")|[ILFSV][^\n]*\n)"
    item = b"(?:" + scalar + b"(?:\x94|q.|p[0-9]{1,6}\n)?)"
    many = b"*+" if sys.version_info >= (3, 11) else b"*"
    units = [item + b"{%d}" % n + re.escape(bytes([0x84 + n])) for n in (3, 2, 1)]  # TUPLE3, TUPLE2, TUPLE1
    units.append(rb"\(" + item + many + b"[t\x91\x90]")  # MARK items TUPLE / FROZENSET / ADDITEMS
    return units


def check_opcodes(data: bytes, name: str) -> None:
    """Refuse (one-line :class:`InputError`) a pickle that is not plain data (see the module docstring)."""
    memo_bits = min(max(len(data) // 2, 1).bit_length() - 1, 32)
    table, fast, with_tuples = _opcodes(), _fast_path(memo_bits), _fast_path(memo_bits, True)
    flat = flat_dicts(_SHORT)
    end, pos = len(data), 0
    starts: deque[int] = deque(maxlen=_RESCAN_RUNS)
    while True:
        starts.append(pos)
        match = fast.match(data, pos)
        pos = match.end() if match else pos
        if pos < end and data[pos] == EMPTY_DICT:  # a run of flat dicts, else the dict opcode alone
            run = flat.match(data, pos)
            pos = max(run.end() if run else pos, pos + 1)
            continue
        if pos < end and table.get(data[pos], ("",))[0] in _HASHED:
            resumed = _rescan(data, with_tuples, starts, pos)
            if resumed is not None:
                pos = resumed
                starts.clear()
                continue
        if pos >= end:
            raise InputError(f"{name}: truncated pickle (no STOP opcode); not a complete snapshot file")
        code = data[pos]
        op_name, size, width, signed = table.get(code, ("", 0, 0, False))
        if op_name not in _ALLOWED:
            what = f"opcode {op_name}" if op_name else f"byte 0x{code:02x}, not a pickle opcode,"
            raise InputError(
                f"{name}: refused: {what} at byte {pos}; a memory snapshot holds only dicts, lists, "
                "strings and numbers, and vramlens never imports or calls anything from a file"
            )
        if op_name == "STOP":
            return
        if op_name in _HASHED:
            raise InputError(
                f"{name}: refused: opcode {op_name} at byte {pos} builds a tuple or set of containers or shared values; "
                "a memory snapshot's tuples and sets hold only numbers and strings"
            )
        if size == _COUNTED:
            pos = _skip_counted(data, pos, op_name, width, signed, name)
        elif size == _LINE:
            pos = _skip_line(data, pos, op_name, name)
        else:
            pos = _skip_fixed(data, pos, op_name, size, name)


def _rescan(data: bytes, with_tuples: re.Pattern[bytes], starts: deque[int], pos: int) -> int | None:
    """Where the scan resumes after the tuple or set opcode at ``pos``: the end of a re-read with
    tuples of scalars allowed, from the start of one of the last runs (most recent first: a
    protocol-0 tuple's items are split into runs by their ``PUT`` opcodes); None when no re-read
    gets past ``pos`` (the opcode is then refused). Each run is re-read at most
    :data:`_RESCAN_RUNS` times, so the check stays linear in the file."""
    for start in reversed(starts):
        again = with_tuples.match(data, start)
        if again is not None and again.end() > pos:
            return again.end()
    return None


def _skip_counted(data: bytes, pos: int, op_name: str, width: int, signed: bool, name: str) -> int:
    """Position after a length-prefixed opcode; the length must fit in the bytes that remain."""
    header = pos + 1 + width
    length = int.from_bytes(data[pos + 1 : header], "little", signed=signed)
    remaining = len(data) - header
    if remaining < 0 or not 0 <= length <= remaining:
        raise InputError(
            f"{name}: refused: {op_name} at byte {pos} declares {length} bytes but only "
            f"{max(remaining, 0)} remain (a truncated file or a length bomb)"
        )
    return header + length


def _skip_line(data: bytes, pos: int, op_name: str, name: str) -> int:
    """Position after a protocol-0 opcode whose argument ends at a newline."""
    newline = data.find(b"\n", pos + 1)
    if newline < 0:
        raise InputError(f"{name}: truncated pickle ({op_name} at byte {pos} has no end of line)")
    if op_name == "PUT":
        _check_memo(_text_int(data[pos + 1 : newline], name, pos), pos, name)
    return newline + 1


def _skip_fixed(data: bytes, pos: int, op_name: str, size: int, name: str) -> int:
    """Position after a fixed-size opcode, checking protocol, frame length and memo index."""
    after = pos + 1 + size
    if after > len(data):
        raise InputError(f"{name}: truncated pickle ({op_name} at byte {pos})")
    argument = int.from_bytes(data[pos + 1 : after], "little")
    if op_name == "LONG_BINPUT":
        _check_memo(argument, pos, name)
    elif op_name == "PROTO" and argument > pickle.HIGHEST_PROTOCOL:
        raise InputError(f"{name}: pickle protocol {argument} is newer than this Python reads")
    elif op_name == "FRAME" and argument > len(data) - after:
        raise InputError(
            f"{name}: refused: FRAME at byte {pos} declares {argument} bytes but only {len(data) - after} remain"
        )
    return after


def _text_int(raw: bytes, name: str, pos: int) -> int:
    """A protocol-0 decimal argument."""
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"{name}: corrupt pickle (bad number at byte {pos})") from None


def _check_memo(index: int, pos: int, name: str) -> None:
    """A memo index needs at least two bytes of opcodes per earlier entry (see module docstring)."""
    if not 0 <= index <= pos // 2:
        raise InputError(f"{name}: refused: memo index {index} at byte {pos} is larger than the data read so far")


class _DataOnlyUnpickler(pickle.Unpickler):
    """An unpickler that can build only plain data: every global and persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        """Never import anything (``os.system``, ``builtins.eval`` ...)."""
        raise pickle.UnpicklingError(f"global {module}.{name} refused")

    def persistent_load(self, pid: Any) -> Any:
        """Never resolve persistent ids (torch.load's tensor storages)."""
        raise pickle.UnpicklingError("persistent id refused")


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (restored on exit) while millions of containers are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _first_line(error: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters) for a one-line error."""
    text = str(error).strip().splitlines()
    return (text[0][:200] if text else "") or type(error).__name__


def expanded_budget(size: int) -> int:
    """Values (expanded: a shared list counted once per place it appears) a snapshot of ``size``
    bytes may stand for. Real snapshots share each stack between the entries recorded at it,
    which expands them 5 to 30 times; a "billion laughs" pickle of 3 KB expands 10**9 times."""
    return max(_MIN_EXPANDED, _EXPANSION * size)


def decode(data: bytes, name: str) -> Any:
    """The object in a pickle or JSON snapshot's bytes (JSON when it starts with ``{`` or ``[``),
    checked by :func:`vramlens._untrusted.check_tree`: no cycle, at most 64 levels, and at most
    :func:`expanded_budget` values."""
    head = data[:64].lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    if head in (b"{", b"["):
        with paused_gc():
            return load_json(data, name=name, what="a JSON memory snapshot", max_values=None)
    if not data:
        raise InputError(f"{name}: empty file; expected a PyTorch memory snapshot (pickle or JSON)")
    check_opcodes(data, name)
    try:
        with paused_gc():
            # A buffered reader has peek(), so the C unpickler prefetches unframed (protocol 2) data.
            obj = _DataOnlyUnpickler(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)).load()
    except Exception as error:  # any failure of untrusted data is the file's fault
        raise InputError(f"{name}: corrupt snapshot pickle ({_first_line(error)})") from None
    check_tree(obj, name=name, max_values=expanded_budget(len(data)))
    return obj


def read_source(source: Any, name: str | None = None) -> tuple[Any, str]:
    """``(object, name for messages)`` of a path, bytes, an already-loaded dict or a bare list
    (``name`` replaces the default name of bytes, dicts and lists)."""
    if isinstance(source, Mapping):
        return source, name or "<snapshot dict>"
    if isinstance(source, list):
        return source, name or "<snapshot list>"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode(bytes(source), name or "<bytes>"), name or "<bytes>"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return decode(read_regular(path, LIMITS["record"], InputError), str(path)), str(path)
    raise InputError(
        f"source: {type(source).__name__} is not a snapshot; accepted: a path, bytes, a dict or a list of segments"
    )
