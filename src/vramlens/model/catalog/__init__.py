"""The bundled catalog: real ``config.json`` data of popular checkpoints, with short aliases.

Each ``*.json`` file beside this module is one checkpoint::

    {"name": "llama-3.1-8b", "hf_id": "meta-llama/Llama-3.1-8B", "aliases": [...],
     "family": "llama", "published_parameters": "8.03B",
     "published_parameters_source": "...", "config_source": "...", "notes": "...",
     "config": {...the checkpoint's config.json, verbatim...}}

``config_source`` says where the verbatim config was read; the published count
and its source are kept so tests can check the computed count against it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from vramlens._files import package_data
from vramlens.errors import ConfigError
from vramlens.model.families import parse_config
from vramlens.model.spec import ModelSpec
from vramlens.units import parse_count

__all__ = ["CatalogEntry", "catalog_entries", "find_entry", "suggest_names"]


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """One bundled checkpoint."""

    name: str
    """Short alias used on the command line (``llama-3.1-8b``)."""
    hf_id: str
    """Hugging Face repository id."""
    aliases: tuple[str, ...]
    """Other accepted names (other HF ids with identical shapes, common spellings)."""
    family: str
    """Model family (usually the config's model_type)."""
    published_parameters: str
    """The parameter count as its publisher states it ("8.03B", "2,614,341,888")."""
    published_parameters_source: str
    """Where that count is published."""
    published_parameters_basis: str
    """What the published count counts: ``unique`` parameters (each once, as
    ``model.parameters()``), or ``stored_tied_head_twice`` (a Hub safetensors total of a
    tied-embedding checkpoint that stores the LM head as a second copy)."""
    config_source: str
    """Where the verbatim config.json was read."""
    notes: str
    """Caveats about the data."""
    config: dict[str, Any] = field(repr=False)
    """The checkpoint's config.json."""

    @property
    def published_count(self) -> int:
        """``published_parameters`` as an int (the leading figure of the text)."""
        return parse_count(self.published_parameters.split()[0], field=f"catalog {self.name}: published_parameters")

    def spec(self) -> ModelSpec:
        """The :class:`ModelSpec` of this checkpoint (parsed once, then cached)."""
        return _spec_for(self.name)


def _entry_from_json(raw: Any, filename: str) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"catalog file {filename}: expected a JSON object")
    try:
        return CatalogEntry(
            name=raw["name"],
            hf_id=raw["hf_id"],
            aliases=tuple(raw.get("aliases", ())),
            family=raw["family"],
            published_parameters=raw["published_parameters"],
            published_parameters_source=raw["published_parameters_source"],
            published_parameters_basis=raw.get("published_parameters_basis", "unique"),
            config_source=raw["config_source"],
            notes=raw.get("notes", ""),
            config=raw["config"],
        )
    except KeyError as exc:
        raise ConfigError(f"catalog file {filename}: missing key {exc}") from None


@cache
def catalog_entries() -> tuple[CatalogEntry, ...]:
    """Every bundled checkpoint, sorted by name."""
    names = [item.name for item in package_data(__name__).iterdir() if item.name.endswith(".json")]
    return tuple(sorted(map(_read_entry, names), key=lambda e: _natural_key(e.name)))


@cache
def _read_entry(filename: str) -> CatalogEntry:
    """The entry of one catalog file (read once: :func:`catalog_entries` and :func:`find_entry`
    share the object)."""
    text = package_data(__name__).joinpath(filename).read_text(encoding="utf-8")
    return _entry_from_json(json.loads(text), filename)


def _natural_key(name: str) -> tuple[object, ...]:
    """Sort ``qwen2.5-7b`` before ``qwen2.5-14b``: digit runs compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


@cache
def _index() -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in catalog_entries():
        for key in (entry.name, entry.hf_id, *entry.aliases):
            index.setdefault(key.lower(), entry)
    return index


def find_entry(name: str) -> CatalogEntry | None:
    """The entry whose name, HF id or alias matches ``name`` (case-insensitive), or None.
    A catalog name is found from its own file (each file is named after its entry, and no
    key names two entries: tests/model/test_catalog.py), without reading the other files."""
    key = name.strip().lower()
    if _FILE_NAME.fullmatch(key) and package_data(__name__).joinpath(f"{key}.json").is_file():
        entry = _read_entry(f"{key}.json")
        if entry.name.lower() == key:
            return entry
    return _index().get(key)


#: Keys that may be a catalog file's name (no path separators).
_FILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


_SIZE = re.compile(r"(?<![a-z0-9.])((?:\d+x)?\d+(?:\.\d+)?)([bm])(?![a-z0-9])")


def _family_and_size(name: str) -> tuple[str, float] | None:
    """``("qwen2.5", 7e9)`` for ``Qwen/Qwen2.5-7B-Instruct`` (the repository name's part before its
    size, and the size); None without a size. ``8x7b`` counts as 56e9."""
    text = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-")
    match = _SIZE.search(text)
    if match is None:
        return None
    number, unit = match.group(1), match.group(2)
    experts, _, each = number.rpartition("x")
    size = float(each) * (int(experts) if experts else 1) * (1e9 if unit == "b" else 1e6)
    return text[: match.start()].strip("-. "), size


def _same_family(family: str, other: str) -> bool:
    """``meta-llama-3.1`` and ``llama-3.1`` are one family; ``qwen2.5`` and ``qwen2`` are not."""
    return (
        bool(family)
        and bool(other)
        and (family == other or family.endswith("-" + other) or other.endswith("-" + family))
    )


def suggest_names(name: str, limit: int = 3) -> list[str]:
    """Catalog names close to ``name``, for "did you mean" messages: the same family and size
    first (``Qwen/Qwen2.5-7B-Instruct`` -> ``qwen2.5-7b``), then the family's other sizes,
    nearest first, then names that are merely spelled alike."""
    wanted = _family_and_size(name)
    ranked: list[tuple[float, str]] = []
    if wanted is not None:
        for entry in catalog_entries():
            for key in (entry.name, entry.hf_id):
                found = _family_and_size(key)
                if found is not None and _same_family(wanted[0], found[0]):
                    ranked.append((abs(math.log(found[1] / wanted[1])), entry.name))
                    break
    close = [entry for _, entry in sorted(ranked)]
    names = [entry.name for entry in catalog_entries()]
    import difflib  # on a miss only (2 ms of a cold start)

    spelled = difflib.get_close_matches(name.strip().lower().rsplit("/", 1)[-1], names, n=limit, cutoff=0.6)
    return list(dict.fromkeys([*close, *spelled]))[:limit]


@cache
def _spec_for(name: str) -> ModelSpec:
    entry = find_entry(name)
    assert entry is not None, name  # only entries' own names come here
    return parse_config(entry.config, source=f"catalog:{entry.name}", name=entry.name, hf_id=entry.hf_id)
