"""The phases of a training step on one stage, each high point the list of terms alive then.

A phase's allocated bytes are the sum of its terms (:meth:`PhaseMemory.of_terms`), so what
``--explain`` lists adds up to the peak by construction: whole quantities (their terms, e.g.
parameters, optimizer state, saved activations) and each instant's own amounts (a working set, a
recomputed layer, the gradients made so far) named with their formula and when they are alive.
See :mod:`vramlens.estimator.training` for the instants.
"""

from __future__ import annotations

from typing import cast

from vramlens.categories import Category
from vramlens.estimator.embedding_grads import pending_embedding_grad_bytes, tied_embedding_grad_bytes
from vramlens.estimator.qlora import prepare_cast_bytes
from vramlens.estimator.runtime import CUBLAS_FORMULA, CUBLAS_WORKSPACE_BYTES
from vramlens.estimator.stage_memory import Formula, StageMemory, Summed
from vramlens.estimator.zero3 import grad_partitions_whole_step
from vramlens.resolve.context import TrainingContext
from vramlens.result.report import PhaseMemory, Term
from vramlens.workload.options import Recompute

__all__ = ["training_phases"]

_C = Category


#: An instant's own amount, its Term made only if the instant is reported: (name, category, bytes, formula).
_Own = tuple[str, Category, int, Formula]
#: ``StageMemory.derived`` keys (size-free records, shared by the estimates of one stage plan).
_BASE, _OPTIMIZER = "phases: base", "phases: optimizer step"


class _Instant:
    """The terms alive at one instant of a step: whole quantities (their terms) and the
    instant's own amounts, named with their formula. Its total is kept as they are added (to pick
    the highest instant); its terms are made for a phase (:meth:`phase`)."""

    __slots__ = ("alive", "mem", "pieces", "total_bytes")

    def __init__(self, mem: StageMemory, alive: str, pieces: tuple[Summed | list[Term], ...] = (), total: int = 0):
        self.mem, self.alive = mem, alive
        self.pieces: list[Summed | list[Term] | _Own] = list(pieces)
        self.total_bytes = total

    def part(self, quantity: Summed) -> None:
        """Every term of ``quantity`` (alive at this instant in full; they add up to the quantity)."""
        if self.mem.parts.get(quantity):
            self.pieces.append(quantity)
            self.total_bytes += getattr(self.mem, quantity)

    def parts(self, *quantities: Summed) -> None:
        """Every term of each of ``quantities``, in order (see :meth:`part`)."""
        mem, pieces = self.mem, self.pieces
        for quantity in quantities:
            if mem.parts.get(quantity):
                pieces.append(quantity)
                self.total_bytes += getattr(mem, quantity)

    def add(self, name: str, category: Category, value: int, formula: Formula) -> None:
        """A term of ``value`` bytes alive at this instant (none when 0)."""
        if value:
            self.pieces.append((name, category, value, formula))
            self.total_bytes += value

    def quantity(self, name: str, category: Category, key: str) -> None:
        """The instant's share of a quantity with no term of its own (``StageMemory.formulas[key]``)."""
        value = getattr(self.mem, key)
        if value:
            self.add(name, category, value, self.mem.formulas.get(key, ""))

    def terms(self) -> list[Term]:
        """The instant's terms, in the order they were added."""
        found: list[Term] = []
        alive, parts = self.alive, self.mem.parts
        for piece in self.pieces:
            if isinstance(piece, str):
                found.extend(parts[piece])
            elif isinstance(piece, list):
                found.extend(piece)
            else:
                name, category, value, formula = piece
                found.append(Term(name=name, category=category, bytes=value, explain=formula, alive=alive))
        return found

    def phase(self, name: str, note: str) -> PhaseMemory:
        """This instant as the phase ``name``."""
        return PhaseMemory.of_terms(name, note, self.terms())


#: The cuBLAS workspaces' terms (the same at every instant of a steady step): the main thread's, and
#: the autograd engine's device thread's, made by the first backward's first matmul (one workspace
#: per cuBLAS handle and stream, handles per thread: CublasHandlePool.cpp; :mod:`vramlens.simulator._blas`).
_CUBLAS = [
    Term(
        name="cuBLAS workspace (from the caching allocator)",
        category=_C.OTHER,
        bytes=CUBLAS_WORKSPACE_BYTES,
        explain=CUBLAS_FORMULA,
        alive="from the first matmul on",
    ),
    Term(
        name="cuBLAS workspace of the autograd thread (from the caching allocator)",
        category=_C.OTHER,
        bytes=CUBLAS_WORKSPACE_BYTES,
        explain=f"{CUBLAS_FORMULA}; backward runs on the autograd engine's device thread, with its own handle",
        alive="from the first backward's first matmul on",
    ),
]


