"""Replayed layers: the simulated step with repeated layers replayed equals the one that runs
every layer, event for event, family by family (issue 23 item 5)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest

from conftest import requires_hf
from vramlens import model_from_config
from vramlens.simulator import simulate
from vramlens.simulator._layers import Region, plan_region

pytestmark = [requires_hf, pytest.mark.hf]

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 500,
    "max_position_embeddings": 512,
}
#: Small models of every family the simulator runs, each with at least four repeating units.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "num_hidden_layers": 6},
    "qwen3": {"model_type": "qwen3", "num_hidden_layers": 5, "head_dim": 16},
    "gemma2 (sliding / full alternating)": {
        "model_type": "gemma2",
        "num_hidden_layers": 8,
        "head_dim": 16,
        "sliding_window": 16,
    },
    "gemma3 (five sliding, one full)": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 26,
        "head_dim": 16,
        "sliding_window": 16,
    },
    "gpt_oss (MoE, alternating attention)": {
        "model_type": "gpt_oss",
        "num_hidden_layers": 10,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
    },
    "olmoe (MoE)": {"model_type": "olmoe", "num_hidden_layers": 5, "num_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v3 (dense first, MLA, MoE)": {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 6,
        "first_k_dense_replace": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "n_group": 1,
        "topk_group": 1,
    },
    "jamba (Mamba / attention, MoE every other)": {
        "model_type": "jamba",
        "num_hidden_layers": 16,
        "attn_layer_period": 4,
        "attn_layer_offset": 2,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    },
    "qwen3_next (gated DeltaNet / attention, MoE)": {
        "model_type": "qwen3_next",
        "num_hidden_layers": 10,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "full_attention_interval": 2,
    },
}
_LORA = {"method": "lora", "lora": {"rank": 8, "alpha": 16, "targets": "all-linear"}}
STEPS: dict[str, dict[str, Any]] = {
    "full bf16": {"precision": "bf16"},
    "LoRA fp32": {"precision": "fp32", **_LORA},
    "mixed-bf16 + full recompute": {"precision": "mixed-bf16", "recompute": "full"},
}
#: Which steps each family runs (every step on llama; the others share them out). LoRA
#: regions start at layer 1 (layer 0's input needs no gradient), so LoRA models have five units.
CASES: dict[str, tuple[str, ...]] = {
    "llama": tuple(STEPS),
    "qwen3": ("LoRA fp32",),
    "gemma2 (sliding / full alternating)": ("mixed-bf16 + full recompute",),
    "gemma3 (five sliding, one full)": ("full bf16",),
    "gpt_oss (MoE, alternating attention)": ("LoRA fp32",),
    "olmoe (MoE)": ("mixed-bf16 + full recompute",),
    "deepseek_v3 (dense first, MLA, MoE)": ("full bf16",),
    "jamba (Mamba / attention, MoE every other)": ("mixed-bf16 + full recompute",),
    "qwen3_next (gated DeltaNet / attention, MoE)": ("LoRA fp32",),
}
_FAST = {("llama", "full bf16")}


def _cases() -> list[Any]:
    return [
        pytest.param(family, step, marks=() if (family, step) in _FAST else (pytest.mark.slow,), id=f"{family}-{step}")
        for family, steps in CASES.items()
        for step in steps
    ]


def canonical(timeline: Any) -> dict[str, list[Any]]:
    """The events as comparable lists (names, not table codes). Within a run of consecutive frees
    the order is put by storage: a full run frees some bursts in hash-table order, which changes
    from run to run (autocast's cache, checkpointed tensors); no peak falls inside such a run."""
    order = np.arange(len(timeline))
    frees = (timeline.nbytes < 0).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], frees, [0]])))
    for first, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        order[first:stop] = first + np.argsort(timeline.storage[first:stop], kind="stable")
    columns = ("nbytes", "category", "phase", "module", "stack", "storage")
    ordered = dataclasses.replace(timeline, **{name: getattr(timeline, name)[order] for name in columns})

    def names(table: tuple[str, ...], codes: Any) -> list[str]:
        return [table[code] if code >= 0 else "" for code in codes.tolist()]

    return {
        "nbytes": ordered.nbytes.tolist(),
        "category": ordered.category.tolist(),
        "phase": names(ordered.phases, ordered.phase),
        "module": names(ordered.modules, ordered.module),
        "stack": names(ordered.stacks, ordered.stack),
        "storage": ordered.storage.tolist(),
    }


def assert_replay_exact(fields: dict[str, Any], *, replays: bool | None = True, **options: Any) -> None:
    """Replayed and fully executed runs of ``fields`` agree event for event and in every peak
    (``replays``: the default run did replay layers, or ran every layer; None: either)."""
    replayed = simulate(fields, replay=True, **options)
    executed = simulate(fields, replay=False, **options)
    did = any("replayed from the recorded events" in note for note in replayed.assumptions)
    assert replays is None or did == replays
    assert not any("replayed from the recorded events" in note for note in executed.assumptions)
    assert replayed.timeline is not None and executed.timeline is not None
    assert len(replayed.timeline) == len(executed.timeline)
    ours, theirs = canonical(replayed.timeline), canonical(executed.timeline)
    for column in ours:
        assert ours[column] == theirs[column], column
    assert replayed.timeline.modules == executed.timeline.modules
    assert replayed.timeline.peak_bytes == executed.timeline.peak_bytes
    assert (replayed.allocated_bytes, replayed.reserved_bytes, replayed.peak_phase) == (
        executed.allocated_bytes,
        executed.reserved_bytes,
        executed.peak_phase,
    )
    assert [p.allocated_bytes for p in replayed.phases] == [p.allocated_bytes for p in executed.phases]


