"""Which stack frames are the user's own code (not a library's, not the standard library's)."""

from __future__ import annotations

__all__ = ["LIBRARY_PARTS", "is_user_frame"]

#: Path parts of frames that are libraries (site-packages, the standard library), not the user's code.
LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen", "<string>")


def is_user_frame(frame: str) -> bool:
    """Whether a stack frame (``path:line in name``, or just a path) is the user's code, not a library's."""
    path = frame.replace("\\", "/")
    return not any(part in path for part in LIBRARY_PARTS)
