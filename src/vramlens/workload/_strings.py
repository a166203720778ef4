"""Workload keys that hold text: bounded in length, and parsed (``alloc_conf``, ``versions``)
with one-line errors that quote what they got briefly (issue 21: a 5,000-digit release number
made ``int()`` raise a bare ValueError)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vramlens._untrusted import brief
from vramlens.errors import InputError

__all__ = ["MAX_ALLOC_CONF_CHARS", "MAX_TEXT_CHARS", "MAX_VERSION_CHARS", "alloc_conf", "text", "versions"]

#: Longest text a string key takes (a path: PATH_MAX is 4096 on Linux).
MAX_TEXT_CHARS: Final = 4096
#: Longest ``alloc_conf`` accepted (every key PyTorch knows, written out, is under 400).
MAX_ALLOC_CONF_CHARS: Final = 1024
#: Longest release number accepted (``2.5.1+cu124.post3.dev20250101`` has 29 characters).
MAX_VERSION_CHARS: Final = 64


def text(key: str, value: Any) -> str:
    """A non-empty string of at most :data:`MAX_TEXT_CHARS` characters, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{key}: must be a non-empty string, got {brief(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise InputError(f"{key}: {len(value):,} characters, more than the {MAX_TEXT_CHARS} accepted: {brief(value)}")
    return value.strip()


def alloc_conf(key: str, value: Any) -> str:
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string (at most :data:`MAX_ALLOC_CONF_CHARS`), parsed now as
    PyTorch parses it (kept as written)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(
            f"{key}: must be a PYTORCH_CUDA_ALLOC_CONF string such as 'expandable_segments:True', got {brief(value)}"
        )
    if len(value) > MAX_ALLOC_CONF_CHARS:
        raise InputError(f"{key}: {len(value):,} characters, more than the {MAX_ALLOC_CONF_CHARS} accepted")
    from vramlens.allocator import AllocatorSettings

    conf = value.strip()
    try:
        AllocatorSettings.from_conf(conf)
    except ValueError as error:
        raise InputError(f"{key}: {str(error).removeprefix('allocator config: ')}") from None
    return conf


def versions(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """Library versions: a mapping (or ``"transformers=4.35,vllm=0.6"``) of known packages to
    quoted release numbers (each at most :data:`MAX_VERSION_CHARS`); sorted pairs."""
    from vramlens.workload.versions import PACKAGES

    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(pair, tuple) and len(pair) == 2 for pair in value):
        value = dict(value)
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in text(key, value).split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise InputError(
                f"{key}: expected package=version pairs such as 'transformers=4.35,vllm=0.6', got {brief(value)}"
            )
        value = {name.strip(): version.strip() for name, version in pairs}
    if not isinstance(value, Mapping):
        raise InputError(
            f"{key}: expected a mapping of package to version, e.g. {{transformers: '4.35'}}, got {brief(value)}"
        )
    found = {}
    for package, version in value.items():
        if package not in PACKAGES:
            raise InputError(f"{key}: unknown package {brief(package)}; accepted: {', '.join(PACKAGES)}")
        found[package] = _version(f"{key}.{package}", version)
    return tuple(sorted(found.items()))


def _version(key: str, version: Any) -> str:
    """A quoted release number such as ``'4.46'``: ASCII, at most :data:`MAX_VERSION_CHARS`."""
    from vramlens.workload.versions import parse_version

    if (
        not isinstance(version, str)
        or not version.isascii()
        or len(version) > MAX_VERSION_CHARS
        or parse_version(version) is None
    ):
        raise InputError(
            f"{key}: expected a quoted release number such as '4.46' "
            f"(a YAML number loses trailing zeros), got {brief(version)}"
        )
    return version.strip()