def _fields(family: str, **step: Any) -> dict[str, Any]:
    model = model_from_config({**_BASE, **FAMILIES[family]})
    return {"model": model, "batch": 1, "seq": 32, "framework": "hf", **step}


@pytest.mark.parametrize(("family", "step"), _cases())
def test_replayed_step_equals_the_executed_one_event_for_event(family: str, step: str) -> None:
    assert_replay_exact(_fields(family, **STEPS[step]))


_LLAMA_STEPS: dict[str, dict[str, Any]] = {
    "QLoRA mixed": {"precision": "mixed-bf16", "method": "qlora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}},
    "recompute every 2": {"precision": "bf16", "recompute": "full", "recompute_every": 2},
    "grad accumulation 2": {"precision": "bf16", "grad_accum": 2},
    "foreach AdamW": {"precision": "fp32", "optimizer_impl": "foreach"},
    "per-tensor AdamW": {"precision": "fp32", "optimizer_impl": "per-tensor"},
    "SGD": {"precision": "bf16", "optimizer": "sgd"},
    "Adafactor": {"precision": "fp32", "optimizer": "adafactor"},
    "optimizer in backward": {"precision": "bf16", "optimizer_in_backward": True},
    "LoRA mixed + recompute": {"precision": "mixed-bf16", "recompute": "full", **_LORA},
}


#: Settings whose cut run the expansion may refuse (a unit's stretch without one neighbour of the
#: last unit; with hash-ordered bursts of frees, some runs only): they then run every layer.
#: Either way the result must equal replay=False.
_MAY_RUN_IN_FULL = {"per-tensor AdamW", "Adafactor", "LoRA mixed + recompute"}


@pytest.mark.slow
@pytest.mark.parametrize("step", list(_LLAMA_STEPS))
def test_replay_is_exact_for_every_training_setting(step: str) -> None:
    model = {**FAMILIES["llama"], "num_hidden_layers": 9}
    fields = {"model": model_from_config({**_BASE, **model}), "batch": 1, "seq": 32, "framework": "hf"}
    assert_replay_exact({**fields, **_LLAMA_STEPS[step]}, replays=None if step in _MAY_RUN_IN_FULL else True)


def test_the_longest_repeating_region_is_cut_to_three_units() -> None:
    assert plan_region([0] * 32) == Region(start=0, period=1, stop=32)
    assert Region(start=0, period=1, stop=32).kept(32) == [0, 1, 31]
    assert plan_region([0, 1] * 5) == Region(start=0, period=2, stop=10)
    gemma3 = ([0] * 5 + [1]) * 4 + [0, 0]
    assert plan_region(gemma3) == Region(start=0, period=6, stop=24)
    assert Region(start=0, period=6, stop=24).kept(26) == [*range(12), *range(18, 26)]
    deepseek = [0, 0, 0] + [1] * 58
    assert plan_region(deepseek) == Region(start=3, period=1, stop=61)
    assert plan_region([0, 0, 0]) is None  # three layers: nothing between U1 and U2
    assert plan_region([0, 1, 2, 3, 4, 5]) is None


def test_a_failed_expansion_runs_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    replay = importlib.import_module("vramlens.simulator._replay")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise replay.Unresolved("for the test")

    monkeypatch.setattr(replay, "expand", refuse)
    fields = _fields("llama", precision="bf16")
    report = simulate(fields, steps=1)
    assert not any("replayed from the recorded events" in note for note in report.assumptions)
    executed = simulate(fields, steps=1, replay=False)
    assert canonical(report.timeline) == canonical(executed.timeline)


def test_layers_that_share_a_module_are_not_replayed() -> None:
    torch = pytest.importorskip("torch")
    from vramlens.simulator._layers import _kinds

    shared = torch.nn.Linear(2, 2)
    layers = [torch.nn.Sequential(shared, torch.nn.ReLU()) for _ in range(5)]
    model = torch.nn.Module()
    model.config = type("Config", (), {})()
    assert _kinds(model, layers, {}) is None
    assert _kinds(model, [torch.nn.Linear(2, 2) for _ in range(5)], {}) == [0] * 5
    assert _kinds(model, [torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)], {}) == [0, 1]


@pytest.mark.slow
def test_fsdp_runs_every_layer() -> None:
    # FSDP2 replays equal the executed run when simulated alone, not after other simulations
    # in the same process (fewer events): until that is understood, several GPUs run every layer.
    assert_replay_exact(_fields("llama", precision="bf16", parallel={"gpus": 2, "shard": "fsdp"}), replays=False)


def test_attribute_keys_of_plain_values_and_empty_containers() -> None:
    """The fast path of _value_key (exact plain types, empty containers) gives what its general
    rules give: the values themselves, and a container's tag with no items."""
    from collections import OrderedDict

    from vramlens.simulator._layers import _value_key

    class Count(int):
        pass

    assert [_value_key(v) for v in (None, True, 3, 2.5, "a", Count(4))] == [None, True, 3, 2.5, "a", 4]
    assert _value_key({}) == _value_key(OrderedDict()) == ("map", ())
    assert _value_key([]) == _value_key(()) == ("seq", ())
    assert _value_key(set()) == _value_key(frozenset()) == ("set", ())
    assert _value_key(OrderedDict(a=[1, {}])) == ("map", (("a", ("seq", (1, ("map", ())))),))
    assert _value_key({1: len}) == ("map", ((None, ("call", "builtins", "len")),))
