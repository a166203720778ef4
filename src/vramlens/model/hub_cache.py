"""Resolve a Hugging Face model id to a snapshot already in the local HF cache. Never downloads.

Cache layout (huggingface_hub "Manage your cache" docs)::

    <cache>/models--<org>--<name>/refs/<revision>          -> commit hash
    <cache>/models--<org>--<name>/snapshots/<hash>/config.json

``<cache>`` is ``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE`` (legacy),
else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub`` - the same order huggingface_hub uses.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from vramlens._files import LIMITS, read_regular
from vramlens.errors import ModelNotFoundError

__all__ = ["COMMIT_PATTERN", "HF_ID_PATTERN", "find_cached_snapshot", "hub_cache_dir", "looks_like_hf_id"]

#: ``org/name`` with the characters the Hub allows in repository ids.
HF_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: What a ``refs/<revision>`` file holds: a git commit hash (huggingface_hub writes 40 hex digits).
COMMIT_PATTERN: Final = re.compile(r"^[0-9a-f]{40}$")


def looks_like_hf_id(text: str) -> bool:
    """True for ``org/name`` strings (one slash, Hub-legal characters)."""
    return bool(HF_ID_PATTERN.match(text))


def hub_cache_dir() -> Path:
    """The directory huggingface_hub caches repositories in, from the environment."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(variable)
        if value:
            return Path(value).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _read_ref(ref: Path) -> str | None:
    """The commit hash a ``refs/<revision>`` file holds (None when it is not a regular file
    holding a commit hash: never a path)."""
    if not ref.is_file():
        return None
    try:
        text = read_regular(ref, LIMITS["hf-ref"], ModelNotFoundError).decode("ascii", "replace").strip()
    except ModelNotFoundError:
        return None
    return text if COMMIT_PATTERN.match(text) else None


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, links resolved, lies inside ``folder`` (links resolved)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def find_cached_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The snapshot directory of ``repo_id`` that holds a ``config.json``, or None.

    Prefers the commit ``refs/<revision>`` points to (a 40-digit hex commit hash; anything else
    in the ref is ignored); otherwise the most recently modified snapshot that has a config.
    Only snapshots and configs inside the repository's cache folder are used (links resolved):
    a ref or link that leads out of the cache reads nothing.
    """
    org, name = repo_id.split("/", 1)
    repo_dir = hub_cache_dir() / f"models--{org}--{name}"
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None

    def usable(candidate: Path) -> bool:
        config = candidate / "config.json"
        return config.is_file() and _inside(candidate, snapshots) and _inside(config, repo_dir)

    commit = _read_ref(repo_dir / "refs" / revision)
    if commit is not None and usable(snapshots / commit):
        return snapshots / commit
    with_config = [s for s in snapshots.iterdir() if usable(s)]
    if not with_config:
        return None
    return max(with_config, key=lambda s: (s / "config.json").stat().st_mtime)
