"""Hostile inputs for the tests of issue 21, and a way to run code under limits.

* :func:`run_limited` runs ``python -m vramlens ...`` (or ``python -c CODE``) in a subprocess with
  an address-space limit (``resource.setrlimit(RLIMIT_AS)``) and a wall-clock timeout, so that a
  test of a bomb fails (instead of taking the machine down) on code that has no bound;
* the builders make the bombs: gzip and zip inflation bombs, "billion laughs" pickles and YAML,
  deep nesting, tuple hash bombs.

(Not a conftest.py: a second module named ``conftest`` would shadow ``tests/conftest.py``.)
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The source tree the subprocesses run (``HOSTILE_SRC`` runs the same tests against another
#: checkout, e.g. to see them fail on the code before a fix).
SRC = os.environ.get("HOSTILE_SRC") or str(Path(__file__).resolve().parents[1] / "src")
#: The limits the issue names: 5 s and 512 MiB per input.
SECONDS = 5.0
MEMORY = 512 * 2**20


@dataclass(frozen=True)
class Outcome:
    """How a limited run ended."""

    status: int | None
    """Exit status; None when it was killed for running past its time."""
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_line(self) -> str:
        """The stderr of a run that ended with one ``error: ...`` line (else the whole stderr)."""
        return self.stderr.strip()


def limited_env(**extra: str) -> dict[str, str]:
    """The environment of a limited child: this tree first on the path, one BLAS thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}
    env.update(PYTHONPATH=SRC, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2")
    env.update(extra)
    return env


def _limits(memory: int) -> None:  # runs in the child, before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_limited(
    *args: str,
    code: str | None = None,
    seconds: float = SECONDS,
    memory: int = MEMORY,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> Outcome:
    """``python -m vramlens ARGS`` (or ``python -c CODE``) under ``memory`` bytes of address space
    and ``seconds`` of wall time plus a start-up allowance (imports take 1-4 s on a busy CI)."""
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "vramlens", *args]
    start = time.monotonic()
    try:
        done = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            timeout=seconds + 15.0,
            cwd=cwd,
            env=env or limited_env(),
            preexec_fn=lambda: _limits(memory),
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"").decode(errors="replace")
        err = (expired.stderr or b"").decode(errors="replace")
        return Outcome(None, out, err, time.monotonic() - start)
    return Outcome(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        time.monotonic() - start,
    )


