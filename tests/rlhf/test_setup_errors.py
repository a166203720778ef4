"""Bad RLHF setups give one-line InputErrors naming the field and what is accepted; defaults
are filled per algorithm and said in the assumptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vramlens.errors import InputError
from vramlens.rlhf import Algo, Placement, load_rlhf, rlhf_estimate

BASE: dict[str, Any] = {"actor": "qwen2.5-0.5b", "gpu": "h100-80gb"}

BAD = [
    ({"algo": "grpo", "critic": "qwen2.5-0.5b"}, "critic: grpo has no critic"),
    ({"algo": "rloo", "critic": "qwen2.5-0.5b"}, "critic: rloo has no critic"),
    ({"algo": "dpo", "critic": "qwen2.5-0.5b"}, "critic: dpo has no critic"),
    ({"algo": "dpo", "reference": None}, "reference: dpo needs a reference model or precomputed_ref_logprobs"),
    ({"algo": "dpo", "reward": "qwen2.5-0.5b"}, "reward: dpo learns from preference pairs"),
    ({"algo": "ppo", "gpus": 2, "separate": {"reward": 1, "reference": 1, "critic": 1}}, "separate: more model groups (4) than GPUs"),
    ({"algo": "ppo", "gpus": 4, "separate": {"reward": 2, "critic": 2}}, "separate: the separate groups (critic=2, reward=2) take 4 of gpus=4"),
    ({"algo": "ppo", "gpus": 4, "separate": {"reward": 8}}, "take 8 of gpus=4"),
    ({"algo": "sft"}, "algo: 'sft' is not one of ppo, grpo, dpo, rloo, online-dpo"),
    ({"algo": "ppo", "offload": ["critc"]}, "offload: 'critc' is not a role of this step"),
    ({"algo": "grpo", "offload": ["critic"]}, "offload: 'critic' is not a role of this step"),
    ({"algo": "ppo", "reward": {"model": "qwen2.5-0.5b", "placement": "elsewhere"}}, "reward.placement: 'elsewhere' is not one of colocated, offload, separate"),
    ({"algo": "ppo", "reward": {"model": "qwen2.5-0.5b", "placement": "separate"}}, "reward.gpus: a separate model needs its GPU count"),
    ({"algo": "ppo", "reward": {"model": "qwen2.5-0.5b", "colour": 1}}, "reward.colour: unknown key; accepted: model"),
    ({"algo": "ppo", "judge": "x"}, "judge: unknown key; accepted: algo"),
    ({"algo": "ppo", "rollout": {"engine": "sglang"}}, "rollout.engine: 'sglang' is not one of hf, vllm"),
    ({"algo": "ppo", "rollout": {"engine": "vllm", "gpu_memory_utilization": 1.5}}, "rollout.gpu_memory_utilization"),
    ({"algo": "grpo", "group_size": 0}, "group_size: 0 is not accepted (a positive whole number)"),
    ({"algo": "ppo", "group_size": 4}, "group_size: ppo samples 1 response(s) per prompt"),
    ({"algo": "ppo", "actor": {"model": "qwen2.5-0.5b", "method": "freeze"}}, "actor.method: 'freeze' is not accepted"),
    ({"algo": "ppo", "reference": {"model": "qwen2.5-0.5b", "from_actor_base": True}}, "reference.from_actor_base: needs an actor trained with method lora"),
    ({"algo": "ppo", "gpu": None}, "gpu: required"),
    ({"algo": "ppo", "actor": None}, "actor: required"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_setups_give_one_line_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as info:
        load_rlhf({**BASE, **data})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_tp_that_does_not_divide_a_group_is_refused_when_estimating() -> None:
    setup = load_rlhf({**BASE, "algo": "ppo", "gpus": 3, "tp": 2})
    with pytest.raises(InputError, match=r"actor\.tp: 2 does not divide the 3 GPU\(s\) of its group"):
        rlhf_estimate(setup)


def test_defaults_per_algorithm_are_stated() -> None:
    ppo = load_rlhf({**BASE, "algo": "ppo"})
    assert ppo.critic is not None and ppo.reward is not None and ppo.reference is not None
    assert ppo.critic.model == ppo.reward.model == "qwen2.5-0.5b" and ppo.group_size == 1
    assert any(a.startswith("critic: none given") for a in ppo.assumptions)
    grpo = load_rlhf({**BASE, "algo": "grpo"})
    assert grpo.critic is None and grpo.reward is None and grpo.group_size == 8
    assert any("rule-based" in a for a in grpo.assumptions)
    lora = load_rlhf({**BASE, "algo": "grpo", "actor": {"model": "qwen2.5-0.5b", "method": "lora"}})
    assert lora.reference is not None and lora.reference.from_actor_base
    dpo = load_rlhf({**BASE, "algo": "dpo", "precomputed_ref_logprobs": True})
    assert dpo.reference is None and not dpo.generates
    online = load_rlhf({**BASE, "algo": "online-dpo"})
    assert online.algo is Algo.ONLINE_DPO and online.group_size == 2 and online.reward is not None
    vllm = load_rlhf({**BASE, "algo": "grpo", "rollout": {"engine": "vllm"}})
    assert vllm.rollout.placement is Placement.OFFLOAD


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rlhf.yaml"
    path.write_text(
        "algo: ppo\ngpu: h100-80gb\ngpus: 4\nactor: {model: qwen2.5-0.5b, method: lora}\n"
        "reward: qwen2.5-1.5b\nrollout: {engine: vllm, gpu_memory_utilization: 0.3}\nseparate: {reward: 1}\n"
    )
    setup = load_rlhf(path, actor="llama-3.2-1b", rollout={"tp": 1}, micro_batch=2)
    assert setup.actor.model == "llama-3.2-1b" and setup.actor.method == "lora"
    assert setup.reward is not None and setup.reward.placement is Placement.SEPARATE and setup.reward.gpus == 1
    assert setup.rollout.engine == "vllm" and setup.rollout.gpu_memory_utilization == 0.3
    assert setup.shared_gpus == 3 and setup.micro_batch == 2
    with pytest.raises(InputError, match=r"config: .* is not a file"):
        load_rlhf(tmp_path / "missing.yaml")


def test_a_role_mapping_without_a_model_takes_the_actors() -> None:
    setup = load_rlhf({**BASE, "algo": "ppo", "critic": {"placement": "offload"}})
    assert setup.critic is not None and setup.critic.model == "qwen2.5-0.5b"
    assert setup.critic.placement is Placement.OFFLOAD


def test_a_separate_group_smaller_than_tp_gets_a_dividing_tp() -> None:
    setup = load_rlhf(
        {**BASE, "actor": "llama-3.2-1b", "algo": "ppo", "gpus": 8, "tp": 4, "separate": {"reward": 2, "rollout": 2}}
    )
    assert setup.reward is not None and setup.reward.tp == 2 and setup.rollout.tp == 2 and setup.actor.tp == 4
    explicit = load_rlhf({**BASE, "algo": "ppo", "gpus": 8, "tp": 4, "reward": {"tp": 1}, "separate": {"reward": 2}})
    assert explicit.reward is not None and explicit.reward.tp == 1
    assert setup.shared_gpus == 4 and rlhf_estimate(setup, recommend=False).phases
    six = load_rlhf({**BASE, "actor": "llama-3.2-1b", "algo": "ppo", "gpus": 8, "tp": 4, "separate": {"reward": 2}})
    with pytest.raises(InputError, match=r"actor\.tp: 4 does not divide the 6 GPU\(s\)"):
        rlhf_estimate(six)
    heads = load_rlhf({**BASE, "algo": "ppo", "gpus": 4, "tp": 4})  # qwen2.5-0.5b has 14 heads
    with pytest.raises(InputError, match=r"^actor \(qwen2\.5-0\.5b\): parallel\.tp: 4 must divide the 14"):
        rlhf_estimate(heads)
