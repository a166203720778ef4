"""How each run-config format maps its keys: the cases beyond the examples, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramlens.errors import InputError
from vramlens.workload import load_workload
from vramlens.workload.sources import parse_run_config, read_run_config


def _yaml(data: dict[str, Any], fmt: str | None = None, name: str = "run.yaml") -> Any:
    return parse_run_config(yaml.safe_dump(data), origin=name, format=fmt)


def _keys(source: Any) -> dict[str, Any]:
    return load_workload({"model": "llama-3.1-8b", **source.keys})


# ---- axolotl ----------------------------------------------------------------------------------------


def test_axolotl_defaults_are_axolotls_and_said() -> None:
    source = _yaml({"base_model": "meta-llama/Llama-3.1-8B", "micro_batch_size": 1, "gradient_accumulation_steps": 2})
    workload = load_workload(source.keys)
    assert (workload.seq, workload.precision.value, workload.method.value) == (512, "bf16", "full")
    text = "\n".join(source.assumptions())
    assert "axolotl's default 512" in text and "bf16 on GPUs that support it" in text
    assert "adamw_torch_fused" in text


def test_axolotl_lora_8bit_and_modules() -> None:
    source = _yaml({"base_model": "x", "adapter": "lora", "load_in_8bit": True,
                    "lora_target_modules": ["q_proj", "v_proj"], "lora_modules_to_save": ["lm_head"],
                    "gradient_checkpointing": "offload", "liger_fused_linear_cross_entropy": True})  # fmt: skip
    w = _keys(source)
    assert (w.method.value, w.quant.value, w.lora.targets, w.lora.modules_to_save) == (
        "lora", "int8", ("q_proj", "v_proj"), ("lm_head",))  # fmt: skip
    assert (w.recompute.value, w.loss.value) == ("offload", "fused-linear")


def test_axolotl_reads_the_deepspeed_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "zero2.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}))
    path = tmp_path / "run.yml"
    path.write_text(yaml.safe_dump({"base_model": "x", "micro_batch_size": 2, "gradient_accumulation_steps": 1,
                                    "deepspeed": "zero2.json"}))  # fmt: skip
    source = read_run_config(path)
    assert source.keys["parallel"]["shard"].value == "zero2"
    assert source.keys["framework"].value == "deepspeed"
    assert source.keys["batch"] == 2  # axolotl's own value; the DeepSpeed file says auto
    missing = _yaml({"base_model": "x", "deepspeed": "deepspeed_configs/zero3.json"})
    assert any("deepspeed=deepspeed_configs/zero3.json" in item for item in missing.unmodelled)


def test_axolotl_unknown_memory_keys_are_listed_and_logging_is_not() -> None:
    source = _yaml({"base_model": "x", "peft_use_dora": True, "wandb_project": "p", "learning_rate": 1e-4,
                    "num_epochs": 3, "datasets": [{"path": "d"}]})  # fmt: skip
    assert source.unmodelled == ("peft_use_dora=true",)
    assert "not modelled, may change memory: peft_use_dora=true" in source.assumptions()[-1]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"base_model": "x", "adapter": "prefix"}, r"^axolotl adapter: unknown adapter"),
        ({"base_model": "x", "load_in_4bit": True}, r"^axolotl load_in_8bit: quantized loading needs"),
        ({"base_model": "x", "micro_batch_size": "two"}, r"^axolotl micro_batch_size: must be an integer"),
        ({"base_model": "x", "flash_attention": True, "sdp_attention": True}, r"^axolotl sdp_attention: only one"),
        ({"base_model": "x", "micro_batch_size": 3, "batch_size": 10}, r"^axolotl batch_size: 10 is not a multiple"),
    ],
)
def test_axolotl_errors_name_the_key(data: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        _yaml(data)


# ---- torchtune --------------------------------------------------------------------------------------


def test_torchtune_qlora_distributed_offload() -> None:
    source = _yaml({
        "model": {"_component_": "torchtune.models.qwen2_5.qlora_qwen2_5_7b_instruct", "lora_attn_modules": ["q_proj"],
                  "apply_lora_to_output": True, "lora_rank": 16},
        "optimizer": {"_component_": "torch.optim.AdamW"}, "dtype": "bf16", "fsdp_cpu_offload": True,
        "enable_activation_checkpointing": True, "enable_activation_offloading": True, "optimizer_in_bwd": True,
        "compile": True, "loss": {"_component_": "torch.nn.CrossEntropyLoss"},
        "tokenizer": {"max_seq_len": 4096}, "dataset": {"packed": True},
    })  # fmt: skip
    w = load_workload(source.keys)
    assert w.model == "qwen2.5-7b"
    assert (w.method.value, w.quant.value, w.lora.targets, w.lora.rank) == (
        "qlora",
        "nf4-dq",
        ("q_proj", "lm_head"),
        16,
    )
    assert (w.parallel.shard.value, w.parallel.offload.value) == ("fsdp", "optimizer+params")
    assert (w.recompute.value, w.optimizer_in_backward, w.compile, w.loss.value) == ("offload", True, True, "full")
    assert (w.optimizer_impl.value, w.seq, w.packing) == ("foreach", 4096, True)
    assert "apply_lora_to_output: q_proj + output -> lora.targets q_proj,lm_head" in "\n".join(source.assumptions())


def test_torchtune_unknown_builder_needs_model_and_says_so() -> None:
    source = _yaml({"model": {"_component_": "mypkg.models.tiny_lm"}})
    assert "model" not in source.keys and any("mypkg.models.tiny_lm" in item for item in source.unmodelled)
    with pytest.raises(InputError, match=r"^torchtune model.lora_attn_modules: unknown module"):
        _yaml({"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_attn_modules": ["wq"]}})


# ---- litgpt -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("bf16-true", "bf16"), ("bf16-mixed", "mixed-bf16"), ("16-true", "fp16"), ("16-mixed", "mixed-fp16"),
     ("32-true", "fp32")],
)  # fmt: skip
def test_litgpt_precision_strings(text: str, expected: str) -> None:
    assert _keys(_yaml({"checkpoint_dir": "checkpoints/a/b", "precision": text})).precision.value == expected


def test_litgpt_qlora_and_fsdp() -> None:
    q = _keys(_yaml({"checkpoint_dir": "checkpoints/a/b", "quantize": "bnb.nf4-dq", "lora_r": 8, "lora_query": True}))
    assert (q.method.value, q.quant.value, q.lora.targets) == ("qlora", "nf4-dq", ("q_proj",))
    head = _keys(_yaml({"checkpoint_dir": "checkpoints/a/b", "lora_r": 8, "lora_value": True, "lora_head": True}))
    assert head.lora.targets == ("v_proj", "lm_head")
    full = _yaml({"checkpoint_dir": "checkpoints/meta-llama/Llama-3.1-8B", "devices": 4,
                  "train": {"micro_batch_size": 2, "global_batch_size": 64}})  # fmt: skip
    w = load_workload(full.keys)
    assert w.model == "meta-llama/Llama-3.1-8B"
    assert (w.parallel.gpus, w.parallel.shard.value, w.recompute.value, w.grad_accum) == (4, "fsdp", "full", 8)
    with pytest.raises(InputError, match=r"^litgpt quantize: litgpt supports quantization on one device"):
        _yaml({"checkpoint_dir": "c/a/b", "quantize": "bnb.nf4", "lora_query": True, "devices": 2})
    with pytest.raises(InputError, match=r"^litgpt precision: unknown value 'bf17'"):
        _yaml({"checkpoint_dir": "c/a/b", "precision": "bf17"})


# ---- DeepSpeed --------------------------------------------------------------------------------------


def test_deepspeed_gpus_from_the_batch_and_auto_left_to_flags() -> None:
    source = parse_run_config(json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
        "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}},
        "optimizer": {"type": "AdamW"},
    }), origin="ds.json")  # fmt: skip
    w = _keys(source)
    assert (w.parallel.gpus, w.parallel.shard.value, w.parallel.offload.value) == (8, "zero2", "optimizer")
    assert "precision" not in source.keys
    assert any("bf16/fp16 enabled auto" in note for note in source.assumptions())


def test_deepspeed_zero_sizes_become_the_parallel_keys_of_their_names() -> None:
    """Numbers (``1e9`` style too) are read, ``auto`` is left to the defaults, stage-3 sizes at stage 2 are noted."""
    zero3 = parse_run_config(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "reduce_bucket_size": "auto", "stage3_max_live_parameters": 1e8,
        "stage3_max_reuse_distance": "5e8", "stage3_prefetch_bucket_size": 0,
    }}), origin="ds.json")  # fmt: skip
    parallel = _keys(zero3).parallel
    assert (parallel.stage3_max_live_parameters, parallel.stage3_max_reuse_distance) == (10**8, 5 * 10**8)
    assert parallel.stage3_prefetch_bucket_size == 0 and parallel.reduce_bucket_size is None
    zero2 = parse_run_config(json.dumps({"zero_optimization": {
        "stage": 2, "reduce_bucket_size": 2e8, "stage3_max_live_parameters": 1e9,
    }}), origin="ds.json")  # fmt: skip
    assert _keys(zero2).parallel.reduce_bucket_size == 2 * 10**8
    assert any("stage3_max_live_parameters is read at ZeRO stage 3 only" in n for n in zero2.assumptions())


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": -5}},
            r"^deepspeed zero_optimization.stage3_max_live_parameters: must be an integer >= 0",
        ),
        (
            {"zero_optimization": {"stage": 3, "reduce_bucket_size": "big"}},
            r"^deepspeed zero_optimization.reduce_bucket_size: must be an integer",
        ),
        ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3}, r"^deepspeed train_batch_size: 10 is not"),
        ({"zero_optimization": {"stage": 4}}, r"^deepspeed zero_optimization.stage: must be 0, 1, 2 or 3"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}, r"offload_param.device: unknown"),
        ({"zero_optimization": []}, r"^deepspeed zero_optimization: expected a mapping"),
    ],
)
def test_deepspeed_errors(data: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        parse_run_config(json.dumps(data), origin="ds.json")


# ---- accelerate -------------------------------------------------------------------------------------


def test_accelerate_deepspeed_and_hybrid() -> None:
    ds = _keys(_yaml({"distributed_type": "DEEPSPEED", "num_processes": 4, "mixed_precision": "fp16",
                      "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu",
                                           "offload_param_device": "cpu"}}))  # fmt: skip
    assert (ds.framework.value, ds.parallel.shard.value, ds.parallel.offload.value) == (
        "deepspeed",
        "zero3",
        "optimizer+params",
    )
    assert ds.precision.value == "mixed-fp16"
    hybrid = _keys(_yaml({"distributed_type": "FSDP", "num_processes": 16, "num_machines": 2, "mixed_precision": "bf16",
                          "fsdp_config": {"fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_version": 1}}))  # fmt: skip
    assert (hybrid.parallel.shard.value, hybrid.parallel.shard_degree, hybrid.fsdp_wrap.value) == ("hsdp", 8, "root")
    ddp = _keys(_yaml({"distributed_type": "MULTI_GPU", "num_processes": 2, "mixed_precision": "no"}))
    assert (ddp.parallel.shard.value, ddp.precision.value) == ("ddp", "fp32")
    with pytest.raises(InputError, match=r"^accelerate use_cpu:"):
        _yaml({"distributed_type": "NO", "use_cpu": True})


# ---- TRL / TrainingArguments ------------------------------------------------------------------------


def test_trl_defaults_differ_from_plain_trainer() -> None:
    trl = parse_run_config("trl sft --model_name_or_path Qwen/Qwen2.5-7B --per_device_train_batch_size 2",
                           origin="run.sh")  # fmt: skip
    w = load_workload(trl.keys)
    assert (w.recompute.value, w.precision.value, w.seq) == ("full", "mixed-bf16", 1024)
    plain = parse_run_config("python train.py --model_name_or_path x --per_device_train_batch_size 2 --output_dir o",
                             origin="run.sh")  # fmt: skip
    p = load_workload(plain.keys)
    assert (p.recompute.value, p.precision.value, p.seq) == ("none", "fp32", 2048)


def test_trl_booleans_lists_and_launcher() -> None:
    text = ("torchrun --nproc_per_node=4 --nnodes 2 train.py --model_name_or_path=x --per_device_train_batch_size 1 "
            "--gradient_checkpointing False --bf16 true --use_peft --load_in_4bit --use_bnb_nested_quant "
            "--lora_target_modules q_proj v_proj --fsdp 'full_shard auto_wrap offload' "
            "--attn_implementation flash_attention_2 --max_prompt_length 512")  # fmt: skip
    source = parse_run_config(text, origin="run.sh")
    w = load_workload(source.keys)
    assert (w.parallel.gpus, w.parallel.shard.value, w.parallel.offload.value) == (8, "fsdp", "optimizer+params")
    assert (w.recompute.value, w.precision.value, w.method.value, w.quant.value) == (
        "none",
        "mixed-bf16",
        "qlora",
        "nf4-dq",
    )
    assert (w.lora.targets, w.attention.value) == (("q_proj", "v_proj"), "flash")
    assert source.unmodelled == ("--max_prompt_length=512",)
    with pytest.raises(InputError, match=r"^trl --bf16: must be true or false, got 'maybe'"):
        parse_run_config("python t.py --per_device_train_batch_size 1 --bf16 maybe", origin="run.sh")


# ---- vLLM -------------------------------------------------------------------------------------------


def test_vllm_spellings_and_unmodelled() -> None:
    text = ("python -m vllm.entrypoints.openai.api_server --model mistralai/Mistral-7B-Instruct-v0.3 -tp 2 "
            "--max_model_len=8192 --quantization awq --dtype half --enforce-eager --host 0.0.0.0")  # fmt: skip
    source = parse_run_config(text, origin="serve.sh")
    w = load_workload(source.keys)
    assert (w.mode.value, w.engine.value, w.parallel.tp, w.parallel.gpus, w.context) == ("infer", "vllm", 2, 2, 8192)
    assert (w.quant.value, w.precision.value) == ("awq-int4", "fp16")
    assert source.unmodelled == ("--enforce-eager=true (no CUDA graphs; their memory is still counted)",)
    with pytest.raises(InputError, match=r"^vllm --kv-cache-dtype: unknown value 'int4'"):
        parse_run_config("vllm serve m --kv-cache-dtype int4", origin="s.sh")


# ---- environment variables on a command line -----------------------------------------------------


def test_command_lines_set_the_allocator_settings_from_the_environment() -> None:
    trl = parse_run_config("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun --nproc_per_node 2 train.py "
                           "--per_device_train_batch_size 1 --run_name A=B", origin="run.sh")  # fmt: skip
    assert load_workload({"model": "x", **trl.keys}).alloc_conf == "expandable_segments:True"
    assert "trl PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True -> alloc_conf" in "\n".join(trl.assumptions())
    serve = parse_run_config("export PYTORCH_ALLOC_CONF=max_split_size_mb:512 PYTORCH_NO_CUDA_MEMORY_CACHING=1\n"
                             "vllm serve m --max-model-len 4096", origin="serve.sh")  # fmt: skip
    assert serve.keys["alloc_conf"] == "max_split_size_mb:512"
    assert serve.unmodelled == ("PYTORCH_NO_CUDA_MEMORY_CACHING=1",)
    # an assignment after the program's name is an argument, not the environment
    assert "alloc_conf" not in parse_run_config("vllm serve m PYTORCH_CUDA_ALLOC_CONF=x", origin="s.sh").keys
    with pytest.raises(InputError, match=r"^vllm PYTORCH_CUDA_ALLOC_CONF: "):
        parse_run_config("PYTORCH_CUDA_ALLOC_CONF=bogus:1 vllm serve m", origin="s.sh")


# ---- recognising formats ----------------------------------------------------------------------------


def test_unknown_files_and_workload_files_are_one_line_errors() -> None:
    with pytest.raises(InputError, match=r"^x.yaml: this is a vramlens workload file; give it with -c"):
        _yaml({"model": "llama-3.1-8b", "batch": 2}, name="x.yaml")
    with pytest.raises(InputError, match=r"^x.yaml: not a run config vramlens knows; expected axolotl"):
        _yaml({"foo": 1}, name="x.yaml")
    with pytest.raises(InputError, match=r"^x.sh: not a run config vramlens knows"):
        parse_run_config("ls -la", origin="x.sh")
    with pytest.raises(InputError, match=r"^x.sh: cannot split the command line"):
        parse_run_config("vllm serve 'unclosed", origin="x.sh")
    with pytest.raises(InputError, match=r"^--from-format: unknown format 'foo'"):
        parse_run_config("a: 1", origin="x.yaml", format="foo")


def test_a_forced_format_wins_over_recognition() -> None:
    text = yaml.safe_dump({"base_model": "x", "zero_optimization": {"stage": 1}})
    assert parse_run_config(text, origin="a.yaml").format == "axolotl"
    forced = parse_run_config(text, origin="a.yaml", format="deepspeed")
    assert forced.format == "deepspeed" and forced.keys["parallel"]["shard"].value == "zero1"
    with pytest.raises(InputError, match=r"^a.sh: a deepspeed config is a YAML/JSON mapping of keys"):
        parse_run_config("vllm serve m", origin="a.sh", format="deepspeed")