def assert_one_line_error(outcome: Outcome, *fragments: str) -> str:
    """The run ended in time with exit status 2 and a single ``error: ...`` line holding every fragment."""
    assert outcome.status is not None, f"ran past its time ({outcome.seconds:.0f} s): {outcome.stderr[-300:]}"
    assert outcome.status == 2, f"status {outcome.status}: {outcome.stderr[-500:]}"
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr[-500:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- bombs ------------------------------------------------------------------------------------


def gzip_bomb(inflated: int = 2**30, member: int = 64 * 2**20) -> bytes:
    """A gzip file of ``inflated`` zero bytes in members of ``member`` bytes (~1 KiB per MiB)."""
    one = gzip.compress(b"\x00" * member, compresslevel=9, mtime=0)
    return one * (inflated // member)


def _npy_header(dtype: str, count: int) -> bytes:
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': ({count},), }}".encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


_CHUNK = 16 * 2**20


def _deflated_zeros(count: int) -> bytes:
    """The rest of a raw deflate stream: ``count`` zero bytes (a multiple of 16 MiB), made fast:
    one chunk is compressed, flushed to a byte boundary, and repeated (its back-references only
    ever see zeros), then an empty final block."""
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = block.compress(b"\x00" * _CHUNK) + block.flush(zlib.Z_FULL_FLUSH)
    return piece * (count // _CHUNK) + b"\x03\x00"


def _zip(entries: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip archive of ``(name, stored bytes, crc, inflated size, method)`` entries (no zip64)."""
    out, central = bytearray(), bytearray()
    for name, data, crc, size, method in entries:
        offset = len(out)
        raw = name.encode()
        fields = struct.pack("<HHHHHIIIHH", 20, 0, method, 0, 0, crc, len(data), size, len(raw), 0)
        out += b"PK\x03\x04" + fields + raw + data
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fields + struct.pack("<HHHII", 0, 0, 0, 0, offset) + raw
    end = struct.pack("<HHHHIIH", 0, 0, len(entries), len(entries), len(central), len(out), 0)
    return bytes(out + central + b"PK\x05\x06" + end)


def npz_bomb(inflated: int = 2**30) -> bytes:
    """A ``.npz`` timeline (about 1 MiB) whose ``time`` column inflates to ``inflated`` bytes of
    zeros, beside a valid header for that many events."""
    events = inflated // 8
    header = json.dumps(
        {"format": "vramlens.timeline", "version": 1, "events": events, "categories": [], "phases": [], "modules": [],
         "stacks": [], "base_bytes": 0, "time_unit": "ns", "level": "tensor", "metadata": {}}
    )  # fmt: skip
    head = _npy_header("|u1", len(header)) + header.encode()
    column_head = _npy_header("<i8", events)
    # the column's .npy header first, then the zeros: one deflate stream of both
    stream = zlib.compressobj(9, zlib.DEFLATED, -15)
    prefix = stream.compress(column_head) + stream.flush(zlib.Z_FULL_FLUSH)
    zeros = _deflated_zeros(inflated)
    column_crc, chunk = zlib.crc32(column_head), b"\x00" * _CHUNK
    for _ in range(inflated // _CHUNK):
        column_crc = zlib.crc32(chunk, column_crc)
    return _zip(
        [
            ("header.npy", head, zlib.crc32(head), len(head), 0),
            ("time.npy", prefix + zeros, column_crc, len(column_head) + inflated, 8),
        ]
    )


def shared_lists(levels: int = 9, width: int = 10) -> list[object]:
    """A list whose expansion holds ``width ** levels`` strings, built from ``levels`` lists."""
    node: list[object] = ["ab"] * width
    for _ in range(levels - 1):
        node = [node] * width
    return node


def laughs_yaml(key: str = "model", levels: int = 9, width: int = 10) -> str:
    """A "billion laughs" YAML document (a few hundred bytes): ``key`` holds ``width ** levels`` values."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    lines.append(f"{key}: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def laughs_pickle(field: str = "frames", levels: int = 30) -> bytes:
    """A protocol-4 snapshot pickle (about 1 KB) whose first trace entry's ``field`` is a list
    nested ``levels`` deep, each level two references to the one below (``2**levels`` strings):
    the pickle memo shares them, as torch's own snapshots share their stacks."""
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, field: shared_lists(levels, 2)}
    return pickle.dumps({"segments": [], "device_traces": [[entry]]}, protocol=4)


def deep_list_json(depth: int = 100_000) -> bytes:
    """``depth`` nested JSON lists."""
    return b"[" * depth + b"]" * depth


def tuple_hash_bomb(levels: int = 40) -> bytes:
    """A pickle whose dict key is a tuple of two shared tuples, ``levels`` deep: hashing it takes
    2**levels steps (in the C unpickler, while it builds the dict)."""
    ops = bytearray(b"\x80\x04}\x94(K\x01K\x02\x86\x94")
    for level in range(levels):
        ops += b"h" + bytes([level + 1]) + b"h" + bytes([level + 1]) + b"\x86\x94"
    ops += b"K\x01u."
    return bytes(ops)


def zlib_ratio(data: bytes) -> float:
    """Inflated over compressed size of a gzip file (for the record)."""
    return len(zlib.decompress(data, 16 + zlib.MAX_WBITS)) / len(data)


def tiny_timeline_npz(path: Path) -> Path:
    """A valid two-event vramlens timeline."""
    from vramlens.result.timeline import Timeline
    from vramlens.trace.timeline_io import save_timeline

    timeline = Timeline(
        time=np.array([0, 1], np.int64),
        nbytes=np.array([1024, -1024], np.int64),
        category=np.array([0, 0], np.int8),
        phase=np.array([-1, -1], np.int32),
        module=np.array([-1, -1], np.int32),
        stack=np.array([-1, -1], np.int32),
        storage=np.array([0, 0], np.int64),
        phases=(),
        modules=(),
        stacks=(),
        base_bytes=0,
        time_unit="ns",
        level="tensor",
        metadata={},
    )
    return save_timeline(timeline, path, compress=True)