def _base(mem: StageMemory, alive: str) -> _Instant:
    """Parameters, optimizer state and the cuBLAS workspace: alive at every instant (the same for
    every estimate of a stage plan)."""
    known = cast("tuple[tuple[Summed | list[Term], ...], int] | None", mem.derived.get(_BASE))
    if known is None:
        instant = _Instant(mem, alive)
        instant.parts("params_bytes", "states_bytes")
        instant.pieces.append(_CUBLAS)
        instant.total_bytes += sum(term.bytes for term in _CUBLAS)
        known = (cast("tuple[Summed | list[Term], ...]", tuple(instant.pieces)), instant.total_bytes)
        mem.derived[_BASE] = known
    return _Instant(mem, alive, known[0], known[1])


def _kept_gradients(ctx: TrainingContext, mem: StageMemory, instant: _Instant) -> None:
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


def _unsharded(instant: _Instant, value: int, where: str) -> None:
    if value:
        instant.add(f"unsharded parameters and buffers {where}", _C.TEMPORARY, value, instant.mem.unsharded.how)


def _logits(instant: _Instant, value: int, name: str) -> None:
    """The loss's tensors of ``value`` bytes, the LM head's bf16 weight copy apart."""
    mem = instant.mem
    assert mem.logits is not None
    instant.add(name, _C.TEMPORARY, value - mem.head_cast_bytes, mem.logits.formula)
    head = "LM head bf16 weight copy (fp32 head after k-bit preparation)"
    instant.add(head, _C.TEMPORARY, mem.head_cast_bytes, "V x h x 2 B")


def _forward(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory:
    """The end of forward: at the loss, or inside the last layer's forward when that is higher (a
    quantized base's dequantized weight exists inside a layer's linear, not at the loss)."""
    u = mem.unsharded
    at_loss = (mem.logits.forward_end if mem.logits else 0) + u.loss
    in_layer = mem.forward_working_bytes + mem.dequant_bytes + u.forward_layer
    where = "at the loss" if at_loss >= in_layer else "inside the last layer's forward"
    instant = _base(mem, where)
    _kept_gradients(ctx, mem, instant)
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "head_side_bytes", "inputs_bytes")
    if at_loss >= in_layer:
        if mem.logits is not None:
            _logits(instant, mem.logits.forward_end, "logits and loss (at the loss)")
        _unsharded(instant, u.loss, "at the loss")
    else:
        instant.quantity("a layer's forward working set", _C.TEMPORARY, "forward_working_bytes")
        instant.part("dequant_bytes")
        _unsharded(instant, u.forward_layer, "in a layer's forward")
    instant.part("casts_bytes")
    return instant.phase("forward", f"end of forward: {where}")


def _gradients_so_far(instant: _Instant, in_backward: bool, missing: dict[str, int]) -> None:
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


def _backward_start(ctx: TrainingContext, mem: StageMemory) -> tuple[str, _Instant]:
    instant = _base(mem, "start of backward")
    _kept_gradients(ctx, mem, instant)
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "head_side_bytes", "inputs_bytes")
    if mem.logits is not None:
        _logits(instant, mem.logits.backward_start, "loss gradient beside the kept logits (start of backward)")
    instant.quantity("autocast weight copies alive in backward", _C.TEMPORARY, "casts_backward_bytes")
    _unsharded(instant, mem.unsharded.backward_start, "at the start of backward")
    return "start of backward: loss gradient beside all activations", instant


