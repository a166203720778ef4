"""``vramlens view --user-frames``: allocation stacks cut to the user's own frames. An allocation made
deep inside a library (here 30 nested calls in a module under site-packages/) used to show only the
library's innermost frames; the user's calls that led there were dropped (the tracker kept the 24
innermost frames, the view the 8 innermost of those)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import vramlens  # noqa: E402
from vramlens.cli import main  # noqa: E402
from vramlens.trace.timeline_io import save_timeline  # noqa: E402

LIBRARY = """
import torch

def deep(n, size):
    if n == 0:
        return torch.empty(size, dtype=torch.uint8)
    return deep(n - 1, size)
"""


def _library(tmp_path: Path) -> Any:
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "deeplib.py").write_text(LIBRARY)
    spec = importlib.util.spec_from_file_location("deeplib", folder / "deeplib.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def users_own_step(library: Any) -> Any:
    return library.deep(30, 1 << 20)


def test_user_frames_are_shown_past_a_deep_library(tmp_path: Path, capsys: Any) -> None:
    library = _library(tmp_path)
    with vramlens.track(capture_stacks=True) as tracker:
        kept = users_own_step(library)
        twice = kept + 1  # a second allocation: the peak comes after the first, which is still live
    path = save_timeline(tracker.timeline(), tmp_path / "run.npz")
    del kept, twice
    capsys.readouterr()
    assert main(["view", str(path), "--user-frames", "--stack-lines", "3", "--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "test_user_frames.py" in out and "users_own_step" in out and "deeplib.py" not in out
    assert main(["view", str(path), "--stack-lines", "3", "--no-replay"]) == 0
    assert "deeplib.py" in capsys.readouterr().out  # without the flag: the innermost frames, the library's
    assert sys.modules.get("deeplib") is None
