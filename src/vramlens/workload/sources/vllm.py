"""A ``vllm serve`` command line (or ``python -m vllm.entrypoints.openai.api_server``) -> workload.

Engine arguments as vLLM's ``EngineArgs`` reads them (dashes or underscores, ``--a=b`` or
``--a b``): the model (positional, or ``--model``), ``--tensor-parallel-size``/``-tp``,
``--pipeline-parallel-size``/``-pp``, ``--gpu-memory-utilization``, ``--max-model-len`` (each
sequence may grow to it: the workload's ``context``), ``--max-num-seqs``, ``--block-size``,
``--max-num-batched-tokens``, ``--kv-cache-dtype``, ``--dtype``, ``--quantization``. How many
sequences run at once is the load's, not the command's: ``batch`` stays the flag's.
``PYTORCH_CUDA_ALLOC_CONF=...`` in front of the command (or exported) sets ``alloc_conf``.
"""

from __future__ import annotations

import itertools
from typing import Final

from vramlens.workload.sources._mapping import MappingBuilder, SourcedWorkload
from vramlens.workload.sources._text import Arguments, as_int, parse_command
from vramlens.workload.sources.shared import ReadContext, map_environment

__all__ = ["detect", "read"]

NAME: Final = "vllm"

_SHORT: Final = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
                 "-q": "quantization"}  # fmt: skip
_DTYPES: Final = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
_KV: Final = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bfloat16": "bf16", "float16": "fp16"}
_QUANT: Final = {
    "fp8": ("fp8", ""), "awq": ("awq-int4", ""), "awq_marlin": ("awq-int4", ""),
    "gptq": ("gptq-int4", "4-bit GPTQ; an 8-bit checkpoint needs --quant gptq-int8"),
    "gptq_marlin": ("gptq-int4", "4-bit GPTQ; an 8-bit checkpoint needs --quant gptq-int8"),
    "bitsandbytes": ("nf4", "bitsandbytes 4-bit NF4 (vLLM's in-flight quantization)"),
}  # fmt: skip
_DIRECT: Final = {
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_seqs": "max_num_seqs",
    "block_size": "block_size",
    "max_num_batched_tokens": "max_num_batched_tokens",
}
_IGNORED: Final = frozenset({
    "host", "port", "api_key", "served_model_name", "trust_remote_code", "download_dir", "seed", "tokenizer",
    "revision", "tokenizer_revision", "uvicorn_log_level", "disable_log_requests", "disable_log_stats",
    "enable_chunked_prefill", "enable_prefix_caching", "no_enable_prefix_caching", "swap_space", "chat_template",
    "tool_call_parser", "enable_auto_tool_choice", "reasoning_parser", "load_format", "distributed_executor_backend",
    "max_log_len", "response_role", "ssl_keyfile", "ssl_certfile", "root_path", "middleware", "generation_config",
    "override_generation_config", "hf_overrides", "tokenizer_mode", "config_format", "data_parallel_size",
    "allowed_origins", "allowed_methods", "allowed_headers", "api_server_count", "headless",
})  # fmt: skip
_WHY: Final = {
    "enforce_eager": "no CUDA graphs; their memory is still counted",
    "cpu_offload_gb": "part of the weights kept in CPU memory",
    "kv_cache_memory_bytes": "a fixed KV pool instead of gpu_memory_utilization",
    "enable_lora": "LoRA adapter slots", "speculative_config": "a draft model beside the target",
}  # fmt: skip
_USED: Final = frozenset({
    "model", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "kv_cache_dtype", "dtype",
    "quantization", *_DIRECT,
})  # fmt: skip


def detect(tokens: list[str]) -> bool:
    """``vllm serve`` or vLLM's OpenAI server module."""
    words = [token.rsplit("/", 1)[-1] for token in tokens]
    serve = any(a == "vllm" and b == "serve" for a, b in itertools.pairwise(words))
    return serve or any(token.startswith("vllm.entrypoints") for token in tokens)


