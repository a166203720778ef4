"""The phases of a training step on one stage, each high point the list of terms alive then.

A phase's allocated bytes are the sum of its terms (:meth:`PhaseMemory.of_terms`), so what
``--explain`` lists adds up to the peak by construction: whole quantities (their terms, e.g.
parameters, optimizer state, saved activations) and each instant's own amounts (a working set, a
recomputed layer, the gradients made so far) named with their formula and when they are alive.
See :mod:`vramlens.estimator.training` for the instants.
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.embedding_grads import pending_embedding_grad_bytes, tied_embedding_grad_bytes
from vramlens.estimator.phase_instant import Instant, base_instant
from vramlens.estimator.qlora import prepare_cast_bytes
from vramlens.estimator.stage_memory import Formula, StageMemory
from vramlens.estimator.zero3 import grad_partitions_whole_step
from vramlens.resolve.context import TrainingContext
from vramlens.result.report import PhaseMemory
from vramlens.workload.options import Recompute

__all__ = ["training_phases"]

_C = Category
#: ``StageMemory.derived`` key of the optimizer step's phase (size-free, shared by a stage plan's estimates).
_OPTIMIZER = "phases: optimizer step"


def _kept_gradients(ctx: TrainingContext, mem: StageMemory, instant: Instant) -> None:
    """Gradients alive before a micro-step's backward: the unsharded ones FSDP accumulates without
    gradient sync (the sharded ones appear at the last micro-step), else with gradient
    accumulation the earlier micro-steps' (sharded) gradients, or ZeRO-3's gradient partitions
    (one buffer from initialization on, :func:`~vramlens.estimator.zero3.grad_partitions_whole_step`);
    none on a single micro-step."""
    accumulated = mem.unsharded.accumulated_grads
    if accumulated:
        instant.add(
            "unsharded accumulated gradients (no gradient sync between micro-steps)",
            _C.GRADIENTS,
            accumulated,
            "every trainable element in the reduce dtype (fsdp.py)",
        )
    elif (ctx.workload.grad_accum > 1 and not ctx.in_backward_step) or grad_partitions_whole_step(ctx):
        instant.part("grads_bytes")


def _unsharded(instant: Instant, value: int, where: str) -> None:
    if value:
        instant.add(f"unsharded parameters and buffers {where}", _C.TEMPORARY, value, instant.mem.unsharded.how)


def _logits(instant: Instant, value: int, name: str) -> None:
    """The loss's tensors of ``value`` bytes, the LM head's bf16 weight copy apart."""
    mem = instant.mem
    assert mem.logits is not None
    instant.add(name, _C.TEMPORARY, value - mem.head_cast_bytes, mem.logits.formula)
    head = "LM head bf16 weight copy (fp32 head after k-bit preparation)"
    instant.add(head, _C.TEMPORARY, mem.head_cast_bytes, "V x h x 2 B")


_AT_LOSS, _IN_LAYER, _IN_NORM = "at the loss", "inside the last layer's forward", "inside the final norm's forward"


def _forward(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory:
    """The end of forward, the highest of: the last layer's forward (a quantized base's dequantized
    weight exists inside a layer's linear, not at the loss), the final norm's forward, or the loss
    (the logits, the final norm's and the head's saved tensors, the norm's output the model still
    holds). The head side is made by the final norm and the head: not there in a full fine-tune's
    layer forward, and part of the final norm's own amount in its forward (tracked CPU runs,
    :mod:`.final_norm`); the adapters' forward working sets were fitted with it counted, so it stays
    in their layer's forward until they are re-derived."""
    u = mem.unsharded
    fitted = 0 if ctx.full else mem.head_side_bytes
    highs = {
        _AT_LOSS: (mem.logits.forward_end if mem.logits else 0) + u.loss + mem.head_side_bytes + mem.final_output_bytes,
        _IN_LAYER: mem.forward_working_bytes + mem.dequant_bytes + u.forward_layer + fitted,
        _IN_NORM: mem.final_norm_forward_bytes,
    }
    where = max(highs, key=highs.__getitem__)
    instant = base_instant(mem, where)
    _kept_gradients(ctx, mem, instant)
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "inputs_bytes")
    if where == _AT_LOSS:
        instant.part("head_side_bytes")
        if mem.logits is not None:
            _logits(instant, mem.logits.forward_end, "logits and loss (at the loss)")
        instant.quantity("the final norm's output (the model's forward holds it)", _C.TEMPORARY, "final_output_bytes")
        _unsharded(instant, u.loss, "at the loss")
    elif where == _IN_LAYER:
        if fitted:
            instant.part("head_side_bytes")
        instant.quantity("a layer's forward working set", _C.TEMPORARY, "forward_working_bytes")
        instant.part("dequant_bytes")
        _unsharded(instant, u.forward_layer, "in a layer's forward")
    else:
        instant.quantity(
            "the final norm's forward (its input, saved tensors, intermediates)",
            _C.TEMPORARY,
            "final_norm_forward_bytes",
        )
    instant.part("casts_bytes")
    return instant.phase("forward", f"end of forward: {where}")


