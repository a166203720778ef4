"""The recipe cache: one JSON file per model config and library versions (no torch import).

What the generic reader and the recipe tracer learn about a config is derived once and
kept in the user's cache directory, so that later estimates of the same config run in
pure Python. A file is keyed by the SHA-256 of the config (canonical JSON) and by the
installed transformers and torch versions (read from their package metadata, without
importing them): a new release of either derives everything again, because the code
that allocates the memory may have changed.

Directory: ``$VRAMLENS_CACHE_DIR``, else ``$XDG_CACHE_HOME/vramlens``, else
``~/.cache/vramlens``; files under ``recipes/``. A file that cannot be read back (corrupt,
truncated, from another format) is ignored and written again. Writes are atomic (a
temporary file renamed over the old one), so concurrent estimates never see half a file.

A process may switch reading and tracing code off (:func:`code_reading`): the web server
does, so that it never imports torch nor holds its event loop for the seconds a build or a
trace takes; a cache miss there is :class:`CodeNotRead`, and the server has the work done in
a process of its own (which fills this cache) before it answers from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from vramlens.errors import InputError, MissingExtraError

__all__ = [
    "FORMAT",
    "CodeNotRead",
    "RecipeFile",
    "cache_dir",
    "code_reading",
    "config_digest",
    "library_versions",
    "recipe_file",
    "require_code_reading",
]

#: Version of the file layout and of what the reader and the tracer measure; a file of another
#: version is derived again (bump it whenever either changes what it records).
FORMAT: Final = 7
#: Largest recipe file read back (real ones are a few KiB to a few hundred KiB).
MAX_FILE_BYTES: Final = 16 * 2**20


class CodeNotRead(InputError):
    """A model's code had to be read or traced, and this process does not (the web server)."""


#: Whether this process reads and traces models' code on a cache miss (module docstring).
_CODE_READING = {"on": True}


@contextmanager
def code_reading(on: bool) -> Iterator[None]:
    """Within the block, reading and tracing code is ``on`` or off (the previous state after)."""
    before = _CODE_READING["on"]
    _CODE_READING["on"] = on
    try:
        yield
    finally:
        _CODE_READING["on"] = before


def require_code_reading(what: str) -> None:
    """Raise :class:`CodeNotRead` (naming ``what`` would have run) when reading code is off."""
    if not _CODE_READING["on"]:
        raise CodeNotRead(f"{what}: not in the recipe cache ({cache_dir()}), and this process does not read code")


def cache_dir() -> Path:
    """Where recipe files live (see the module docstring)."""
    explicit = os.environ.get("VRAMLENS_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "recipes"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vramlens" / "recipes"


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of the config as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def library_versions(purpose: str) -> dict[str, str]:
    """Installed transformers and torch versions (package metadata only: nothing is imported).

    Raises :class:`MissingExtraError` with the install hint when either is absent."""
    versions = {}
    for package in ("transformers", "torch"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            raise MissingExtraError(
                f"{purpose} needs the optional package '{package}'; install it with: pip install 'vramlens[hf]'"
            ) from None
    return versions


@dataclass(frozen=True, kw_only=True)
class RecipeFile:
    """The cache file of one config under the installed library versions."""

    path: Path
    key: dict[str, str]
    """What the file must say it was derived from: config digest, model type, versions, format."""

    def read(self) -> dict[str, Any] | None:
        """The stored document, or None when absent, unreadable or derived from something else."""
        try:
            if not self.path.is_file() or self.path.stat().st_size > MAX_FILE_BYTES:
                return None
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get("key") != self.key:
            return None
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Store ``data`` (with this file's key) atomically; an unwritable cache is not an error."""
        document = {**data, "key": self.key}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".recipe-", suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(document, stream, separators=(",", ":"))
            os.replace(temporary, self.path)
        except OSError:
            return


def recipe_file(config: Mapping[str, Any], model_type: str, *, purpose: str) -> RecipeFile:
    """The cache file for ``config`` under the installed transformers and torch."""
    digest = config_digest(config)
    versions = library_versions(purpose)
    key = {
        "format": str(FORMAT),
        "config_sha256": digest,
        "model_type": model_type,
        "transformers": versions["transformers"],
        "torch": versions["torch"],
    }
    safe_type = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_type)[:64]
    name = f"{safe_type}-{digest[:20]}-tf{versions['transformers']}-torch{versions['torch']}.json"
    return RecipeFile(path=cache_dir() / name.replace("+", "_"), key=key)
