"""The settings line (what the answer assumed) in the terminal, Markdown, JSON and HTML reports,
the HTML inputs table of the keys that apply, and every default in --help."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from vramlens.cli import main
from vramlens.estimator import estimate
from vramlens.report.html import render_html
from vramlens.report.text import markdown_report
from vramlens.result.settings import applicable_inputs, settings, settings_line

DEFAULT_LINES = [
    "settings: batch 4, seq 2048, precision mixed-bf16, optimizer adamw, optimizer_impl fused, framework hf",
    "  (defaults: batch, seq, precision, optimizer; auto: optimizer_impl = hf's, framework = hf; flags change any of them)",
]
DEFAULT_TRAIN = " ".join(line.strip() for line in DEFAULT_LINES)


def _run(capsys: Any, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(args))
    return status, capsys.readouterr().out


def test_training_defaults_are_named() -> None:
    assert settings_line(estimate({"model": "llama-3.1-8b"})) == DEFAULT_TRAIN
    given = settings_line(
        estimate({"model": "llama-3.1-8b", "batch": 2, "framework": "litgpt", "optimizer_impl": "fused"})
    )
    assert given == (
        "settings: batch 2, seq 2048, precision mixed-bf16, optimizer adamw, optimizer_impl fused, framework litgpt "
        "(defaults: seq, precision, optimizer; flags change any of them)"
    )
    litgpt = settings(estimate({"model": "llama-3.1-8b", "framework": "litgpt"}))
    assert [s.text() for s in litgpt][4] == "optimizer_impl foreach (auto)" and litgpt[4].why == "= litgpt's"


def test_inference_settings() -> None:
    line = settings_line(estimate({"model": "llama-3.1-8b", "mode": "infer", "framework": "vllm", "context": 4096}))
    assert line == (
        "settings: batch 4, context 4096, precision mixed-bf16, kv_dtype auto, engine vllm "
        "(defaults: batch, precision, kv_dtype; flags change any of them)"
    )


def test_every_format_shows_the_line(capsys: Any) -> None:
    status, out = _run(capsys, "estimate", "llama-3.1-8b", "--gpu", "h100")
    assert status == 0 and out.splitlines()[2:4] == DEFAULT_LINES
    status, out = _run(capsys, "estimate", "llama-3.1-8b", "--format", "markdown")
    assert status == 0 and [line.strip() for line in out.splitlines()[2:4]] == [line.strip() for line in DEFAULT_LINES]
    status, out = _run(capsys, "estimate", "llama-3.1-8b", "--format", "json")
    data = json.loads(out)["settings"]
    assert data[0] == {"key": "batch", "value": "4", "source": "default", "why": ""}
    assert data[4] == {"key": "optimizer_impl", "value": "fused", "source": "auto", "why": "= hf's"}
    page = render_html(estimate({"model": "llama-3.1-8b"}))
    assert (
        f'<p class="settings" id="settings">{DEFAULT_TRAIN.replace("&", "&amp;").replace(chr(39), "&#x27;")}</p>'
        in page
    )
    assert markdown_report(estimate({"model": "llama-3.1-8b"})).splitlines()[2].strip() == DEFAULT_LINES[0]


@pytest.mark.parametrize("command", ["estimate", "plan", "simulate"])
def test_help_shows_every_default(capsys: Any, command: str) -> None:
    status, out = _run(capsys, command, "--help")
    text = " ".join(out.split())
    assert status == 0
    for flag, default in (("--batch", "4"), ("--seq", "2048"), ("--precision", "mixed-bf16"), ("--optimizer", "adamw"),
                          ("--optimizer-impl", "auto"), ("--framework", "auto"), ("--gpus", "1"), ("--lora-rank", "16"),
                          ("--compile / --no-compile", "off")):  # fmt: skip
        assert re.search(rf"{re.escape(flag)}( VALUE)? .*?\[default: {re.escape(default)}\]", text), flag


def test_html_inputs_are_the_keys_that_apply_without_raw_json() -> None:
    train = estimate({"model": "llama-3.1-8b", "method": "lora", "parallel": {"gpus": 2, "shard": "ddp"}})
    keys = dict(applicable_inputs(train.workload_dict))
    assert keys["lora.rank"] == "16" and keys["lora.modules_to_save"] == "none" and keys["parallel.gpus"] == "2"
    assert "prompt" not in keys and "kv_dtype" not in keys and "gpu_memory_utilization" not in keys
    full = dict(applicable_inputs(estimate({"model": "llama-3.1-8b"}).workload_dict))
    assert "lora.rank" not in full and full["alloc_conf"] == "none"
    older = estimate({"model": "llama-3.1-8b", "versions": {"transformers": "4.40"}}).workload_dict
    assert dict(applicable_inputs(older))["versions.transformers"] == "4.40"
    infer = dict(applicable_inputs(estimate({"model": "llama-3.1-8b", "mode": "infer"}).workload_dict))
    assert "seq" not in infer and "optimizer" not in infer and "max_num_seqs" not in infer and infer["prompt"] == "1024"
    page = render_html(train)
    inputs = page[page.index('<section id="inputs">') : page.index('<section id="assumptions">')]
    assert "{" not in inputs and "<th>lora.rank</th><td>16</td>" in inputs
