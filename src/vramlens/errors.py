"""Errors raised by vramlens.

Every error a user can cause is a :class:`VramlensError` whose ``str()`` is a
single line naming what was wrong (a key, a file, a flag) and what is
accepted. The CLI prints that line and exits with status 2; it never shows a
traceback for these.

::

    VramlensError
     ├── InputError            bad input of any kind (a value, a flag, a size string)
     │    ├── ConfigError      a model config (config.json or dict) is malformed
     │    ├── CheckpointError  a safetensors file or index cannot be read
     │    └── ModelNotFoundError  a model reference resolves to nothing
     └── MissingExtraError     an optional dependency (torch, transformers, ...) is absent
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputError",
    "MissingExtraError",
    "ModelNotFoundError",
    "VramlensError",
]


#: Longest message kept (characters): a message quoting a huge value keeps its start and end.
MAX_MESSAGE_CHARS = 1000


def _one_line(message: str) -> str:
    """Collapse whitespace runs that contain newlines so a message stays on one line, and keep
    at most :data:`MAX_MESSAGE_CHARS` characters (the middle of a longer one is left out)."""
    if "\n" in message or "\r" in message:
        message = " ".join(message.split())
    if len(message) > MAX_MESSAGE_CHARS:
        head, tail = MAX_MESSAGE_CHARS * 3 // 4, MAX_MESSAGE_CHARS // 5
        left_out = len(message) - head - tail
        message = f"{message[:head]}...[{left_out} characters left out]...{message[-tail:]}"
    return message


class VramlensError(Exception):
    """Base class of every error vramlens raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))

    @property
    def message(self) -> str:
        """The one-line message (same as ``str(self)``)."""
        return str(self)


class InputError(VramlensError, ValueError):
    """Bad input: the message names the field and what it accepts."""


class ConfigError(InputError):
    """A model configuration is malformed (missing key, wrong type, bad value)."""


class CheckpointError(InputError):
    """A safetensors checkpoint or its index is truncated, corrupt or inconsistent."""


class ModelNotFoundError(InputError, LookupError):
    """A model name, path or HF id that resolves to no configuration."""


class MissingExtraError(VramlensError, ImportError):
    """An optional dependency is not installed; the message says which extra to install."""