def _program_end(tokens: list[str]) -> int:
    """Index just past ``vllm serve`` / ``-m vllm.entrypoints...``."""
    for index, token in enumerate(tokens):
        if token.rsplit("/", 1)[-1] == "vllm" and index + 1 < len(tokens) and tokens[index + 1] == "serve":
            return index + 2
        if token.startswith("vllm.entrypoints"):
            return index + 1
    return 0


def read(tokens: list[str], ctx: ReadContext) -> SourcedWorkload:
    out = MappingBuilder(NAME)
    out.fixed("mode", "infer", "a serving command")
    out.fixed("engine", "vllm", "vllm serve")
    out.fixed("framework", "vllm", "vllm serve")
    map_environment(out, tokens)
    rest = tokens[_program_end(tokens) :]
    rest = rest[: next((i for i, t in enumerate(rest) if t in ("&&", ";", "|", "||", "&")), len(rest))]
    args = parse_command(rest, short=_SHORT)
    model = args.value("model") or (args.positionals[0] if args.positionals else None)
    if model:
        out.set("model", model, "model" if args.value("model") else "(positional model)")
    _parallel(out, args)
    for source, target in _DIRECT.items():
        if args.value(source):
            out.set(target, args.value(source), args.spelled[source])
    if args.value("max_model_len"):
        out.set(
            "context",
            args.value("max_model_len"),
            args.spelled["max_model_len"],
            why="the longest sequence the pool must hold",
        )
    else:
        out.note(
            "--max-model-len not given: vLLM allows the model's full context; the workload's prompt + generate stand in",
            "context",
        )
    _dtypes(out, args)
    out.note(
        "batch: how many sequences run at once is the load's, not the command's; the flag's batch stands in", "batch"
    )
    for name, values in args.options.items():
        if name not in _USED and name not in _IGNORED:
            out.not_modelled(args.spelled[name], " ".join(values) or "true", _WHY.get(name, ""))
    return out.result(ctx.origin)


def _parallel(out: MappingBuilder, args: Arguments) -> None:
    tp = as_int(
        f"{NAME} {args.spelled.get('tensor_parallel_size', '--tensor-parallel-size')}",
        args.value("tensor_parallel_size") or 1,
    )
    pp = as_int(
        f"{NAME} {args.spelled.get('pipeline_parallel_size', '--pipeline-parallel-size')}",
        args.value("pipeline_parallel_size") or 1,
    )
    if args.has("tensor_parallel_size"):
        out.set("parallel.tp", tp, args.spelled["tensor_parallel_size"])
    if args.has("pipeline_parallel_size"):
        out.set("parallel.pp", pp, args.spelled["pipeline_parallel_size"])
    if tp * pp > 1:
        out.set("parallel.gpus", tp * pp, "tp x pp", shown=f"{tp} x {pp}", why="GPUs of one engine")
    if args.value("data_parallel_size"):
        out.note("--data-parallel-size: each replica holds its own copy; memory per GPU is one replica's")


def _dtypes(out: MappingBuilder, args: Arguments) -> None:
    dtype = args.value("dtype")
    if dtype:
        text = dtype.strip().lower()
        if text == "auto":
            out.note(
                "--dtype auto: the checkpoint's dtype (fp32 checkpoints run in bf16); precision is the flag's",
                "precision",
            )
        elif text in _DTYPES:
            out.set("precision", _DTYPES[text], args.spelled["dtype"], shown=dtype)
        else:
            raise out.fail(
                args.spelled["dtype"], f"unknown value {dtype!r}; expected auto, bfloat16, float16 or float32"
            )
    kv = args.value("kv_cache_dtype")
    if kv:
        if kv.strip().lower() not in _KV:
            raise out.fail(
                args.spelled["kv_cache_dtype"], f"unknown value {kv!r}; expected auto, fp8, fp8_e4m3, fp8_e5m2"
            )
        out.set("kv_dtype", _KV[kv.strip().lower()], args.spelled["kv_cache_dtype"], shown=kv)
    quant = args.value("quantization")
    if quant:
        key = quant.strip().lower()
        if key not in _QUANT:
            out.not_modelled(args.spelled["quantization"], quant, "weights read as the checkpoint's dtype")
        else:
            value, why = _QUANT[key]
            out.set("quant", value, args.spelled["quantization"], shown=quant, why=why)