def _gradients_so_far(instant: Instant, in_backward: bool, missing: dict[str, int]) -> None:
    """Every gradient (none with an optimizer in backward, which frees each at once) but those
    ``missing`` not made yet at this instant (bytes by what they are)."""
    if in_backward:
        return
    grads = instant.mem.grads_bytes
    less = min(sum(missing.values()), grads)
    if not less:
        instant.part("grads_bytes")
        return
    what = " and ".join(name for name, value in missing.items() if value)
    parts = " - ".join(f"{name} {value:,} B" for name, value in missing.items() if value)
    instant.add(
        f"gradients made so far (all but {what})", _C.GRADIENTS, grads - less, f"every gradient {grads:,} B - {parts}"
    )


def _backward_start(ctx: TrainingContext, mem: StageMemory) -> tuple[str, Instant]:
    instant = base_instant(mem, "start of backward")
    _kept_gradients(ctx, mem, instant)
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "head_side_bytes", "inputs_bytes")
    if mem.logits is not None:
        _logits(instant, mem.logits.backward_start, "loss gradient beside the kept logits (start of backward)")
    instant.quantity("autocast weight copies alive in backward", _C.TEMPORARY, "casts_backward_bytes")
    _unsharded(instant, mem.unsharded.backward_start, "at the start of backward")
    return "start of backward: loss gradient beside all activations", instant