def _first_layers(ctx: TrainingContext, mem: StageMemory, outputs: int) -> tuple[str, _Instant]:
    instant = _base(mem, "inside the first layers' backward")
    _kept_gradients(ctx, mem, instant)
    instant.part("grad_buckets_bytes")
    if not ctx.in_backward_step and not grad_partitions_whole_step(ctx):
        instant.quantity("LM head gradient (made first in backward)", _C.GRADIENTS, "head_grads_bytes")
    instant.parts("activations_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(instant)
    instant.quantity("the recomputed layer's tensors", _C.ACTIVATIONS, "recompute_bytes")
    _kept_outputs(instant, outputs)
    instant.quantity("a layer's backward working set", _C.TEMPORARY, "working_bytes")
    instant.quantity("autocast weight copies alive in backward", _C.TEMPORARY, "casts_backward_bytes")
    instant.part("dequant_bytes")
    _unsharded(instant, mem.unsharded.first_layers, "in a layer's backward")
    return "first layers of backward: a recomputed layer and the gradient working set", instant


def _hook_step(mem: StageMemory, outputs: int) -> tuple[str, _Instant]:
    """``optimizer_in_backward``: the largest tensor stepped in its post-accumulate-grad hook while
    every layer's activations are still alive (the LM head's hook runs first in backward; the loss's
    logits tensors are freed by then, the loop's kept outputs are not). An upper bound when the
    largest tensor is a layer's or the embedding's (their hooks run later, with fewer activations)."""
    instant = _base(mem, "inside the largest tensor's in-backward step")
    instant.parts("grad_buckets_bytes", "activations_bytes", "non_layer_bytes", "head_side_bytes", "inputs_bytes")
    _kept_outputs(instant, outputs)
    instant.quantity("the largest tensor's gradient and its step temporaries", _C.TEMPORARY, "hook_step_bytes")
    _unsharded(instant, mem.unsharded.backward_start, "at the start of backward")
    return "in backward: the largest tensor's optimizer step beside all activations", instant


def _head_side_unless_recomputed(instant: _Instant) -> None:
    """The final norm's and the head's saved tensors in a layer's backward: freed by then (their
    backward runs first), as measured with whole-layer recompute; the no-recompute working set was
    fitted with them counted, so they stay there until that set is re-derived (docs/accuracy.md)."""
    if not instant.mem.recompute_bytes:
        instant.part("head_side_bytes")


def _kept_outputs(instant: _Instant, outputs: int) -> None:
    formula = instant.mem.logits.formula if instant.mem.logits is not None else ""
    instant.add("model outputs the loop keeps (logits, until backward returns)", _C.TEMPORARY, outputs, formula)


def _backward_end(ctx: TrainingContext, mem: StageMemory, kept_to_end: int) -> tuple[str, _Instant]:
    instant = _base(mem, "end of backward")
    _gradients_so_far(instant, ctx.in_backward_step, {})
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(instant)
    _kept_outputs(instant, kept_to_end)
    if mem.end_working_bytes is None:
        instant.quantity("a layer's backward working set", _C.TEMPORARY, "working_bytes")
    else:
        instant.add("the embedding's backward working set", _C.TEMPORARY, mem.end_working_bytes, "")
    instant.part("dequant_bytes")
    instant.quantity("the tied table's gradient and its in-backward step", _C.TEMPORARY, "hook_end_bytes")
    _unsharded(instant, mem.unsharded.end, "in the embedding's backward")
    return "end of backward: every gradient", instant


def _last_layer(ctx: TrainingContext, mem: StageMemory, kept_to_end: int, embedding: int) -> tuple[str, _Instant]:
    instant = _base(mem, "inside the first layer's backward (the last backward reaches)")
    # The MLP's output projection's gradient is made first in the layer's backward (its MLP peaks after).
    first = mem.layer_grads_bytes - (mem.mlp_out_grads_bytes if mem.recompute_bytes else 0)
    missing = {"the first layer's": first, "the input embedding's": embedding}
    _gradients_so_far(instant, ctx.in_backward_step, {} if grad_partitions_whole_step(ctx) else missing)
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(instant)
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


def _tied_backward(ctx: TrainingContext, mem: StageMemory, outputs: int, tied: int) -> tuple[str, _Instant]:
    """The tied embedding's backward: under FSDP (``tied`` 0; the gathered tail, the head's gradient,
    the embedding's, their sum and a reduce-scatter input are ``unsharded.end``) while the loop still
    holds the logits, the tied matrix's sharded gradient still to come; on one unsharded rank the
    head's contribution and the sum beside the embedding's (``tied`` bytes each)."""
    instant = _base(mem, "inside the tied embedding's backward")
    missing = {} if tied or grad_partitions_whole_step(ctx) else {"the tied matrix's": mem.head_grads_bytes}
    _gradients_so_far(instant, ctx.in_backward_step, missing)
    instant.parts("grad_buckets_bytes", "non_layer_bytes", "inputs_bytes")
    _head_side_unless_recomputed(instant)
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
        instant = _base(mem, "inside optimizer.step()")
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
    instant = _Instant(mem, "inside prepare_model_for_kbit_training")
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
