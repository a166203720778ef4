"""README.md: its two set-up commands, and its Python example, work as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def _bash_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)]


def test_first_screen_has_exactly_two_setup_commands() -> None:
    first_screen = README.split("---", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", first_screen, flags=re.S)
    assert len(blocks) == 2
    assert "vramlens estimate llama-3.1-8b" in blocks[0]
    assert blocks[1].strip() == "bash .ci/run"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_estimate_example_runs() -> None:
    code = _python_blocks()[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    report = namespace["report"]
    assert "('backward', True)" in code, "the example states what it prints"
    assert (report.peak_phase, report.fits) == ("backward", True)  # type: ignore[attr-defined]
    assert set(report.to_dict()["peak"]) >= {"allocated_bytes", "reserved_bytes", "device_bytes", "phase"}  # type: ignore[attr-defined]


def test_model_example_runs() -> None:
    code = _python_blocks()[1]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    expected = re.search(r"# \((\d+), (\d+)\)", code)
    assert expected is not None, "the example states the counts it prints"
    spec = namespace["spec"]
    assert (spec.num_parameters, spec.active_parameters) == (int(expected.group(1)), int(expected.group(2)))  # type: ignore[attr-defined]


def test_sample_output_matches_the_estimator() -> None:
    """The figures in README's sample output are what the main command prints today."""
    import vramlens
    from vramlens.units import format_bytes

    report = vramlens.estimate({"model": "llama-3.1-8b", "method": "lora", "recompute": "full", "gpu": "a100-80gb"})
    sample = re.findall(r"```text\n(.*?)```", README, flags=re.S)[0]
    for value in (report.allocated_bytes, report.reserved_bytes, report.device_bytes):
        assert format_bytes(value) in sample
    assert f"headroom {format_bytes(report.headroom_bytes or 0)}" in sample
    from vramlens.result.settings import settings_lines

    for line in settings_lines(report):  # the defaults it used, as the first lines say them
        assert line in sample, line


@pytest.mark.slow
def test_install_command_works_in_a_fresh_virtual_environment(tmp_path: Path) -> None:
    """Copy the project, run README's first command verbatim in a fresh venv (pip reaches the package registry)."""
    project = tmp_path / "vramlens"
    shutil.copytree(
        REPO_ROOT,
        project,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".ci-venv", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "build"
        ),
    )
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p and ".ci-venv" not in p
    )
    command = (
        _bash_blocks()[0].replace("python3 ", f"{sys.executable} ", 1)
        if shutil.which("python3") is None
        else _bash_blocks()[0]
    )
    result = subprocess.run(["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "llama-3.1-8b - estimate: peak" in result.stdout and "fits a100-sxm-80gb" in result.stdout


def test_inference_commands_run() -> None:
    """Every ``vramlens estimate ... --mode infer`` line of the README exits 0 and prints a report."""
    from click.testing import CliRunner

    from vramlens.cli.app import cli

    lines = [line for block in _bash_blocks() for line in block.splitlines() if "--mode infer" in line]
    assert len(lines) >= 2
    for line in lines:
        args = line.split()[1:]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (line, result.output)
        assert "KV cache:" in result.output
        if "--max-batch" in args:
            assert re.search(r"largest batch that fits: \d+", result.output)


def test_readme_links_only_to_files_in_the_repository() -> None:
    """Every relative link and every ``docs/...`` / ``examples/...`` path the README names exists;
    the shared design documents (outside the repository) are not named."""
    assert "DESIGN.md" not in README and "WORKLOAD.md" not in README
    targets = re.findall(r"\]\(([^)#]+)\)", README) + re.findall(r"`((?:docs|examples|benchmarks)/[^`\s]+)`", README)
    relative = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert "docs/workload.md" in relative
    for target in relative:
        assert (REPO_ROOT / target).exists(), target


def test_from_examples_print_what_the_readme_shows() -> None:
    """The README's two ``--from`` commands run and print the lines its sample output shows."""
    import shlex

    from click.testing import CliRunner

    from vramlens.cli.app import cli

    lines = [line for block in _bash_blocks() for line in block.splitlines() if "--from" in line]
    samples = re.findall(r"```text\n(.*?)```", README, flags=re.S)
    assert len(lines) == 2
    for line in lines:
        result = CliRunner().invoke(cli, shlex.split(line)[1:], env={"COLUMNS": "120"})
        assert result.exit_code == 0, (line, result.output)
        sample = next(s for s in samples if s.splitlines()[0] == result.output.splitlines()[0])
        shown = [row for row in sample.splitlines() if row.strip() != "..."]
        output = [row.rstrip() for row in result.output.splitlines()]
        assert all(row.rstrip() in output for row in shown), [row for row in shown if row.rstrip() not in output]
