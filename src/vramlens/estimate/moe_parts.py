"""Activation parts of a mixture-of-experts block (transformers 5 grouped-GEMM experts)."""

from __future__ import annotations

from vramlens.estimate.saved_parts import FP32, GATHERED, SEQUENCE, LayerRecipe, Part, gated_saved, plain_saved
from vramlens.model.components import MlpKind

__all__ = ["expert_bytes", "moe_parts"]


def moe_parts(recipe: LayerRecipe, input_bytes: int) -> list[Part]:
    """transformers 5 grouped-GEMM experts: router softmax and indices, gathered tokens,
    per-expert intermediates for the k routed copies of every token, shared expert.

    The router terms follow Mixtral (fp32 re-normalized top-k weights); families that do
    not re-normalize keep 16 bytes per token less, which is left as a small over-count.
    With a capacity factor ``c`` the expert buffers are padded to ``c x tokens x k / experts``
    rows each, so every per-expert tensor is ``c`` times the routed copies.

    The experts compute in their weights' dtype (:func:`expert_bytes`). Frozen experts (LoRA,
    QLoRA: 3-D parameters are not adapter targets) keep no input for their down projection:
    ``grouped_mm``'s backward saves an operand only for the other operand's gradient.
    """
    spec = recipe.spec
    moe = spec.moe
    assert moe is not None
    a, x = recipe.compute_bytes, expert_bytes(recipe)
    h, k, e = spec.hidden_size, moe.experts_per_token, moe.num_experts
    i = moe.expert_intermediate_size
    c = recipe.moe_capacity
    trained = recipe.train.norms  # experts train only in full fine-tuning (3-D parameters are not LoRA targets)
    if moe.expert_kind is MlpKind.PLAIN:  # up -> act -> down (Nemotron-H's relu2 experts)
        intermediates = plain_saved(moe.activation, down_keeps_input=trained)
    else:
        intermediates = gated_saved(moe.activation) + (1 if trained else 0)
    parts = [
        Part(
            name="router probabilities and routing indices",
            bytes_per_token=FP32 * e + FP32 + 4 * 8 * k + 2 * FP32 * k,
            split=SEQUENCE,
        ),
        Part(
            name="experts gate/up outputs and activation",
            bytes_per_token=intermediates * x * i * k * c,
        ),
        Part(name="experts output (weighted by the router)", bytes_per_token=x * h * k * c, split=SEQUENCE),
    ]
    if trained:
        parts.append(Part(name="experts gathered inputs", bytes_per_token=x * h * k * c, split=SEQUENCE))
    shared_inputs = moe.shared_intermediate_size and any(
        s.group == "mlp_in" and s.name in recipe.train.needs_input for s in recipe.linears
    )
    if recipe.style.router_fp32 and a != FP32:  # in fp32 the router's copy is its input
        if trained:
            parts.append(Part(name="router input (fp32 copy)", bytes_per_token=FP32 * h, split=GATHERED))
        if shared_inputs:
            parts.append(Part(name="shared expert input", bytes_per_token=a * h, split=GATHERED))
    elif recipe.autocast and input_bytes != a:
        # Under autocast each linear reading the fp32 block input keeps its own bf16 cast.
        readers = _input_readers(recipe, trained=trained)
        parts += [Part(name=f"{name} input (autocast cast)", bytes_per_token=a * h, split=GATHERED) for name in readers]
    elif trained or shared_inputs:
        # One tensor read by the router and the shared expert's projections.
        parts.append(Part(name="MoE block input (router, shared expert)", bytes_per_token=a * h, split=GATHERED))
    if moe.shared_intermediate_size:
        parts += _shared_expert_parts(recipe)
    return parts


def _input_readers(recipe: LayerRecipe, *, trained: bool) -> list[str]:
    """The linears of an MoE block that keep its input: the router and the shared expert's
    sigmoid gate when trained, and the shared expert's input projections that keep theirs."""
    moe = recipe.spec.moe
    assert moe is not None
    readers = ["router"] if trained else []
    if moe.shared_expert_gate and trained:
        readers.append("shared expert gate")
    prefix = "shared_expert." if moe.shared_expert_gate else "shared_experts."
    readers += [
        s.name
        for s in recipe.linears
        if s.group == "mlp_in" and s.name.startswith(prefix) and s.name in recipe.train.needs_input
    ]
    return readers


def expert_bytes(recipe: LayerRecipe) -> int:
    """Bytes per element of what the routed experts compute: their weights' dtype.

    transformers 5's experts multiply with ``grouped_mm`` after ``input.to(weight.dtype)``
    (``transformers/integrations/moe.py``, ``_grouped_mm``), and ``grouped_mm`` is not on
    autocast's cast lists, so fp32 experts under autocast (mixed-precision full training,
    QLoRA's k-bit preparation) compute in fp32, not in the autocast dtype. Checked with
    saved-tensor hooks under autocast (``tests/estimate/test_activations_hf.py``) and by the
    QLoRA simulation of an MoE model.
    """
    return FP32 if recipe.autocast else recipe.compute_bytes


def _shared_expert_parts(recipe: LayerRecipe) -> list[Part]:
    moe = recipe.spec.moe
    assert moe is not None
    a, width = recipe.compute_bytes, moe.shared_intermediate_size
    down_keeps = any(s.group == "mlp_out" and s.name in recipe.train.needs_input for s in recipe.linears)
    if moe.shared_kind is MlpKind.PLAIN:  # the activation's output is the down projection's input
        kept = plain_saved(moe.activation, down_keeps_input=down_keeps)
        return [Part(name="shared expert activation (and down input)", bytes_per_token=kept * a * width)]
    parts = [Part(name="shared expert activations", bytes_per_token=gated_saved(moe.activation) * a * width)]
    if down_keeps:
        parts.append(Part(name="shared expert down input", bytes_per_token=a * width))
    if moe.shared_expert_gate:
        # sigmoid(gate(x)) * shared_expert(x) keeps both factors.
        parts.append(
            Part(name="shared expert output and sigmoid gate", bytes_per_token=a * (recipe.spec.hidden_size + 1))
        )
    return parts
