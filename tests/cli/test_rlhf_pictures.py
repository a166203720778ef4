"""``vramlens rlhf`` pictures: the terminal timeline after the table (``--no-timeline``, ``--ascii``),
``--plot`` and ``--html`` files, clean JSON, bad paths refused before any work, no torch."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from vramlens.cli.app import main

GRPO = ["rlhf", "--algo", "grpo", "--actor", "qwen2.5-7b", "--method", "lora", "--gpus", "1", "--gpu", "h100-80gb"]


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep rich from emitting colour codes or picking a width from the environment."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_table_ends_with_the_timeline_unless_turned_off(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(GRPO, capsys)
    assert status == 0
    table_end = out.index("assumptions:")
    picture = out[table_end:]
    assert "RLHF step: memory per phase (busiest GPU)" in picture and "by model, per GPU" in picture
    timeline = out[out.index("RLHF step: memory per phase") :]
    assert "◀ peak" in timeline and max(len(line) for line in timeline.splitlines()) <= 120  # piped: 120 columns
    status, plain, _ = run([*GRPO, "--no-timeline"], capsys)
    assert status == 0 and "by model, per GPU" not in plain and "assumptions:" in plain


def test_ascii_timeline_is_ascii(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([*GRPO, "--ascii"], capsys)
    picture = out[out.index("RLHF step: memory per phase") :]
    assert status == 0 and picture.isascii() and "< peak" in picture


def test_plot_and_html_files_and_clean_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra")
    png, page = tmp_path / "step.png", tmp_path / "step.html"
    status, out, err = run([*GRPO, "--format", "json", "--plot", str(png), "--html", str(page)], capsys)
    assert status == 0, err
    data = json.loads(out)  # no picture and no "written to" line on stdout
    assert png.read_bytes()[:4] == b"\x89PNG" and page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert f"plot: written to {png}" in err and f"html: written to {page}" in err
    assert data["peak"]["phase"] in page.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("flag", "name", "message"),
    [
        ("--plot", "step.jpg", "--plot: cannot write"),
        ("--html", "step.txt", "--html: cannot write"),
        ("--html", "missing/step.html", "does not exist"),
    ],
)
def test_bad_paths_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, name: str, message: str
) -> None:
    status, out, err = run([*GRPO, flag, str(tmp_path / name)], capsys)
    assert status != 0 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "assumptions:" not in out  # refused before any work


def test_timeline_and_html_need_no_torch_or_matplotlib(tmp_path: Path) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from vramlens.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({[*GRPO, '--html', str(tmp_path / 'step.html')]!r}) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def readme_rlhf_commands() -> list[list[str]]:
    """The ``vramlens rlhf`` commands of README.md's RLHF section, as argument lists."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### `vramlens rlhf`", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```text\n(.*?)```", section, flags=re.S)
    return [shlex.split(block.replace("\\\n", " "))[1:] for block in blocks]


def test_readme_examples_say_what_the_tool_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's GRPO 7B and PPO 70B examples run; their pictures are drawn from the same flags
    (benchmarks/readme_pictures.py) and the peaks the text names are today's."""
    commands = readme_rlhf_commands()
    assert len(commands) == 2
    spec = importlib.util.spec_from_file_location("readme_pictures", REPO_ROOT / "benchmarks" / "readme_pictures.py")
    assert spec is not None and spec.loader is not None
    pictures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pictures)
    peaks = []
    for args, flags in zip(commands, pictures.RLHF_COMMANDS.values(), strict=True):
        given = [arg for arg in args if not arg.endswith((".png", ".html")) and arg not in ("--plot", "--html")]
        assert given[1:] == list(flags)
        status, out, err = run([*given, "--format", "json"], capsys)
        assert status == 0, err
        data = json.loads(out)
        assert data["fits"] is True
        peaks.append(data["peak"]["phase"])
    assert peaks == ["generation", "actor_training"]  # "the peak is generation" / "the actor's training"
