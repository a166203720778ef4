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
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from vramlens.errors import MissingExtraError

__all__ = ["FORMAT", "RecipeFile", "cache_dir", "config_digest", "library_versions", "recipe_file"]

#: Version of the file layout and of what the reader and the tracer measure; a file of another
#: version is derived again (bump it whenever either changes what it records).
FORMAT: Final = 7
#: Largest recipe file read back (real ones are a few KiB to a few hundred KiB).
MAX_FILE_BYTES: Final = 16 * 2**20


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
