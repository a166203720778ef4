"""``vramlens estimate --mode infer``: the KV cache and vLLM pool lines, JSON ``serving``,
the capacity switches ``--max-batch`` / ``--max-context``, and ``--max-num-batched-tokens``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import vramlens
from vramlens.cli import main
from vramlens.estimator import estimate
from vramlens.estimator.capacity import search_capacity

MODEL = "llama-3.1-8b"
VLLM_ARGS = [MODEL, "--mode", "infer", "--engine", "vllm", "--gpu", "h100-80gb"]
VLLM_WORKLOAD: dict[str, Any] = {"model": MODEL, "mode": "infer", "engine": "vllm", "gpu": "h100-80gb"}


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep rich from emitting colour codes or picking a width from the environment."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES"):
        monkeypatch.delenv(name, raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["estimate", *args])
    out, err = capsys.readouterr()
    return status, out, err


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    status, out, err = run([*args, "--format", "json"], capsys)
    assert status == 0, err
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def flat(text: str) -> str:
    """The text with rich's line wrapping undone (runs of whitespace as one space)."""
    return " ".join(text.split())


def assert_one_line_error(status: int, out: str, err: str, *fragments: str) -> None:
    assert status != 0 and out == ""
    assert err.startswith("error: ") and err.strip().count("\n") == 0 and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def test_vllm_table_shows_the_kv_pool_and_concurrent_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    serving = estimate(VLLM_WORKLOAD).serving
    assert serving is not None
    status, out, err = run(VLLM_ARGS, capsys)
    assert status == 0 and err == ""
    text = flat(out)
    assert "vLLM KV pool:" in text and "concurrent sequences" in text
    assert f"= {serving.kv_blocks} blocks of" in text
    assert f"up to {serving.max_concurrent_sequences} concurrent sequences" in text
    assert "KV cache:" in text
    assert "serving <- peak" in out


