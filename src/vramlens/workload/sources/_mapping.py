"""What a run config reader produces: workload keys, one note per mapping, and what it could not use.

A reader fills a :class:`MappingBuilder`: every key it maps goes through the workload
loader's own converter (so a bad value is a one-line error naming the *source* key, e.g.
``axolotl micro_batch_size: must be an integer >= 1, got 'two'``) and leaves a note saying
which source key became which workload key. Keys that matter for memory but have no
workload equivalent are recorded as *not modelled*; keys known not to matter are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from vramlens.errors import InputError
from vramlens.workload.load import LORA_KEYS, PARALLEL_KEYS, TOP_KEYS

__all__ = ["MappingBuilder", "SourceNote", "SourcedWorkload", "short"]

_TABLES = {"": TOP_KEYS, "lora": LORA_KEYS, "parallel": PARALLEL_KEYS}


def short(value: Any, limit: int = 60) -> str:
    """A value as notes show it: booleans as ``true``/``false``, lists comma-separated, control
    characters dropped, whitespace runs collapsed, cut to ``limit`` characters."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    text = (
        ",".join(short(v, limit) for v in value[:50]) if isinstance(value, (list, tuple)) else str(value)[: 4 * limit]
    )
    text = " ".join("".join(ch for ch in text if ch.isprintable() or ch.isspace()).split())
    return text if len(text) <= limit else f"{text[: limit - 13]}...{text[-10:]}"


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceNote:
    """One sentence of how the source was read; ``target`` is the workload key it set (or None)."""

    text: str
    target: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SourcedWorkload:
    """A run config read into workload keys.

    ``keys`` are workload keys (``lora`` and ``parallel`` as nested dicts) with converted
    values; they need a ``model`` only when the source names one. ``notes`` say how every key
    was mapped and which defaults stand in for what the source does not say;
    ``unmodelled`` lists the source's keys that matter for memory but have no workload key.
    """

    format: str
    origin: str
    """The file name (or "upload")."""
    keys: Mapping[str, Any]
    notes: tuple[SourceNote, ...] = ()
    unmodelled: tuple[str, ...] = ()

    def assumptions(self, overridden: frozenset[str] = frozenset()) -> tuple[str, ...]:
        """The report's assumption lines: the notes (marked where a flag overrides the key they
        set, ``overridden`` holding dotted workload keys) and one line listing what was not modelled."""
        lines = [f"read {self.origin} as {self.format}"]
        for note in self.notes:
            mark = " (overridden by a flag)" if note.target is not None and note.target in overridden else ""
            lines.append(note.text + mark)
        if self.unmodelled:
            lines.append(f"{self.format}: not modelled, may change memory: {'; '.join(self.unmodelled)}")
        return tuple(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (format, origin, workload keys, notes, not modelled keys)."""
        keys = {
            k: ({kk: _plain(vv) for kk, vv in v.items()} if isinstance(v, dict) else _plain(v))
            for k, v in self.keys.items()
        }
        return {
            "format": self.format,
            "origin": self.origin,
            "keys": keys,
            "notes": [note.text for note in self.notes],
            "unmodelled": list(self.unmodelled),
        }


@dataclass
class MappingBuilder:
    """Collects the workload keys, notes and not-modelled keys of one source file."""

    format: str
    keys: dict[str, Any] = field(default_factory=dict)
    notes: list[SourceNote] = field(default_factory=list)
    unmodelled: list[str] = field(default_factory=list)

    def set(self, target: str, value: Any, source: str, *, why: str = "", shown: Any = None) -> Any:
        """Set workload key ``target`` (``batch``, ``lora.rank``, ``parallel.shard``) from the source
        key ``source``: converted and checked by the workload loader, noted as
        ``"<format> <source> <shown> -> <target> <value>"``. Returns the converted value."""
        block, _, name = target.rpartition(".")
        table = _TABLES[block]
        converted = table[name](f"{self.format} {source}", value)
        if block:
            self.keys.setdefault(block, {})[name] = converted
        else:
            self.keys[name] = converted
        origin = short(value if shown is None else shown)
        text = f"{self.format} {short(source, 80)}: {origin} -> {target} {short(converted)}"
        self.notes.append(SourceNote(text=text + (f" ({why})" if why else ""), target=target))
        return converted

    def fixed(self, target: str, value: Any, why: str) -> None:
        """Set a key the format implies (``mode``, ``framework``, ``engine``), noted as ``"<format>: <target> <value> (why)"``."""
        block, _, name = target.rpartition(".")
        converted = _TABLES[block][name](f"{self.format} {target}", value)
        self.keys[name] = converted
        self.notes.append(SourceNote(text=f"{self.format}: {target} {short(converted)} ({why})", target=target))

    def has(self, target: str) -> bool:
        """Whether ``target`` was already set."""
        block, _, name = target.rpartition(".")
        holder = self.keys.get(block, {}) if block else self.keys
        return isinstance(holder, dict) and name in holder

    def note(self, text: str, target: str | None = None) -> None:
        """A sentence about a default or a choice (prefixed with the format)."""
        self.notes.append(SourceNote(text=f"{self.format}: {text}", target=target))

    def not_modelled(self, key: str, value: Any, why: str = "") -> None:
        """A source key that matters for memory but has no workload equivalent."""
        self.unmodelled.append(f"{short(key, 60)}={short(value, 40)}" + (f" ({why})" if why else ""))

    def fail(self, key: str, message: str) -> InputError:
        """A one-line error naming the source key."""
        return InputError(f"{self.format} {key}: {message}")

    def result(self, origin: str) -> SourcedWorkload:
        return SourcedWorkload(
            format=self.format,
            origin=origin,
            keys=dict(self.keys),
            notes=tuple(self.notes),
            unmodelled=tuple(self.unmodelled),
        )
