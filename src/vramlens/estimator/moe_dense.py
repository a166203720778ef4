"""Activation parts of a mixture of experts whose experts run on every token (Llama 4).

transformers' ``Llama4TextMoe`` does not gather tokens per expert: the router keeps the
top-k logits (the rest set to -inf) and takes their sigmoid, every token is copied once
per expert (``hidden.repeat(E, 1)``) and scaled by that score (0 for unrouted experts),
and ``Llama4TextExperts`` multiplies all ``E x tokens`` rows with ``torch.bmm``. Memory and
compute are those of ``E`` dense experts, whatever ``num_experts_per_tok`` says.
Checked against autograd's saved tensors in ``tests/estimator/test_activations_hf.py``.
"""

from __future__ import annotations

from vramlens.estimator.saved_parts import FP32, SEQUENCE, LayerRecipe, Part, gated_saved

__all__ = ["dense_expert_parts"]

INDEX = 8
"""Bytes of one int64 routing index."""


def dense_expert_parts(recipe: LayerRecipe) -> list[Part]:
    """What the router and the experts keep, per token (the block input and the shared expert
    are counted by :func:`vramlens.estimator.moe_parts.moe_parts`).

    * router: the fp32 sigmoid over all ``E`` scores, the ``k`` int64 top-k indices (kept by
      ``topk`` and the ``scatter``), and the ``E`` scores as the column that scales the copies;
    * the ``E`` copies of the input (kept to differentiate the score), and, when the experts
      train, their scaled product (``bmm``'s input);
    * per expert and token: the fused gate/up output (``2i``; silu keeps the gate view, the
      product the up view), the activation (``i``), and with trained experts the product fed
      to the down ``bmm`` (``i``).
    """
    spec = recipe.spec
    moe = spec.moe
    assert moe is not None
    a, h, e, i = recipe.compute_bytes, spec.hidden_size, moe.num_experts, moe.expert_intermediate_size
    trained = recipe.train.norms  # 3-D expert weights train only in full fine-tuning
    parts = [
        Part(
            name="router sigmoid scores, top-k indices and score column",
            bytes_per_token=FP32 * e + INDEX * moe.experts_per_token + a * e,
            split=SEQUENCE,
        ),
        Part(name="experts input copies (one per expert)", bytes_per_token=a * h * e, split=SEQUENCE),
        Part(
            name="experts gate/up outputs and activation (every expert, every token)",
            bytes_per_token=(gated_saved(moe.activation) + (1 if trained else 0)) * a * i * e,
        ),
    ]
    if trained:
        parts.append(Part(name="experts scaled inputs", bytes_per_token=a * h * e, split=SEQUENCE))
    return parts
