"""``vramlens estimate MODEL [flags]`` and ``vramlens estimate -c run.yaml [flags]``.

Every workload key is a flag with the same name in dashes (``--grad-accum``);
``lora.*`` keys are ``--lora-rank`` etc., ``parallel.*`` keys are plain
(``--gpus``, ``--tp``, ``--shard``). Flags override the file. Values are
validated by the workload loader, so errors are the same one-liners as for files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from vramlens.cli._from import WorkloadInputs, from_options, read_source, with_source
from vramlens.cli._output import dumps, echo
from vramlens.cli._pictures import check_pictures, picture_options, write_pictures
from vramlens.errors import InputError

__all__ = ["FLAGS", "estimate_command", "with_workload_options", "workload_arguments", "workload_inputs"]

#: flag name -> (workload path, help). Paths with a dot go into the ``lora`` / ``parallel`` blocks.
FLAGS: dict[str, tuple[str, str]] = {
    "mode": ("mode", "train | infer"),
    "gpu": ("gpu", "GPU name (h100-80gb, a100-80gb, rtx-4090, ...) or a size such as 24GiB"),
    "framework": (
        "framework",
        "auto | hf | plain | torchtitan | torchtune | litgpt | megatron | deepspeed | vllm (auto: hf)",
    ),
    "method": ("method", "full | lora | qlora | freeze"),
    "precision": ("precision", "fp32 | bf16 | fp16 | mixed-bf16 | mixed-fp16"),
    "quant": ("quant", "none | int8 | nf4 | nf4-dq | gptq-int4 | gptq-int8 | awq-int4 | fp8"),
    "optimizer": ("optimizer", "adamw | adamw-8bit | paged-adamw | paged-adamw-8bit | adafactor | sgd | lion"),
    "optimizer-impl": ("optimizer_impl", "auto | per-tensor | foreach | fused (auto: the framework's own)"),
    "batch": ("batch", "micro-batch per data-parallel rank"),
    "seq": ("seq", "tokens per sample (e.g. 4096 or 8k)"),
    "grad-accum": ("grad_accum", "gradient accumulation steps"),
    "recompute": ("recompute", "none | selective | full | offload"),
    "recompute-every": ("recompute_every", "with full recompute: checkpoint every k-th layer"),
    "attention": ("attention", "auto | flash | efficient | sdpa | eager"),
    "loss": ("loss", "auto | full | chunked | fused-linear"),
    "moe-capacity-factor": ("moe_capacity_factor", "MoE expert capacity factor (e.g. 1.25); default dropless"),
    "fsdp-wrap": ("fsdp_wrap", "auto | root (FSDP1) | split (FSDP2 as accelerate and torchtitan wrap it)"),
    "prompt": ("prompt", "inference: prompt tokens"),
    "generate": ("generate", "inference: generated tokens"),
    "context": ("context", "inference: prompt + generated tokens"),
    "kv-dtype": ("kv_dtype", "inference: auto | bf16 | fp16 | fp8"),
    "engine": ("engine", "inference: hf | vllm"),
    "gpu-memory-utilization": ("gpu_memory_utilization", "inference (vllm): fraction of the GPU to use"),
    "max-num-seqs": ("max_num_seqs", "inference (vllm): concurrent sequences"),
    "block-size": ("block_size", "inference (vllm): KV block size in tokens"),
    "max-num-batched-tokens": ("max_num_batched_tokens", "inference: tokens per forward step (vllm default 8192)"),
    "alloc-conf": ("alloc_conf", "PYTORCH_CUDA_ALLOC_CONF of the run, e.g. expandable_segments:True"),
    "versions": ("versions", "library versions of the run, e.g. transformers=4.35,vllm=0.6"),
    "lora-rank": ("lora.rank", "LoRA rank r"),
    "lora-alpha": ("lora.alpha", "LoRA alpha"),
    "lora-dropout": ("lora.dropout", "LoRA dropout"),
    "lora-targets": ("lora.targets", "all-linear, or comma-separated module names (q_proj,v_proj,lm_head)"),
    "modules-to-save": ("lora.modules_to_save", "comma-separated modules trained in full (embed_tokens,lm_head)"),
    "gpus": ("parallel.gpus", "total GPUs"),
    "shard": ("parallel.shard", "none | ddp | zero1 | zero2 | zero3 | fsdp | hsdp"),
    "shard-degree": ("parallel.shard_degree", "ranks per shard group (hsdp)"),
    "tp": ("parallel.tp", "tensor-parallel degree"),
    "pp": ("parallel.pp", "pipeline stages"),
    "pp-schedule": ("parallel.pp_schedule", "1f1b | gpipe | interleaved-1f1b"),
    "cp": ("parallel.cp", "context-parallel degree"),
    "ep": ("parallel.ep", "expert-parallel degree"),
    "offload": ("parallel.offload", "none | optimizer | optimizer+params"),
}
#: Boolean workload keys (``--compile/--no-compile``).
SWITCHES: dict[str, tuple[str, str]] = {
    "float8": ("float8", "float8 matmuls (torchao)"),
    "optimizer-in-backward": ("optimizer_in_backward", "step and free each gradient during backward"),
    "packing": ("packing", "sequences packed into full-length samples"),
    "compile": ("compile", "torch.compile (fused norms and pointwise ops)"),
    "allow-long-context": ("allow_long_context", "allow seq beyond the model's max_position_embeddings"),
}


def _set(overrides: dict[str, Any], path: str, value: Any) -> None:
    block, _, key = path.rpartition(".")
    target = overrides.setdefault(block, {}) if block else overrides
    target[key] = value


def _overrides(options: dict[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for flag, (path, _) in {**FLAGS, **SWITCHES}.items():
        value = options.get(flag.replace("-", "_"))
        if value is not None:
            _set(overrides, path, value)
    return overrides


def _default(path: str) -> str:
    """The contract default of a workload key (``batch``, ``lora.rank``, ``parallel.gpus``) as --help shows it."""
    import dataclasses

    from vramlens.workload.spec import LoraConfig, Parallelism, Workload

    block, _, key = path.rpartition(".")
    owner = {"": Workload, "lora": LoraConfig, "parallel": Parallelism}[block]
    field = next(f for f in dataclasses.fields(owner) if f.name == key)
    value = field.default
    if value is None:
        return "none" if key != "gpu" else "none: no fit check"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "none: PyTorch's defaults" if key == "alloc_conf" else "none"
    if key == "versions":
        return "none: the installed ones, else the current releases"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return str(getattr(value, "value", value))


def _with_workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = from_options(func)
    for flag, (path, help_text) in reversed(list(SWITCHES.items())):
        func = click.option(f"--{flag}/--no-{flag}", default=None, help=f"{help_text} [default: {_default(path)}]")(
            func
        )
    from vramlens.workload.ranges import RANGES

    for flag, (path, help_text) in reversed(list(FLAGS.items())):
        bounds = f" ({RANGES[path].describe()})" if path in RANGES else ""
        func = click.option(
            f"--{flag}", default=None, metavar="VALUE", help=f"{help_text}{bounds} [default: {_default(path)}]"
        )(func)
    return func


def workload_inputs(model: str | None, config: str | None, options: dict[str, Any], *, command: str) -> WorkloadInputs:
    """The base (a ``-c`` workload file or a ``--from`` run config), the flags' overrides and the
    run config's reading, for a command that takes MODEL, -c/--from and workload flags."""
    from vramlens.workload.load import read_workload_file

    source = read_source(options, config)
    base: dict[str, Any] = read_workload_file(config) if config else {}
    if source is not None:
        base = {k: (dict(v) if isinstance(v, dict) else v) for k, v in source.keys.items()}
    overrides = _overrides(options)
    if model is not None:
        overrides["model"] = model
    if "model" not in base and "model" not in overrides:
        where = f"{source.origin} names no model; " if source is not None else ""
        raise InputError(
            f"model: {where}give MODEL (e.g. vramlens {command} llama-3.1-8b) or a workload file with a 'model' key (-c run.yaml)"
        )
    return WorkloadInputs(base=base, overrides=overrides, source=source)