def _first_layers(ctx: TrainingContext, mem: StageMemory, outputs: int) -> tuple[str, Instant]:
    instant = base_instant(mem, "inside the first layers' backward")
    _kept_gradients(ctx, mem, instant)
    instant.part("grad_buckets_bytes")
    kept_grads = not ctx.in_backward_step and not grad_partitions_whole_step(ctx)
    if kept_grads:
        instant.quantity("LM head gradient (made first in backward)", _C.GRADIENTS, "head_grads_bytes")
    instant.parts("activations_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(ctx, instant)
    instant.quantity("the recomputed layer's tensors", _C.ACTIVATIONS, "recompute_bytes")
    if kept_grads and not mem.recompute_bytes:  # made first in the layer's backward, before its MLP's high point
        instant.quantity("the layer's MLP output projection gradient", _C.GRADIENTS, "mlp_out_grads_bytes")
    _kept_outputs(instant, outputs)
    instant.quantity("a layer's backward working set", _C.TEMPORARY, "working_bytes")
    _casts_after_head(instant, down=not mem.recompute_bytes)
    instant.part("dequant_bytes")
    _unsharded(instant, mem.unsharded.first_layers, "in a layer's backward")
    return "first layers of backward: a recomputed layer and the gradient working set", instant


def _final_norm_backward(ctx: TrainingContext, mem: StageMemory, outputs: int) -> tuple[str, Instant]:
    """Inside the final norm's backward, the first after the head's: the head's gradient, every
    layer's saved tensors, the loop's kept outputs and the norm's own high point (its fp32 input and
    rsqrt, the gradients it makes: :mod:`vramlens.estimator.final_norm`); the head's input, the
    norm's normalized tensor and the loss's tensors are freed by then."""
    instant = base_instant(mem, "inside the final norm's backward")
    _kept_gradients(ctx, mem, instant)
    instant.part("grad_buckets_bytes")
    if not ctx.in_backward_step and not grad_partitions_whole_step(ctx):
        instant.quantity("LM head gradient (made first in backward)", _C.GRADIENTS, "head_grads_bytes")
    instant.parts("activations_bytes", "non_layer_bytes", "inputs_bytes")
    _kept_outputs(instant, outputs)
    what = "the final norm's backward (its fp32 input and rsqrt, its fp32 gradients)"
    instant.quantity(what, _C.TEMPORARY, "final_norm_backward_bytes")
    _casts_after_head(instant, down=False)
    _unsharded(instant, mem.unsharded.backward_start, "at the start of backward")
    return "inside the final norm's backward: its fp32 gradients beside all activations", instant


def _casts_after_head(instant: Instant, *, down: bool) -> None:
    """The autocast weight copies alive in backward once the head's backward has freed its copy, and,
    when ``down``, inside a layer's MLP backward without recompute, whose output projection's
    backward has freed that projection's copy (tracked CPU run of the tiny Llama, mixed-bf16; the
    simulator on a Llama-3.2-1B-shaped model)."""
    mem = instant.mem
    head, down_copy = mem.autocast_head_copy_bytes, mem.autocast_down_copy_bytes if down else 0
    value = mem.casts_backward_bytes - head - down_copy
    less = (
        (" - the head's copy" + (" - the layer's down projection's copy" if down_copy else ""))
        if head or down_copy
        else ""
    )
    base = mem.formulas.get("casts_backward_bytes", "")
    formula: Formula = (lambda: f"{base()}{less}") if callable(base) else f"{base}{less}"
    instant.add("autocast weight copies alive in backward", _C.TEMPORARY, value, formula)


def _hook_step(mem: StageMemory, outputs: int) -> tuple[str, Instant]:
    """``optimizer_in_backward``: the largest tensor stepped in its post-accumulate-grad hook while
    every layer's activations are still alive (the LM head's hook runs first in backward; the loss's
    logits tensors are freed by then, the loop's kept outputs are not). An upper bound when the
    largest tensor is a layer's or the embedding's (their hooks run later, with fewer activations)."""
    instant = base_instant(mem, "inside the largest tensor's in-backward step")
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "head_side_bytes", "inputs_bytes")
    _kept_outputs(instant, outputs)
    instant.quantity("the largest tensor's gradient and its step temporaries", _C.TEMPORARY, "hook_step_bytes")
    _unsharded(instant, mem.unsharded.backward_start, "at the start of backward")
    return "in backward: the largest tensor's optimizer step beside all activations", instant


def _head_side_unless_recomputed(ctx: TrainingContext, instant: Instant) -> None:
    """The final norm's and the head's saved tensors in a layer's backward: freed by then (their
    backward runs first), as measured with whole-layer recompute and, for a full fine-tune, without
    (its working set re-derived, :func:`~vramlens.estimator.mlp_working.full_mlp_backward`); the
    adapters' no-recompute working set was fitted with them counted, so they stay there until that
    set is re-derived (docs/accuracy.md)."""
    if not instant.mem.recompute_bytes and not ctx.full:
        instant.part("head_side_bytes")


def _kept_outputs(instant: Instant, outputs: int) -> None:
    formula = instant.mem.logits.formula if instant.mem.logits is not None else ""
    instant.add("model outputs the loop keeps (logits, until backward returns)", _C.TEMPORARY, outputs, formula)


