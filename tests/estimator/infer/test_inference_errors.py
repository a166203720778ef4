"""Bad inference workloads: one-line InputError led by the key at fault, from the library and the CLI."""

from __future__ import annotations

from typing import Any

import pytest

from vramlens.cli import main
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.result.report import MemoryReport

LLAMA = "llama-3.1-8b"  # llama-3.1-8b.json: max_position_embeddings 131072, 32 heads, 8 KV heads


def infer(**workload: Any) -> MemoryReport:
    return estimate({"model": LLAMA, "mode": "infer", **workload})


def error_of(**workload: Any) -> str:
    with pytest.raises(InputError) as caught:
        infer(**workload)
    message = str(caught.value)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    return message


BAD = [
    pytest.param({"context": 131073}, "context:", "131072", id="context-beyond-max-positions"),
    pytest.param({"prompt": 131000, "generate": 73}, "prompt + generate:", "131073", id="prompt-plus-generate"),
    pytest.param({"parallel": {"tp": 3, "gpus": 3}}, "parallel.tp:", "8 KV heads", id="tp-3"),
    pytest.param({"parallel": {"tp": 64, "gpus": 64}}, "parallel.tp:", "32 attention heads", id="tp-64"),
    pytest.param({"gpu_memory_utilization": 0}, "gpu_memory_utilization:", ">= 0.01", id="utilization-0"),
    pytest.param({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization:", "1.5", id="utilization-1.5"),
    pytest.param({"quant": "int3"}, "quant:", "gptq-int4", id="unknown-quant"),
    pytest.param({"kv_dtype": "fp8"}, "kv_dtype:", "engine vllm", id="fp8-kv-on-hf"),
    pytest.param({"kv_dtype": "fp8", "engine": "hf"}, "kv_dtype:", "auto", id="fp8-kv-on-explicit-hf"),
    pytest.param({"engine": "vllm", "batch": 257}, "batch:", "max_num_seqs 256", id="batch-over-max-num-seqs"),
    pytest.param({"framework": "vllm", "batch": 9, "max_num_seqs": 8}, "batch:", "max_num_seqs 8", id="framework-vllm"),
    pytest.param({"framework": "torchtitan"}, "framework:", "hf or vllm", id="torchtitan"),
    pytest.param({"framework": "megatron"}, "framework:", "training framework", id="megatron"),
    pytest.param({"parallel": {"pp": 33, "gpus": 33}}, "parallel.pp:", "32 layers", id="pp-over-layers"),
    pytest.param({"parallel": {"ep": 2, "gpus": 2, "shard": "fsdp"}}, "parallel.ep:", "MoE", id="ep-on-dense"),
]


@pytest.mark.parametrize(("workload", "lead", "fragment"), BAD)
def test_bad_inference_workloads_name_the_key(workload: dict[str, Any], lead: str, fragment: str) -> None:
    message = error_of(**workload)
    assert message.startswith(lead), message
    assert fragment in message, message


def test_long_context_passes_with_allow_long_context() -> None:
    report = infer(context=131073, batch=1, allow_long_context=True)
    assert report.serving is not None and report.serving.tokens_per_sequence == 131073


def test_context_at_the_limit_is_accepted() -> None:
    assert infer(context=131072, batch=1).serving is not None
    assert infer(prompt=131071, generate=1, batch=1).serving is not None


def test_gemma_2_context_limit_is_its_own() -> None:
    # gemma-2-2b.json: max_position_embeddings 8192.
    with pytest.raises(InputError, match=r"^context: 8193 tokens exceed gemma-2-2b's max_position_embeddings 8192"):
        estimate({"model": "gemma-2-2b", "mode": "infer", "context": 8193})


def test_utilization_of_one_is_accepted() -> None:
    report = infer(engine="vllm", gpu="h100-80gb", gpu_memory_utilization=1.0)
    assert report.serving is not None and report.capacity_bytes is not None
    assert report.serving.budget_bytes == report.capacity_bytes


@pytest.mark.parametrize("tp", [2, 4, 8, 16, 32])
def test_tp_dividing_the_heads_is_accepted(tp: int) -> None:
    # tp 16 and 32 exceed the 8 KV heads but are multiples of them: KV heads are replicated.
    assert infer(engine="vllm", parallel={"tp": tp, "gpus": tp}).serving is not None


def test_fp8_kv_and_a_full_batch_are_accepted_by_vllm() -> None:
    assert infer(engine="vllm", kv_dtype="fp8", batch=256).serving is not None


# ---- the CLI -----------------------------------------------------------------------------------


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["estimate", LLAMA, "--mode", "infer", *args])
    out, err = capsys.readouterr()
    return status, out, err


CLI_BAD = [
    pytest.param(["--tp", "3", "--gpus", "3"], "error: parallel.tp: 3", id="tp-3"),
    pytest.param(["--tp", "3"], "error: parallel.gpus:", id="tp-3-on-one-gpu"),
    pytest.param(["--context", "200000"], "error: context: 200000", id="context"),
    pytest.param(["--kv-dtype", "fp8"], "error: kv_dtype: fp8", id="fp8-on-hf"),
    pytest.param(["--gpu-memory-utilization", "1.5"], "error: gpu_memory_utilization:", id="utilization"),
    pytest.param(["--engine", "vllm", "--batch", "300"], "error: batch: 300", id="batch"),
    pytest.param(["--framework", "torchtitan"], "error: framework: torchtitan", id="framework"),
    pytest.param(["--quant", "int3"], "error: quant:", id="quant"),
]


@pytest.mark.parametrize(("args", "lead"), CLI_BAD)
def test_cli_errors_are_one_line_without_traceback(
    args: list[str], lead: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(args, capsys)
    assert status != 0 and out == ""
    assert err.startswith(lead), err
    assert err.strip().count("\n") == 0 and "Traceback" not in err


def test_cli_accepts_allow_long_context(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(["--context", "200000", "--batch", "1", "--allow-long-context"], capsys)
    assert status == 0, err
    assert out
