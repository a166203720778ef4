"""The code of vramlens' dataclass methods, kept beside the package's bytecode between runs.

``@dataclass`` writes the source of each method it adds (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, and ``__setattr__`` and ``__delattr__`` when frozen) and compiles it with ``exec``
when the class is created. Before Python 3.13 that is one compilation per method: about 0.4 ms
of the 0.6 ms a frozen dataclass costs. A cold ``vramlens estimate`` creates about 90 of them,
so compiling their methods was a third of its start-up. Python keeps the bytecode of a module's
own code in ``__pycache__``, but not of methods compiled from strings.

:func:`install` gives :mod:`dataclasses` an ``exec`` (a module global, which its calls find before
the builtin) that, for classes of ``vramlens`` modules only (the ``__name__`` of the globals they
are created in), takes the code object from a table keyed by the module and the exact source
text, compiling it on a miss as ``exec`` does (file name ``<string>``, no inherited
``__future__`` flags): the functions made are the ones ``exec`` of the text makes. Classes of
other packages go straight to the builtin ``exec``.

At exit, when something was compiled, the tables of the modules this process created classes
in are written back (each replaced by what the module used, so code of old sources drops out)
to ``__pycache__/_dataclass_methods.<tag>.bin`` beside the package's ``.pyc`` files
(:func:`importlib.util.cache_from_source`: ``PYTHONPYCACHEPREFIX`` is honoured), as marshal
data headed by the interpreter's bytecode magic number, replaced atomically; nothing is
written when bytecode writing is off (``PYTHONDONTWRITEBYTECODE``) or the folder is read-only.
It is trusted as the ``.pyc`` files beside it are. A missing, unreadable or other-version file
is ignored (every method is compiled).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
from types import CodeType
from typing import Any

__all__ = ["install"]

#: Modules whose dataclass methods are cached.
_PACKAGE = "vramlens."


class Store:
    """Code tables per module: read from ``path`` on first use, written back by :meth:`save`."""

    def __init__(self, path: str | None) -> None:
        """A store backed by the file ``path`` (None: nothing is read or written)."""
        self.path = path
        self._packed: dict[str, bytes] | None = None
        self._tables: dict[str, dict[str, CodeType]] = {}
        self.used: dict[str, dict[str, CodeType]] = {}
        """Per module, the code this process ran (what :meth:`save` writes)."""
        self.compiled = 0
        """Sources compiled in this process (cache misses)."""

    def code(self, module: str, source: str) -> CodeType:
        """The code of ``source``, a method's source written by dataclasses in ``module``."""
        table = self._tables.get(module)
        if table is None:
            table = self._tables[module] = _unpack(self._file().pop(module, None))
        code = table.get(source)
        if code is None:
            code = table[source] = compile(source, "<string>", "exec", dont_inherit=True)
            self.compiled += 1
        self.used.setdefault(module, {})[source] = code
        return code

    def save(self) -> None:
        """Write the modules' tables back when anything was compiled (see the module docstring)."""
        if not self.compiled or self.path is None or sys.dont_write_bytecode:
            return
        packed = _read(self.path)
        packed.update((module, marshal.dumps(table)) for module, table in self.used.items())
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(temporary, "wb") as handle:
                handle.write(_magic() + marshal.dumps(packed))
            os.replace(temporary, self.path)
        except OSError:  # a read-only installation: every run compiles, as without the store
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        self.compiled = 0

    def _file(self) -> dict[str, bytes]:
        if self._packed is None:
            self._packed = _read(self.path) if self.path is not None else {}
        return self._packed


def _magic() -> bytes:
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER


def _read(path: str) -> dict[str, bytes]:
    """Module -> marshalled table, from the file at ``path`` ({} if absent, foreign or damaged)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        magic = _magic()
        packed = marshal.loads(data[len(magic) :]) if data.startswith(magic) else {}
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(packed, dict) or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in packed.items()):
        return {}
    return packed


def _unpack(raw: bytes | None) -> dict[str, CodeType]:
    """One module's table ({} if absent or damaged)."""
    try:
        table = marshal.loads(raw) if raw is not None else {}
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, CodeType) for k, v in table.items()):
        return {}
    return table


def default_path() -> str | None:
    """``__pycache__/_dataclass_methods.<tag>.bin`` of this package (None when this Python
    keeps no bytecode: no cache tag)."""
    from importlib.util import cache_from_source

    try:
        pyc = cache_from_source(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dataclass_methods.py"))
    except NotImplementedError:
        return None
    return pyc.removesuffix(".pyc") + ".bin"


_store: Store | None = None


def _exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
    """``exec`` for :mod:`dataclasses`: the stored code for a vramlens class's method source."""
    if type(source) is not str:
        return builtins.exec(source, globals, locals)
    module = globals.get("__name__") if type(globals) is dict else None
    if _store is None or not isinstance(module, str) or not module.startswith(_PACKAGE):
        # compiled here as dataclasses' own exec would: not with this module's __future__ flags
        return builtins.exec(compile(source, "<string>", "exec", dont_inherit=True), globals, locals)
    return builtins.exec(_store.code(module, source), globals, locals)


def install() -> None:
    """Route :mod:`dataclasses`' ``exec`` through the store (once per process), and write the
    store back at exit."""
    global _store
    if _store is not None:
        return
    _store = Store(default_path())
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # a module global before the builtin
    atexit.register(_store.save)
