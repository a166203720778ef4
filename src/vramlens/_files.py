"""Reading untrusted files with bounds: regular files only, a size limit per kind of file, and
decompression that stops at a limit.

* Only regular files are read. A device (``/dev/zero``, ``/dev/urandom``) never ends and a FIFO
  blocks until someone writes to it, so :func:`open_regular` opens without blocking and
  refuses anything whose ``fstat`` is not a regular file, before reading a byte.
* Each kind of file has a size limit (:data:`LIMITS`, far above any real file of that kind);
  a larger file is refused with one line, and a file that grows while it is read is cut off
  at the limit plus one byte (then refused).
* Compressed input (gzip members, zip entries) is inflated in steps of at most the bytes still
  allowed, so a decompression bomb (1 KiB of gzip can stand for 1 MiB; a crafted 3 MiB file
  for 6 GiB) stops at :func:`inflation_limit`: :data:`MAX_INFLATION` times the compressed size
  or the caller's cap, whichever is smaller (real profiler exports and timelines compress 5-7
  times; see ``tests/test_hostile_input.py``).
"""

from __future__ import annotations

import os
import stat
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

from vramlens.errors import VramlensError

if TYPE_CHECKING:
    from importlib.abc import Traversable

__all__ = [
    "LIMITS",
    "MAX_INFLATION",
    "FileKind",
    "files_markdown",
    "gunzip",
    "inflation_limit",
    "open_regular",
    "package_data",
    "read_open_file",
    "read_regular",
    "read_small_text",
]

#: Largest ratio of inflated to compressed bytes accepted (real records compress 5-7 times).
MAX_INFLATION: Final = 32
#: Inflated bytes always allowed, whatever the compressed size (headers of tiny files).
_INFLATION_FLOOR: Final = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class FileKind:
    """A kind of file vramlens reads, and the most bytes it reads of one."""

    what: str
    """What the file should be, for messages ("a workload file")."""
    limit: int
    """Largest size accepted, bytes."""


#: Every kind of file read whole, with its size limit (each far above real files of the kind).
LIMITS: Final = {
    "workload": FileKind(what="a workload file (YAML or JSON)", limit=1 << 20),
    "matrix": FileKind(what="an experiment matrix file (YAML)", limit=1 << 20),
    "config": FileKind(what="a JSON model config", limit=10 << 20),
    "safetensors-index": FileKind(what="a safetensors index (model.safetensors.index.json)", limit=64 << 20),
    "store": FileKind(what="a vramlens results store (JSON lines)", limit=256 << 20),
    "hf-ref": FileKind(what="a Hugging Face cache ref (a commit hash)", limit=1 << 10),
    "record": FileKind(what="a memory record (snapshot, profiler export or vramlens timeline)", limit=4 << 30),
}


def _size(limit: int) -> str:
    """A size in words: 1 MiB, 4 GiB, 31.9 MiB, 1,000 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift:
            exact = limit % (1 << shift) == 0
            return f"{limit >> shift} {unit}" if exact else f"{limit / (1 << shift):,.1f} {unit}"
    return f"{limit:,} bytes"


def files_markdown() -> str:
    """The Markdown table of :data:`LIMITS` that ``docs/limits.md`` holds."""
    lines = ["| file | largest accepted |", "| --- | --- |"]
    lines += [f"| {kind.what} | {_size(kind.limit)} |" for kind in LIMITS.values()]
    return "\n".join(lines) + "\n"


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], kind: FileKind, error: type[VramlensError]) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file of at most ``kind.limit``
    bytes; otherwise ``error`` with one line naming the file (never blocks on a FIFO)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: cannot read: {_describe(info.st_mode)}, not a regular file; expected {kind.what}")
        if info.st_size > kind.limit:
            raise error(f"{path}: {info.st_size:,} bytes, larger than the {_size(kind.limit)} accepted for {kind.what}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_regular(path: str | os.PathLike[str], kind: FileKind, error: type[VramlensError]) -> bytes:
    """Every byte of the regular file ``path`` (at most ``kind.limit``; see :func:`open_regular`)."""
    with open_regular(path, kind, error) as handle:
        try:
            return read_open_file(handle, kind, path, error)
        except OSError as exc:
            raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_open_file(handle: BinaryIO, kind: FileKind, path: object, error: type[VramlensError]) -> bytes:
    """The bytes of an open regular file, refused past ``kind.limit``. ``read(n)`` allocates
    ``n`` bytes first, so it asks for the file's size (plus one byte, to see it grow), then
    reads on in 1 MiB steps only while the file keeps growing."""
    expected = min(os.fstat(handle.fileno()).st_size, kind.limit)
    data = handle.read(expected + 1)
    while len(data) > expected and len(data) <= kind.limit:
        more = handle.read(min(1 << 20, kind.limit + 1 - len(data)))
        if not more:
            break
        data += more
    if len(data) > kind.limit:
        raise error(f"{path}: larger than the {_size(kind.limit)} accepted for {kind.what}")
    return data


def read_small_text(
    path: str | os.PathLike[str], *, limit: int, error: type[VramlensError], what: str
) -> tuple[Path, str]:
    """The UTF-8 text of the regular file ``path``, refusing files over ``limit`` bytes.

    Raises ``error`` with a one-line message naming the file; ``what`` says what the
    file was expected to be ("a workload file", "a model config").
    """
    file = Path(path)
    data = read_regular(file, FileKind(what=what, limit=limit), error)
    try:
        return file, data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{file}: not UTF-8 text; expected {what}") from None


def inflation_limit(compressed_bytes: int, cap: int) -> int:
    """Most bytes an input of ``compressed_bytes`` may inflate to: :data:`MAX_INFLATION` times
    its size (at least 1 MiB), and never more than ``cap``."""
    return min(max(MAX_INFLATION * compressed_bytes, _INFLATION_FLOOR), cap)


def gunzip(data: bytes, *, name: str, limit: int, error: type[VramlensError], accepted: str = "") -> bytes:
    """The inflated bytes of a gzip file (every member, as ``gzip`` reads them), refused with
    ``error`` as soon as they pass ``limit`` bytes: each step inflates at most the bytes still
    allowed, so a bomb costs ``limit`` bytes of memory at most."""
    suffix = f"; {accepted}" if accepted else ""
    out = bytearray()
    rest = data
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = rest
        try:
            while True:
                out += inflater.decompress(chunk, limit + 1 - len(out))
                if len(out) > limit:
                    raise error(
                        f"{name}: inflates to more than {_size(limit)} (accepted: {MAX_INFLATION} times its "
                        f"{_size(len(data))} at most, a decompression bomb otherwise){suffix}"
                    )
                if inflater.eof:
                    break
                chunk = inflater.unconsumed_tail
                if not chunk:
                    raise error(f"{name}: corrupt gzip file (it ends inside a compressed block){suffix}")
        except zlib.error as exc:
            raise error(f"{name}: corrupt gzip file ({exc}){suffix}") from None
        rest = inflater.unused_data.lstrip(b"\x00")  # members may be padded with zero bytes
    return bytes(out)


def package_data(package: str) -> Traversable:
    """The bundled data files of an imported ``package``: its directory on disk, or
    ``importlib.resources``' view of it when the package is not a directory (inside a zip).
    ``importlib.resources`` costs a cold command 8 ms of imports (tempfile, shutil, lzma), so it
    is only imported when the plain directory is not there."""
    file = getattr(sys.modules[package], "__file__", None)
    if file is not None and os.path.isdir(directory := os.path.dirname(file)):
        return Path(directory)
    from importlib import resources

    return resources.files(package)
