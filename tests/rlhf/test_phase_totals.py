"""Hand-computed phase totals of a small GRPO and a small PPO step.

The model is a tiny llama (hidden 256, 2 layers, 4 heads, 2 KV heads of 64, MLP 512, vocab
1000, untied head), so every resident term is a short product we can write down:

    N = embed V*h + head V*h + final norm h
        + layers * (q,o: 2*h*h + k,v: 2*h*(kv*hd) + mlp 3*h*I + 2 norms * h)  = 1,692,928

* a trained model in mixed-bf16 with AdamW keeps fp32 weights (4N) and two fp32 moments
  (8N) between phases (gradients are freed by zero_grad);
* a frozen bf16 model keeps 2N;
* HF generate's KV cache is 2 (K, V) x layers x kv_heads x head_dim x tokens x 2 bytes;
* reference log-probs add bf16 logits of every position: tokens x vocab x 2 bytes.

The per-phase working memory of a busy model (activations, temporaries, workspace) is the
estimator's own, taken here from an independent ``vramlens.estimator`` call: the test checks
the rlhf engine composes the step correctly from hand-computed resident parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramlens import Category, estimate
from vramlens.rlhf import load_rlhf, rlhf_estimate

H, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 256, 512, 2, 4, 2, 64, 1000
N = VOCAB * H * 2 + H + LAYERS * (2 * H * H + 2 * H * KV_HEADS * HEAD_DIM + 3 * H * INTER + 2 * H)


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    config = {
        "model_type": "llama", "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "tie_word_embeddings": False, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def _work(model: str, **workload: object) -> int:
    """Allocated peak of one estimate minus its weights (and KV cache): the busy model's work."""
    report = estimate({"model": model, "gpu": "h100-80gb", **workload})
    return report.allocated_bytes - report.peak.breakdown.get(Category.PARAMETERS, 0)


def test_parameter_count_is_the_hand_count(tiny: str) -> None:
    assert N == 1_692_928
    report = estimate({"model": tiny, "mode": "infer", "precision": "bf16", "batch": 1, "prompt": 8, "generate": 0})
    assert report.peak.breakdown[Category.PARAMETERS] == 2 * N


def test_grpo_phase_totals(tiny: str) -> None:
    setup = load_rlhf(
        {"algo": "grpo", "actor": tiny, "gpu": "h100-80gb", "group_size": 4, "rollout_batch": 2,
         "prompt": 32, "response": 224, "micro_batch": 2},
    )  # fmt: skip
    report = rlhf_estimate(setup)
    phases = {p.name: p for p in report.phases}
    assert list(phases) == ["generation", "reference", "actor_training"]
    actor, reference = 4 * N + 8 * N, 2 * N
    sequences, tokens = 2 * 4, 32 + 224
    # generation's peak is the end of decoding (the KV cache of every token), not the prefill
    kv = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * sequences * tokens
    gen = phases["generation"]
    assert gen.models["rollout"].breakdown["kv_cache"] == kv
    assert gen.models["actor"].breakdown == {"parameters": 4 * N, "optimizer_state": 8 * N}
    assert gen.models["reference"].bytes == reference
    rollout_work = _work(tiny, mode="infer", precision="bf16", batch=sequences, prompt=32, generate=224)
    assert gen.allocated_bytes == actor + reference + rollout_work
    logits = 2 * tokens * VOCAB * 2
    ref_work = _work(tiny, mode="infer", precision="bf16", batch=2, prompt=tokens, generate=0)
    assert phases["reference"].allocated_bytes == actor + reference + ref_work + logits
    train = estimate({"model": tiny, "gpu": "h100-80gb", "mode": "train", "batch": 2, "seq": tokens})
    assert phases["actor_training"].allocated_bytes == train.allocated_bytes + reference
    assert report.peak_phase == max(report.phases, key=lambda p: p.device_bytes).name


def test_ppo_phase_totals(tiny: str) -> None:
    setup = load_rlhf(
        {"algo": "ppo", "actor": tiny, "gpu": "h100-80gb", "rollout_batch": 4, "prompt": 16, "response": 240,
         "micro_batch": 2},
    )  # fmt: skip
    report = rlhf_estimate(setup)
    phases = {p.name: p for p in report.phases}
    assert list(phases) == ["generation", "scoring", "reference", "values", "actor_training", "critic_training"]
    trained, frozen, tokens = 12 * N, 2 * N, 256
    resident = 2 * trained + 2 * frozen
    kv = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * 4 * tokens
    assert phases["generation"].breakdown["kv_cache"] == kv
    rollout_work = _work(tiny, mode="infer", precision="bf16", batch=4, prompt=16, generate=240)
    assert phases["generation"].allocated_bytes == resident + rollout_work
    forward = _work(tiny, mode="infer", precision="bf16", batch=2, prompt=tokens, generate=0)
    assert phases["scoring"].allocated_bytes == resident + forward
    assert phases["reference"].allocated_bytes == resident + forward + 2 * tokens * VOCAB * 2
    values = _work(tiny, mode="infer", precision="mixed-bf16", batch=2, prompt=tokens, generate=0)
    assert phases["values"].allocated_bytes == resident + values
    train = estimate({"model": tiny, "gpu": "h100-80gb", "mode": "train", "batch": 2, "seq": tokens})
    for name in ("actor_training", "critic_training"):
        assert phases[name].allocated_bytes == train.allocated_bytes + trained + 2 * frozen
    assert report.peak_allocated_bytes == max(p.allocated_bytes for p in report.phases)
    assert report.fits


