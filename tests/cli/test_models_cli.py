"""``vramlens models list|show``: formats, errors, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_llama_config
from vramlens.cli import main
from vramlens.model.catalog import catalog_entries


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_list_json_is_an_array_of_objects_with_integer_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["models", "list", "--format", "json"], capsys)
    rows = json.loads(out)
    assert status == 0 and isinstance(rows, list) and len(rows) == len(catalog_entries()) >= 40
    by_name = {row["name"]: row for row in rows}
    assert by_name["llama-3.1-8b"]["parameters"] == 8_030_261_248
    for row in rows:
        assert isinstance(row["parameters"], int) and not isinstance(row["parameters"], bool)
        assert {
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        } <= set(row)


def test_list_table_shows_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["models", "list"], capsys)
    assert status == 0
    for entry in catalog_entries():
        assert entry.name in out
    assert "8.03B" in out and "heads/kv" in out


def test_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["models", "show", "llama-3.1-8b", "--format", "json"], capsys)
    data = json.loads(out)
    assert status == 0
    assert data["parameters"] == 8_030_261_248 and isinstance(data["parameters"], int)
    assert data["parameter_breakdown"]["total"] == data["parameters"]
    assert data["weight_bytes"] == 2 * 8_030_261_248  # bf16 checkpoint
    assert data["published_parameters"] and data["hf_id"] == "meta-llama/Llama-3.1-8B"


def test_show_table_for_an_moe_model(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["models", "show", "mixtral-8x7b"], capsys)
    assert status == 0
    assert "46.7B" in out and "active per token" in out and "8 experts, top-2" in out and "moe experts" in out


def test_show_a_config_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    config = tiny_llama_config()
    del config["tie_word_embeddings"]  # read with transformers' default, which the report says
    path.write_text(json.dumps(config))
    status, out, _ = run(["models", "show", str(path), "--format", "json"], capsys)
    data = json.loads(out)
    assert status == 0 and data["model_type"] == "llama"
    assert any("tie_word_embeddings" in a for a in data["assumptions"])
    status, out, _ = run(["models", "show", str(path)], capsys)
    assert status == 0 and "assumptions" in out


def test_show_refuses_an_unknown_model_type_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_llama_config(model_type="my_llama")))
    status, out, err = run(["models", "show", str(path)], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and "model_type 'my_llama'" in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["models", "show", "llama-9000"], "error: model 'llama-9000' is not a catalog name"),
        (["models", "show", "acme/absent-model"], "not in the local Hugging Face cache"),
        (["models", "list", "--format", "xml"], "error: Invalid value for '--format'"),
        (["models", "show"], "error: Missing argument 'MODEL'"),
        (["modelz"], "error: No such command 'modelz'"),
    ],
)
def test_errors_are_one_line_with_status_2(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(args, capsys)
    assert status == 2 and out == ""
    assert expected in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_bad_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**tiny_llama_config(), "hidden_size": -4}))
    status, _, err = run(["models", "show", str(path)], capsys)
    assert status == 2
    assert err.strip().count("\n") == 0 and "key 'hidden_size' must be an integer >= 1, got -4" in err


def test_models_commands_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from vramlens.cli import main\n"
        "assert main(['models', 'list']) == 0\n"
        "assert main(['models', 'list', '--format', 'json']) == 0\n"
        "assert main(['models', 'show', 'deepseek-v3']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'matplotlib', 'safetensors') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_console_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vramlens", "models", "show", "gpt2", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["parameters"] == 124_439_808
    version = subprocess.run(
        [sys.executable, "-m", "vramlens", "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and "vramlens" in version.stdout


def test_show_a_checkpoint_directory_reports_stored_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import write_safetensors

    config = tiny_llama_config(num_hidden_layers=1, tie_word_embeddings=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    h, i, V = 64, 160, 100
    layer = "model.layers.0."
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [V, h]),
            "model.norm.weight": ("BF16", [h]),
            layer + "self_attn.q_proj.weight": ("BF16", [h, h]),
            layer + "self_attn.k_proj.weight": ("BF16", [32, h]),
            layer + "self_attn.v_proj.weight": ("BF16", [32, h]),
            layer + "self_attn.o_proj.weight": ("BF16", [h, h]),
            layer + "mlp.gate_proj.weight": ("BF16", [i, h]),
            layer + "mlp.up_proj.weight": ("BF16", [i, h]),
            layer + "mlp.down_proj.weight": ("BF16", [h, i]),
            layer + "input_layernorm.weight": ("BF16", [h]),
            layer + "post_attention_layernorm.weight": ("BF16", [h]),
        },
    )
    status, out, _ = run(["models", "show", str(tmp_path), "--format", "json"], capsys)
    data = json.loads(out)
    assert status == 0
    assert data["checkpoint"]["total_elements"] == data["parameters"]
    assert data["checkpoint"]["bytes_by_dtype"] == {"BF16": 2 * data["parameters"]}
    status, out, _ = run(["models", "show", str(tmp_path)], capsys)
    assert status == 0 and "checkpoint" in out and "11 tensors" in out


def test_progress_notes_escape_what_they_quote(capsys: pytest.CaptureFixture[str]) -> None:
    """A note (e.g. 'reading PATH from transformers' code') quotes a path or config strings: its
    control characters are escaped and its length capped like every line the CLI prints (issue 21)."""
    import logging

    from vramlens._notes import notes_on_stderr

    notes_on_stderr()
    logging.getLogger("vramlens.model.generic").info("reading %s", "/m/\x1b]0;pwned\x07" + "a" * 5000)
    err = capsys.readouterr().err
    assert err.startswith("note: reading /m/\\x1b]0;pwned\\x07") and "\x1b" not in err and "\x07" not in err
    assert len(err) < 1100 and err.count("\n") == 1
