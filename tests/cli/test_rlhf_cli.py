"""``vramlens rlhf``: the table (phases, peak, transitions, recommendations, assumptions), the
JSON contract of issue 9, flags over a setup file, and one-line errors without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramlens.cli import main


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["rlhf", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_table_shows_phases_peak_transitions_and_recommendations(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--algo", "ppo", "--actor", "qwen2.5-0.5b", "--gpu", "rtx-4090", "--offload", "reference", "--no-timeline"]
    status, out, err = run(args, capsys)
    assert status == 0, err
    assert "vramlens rlhf: ppo on 1 x rtx-4090" in out
    for phase in ("generation", "scoring", "reference", "values", "actor_training", "critic_training"):
        assert f"\n  {phase} " in out
    assert "<- peak" in out and "peak: " in out
    assert "reference load" in out and "reference offload" in out and " s)" in out
    assert "recommendations:" in out and "assumptions:" in out
    assert "critic: none given, so the actor's model (qwen2.5-0.5b)" in out


def test_json_has_the_issue_contract(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--algo", "grpo", "--actor", "qwen2.5-0.5b", "--gpu", "h100-80gb", "--group-size", "4", "--format", "json"]
    status, out, err = run(args, capsys)
    assert status == 0, err
    data: dict[str, Any] = json.loads(out)
    assert {"phases", "peak", "fits", "recommendations", "transitions", "assumptions", "setup"} <= set(data)
    assert [p["name"] for p in data["phases"]] == ["generation", "reference", "actor_training"]
    for phase in data["phases"]:
        assert {"name", "allocated_bytes", "reserved_bytes", "device_bytes", "breakdown", "models"} <= set(phase)
        assert sum(phase["breakdown"].values()) == phase["allocated_bytes"]
        assert set(phase["models"]) == {"actor", "reference", "rollout"}
    peak = data["peak"]
    assert peak["device_bytes"] == max(p["device_bytes"] for p in data["phases"])
    assert peak["phase"] in [p["name"] for p in data["phases"]]
    assert data["fits"] is True and data["setup"]["group_size"] == 4
    assert all(isinstance(t["seconds"], float) for t in data["transitions"])


def test_flags_override_the_file_and_separate_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rlhf.yaml"
    path.write_text("algo: ppo\ngpu: h100-80gb\ngpus: 2\nactor: qwen2.5-0.5b\nprompt: 256\n")
    args = ["-c", str(path), "--separate", "reward=1", "--response", "128", "--format", "json"]
    status, out, err = run(args, capsys)
    assert status == 0, err
    data = json.loads(out)
    assert data["setup"]["prompt"] == 256 and data["setup"]["response"] == 128
    assert data["setup"]["reward"]["placement"] == "separate" and data["setup"]["reward"]["gpus"] == 1
    assert {p["models"]["reward"]["group"] for p in data["phases"]} == {"reward"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "grpo", "--critic", "qwen2.5-0.5b"], "error: critic: grpo has no critic"),
        (["--algo", "dpo", "--no-reference"], "error: reference: dpo needs a reference model"),
        (["--algo", "ppo", "--gpus", "2", "--separate", "reward=1", "--separate", "critic=1"], "error: separate: "),
        (["--algo", "ppo", "--separate", "reward"], "error: --separate: 'reward' is not accepted (ROLE=GPUS"),
        (["--algo", "ppx"], "error: algo: 'ppx' is not one of ppo, grpo, dpo, rloo, online-dpo"),
    ],
)
def test_bad_flags_are_one_line_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([*args, "--actor", "qwen2.5-0.5b", "--gpu", "h100-80gb"], capsys)
    assert status == 2
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_actor_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["--algo", "ppo", "--gpu", "h100-80gb"], capsys)
    assert status == 2 and "error: --actor: give the actor model" in err


def test_rlhf_does_not_import_torch() -> None:
    code = (
        "import sys; from vramlens.cli import main; "
        "main(['rlhf','--algo','grpo','--actor','qwen2.5-0.5b','--gpu','h100-80gb','--format','json']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