def _backward_end(ctx: TrainingContext, mem: StageMemory, kept_to_end: int) -> tuple[str, Instant]:
    instant = base_instant(mem, "end of backward")
    _gradients_so_far(instant, ctx.in_backward_step, {})
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(ctx, instant)
    _kept_outputs(instant, kept_to_end)
    if mem.end_working_bytes is None:
        instant.quantity("a layer's backward working set", _C.TEMPORARY, "working_bytes")
    else:
        instant.add("the embedding's backward working set", _C.TEMPORARY, mem.end_working_bytes, "")
    instant.part("dequant_bytes")
    instant.quantity("the tied table's gradient and its in-backward step", _C.TEMPORARY, "hook_end_bytes")
    _unsharded(instant, mem.unsharded.end, "in the embedding's backward")
    return "end of backward: every gradient", instant


def _last_layer(ctx: TrainingContext, mem: StageMemory, kept_to_end: int, embedding: int) -> tuple[str, Instant]:
    instant = base_instant(mem, "inside the first layer's backward (the last backward reaches)")
    # The MLP's output projection's gradient is made first in the layer's backward (its MLP peaks after).
    first = mem.layer_grads_bytes - mem.mlp_out_grads_bytes
    missing = {"the first layer's": first, "the input embedding's": embedding}
    _gradients_so_far(instant, ctx.in_backward_step, {} if grad_partitions_whole_step(ctx) else missing)
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(ctx, instant)
    layers = max(mem.stage.layers, 1)
    # Its own saved tensors until its backward ends: all of them, or its checkpointed input when every
    # layer is checkpointed (with every k-th, an average would mix saved and checkpointed layers).
    every = ctx.workload.recompute is Recompute.FULL and ctx.workload.recompute_every == 1
    if every or not mem.recompute_bytes:
        what = "checkpointed input" if mem.recompute_bytes else "saved activations"
        formula = lambda: f"activations {mem.activations_bytes:,} B / {layers} layers"  # noqa: E731 (lazy: traced)
        instant.add(f"the first layer's {what}", _C.ACTIVATIONS, mem.activations_bytes // layers, formula)
    if mem.recompute_bytes:
        instant.quantity("the recomputed layer's tensors", _C.ACTIVATIONS, "recompute_bytes")
    _kept_outputs(instant, kept_to_end)
    instant.quantity("a layer's backward working set", _C.TEMPORARY, "working_bytes")
    instant.quantity("the first layer's autocast weight copies", _C.TEMPORARY, "casts_last_layer_bytes")
    instant.part("dequant_bytes")
    _unsharded(instant, mem.unsharded.last_layer, "in the first layer's backward")
    return "last layer of backward: the first layer's activations beside every other gradient", instant


def _tied_backward(ctx: TrainingContext, mem: StageMemory, outputs: int, tied: int) -> tuple[str, Instant]:
    """The tied embedding's backward: under FSDP (``tied`` 0; the gathered tail, the head's gradient,
    the embedding's, their sum and a reduce-scatter input are ``unsharded.end``) while the loop still
    holds the logits, the tied matrix's sharded gradient still to come; on one unsharded rank the
    head's contribution and the sum beside the embedding's (``tied`` bytes each)."""
    instant = base_instant(mem, "inside the tied embedding's backward")
    missing = {} if tied or grad_partitions_whole_step(ctx) else {"the tied matrix's": mem.head_grads_bytes}
    _gradients_so_far(instant, ctx.in_backward_step, missing)
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(ctx, instant)
    _kept_outputs(instant, outputs)
    instant.add(
        "tied embedding: the LM head's gradient contribution and the sum (InputBuffer::accumulate)",
        _C.TEMPORARY,
        2 * tied,
        f"2 x vocab {ctx.spec.vocab_size:,} x hidden {ctx.spec.hidden_size:,} x {ctx.grad_bytes} B",
    )
    _unsharded(instant, mem.unsharded.end, "in the embedding's backward")
    if tied:
        return "end of backward: the tied embedding's two gradient contributions and their sum", instant
    return "end of backward: the tied embedding's backward (FSDP) beside the kept logits", instant


def _backward(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory:
    """The highest of backward's instants (the first on a tie).

    The loop's kept model outputs live until backward returns, so they are in the last layer's
    and the end's working set too, where a checkpointed single-GPU step peaks, and the input
    embedding's gradient is not there yet at the last layer (tracked CPU runs and the simulator,
    tests/experiments). Under FSDP the simulator's last layer stays at the formula without both
    (llama-3.1-8b, 8 GPUs, bf16, recompute full: 11.3895 GB), so FSDP keeps it.
    """
    u = mem.unsharded
    outputs = mem.logits.outputs if mem.logits else 0
    fsdp = bool(u.last_layer or u.end)
    kept_to_end = 0 if fsdp else outputs
    embedding = 0 if fsdp else pending_embedding_grad_bytes(ctx, mem)
    candidates = [
        _backward_start(ctx, mem),
        _first_layers(ctx, mem, outputs),
        _backward_end(ctx, mem, kept_to_end),
        _last_layer(ctx, mem, kept_to_end, embedding),
    ]
    if mem.final_norm_backward_bytes:
        candidates.append(_final_norm_backward(ctx, mem, outputs))
    if mem.hook_step_bytes:
        candidates.append(_hook_step(mem, outputs))
    if u.end and ctx.spec.tie_word_embeddings and outputs:
        candidates.append(_tied_backward(ctx, mem, outputs, 0))
    tied = tied_embedding_grad_bytes(ctx)
    if tied:
        candidates.append(_tied_backward(ctx, mem, outputs, tied))
    note, peak = max(candidates, key=lambda candidate: candidate[1].total_bytes)
    return peak.phase("backward", note)


def _optimizer(mem: StageMemory) -> PhaseMemory:
    """Inside ``optimizer.step()``: every gradient and the step's temporaries (the same for every
    estimate of a stage plan)."""
    known = mem.derived.get(_OPTIMIZER)
    if known is None:
        instant = base_instant(mem, "inside optimizer.step()")
        instant.parts("grads_bytes", "grad_buckets_bytes", "step_temp_bytes")
        known = mem.derived[_OPTIMIZER] = instant.phase(
            "optimizer_step", "optimizer.step(): every gradient and the step's temporaries"
        )
    return known  # type: ignore[return-value]


def _load(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory | None:
    """QLoRA's load (before the first step), when ``prepare_model_for_kbit_training`` runs: the
    frozen weights in their final dtypes beside the loaded copy of the weight being cast to fp32
    (:func:`vramlens.estimator.qlora.prepare_cast_bytes`); no adapters, states or workspace yet."""
    cast = prepare_cast_bytes(ctx)
    if not cast:
        return None
    instant = Instant(mem, "inside prepare_model_for_kbit_training")
    instant.add(
        "frozen weights (after the k-bit preparation)",
        _C.PARAMETERS,
        int(mem.stage.frozen_bytes),
        "4-bit linears and their quantization states + every unquantized weight in fp32 (no adapters yet)",
    )
    instant.add(
        "the loaded copy of the weight being cast to fp32 (prepare_model_for_kbit_training)",
        _C.TEMPORARY,
        cast,
        "the largest unquantized weight (vocabulary table or fused experts) in the loaded dtype",
    )
    return instant.phase("load", "load: prepare_model_for_kbit_training casting the largest weight")


def training_phases(ctx: TrainingContext, mem: StageMemory) -> list[PhaseMemory]:
    """The phases of one step on one stage (QLoRA with k-bit preparation: the load before them)."""
    load = _load(ctx, mem)
    phases = [] if load is None else [load]
    phases += [_forward(ctx, mem), _backward(ctx, mem)]
    if not ctx.in_backward_step:
        phases.append(_optimizer(mem))
    return phases