def workload_arguments(
    model: str | None, config: str | None, options: dict[str, Any], *, command: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload file's keys and the flags' overrides of a command that takes MODEL/-c and workload flags."""
    inputs = workload_inputs(model, config, options, command=command)
    return inputs.base, inputs.overrides


#: Adds every workload flag (and switch) to a click command.
with_workload_options = _with_workload_options


@click.command("estimate")
@click.argument("model", required=False)
@click.option(
    "-c", "--config", "config", type=click.Path(dir_okay=False), help="Workload file (YAML or JSON); flags override it."
)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@click.option("--explain", is_flag=True, help="Also list every term with its formula.")
@click.option("--max-batch", "max_batch", is_flag=True, help="Find the largest batch that fits the GPU.")
@click.option(
    "--max-context", "max_context", is_flag=True, help="Inference: find the longest context that fits the GPU."
)
@picture_options
@_with_workload_options
def estimate_command(
    model: str | None,
    config: str | None,
    fmt: str,
    explain: bool,
    max_batch: bool,
    max_context: bool,
    ascii_only: bool,
    plot_path: str | None,
    html_path: str | None,
    **options: Any,
) -> None:
    """Estimate per-GPU memory of training or serving MODEL (a catalog name, config path or cached HF id)."""
    from vramlens.estimator import estimate

    check_pictures(plot_path=plot_path, html_path=html_path)
    inputs = workload_inputs(model, config, options, command="estimate")
    base, overrides = inputs.base, inputs.overrides
    if max_batch and max_context:
        raise InputError("--max-batch and --max-context: ask one at a time (the other value is held fixed)")
    answer = None
    if max_batch or max_context:
        from vramlens.estimator.capacity import search_capacity

        answer = search_capacity(base, "batch" if max_batch else "context", **overrides)
        if answer.report is None:
            raise InputError(
                f"{answer.key}: even 1 does not fit the GPU; try quantized weights, more GPUs (tp) or fewer tokens"
            )
        report = answer.report
    else:
        report = estimate(base, **overrides)
    report = with_source(report, inputs)
    _show(report, fmt, explain, answer, ascii_only=ascii_only, source=inputs.source)
    write_pictures(report, plot_path=plot_path, html_path=html_path)


def _show(report: Any, fmt: str, explain: bool, answer: Any, *, ascii_only: bool = False, source: Any = None) -> None:
    headline = None
    if answer is not None:
        headline = f"largest {answer.key} that fits: {answer.value} (searched up to {answer.limit})"
    if fmt == "json":
        data = report.to_dict()
        if answer is not None:
            data["capacity"] = {"key": answer.key, "value": answer.value, "limit": answer.limit}
        if source is not None:
            data["source"] = source.to_dict()
        click.echo(dumps(data, indent=2))
        return
    if headline:
        echo(headline)
    if fmt == "markdown":
        from vramlens.report.text import markdown_report

        echo(markdown_report(report, explain=explain), nl=False)
    else:
        from vramlens.report.text import print_report

        print_report(report, explain=explain, ascii_only=ascii_only)
