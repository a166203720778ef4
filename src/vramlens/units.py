"""Byte and count units: the only module that converts bytes to and from human units.

Conventions used everywhere in vramlens:

* Byte quantities are ``int`` and their names end in ``_bytes``.
* Binary units (KiB, MiB, GiB, TiB) are powers of 2**10; decimal units (KB, MB,
  GB, TB) are powers of 10**3. ``nvidia-smi`` and ``torch.cuda`` print MiB/GiB;
  GPU vendors' marketing capacities ("80GB") are decimal-ish and are looked up
  in the hardware table rather than converted.
* Bare single-letter units ("80G") are refused: they are ambiguous between GiB
  and GB, and a 7% difference is the gap between fitting and OOM.
* Parameter counts use decimal suffixes K/M/B/T (thousand, million, billion,
  trillion) and are parsed by :func:`parse_count`, never by :func:`parse_size`.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final

from vramlens.errors import InputError

if TYPE_CHECKING:
    from decimal import Decimal

__all__ = [
    "GB",
    "KB",
    "MB",
    "TB",
    "GiB",
    "KiB",
    "MiB",
    "TiB",
    "format_bytes",
    "format_count",
    "parse_count",
    "parse_size",
    "to_gib",
]

KiB: Final = 2**10
MiB: Final = 2**20
GiB: Final = 2**30
TiB: Final = 2**40
KB: Final = 10**3
MB: Final = 10**6
GB: Final = 10**9
TB: Final = 10**12

#: Accepted byte-unit suffixes (lower-cased) and their size in bytes.
BYTE_UNITS: Final[dict[str, int]] = {
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
}

#: Parameter-count suffixes (upper-cased): K thousand, M million, B billion, T trillion.
COUNT_UNITS: Final[dict[str, int]] = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

_NUMBER_RE: Final = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
_ACCEPTED_SIZES: Final = (
    "a byte count or a number with a unit: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (e.g. '80GiB', '24 GB')"
)


def _decimal(text: str, field: str, accepted: str) -> tuple[Decimal, str]:
    """The number and unit of ``text`` (``decimal`` is imported here: parsing a human size is rare, and
    a cold ``vramlens estimate`` need not load it)."""
    from decimal import Decimal, InvalidOperation

    match = _NUMBER_RE.match(text)
    if match is None:
        raise InputError(f"{field}: cannot read {text!r} as a size; expected {accepted}")
    try:
        number = Decimal(match.group(1).replace(",", "").replace("_", ""))
    except InvalidOperation:
        raise InputError(f"{field}: cannot read {text!r}; expected {accepted}") from None
    return number, match.group(2)


def _nearest(number: Decimal) -> int:
    """``number`` rounded to the nearest integer (ties to even)."""
    from decimal import ROUND_HALF_EVEN

    return int(number.to_integral_value(rounding=ROUND_HALF_EVEN))


def parse_size(value: str | int, *, field: str = "size") -> int:
    """Parse a human size such as ``"80GiB"``, ``"24 GB"`` or ``1024`` into bytes (int).

    Units: B, KiB, MiB, GiB, TiB (powers of 2) and KB, MB, GB, TB (powers of 10),
    case-insensitive; a bare number is bytes. Fractions are allowed ("1.5GiB") and
    rounded to the nearest byte. Raises :class:`InputError` naming ``field`` for
    negative, non-numeric or ambiguous input ("80G").
    """
    if isinstance(value, bool):
        raise InputError(f"{field}: expected {_ACCEPTED_SIZES}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InputError(f"{field}: size must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise InputError(f"{field}: expected {_ACCEPTED_SIZES}, got {type(value).__name__}")
    number, unit = _decimal(value, field, _ACCEPTED_SIZES)
    scale = BYTE_UNITS.get(unit.lower()) if unit else 1
    if scale is None:
        hint = " (ambiguous: write GiB for 2**30 or GB for 10**9)" if unit.upper() in {"K", "M", "G", "T"} else ""
        raise InputError(f"{field}: unknown unit {unit!r} in {value!r}{hint}; expected {_ACCEPTED_SIZES}")
    return _nearest(number * scale)


def parse_count(value: str | int, *, field: str = "count") -> int:
    """Parse a parameter count such as ``"8.03B"``, ``"124M"`` or ``"6,738,415,616"`` into an int.

    Suffixes are decimal multipliers: K (10**3), M (10**6), B (10**9, billion,
    not bytes), T (10**12). Raises :class:`InputError` naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InputError(f"{field}: expected a count such as '8.03B' or 124000000, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InputError(f"{field}: count must not be negative, got {value}")
        return value
    accepted = "a count such as '124M', '8.03B', '1.2T' or '6,738,415,616'"
    number, unit = _decimal(value, field, accepted)
    scale = COUNT_UNITS.get(unit.upper())
    if scale is None:
        raise InputError(f"{field}: unknown count suffix {unit!r} in {value!r}; expected {accepted}")
    return _nearest(number * scale)


def to_gib(num_bytes: int) -> float:
    """Bytes to GiB (2**30) as a float, for display and plotting only."""
    return num_bytes / GiB


_BINARY_LADDER: Final = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB), ("B", 1))
_DECIMAL_LADDER: Final = (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB), ("B", 1))


def format_bytes(num_bytes: int, *, unit: str = "auto", precision: int = 2, binary: bool = True) -> str:
    """Format a byte count for people: ``format_bytes(85899345920) == "80.00 GiB"``.

    ``unit="auto"`` picks the largest unit (binary ladder by default, decimal with
    ``binary=False``) in which the value is at least 1; a named unit ("GiB",
    "GB", ...) forces it. Negative values keep their sign.
    """
    if unit != "auto":
        scale = BYTE_UNITS.get(unit.lower())
        if scale is None:
            raise InputError(
                f"unit: unknown byte unit {unit!r}; expected one of {', '.join(n for n, _ in _BINARY_LADDER + _DECIMAL_LADDER)}"
            )
        return f"{num_bytes / scale:.{precision}f} {unit}" if scale > 1 else f"{num_bytes} B"
    ladder = _BINARY_LADDER if binary else _DECIMAL_LADDER
    magnitude = abs(num_bytes)
    for name, scale in ladder:
        if magnitude >= scale and scale > 1:
            return f"{num_bytes / scale:.{precision}f} {name}"
    return f"{num_bytes} B"


def format_count(count: int, *, digits: int = 3) -> str:
    """Format a parameter count with a decimal suffix and ``digits`` significant digits: ``"8.03B"``."""
    suffixes = ("", "K", "M", "B", "T")
    magnitude = abs(count)
    index = 0
    while index < len(suffixes) - 1 and magnitude >= COUNT_UNITS[suffixes[index + 1]]:
        index += 1
    if index == 0:
        return str(count)
    value = count / COUNT_UNITS[suffixes[index]]
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{abs(value):.{decimals}f}"
    if float(text) >= 1000 and index < len(suffixes) - 1:  # 999.6M rounds to 1000M: step up to 1.00B
        value /= 1000
        index += 1
        text = f"{abs(value):.{digits - 1}f}"
    return f"{'-' if count < 0 else ''}{text}{suffixes[index]}"