def test_vllm_json_has_the_serving_object(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(VLLM_ARGS, capsys)
    assert data["peak"]["phase"] == "serving"
    serving = data["serving"]
    assert isinstance(serving, dict) and serving["engine"] == "vllm"
    for key in ("kv_blocks", "max_concurrent_sequences", "kv_pool_bytes", "budget_bytes", "kv_bytes_needed"):
        assert isinstance(serving[key], int) and not isinstance(serving[key], bool), key
    assert serving["kv_blocks"] > 0 and 1 <= serving["max_concurrent_sequences"] <= 256
    assert serving["kv_blocks"] == serving["kv_pool_bytes"] // serving["kv_block_bytes"]
    assert serving == estimate(VLLM_WORKLOAD).to_dict()["serving"]
    assert {phase["name"] for phase in data["phases"]} == {"profile", "serving"}
    assert "capacity" not in data


def test_markdown_has_the_kv_cache_and_pool_lines(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([*VLLM_ARGS, "--format", "markdown"], capsys)
    assert status == 0 and err == ""
    assert re.search(r"^KV cache: .+ per token; 4 sequences x 1280 tokens need ", out, re.M)
    assert re.search(r"^vLLM KV pool: .+ concurrent sequences of 1280 tokens$", out, re.M)


def test_hf_table_shows_prefill_decode_and_the_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([MODEL, "--mode", "infer", "--engine", "hf", "--gpu", "h100-80gb"], capsys)
    assert status == 0 and err == ""
    assert re.search(r"^\s*prefill\b", out, re.M) and re.search(r"^\s*decode\b", out, re.M)
    assert "KV cache:" in out
    assert "vLLM KV pool" not in out


def test_hf_json_serving_has_no_pool(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json([MODEL, "--mode", "infer", "--gpu", "h100-80gb"], capsys)
    assert data["serving"]["engine"] == "hf"
    assert data["serving"]["kv_pool_bytes"] is None and data["serving"]["kv_blocks"] is None
    assert data["peak"]["phase"] in ("prefill", "decode")


@pytest.mark.parametrize(
    ("args", "workload"),
    [
        ([MODEL, "--mode", "infer", "--gpu", "h100-80gb"], {"model": MODEL, "mode": "infer", "gpu": "h100-80gb"}),
        (
            [*VLLM_ARGS, "--max-num-seqs", "1024", "--context", "32k"],
            {**VLLM_WORKLOAD, "max_num_seqs": 1024, "context": 32768},
        ),
        (
            ["llama-3.1-70b", "--mode", "infer", "--tp", "2", "--gpus", "2", "--gpu", "a100-80gb"],
            {"model": "llama-3.1-70b", "mode": "infer", "parallel": {"tp": 2, "gpus": 2}, "gpu": "a100-80gb"},
        ),
        (
            [MODEL, "--mode", "train", "--method", "lora", "--gpu", "a100-80gb"],
            {"model": MODEL, "mode": "train", "method": "lora", "gpu": "a100-80gb"},
        ),
    ],
)
def test_max_batch_prints_the_library_answer(
    args: list[str], workload: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = vramlens.max_batch(workload)
    assert expected >= 1
    status, out, err = run([*args, "--max-batch"], capsys)
    assert status == 0 and err == ""
    first = out.splitlines()[0]
    match = re.fullmatch(r"largest batch that fits: (\d+) \(searched up to (\d+)\)", first)
    assert match is not None, first
    assert int(match.group(1)) == expected
    data = run_json([*args, "--max-batch"], capsys)
    assert data["capacity"]["key"] == "batch" and data["capacity"]["value"] == expected
    assert data["capacity"]["limit"] == int(match.group(2))
    assert data["workload"]["batch"] == expected and data["fits"] is True


def test_max_batch_json_matches_search_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    answer = search_capacity(VLLM_WORKLOAD, "batch")
    data = run_json([*VLLM_ARGS, "--max-batch"], capsys)
    assert data["capacity"] == {"key": "batch", "value": answer.value, "limit": answer.limit}
    assert answer.report is not None
    assert data["peak"] == answer.report.to_dict()["peak"]


def test_max_context_prints_the_library_answer(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["qwen2.5-7b", "--mode", "infer", "--gpu", "rtx-4090", "--quant", "awq-int4"]
    expected = vramlens.max_context({"model": "qwen2.5-7b", "mode": "infer", "gpu": "rtx-4090", "quant": "awq-int4"})
    status, out, err = run([*args, "--max-context"], capsys)
    assert status == 0 and err == ""
    assert out.splitlines()[0].startswith(f"largest context that fits: {expected} (searched up to ")
    data = run_json([*args, "--max-context"], capsys)
    assert data["capacity"]["key"] == "context" and data["capacity"]["value"] == expected
    assert data["workload"]["context"] == expected


def test_max_batch_and_max_context_together_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([*VLLM_ARGS, "--max-batch", "--max-context"], capsys)
    assert_one_line_error(status, out, err, "--max-batch", "--max-context")


@pytest.mark.parametrize("switch", ["--max-batch", "--max-context"])
def test_capacity_without_gpu_is_a_one_line_error_naming_gpu(switch: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([MODEL, "--mode", "infer", switch], capsys)
    assert_one_line_error(status, out, err, "error: gpu:")


def test_max_context_in_training_is_a_one_line_error_naming_mode(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([MODEL, "--mode", "train", "--gpu", "h100-80gb", "--max-context"], capsys)
    assert_one_line_error(status, out, err, "error: mode:")


def test_max_batch_when_nothing_fits_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["mixtral-8x7b", "--mode", "infer", "--gpu", "l4", "--max-batch"], capsys)
    assert_one_line_error(status, out, err, "error: batch:", "does not fit")


def profile_bytes(data: dict[str, Any]) -> int:
    return next(phase["allocated_bytes"] for phase in data["phases"] if phase["name"] == "profile")


def test_max_num_batched_tokens_changes_the_vllm_profile(capsys: pytest.CaptureFixture[str]) -> None:
    """With max_num_seqs 8 the sampler is small, so the profile's forward step sets the activation peak."""
    args = [*VLLM_ARGS, "--max-num-seqs", "8"]
    default = run_json(args, capsys)
    explicit_default = run_json([*args, "--max-num-batched-tokens", "8192"], capsys)
    smaller = run_json([*args, "--max-num-batched-tokens", "4096"], capsys)
    short = run_json([*args, "--max-num-batched-tokens", "4k"], capsys)
    assert profile_bytes(explicit_default) == profile_bytes(default)
    assert profile_bytes(smaller) < profile_bytes(default)
    assert profile_bytes(short) == profile_bytes(smaller)
    assert smaller["workload"]["max_num_batched_tokens"] == 4096
    assert default["workload"]["max_num_batched_tokens"] is None
    assert smaller["serving"]["kv_pool_bytes"] > default["serving"]["kv_pool_bytes"]
    expected = estimate({**VLLM_WORKLOAD, "max_num_seqs": 8, "max_num_batched_tokens": 4096})
    assert profile_bytes(smaller) == profile_bytes(expected.to_dict())
    assert any("4096 tokens" in phase.get("note", "") for phase in smaller["phases"])


@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_num_batched_tokens_below_one_is_a_one_line_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run([*VLLM_ARGS, f"--max-num-batched-tokens={value}"], capsys)
    assert_one_line_error(status, out, err, "max_num_batched_tokens")