def test_offload_moves_weights_over_pcie_and_a_separate_group_leaves_the_shared_gpus(tiny: str) -> None:
    base = {"algo": "ppo", "actor": tiny, "gpu": "h100-80gb", "gpus": 2, "prompt": 64, "response": 64}
    report = rlhf_estimate(load_rlhf(base, offload="reference", pcie_gbps=20))
    loads = [t for t in report.transitions if t.role == "reference" and t.action in ("load", "offload")]
    assert [(t.before, t.after, t.action) for t in loads] == [
        ("scoring", "reference", "load"), ("reference", "values", "offload"),
    ]  # fmt: skip
    assert all(t.bytes == 2 * N and t.seconds == pytest.approx(2 * N / 20e9) for t in loads)
    scoring = next(p for p in report.phases if p.name == "scoring")
    assert scoring.models["reference"].where == "cpu" and scoring.models["reference"].bytes == 0
    apart = rlhf_estimate(load_rlhf(base, separate={"reward": 1}))
    assert apart.setup.shared_gpus == 1
    for phase in apart.phases:
        assert phase.models["reward"].group == "reward"
        assert phase.gpu_group == "shared"  # the trained models outweigh the lone reward model
        assert "reward" not in phase.breakdown or phase.name != "generation"
    generation = apart.phases[0]
    shared = sum(s.bytes for s in generation.models.values() if s.group == "shared")
    assert generation.allocated_bytes == shared


def test_dpo_has_no_generation_and_doubles_the_sequences(tiny: str) -> None:
    report = rlhf_estimate(load_rlhf({"algo": "dpo", "actor": tiny, "gpu": "h100-80gb", "micro_batch": 2}))
    assert [p.name for p in report.phases] == ["reference", "actor_training"]
    tokens = 2048
    # DPOTrainer: the policy trains under the trl profile (TRL's fused head), not hf.
    train = estimate(
        {"model": tiny, "gpu": "h100-80gb", "mode": "train", "batch": 4, "seq": tokens, "framework": "trl"}
    )
    assert report.phases[1].allocated_bytes == train.allocated_bytes + 2 * N
    pre = rlhf_estimate(load_rlhf({"algo": "dpo", "actor": tiny, "gpu": "h100-80gb", "precomputed_ref_logprobs": True}))
    assert [p.name for p in pre.phases] == ["actor_training"] and pre.transitions == ()


def test_dpo_reference_log_probs_come_through_trls_fused_head(tiny: str) -> None:
    """DPOTrainer (TRL 1.16) adds its fused LM head to the reference model too
    (``add_fused_lm_head(self.ref_model)``): the reference's log-prob forward holds the final hidden
    state's copy, one bf16 ``[4096, 32768]`` tile (at full width for any vocabulary) and seven fp32
    running statistics per scored position (each row's last position is not scored), not the
    ``[tokens, vocab]`` logits of a plain forward."""
    report = rlhf_estimate(load_rlhf({"algo": "dpo", "actor": tiny, "gpu": "h100-80gb", "micro_batch": 2}))
    rows, seq = 2 * 2, 2048  # chosen + rejected rows of 2 pairs
    positions = rows * seq - rows
    head = positions * H * 2 + min(positions, 4096) * 32768 * 2 + positions * 7 * 4
    ref_work = _work(tiny, mode="infer", precision="bf16", batch=rows, prompt=seq, generate=0)
    assert report.phases[0].name == "reference"
    assert report.phases[0].allocated_bytes == 12 * N + 2 * N + ref_work + head


def test_a_sharded_frozen_model_gathers_its_root_and_two_layers_to_run() -> None:
    """PPO of Llama-3.1-8B on 8 GPUs with ZeRO-3: the reward model's bf16 weights are split 8
    ways while resident, but its forward holds whole weights at once: the root (embedding and
    head, 2 x 128256 x 4096, plus the final norm 4096) and two decoder layers (each: attention
    4096 x (4096 + 1024 + 1024 + 4096), MLP 3 x 4096 x 14336, two norms 2 x 4096), 2 bytes each.
    Replicated (shard none) it gathers nothing."""
    root = 2 * 128256 * 4096 + 4096
    layer = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    gathered = (root + 2 * layer) * 2

    def scoring_reward(shard: str) -> Any:
        setup = load_rlhf({"algo": "ppo", "actor": "llama-3.1-8b", "gpus": 8, "gpu": "h100-80gb", "shard": shard})
        phase = next(p for p in rlhf_estimate(setup).phases if p.name == "scoring")
        return phase.models["reward"]

    sharded, replicated = scoring_reward("zero3"), scoring_reward("none")
    assert sharded.breakdown["parameters"] == -(-replicated.breakdown["parameters"] // 8)
    assert sharded.breakdown.get("temporary", 0) - replicated.breakdown.get("temporary", 0) == pytest.approx(
        gathered, abs=8
    )
