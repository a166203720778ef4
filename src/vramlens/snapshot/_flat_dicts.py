"""One regex over runs of flat dicts, the bulk of a snapshot pickle, for :func:`~vramlens.snapshot._unpickle.check_opcodes`.

A trace entry, a frame and a block pickle (protocol 4 and 5, ``pickle.dump``'s default) as
``EMPTY_DICT MEMOIZE MARK``, key/value pairs, ``SETITEMS``; keys are memo gets or short strings,
values memo gets, integers of up to 64 bits, short strings, None or booleans; between two list
batches of 1000 entries come ``APPENDS MARK``. :func:`flat_dicts` matches a run of such dicts
as a whole, about twice as fast as the check's opcode-by-opcode pattern, which tries each
opcode against every kind of opcode in turn.

Every opcode it matches is one the opcode-by-opcode pattern passes unconditionally, with the
same argument lengths (so both read the same opcode boundaries), and it matches nothing that
pattern stops at (``FRAME``, ``PUT``s, ``STOP``, tuples): the check accepts and refuses exactly
the same files with it.
"""

from __future__ import annotations

import re
import sys
from functools import cache

__all__ = ["EMPTY_DICT", "flat_dicts"]

#: The ``EMPTY_DICT`` opcode, where a run of flat dicts begins.
EMPTY_DICT = ord("}")


def _counted(longest: int) -> bytes:
    """A one-byte length (0 to ``longest``) and that many bytes."""
    return b"(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(longest + 1)) + b")"


@cache
def flat_dicts(short: int) -> re.Pattern[bytes]:
    """A run of flat dicts (module docstring); strings up to ``short`` bytes (``SHORT_BINUNICODE``)."""
    text = b"\x8c" + _counted(short)
    get = b"j.{4}|h."  # LONG_BINGET, BINGET
    key = b"(?:" + get + b"|" + text + b"\x94)"  # a memo get, or a new key string and its MEMOIZE
    integer = b"\x8a" + _counted(8) + b"|K.|M..|J.{4}"  # LONG1 (up to 64 bits), BININT1, BININT2, BININT
    value = b"(?:" + get + b"|" + integer + b"|[N\x88\x89]|" + text + b"\x94?)"  # None, True, False
    possessive = sys.version_info >= (3, 11)  # no backtracking state kept; 3.10 gets bounded runs
    pairs = b"(?:" + key + value + (b")++" if possessive else b")+")
    one = b"(?:e\\()?\\}\x94\\(" + pairs + b"u"  # [APPENDS MARK] EMPTY_DICT MEMOIZE MARK pairs SETITEMS
    return re.compile(b"(?:" + one + (b")*+" if possessive else b"){0,4096}"), re.DOTALL)
