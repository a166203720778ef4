"""A dense layer's MLP working sets, bytes per token (:func:`vramlens.estimator.stage_plan.working_set`):
PEFT's adapter sums on the input projections, a recomputed layer's MLP backward, and the fp32 input
copy an adapter on the down projection makes under autocast. Each is measured against tracked CPU
runs of transformers' Llama layer (``tests/estimator/test_training_hf.py``).
"""

from __future__ import annotations

from vramlens.model.components import MlpKind
from vramlens.model.modules import layer_linears
from vramlens.model.spec import ModelSpec
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Method

__all__ = [
    "adapter_transients",
    "down_adapter_cast",
    "full_mlp_backward",
    "mlp_out_elements",
    "recomputed_mlp_backward",
]


def mlp_out_elements(spec: ModelSpec) -> int:
    """Weight elements of a dense layer's MLP output projection (0 without a dense MLP or for MoE)."""
    if spec.mlp is None or spec.is_moe:
        return 0
    return sum(s.in_features * s.out_features for s in layer_linears(spec) if s.group == "mlp_out")


def recomputed_mlp_backward(ctx: TrainingContext, targets: frozenset[str], inner: int, adapter_grad: float) -> float:
    """Bytes per token a recomputed dense layer's MLP backward holds beyond the layer's recomputed
    tensors, at the higher of its two high points (tracked CPU runs of transformers' Llama layer under
    non-reentrant checkpointing, LoRA on q/v, on every linear, and full fine-tuning:
    ``tests/estimator/test_training_hf.py``):

    * the activation's backward: the gradients of the MLP's intermediates (gated: the product's,
      the activation's and the up projection's, ``3 a i``; plain: ``2 a i``) beside the incoming
      hidden-state gradient (``a h``) and the input projections' adapter output gradients
      (``adapter_grad``), less the down projection's kept input (the product, or an adapter's
      cast copy of it), which its backward has freed by then;
    * with an adapter on the down projection, its backward: the gradient of the adapter's input copy
      and of its output (``d i + d h``, ``d`` the adapter's bytes) beside four hidden-state
      gradients (incoming, the scaled branch's, the base branch's and their sum: ``4 a h``);
    * under autocast with PEFT's fp32 adapters, the recomputation's own high point at that adapter
      (:func:`down_adapter_cast`) beside three hidden-state gradients (``3 a h``): tracked, LoRA on
      every linear, ``mixed-bf16``, 64-token vocabulary (it was 6-8% low before)."""
    a, h, spec = ctx.compute_bytes, ctx.spec.hidden_size, ctx.spec
    gradients = 3 if spec.mlp is not None and spec.mlp.kind is MlpKind.GATED else 2
    down_adapted = ctx.method is not Method.FULL and any(
        s.name in targets for s in layer_linears(spec) if s.group == "mlp_out"
    )
    d = 4 if ctx.profile.adapters_fp32 and not ctx.autocast else a
    kept = a * inner if ctx.method is Method.FULL else (d * inner if down_adapted else 0)
    activation = gradients * a * inner + a * h - kept + adapter_grad
    if not down_adapted:
        return activation
    cast = down_adapter_cast(ctx, targets, inner)
    return max(activation, d * (inner + h) + 4 * a * h, cast + 3 * a * h if cast else 0)


def full_mlp_backward(spec: ModelSpec, inner: int, *, compute: int, stream: int) -> float:
    """Bytes per token a dense layer's MLP backward holds beyond every layer's saved tensors in a full
    fine-tune without recompute, at its high point (the activation's backward): the gradients of the
    MLP's intermediates (gated: the product's, the activation's and the up projection's, ``3 a i``;
    plain: ``2 a i``) less the product the down projection kept, which its backward has freed
    (``a i``), beside the incoming hidden-state gradient in the residual stream's dtype (``s h``: fp32
    under autocast over fp32 weights, where the stream's adds and norms run in fp32). The down
    projection's weight gradient, made just before, is the caller's (``mlp_out_grads_bytes``). Tracked
    CPU runs of transformers' Llama step, bf16 and mixed-bf16, 64-token vocabulary
    (``tests/estimator/test_training_hf.py``), the layer's backward window read with tensor hooks."""
    gradients = 3 if spec.mlp is not None and spec.mlp.kind is MlpKind.GATED else 2
    return (gradients - 1) * compute * inner + stream * spec.hidden_size


def down_adapter_cast(ctx: TrainingContext, targets: frozenset[str], inner: int) -> float:
    """Bytes per token alive beyond a dense layer's kept tensors while a PEFT adapter on its down
    projection runs under autocast (0 elsewhere): ``_cast_input_dtype`` copies the intermediate to
    the adapters' fp32 (``4 i``; autocast casts it back for the matmul and keeps that copy), the
    projection's input, which nobody keeps (``a i``), the base output, the adapter's output and its
    scaled copy (``3 a h``). Standard LoRA layers only: PEFT's 4-bit layers skip the cast under
    autocast. Tracked CPU runs (``tests/estimator/test_training_hf.py``)."""
    a, h = ctx.compute_bytes, ctx.spec.hidden_size
    cast = ctx.autocast and ctx.profile.adapters_fp32 and ctx.method is Method.LORA and a < 4
    if not cast or not any(s.name in targets for s in layer_linears(ctx.spec) if s.group == "mlp_out"):
        return 0.0
    return float((4 + a) * inner + 3 * a * h)


def adapter_transients(ctx: TrainingContext, targets: frozenset[str], inner: int) -> tuple[float, float]:
    """Bytes per token of PEFT's ``result + lora_B(lora_A(x)) * scaling`` on an MLP input
    projection: (forward: base output, scaled adapter output and promoted sum; backward:
    the adapter output's gradient). ``d`` is 4 for fp32 adapters, 2 for bf16 or under autocast."""
    if not targets or not any(
        s.group == "mlp_in" and s.name in targets for s in layer_linears(ctx.spec, moe_layer=not ctx.spec.mlp)
    ):
        return 0.0, 0.0
    d = 2 if ctx.autocast or not ctx.profile.adapters_fp32 else 4
    return (2 * d + ctx.compute_bytes) * inner, d * inner
