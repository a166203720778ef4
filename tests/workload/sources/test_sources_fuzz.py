"""Fuzzing every run-config reader: any content gives workload keys that load into a Workload, or a
one-line InputError - never another exception, never a multi-line message."""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vramlens.errors import InputError
from vramlens.workload import Workload, load_workload
from vramlens.workload.sources import accelerate, axolotl, deepspeed, litgpt, parse_run_config, torchtune, trl, vllm

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.sampled_from(["auto", "true", "none", "cpu", "nvme", "bf16", "bf16-true", "fp16", "1e9", "8k", "FULL_SHARD",
                     "HYBRID_SHARD", "2", "q_proj", "all-linear", "bnb.nf4", "\n", "x\ny", "\x1b[2J"]),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _mapping(keys: list[str], extra: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    known = st.dictionaries(st.sampled_from(keys), values, max_size=10)
    return st.tuples(known, st.fixed_dictionaries({}, optional=extra), st.dictionaries(st.text(max_size=8), values,
                                                                                      max_size=2)).map(
        lambda parts: {**parts[2], **parts[0], **parts[1]}
    )  # fmt: skip


def _assert_one_line(error: InputError) -> None:
    message = str(error)
    assert message and "\n" not in message and "\r" not in message and len(message) < 2000, message


def _check(text: str, origin: str, fmt: str) -> None:
    for forced in (fmt, None):
        try:
            source = parse_run_config(text, origin=origin, format=forced)
            keys = dict(source.keys)
            keys.setdefault("model", "llama-3.1-8b")
            loaded = load_workload(keys)
        except InputError as error:
            _assert_one_line(error)
        else:
            assert isinstance(loaded, Workload)
            assert all("\n" not in line for line in source.assumptions())


def _document(data: dict[str, Any], *, as_json: bool) -> str:
    return json.dumps(data, default=str) if as_json else yaml.safe_dump(data, allow_unicode=True)


SETTINGS = settings(max_examples=150, deadline=None)
_LORA = {k: values for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear")}


@SETTINGS
@given(_mapping(sorted(axolotl._USED), {"base_model": st.sampled_from(["llama-3.1-8b", "x/y"]) | values, **_LORA}))
def test_axolotl(data: dict[str, Any]) -> None:
    data.setdefault("base_model", "llama-3.1-8b")
    _check(_document(data, as_json=False), "run.yml", "axolotl")


_TT_MODEL = st.fixed_dictionaries(
    {
        "_component_": st.sampled_from(
            [
                f"torchtune.models.x.{p}{b}"
                for p in ("", "lora_", "qlora_")
                for b in ("llama3_1_8b", "qwen2_5_7b_base", "nope")
            ]
        )
        | values
    },
    optional={
        k: values
        for k in (
            "lora_attn_modules",
            "apply_lora_to_mlp",
            "apply_lora_to_output",
            "lora_rank",
            "lora_alpha",
            "lora_dropout",
            "quantize_base",
            "use_dora",
        )
    },
)


@SETTINGS
@given(_mapping(sorted(torchtune._USED - {"model"}), {"optimizer": values, "loss": values}), _TT_MODEL)
def test_torchtune(data: dict[str, Any], model: dict[str, Any]) -> None:
    _check(_document({**data, "model": model}, as_json=False), "recipe.yaml", "torchtune")


@SETTINGS
@given(_mapping(sorted(litgpt._USED), {"train": st.dictionaries(st.sampled_from(sorted(litgpt._TRAIN_USED)), values)}))
def test_litgpt(data: dict[str, Any]) -> None:
    data.setdefault("checkpoint_dir", "checkpoints/meta-llama/Llama-3.2-1B")
    _check(_document(data, as_json=False), "lit.yaml", "litgpt")


_ZERO = st.dictionaries(
    st.sampled_from(
        ["stage", "offload_optimizer", "offload_param", "cpu_offload", "reduce_bucket_size", "sub_group_size"]
    ),
    values | st.fixed_dictionaries({"device": st.sampled_from(["cpu", "nvme", "none", "gpu"]) | values}),
    max_size=4,
)


@SETTINGS
@given(_mapping(sorted(deepspeed._TOP_USED), {"zero_optimization": _ZERO}), st.booleans())
def test_deepspeed(data: dict[str, Any], as_json: bool) -> None:
    data.setdefault("zero_optimization", {})
    _check(_document(data, as_json=as_json), "ds.json" if as_json else "ds.yaml", "deepspeed")


_FSDP = st.dictionaries(
    st.sampled_from(["fsdp_version", "fsdp_sharding_strategy", "fsdp_offload_params", "fsdp_reshard_after_forward",
                     "fsdp_activation_checkpointing", "fsdp_auto_wrap_policy", "fsdp_forward_prefetch"]),
    values,
)  # fmt: skip


@SETTINGS
@given(_mapping(sorted(accelerate._USED), {"fsdp_config": _FSDP, "deepspeed_config": values,
                                           "distributed_type": st.sampled_from(["FSDP", "DEEPSPEED", "MULTI_GPU", "NO"])}))  # fmt: skip
def test_accelerate(data: dict[str, Any]) -> None:
    data.setdefault("distributed_type", "FSDP")
    _check(_document(data, as_json=False), "accelerate.yaml", "accelerate")


_WORDS = st.sampled_from(["1", "0", "true", "False", "2", "bfloat16", "nf4", "q_proj", "all-linear", "auto", "x y",
                          "-3", "1e3", "full_shard offload", "'", "&&", "\\"]) | st.text(max_size=6)  # fmt: skip


def _command(prefix: list[str], names: list[str]) -> st.SearchStrategy[str]:
    option = st.tuples(st.sampled_from(names), st.sampled_from(["--", "-"]), st.sampled_from([" ", "=", "_"]),
                       st.lists(_WORDS, max_size=2))  # fmt: skip

    def build(options: list[tuple[str, str, str, list[str]]]) -> str:
        parts = list(prefix)
        for name, dash, sep, words in options:
            spelled = dash + (name if sep != "_" else name.replace("_", "-"))
            if sep == "=" and words:
                parts.append(shlex.quote(f"{spelled}={words[0]}"))
            else:
                parts.append(spelled)
                parts.extend(shlex.quote(word) for word in words)
        return " \\\n  ".join(parts)

    return st.lists(option, max_size=12).map(build) | st.text(max_size=80).map(lambda t: " ".join([*prefix, t]))


#: An environment assignment in front of the command (``PYTORCH_CUDA_ALLOC_CONF=... vllm serve ...``).
_ENV = st.tuples(
    st.sampled_from(["", "PYTORCH_CUDA_ALLOC_CONF=", "export PYTORCH_ALLOC_CONF=", "PYTORCH_NO_CUDA_MEMORY_CACHING="]),
    st.sampled_from(["expandable_segments:True", "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:2]",
                     "expandable_segments:maybe", "x", ""]) | st.text(max_size=12),
).map(lambda pair: f"{pair[0]}{shlex.quote(pair[1])} " if pair[0] else "")  # fmt: skip


@SETTINGS
@given(_ENV, _command(["trl", "sft", "--per_device_train_batch_size", "2"], sorted(trl._USED | trl._RELEVANT)))
def test_trl(env: str, text: str) -> None:
    _check(env + text, "run.sh", "trl")


@SETTINGS
@given(_ENV, _command(["vllm", "serve", "Qwen/Qwen2.5-7B"], sorted(vllm._USED | set(vllm._WHY) | {"model"})))
def test_vllm(env: str, text: str) -> None:
    _check(env + text, "serve.sh", "vllm")


@SETTINGS
@given(st.text(max_size=300), st.sampled_from(["a.yaml", "a.json", "a.sh", "a"]))
def test_any_text(text: str, name: str) -> None:
    try:
        source = parse_run_config(text, origin=name)
    except InputError as error:
        _assert_one_line(error)
    else:
        assert source.format
