"""Activation parts of a mixture-of-experts block (transformers 5 grouped-GEMM experts)."""

from __future__ import annotations

from vramlens.estimator.moe_dense import dense_expert_parts
from vramlens.estimator.saved_parts import (
    FP32,
    GATHERED,
    SEQUENCE,
    LayerRecipe,
    Part,
    gated_saved,
    lora_parts,
    plain_saved,
)
from vramlens.model.components import MlpKind
from vramlens.model.modules import shared_expert_prefix

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
    full = recipe.train.norms
    # The experts' weights need gradients in full fine-tuning, and as PEFT's merged weights under
    # all-linear LoRA (expert_lora.py): grouped_mm then keeps its inputs, the router its input.
    trained = full or recipe.train.experts_adapted
    down_input = 1 if trained else 0
    if recipe.style.dense_experts:
        parts = dense_expert_parts(recipe)
    else:
        if moe.expert_kind is MlpKind.PLAIN:  # up -> act -> down (Nemotron-H's relu2 experts)
            intermediates = plain_saved(moe.activation, down_keeps_input=trained)
        else:
            intermediates = _gate_saved(moe.activation) + down_input
        parts = [
            _router_part(recipe, k, e),
            Part(name="experts gate/up outputs and activation", bytes_per_token=intermediates * x * i * k * c),
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
        readers = _input_readers(recipe, router=trained, gate=full)
        parts += [Part(name=f"{name} input (autocast cast)", bytes_per_token=a * h, split=GATHERED) for name in readers]
    elif trained or shared_inputs:
        # One tensor read by the router and the shared expert's projections.
        parts.append(Part(name="MoE block input (router, shared expert)", bytes_per_token=a * h, split=GATHERED))
    if moe.shared_intermediate_size:
        parts += _shared_expert_parts(recipe)
    return parts


#: Expert gates written out in a family's code instead of ``act_fn(gate) * up``: tensors of the
#: expert width kept per routed copy up to the down projection's input (exclusive), the gate/up
#: output (two widths, kept through its gate and up views) included.
_CUSTOM_GATES = {
    # GptOssExperts._apply_gate: gate = gate_up[..., ::2].clamp(max=limit) (keeps gate_up through
    # the view), up = gate_up[..., 1::2].clamp(-limit, limit); glu = gate * sigmoid(gate * alpha)
    # keeps the clamped gate and the sigmoid; (up + 1) * glu keeps both factors: 2 + 4 widths.
    "clamped_swiglu": 6,
}


def _gate_saved(activation: str) -> int:
    """Expert-width tensors a gated expert keeps before its down projection (see :func:`gated_saved`)."""
    return _CUSTOM_GATES.get(activation) or gated_saved(activation)


def _router_part(recipe: LayerRecipe, k: int, e: int) -> Part:
    """The router's kept tensors and the grouped experts' int64 routing indices, per token.

    Softmax-then-top-k routers (Mixtral, Qwen, OLMoE): the fp32 probabilities over the ``e``
    experts, the top-k indices and three int64 indices per routed copy (sort permutation,
    gather index, inverse permutation), the routing weights. Top-k-then-softmax (gpt-oss's
    ``GptOssTopKRouter``): no expert-wide probabilities; the softmax over the k chosen logits and
    the weights gathered per copy in the compute dtype, and one more int64 index per copy when the
    experts have biases (``gate_up_proj_bias[expert_ids]``). Counted with saved-tensor hooks
    (``tests/estimator/test_activations_hf.py``).
    """
    moe = recipe.spec.moe
    assert moe is not None
    if recipe.style.router_topk_first:
        indices = 8 * k * (4 + (1 if moe.expert_bias else 0))
        return Part(
            name="router top-k softmax and routing indices",
            bytes_per_token=indices + 2 * recipe.compute_bytes * k,
            split=SEQUENCE,
        )
    return Part(
        name="router probabilities and routing indices",
        bytes_per_token=FP32 * e + FP32 + 4 * 8 * k + 2 * FP32 * k,
        split=SEQUENCE,
    )


def _input_readers(recipe: LayerRecipe, *, router: bool, gate: bool) -> list[str]:
    """The linears of an MoE block that keep its input: the router when its weight needs a
    gradient, the shared expert's sigmoid gate when trained (``gate``), and the shared expert's
    input projections that keep theirs."""
    moe = recipe.spec.moe
    assert moe is not None
    readers = ["router"] if router else []
    if moe.shared_expert_gate and gate:
        readers.append("shared expert gate")
    prefix = shared_expert_prefix(recipe.spec)
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
    saved-tensor hooks under autocast (``tests/estimator/test_activations_hf.py``) and by the
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
        parts = [Part(name="shared expert activation (and down input)", bytes_per_token=kept * a * width)]
    else:
        parts = [Part(name="shared expert activations", bytes_per_token=gated_saved(moe.activation) * a * width)]
        if down_keeps:
            parts.append(Part(name="shared expert down input", bytes_per_token=a * width))
    # LoRA adapters on the shared expert's projections (the dense MLP's are counted in dense layers).
    parts += lora_parts(recipe, "mlp_in", recipe.spec.hidden_size, input_bytes=a, shared_expert=True)
    parts += lora_parts(recipe, "mlp_out", width, input_bytes=a, shared_expert=True)
    if moe.shared_expert_gate:
        # sigmoid(gate(x)) * shared_expert(x) keeps both factors.
        parts.append(
            Part(name="shared expert output and sigmoid gate", bytes_per_token=a * (recipe.spec.hidden_size + 1))
        )
    return parts
