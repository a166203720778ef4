"""A training step as the allocator sees it: the requests of :class:`StepShape`, in code order.

Order follows an eager PyTorch step (transformers' modules, ``loss.backward()``,
``optimizer.step()``, ``zero_grad(set_to_none=True)``), as the simulator records it:

* load: the cuBLAS workspace, then every resident weight (DDP's gradient buckets are left out:
  persistent and in segments of their own, they never meet another request);
* forward, layer by layer: the gathered unit (sharded parameters), autocast weight copies, the
  saved activations, the layer's transient working set, the next hidden state (a LoRA layer of the
  families :mod:`vramlens.estimator.layer_script` describes: its forward in code order instead);
  then the final norm's output, the head's weight copy and the loss (:mod:`vramlens.estimator.loss_pattern`);
* backward: the head's first gradient, then (first backward only) the autograd thread's own cuBLAS
  workspace, held to the end; layers in reverse (a trained embedding tied to the head: autograd holds the head's
  gradient contribution from the head's backward to the embedding's, where it is summed with the
  embedding's own into a new tensor, the gradient): the recomputed layer (checkpointing), the gradient working set,
  the layer's gradients (stepped and freed at once with an optimizer in backward), then its saved
  tensors and weight copies are freed; the embedding's gradient last;
* optimizer step: the moments (created by the first step), the step's temporaries (foreach: one
  copy of every tensor at once; per-tensor: two copies of one tensor at a time), then the
  gradients are freed.

With sharded parameters each request is made on the stream the code makes it on
(:mod:`vramlens.allocator.streams`): FSDP2 all-gathers a unit into a flat output on its all-gather
stream and copies it out into the parameters on the compute stream (in forward the output lives
until the next unit's copy-out, in backward only until its own, the next unit's all-gather being
prefetched), keeps one reduce-scatter input on the compute stream, and makes each unit's sharded
gradient (the reduce-scatter output, or its cast to the parameters' dtype) on the reduce-scatter
stream; FSDP1 and ZeRO-3 make the gathered unit itself on the all-gather stream. A stream's freed
blocks serve only that stream's later requests.

Two steps are written (the first creates the optimizer state, the second is the steady state),
with at most two micro-steps of gradient accumulation each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramlens.allocator.pattern import Pattern
from vramlens.allocator.streams import Stream
from vramlens.estimator.layer_script import write_steps
from vramlens.estimator.loss_pattern import LossScript
from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES
from vramlens.estimator.step_fsdp2 import prefetched, unshard
from vramlens.estimator.step_layers import working_pieces
from vramlens.estimator.step_shape import StepShape

__all__ = ["step_pattern"]


@dataclass
class _Forward:
    """What a forward leaves for its backward (allocation keys)."""

    at_end: list[int]
    kept: list[list[int]] = field(default_factory=list)
    """Each layer's saved tensors (and weight copies kept for its backward)."""
    head: list[int] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)
    """The loss's live tensors by name."""


class _Writer:
    """Writes the events of ``layers`` decoder layers of ``shape`` into one pattern."""

    def __init__(self, shape: StepShape, loss: LossScript, layers: int, into: Pattern) -> None:
        self.shape, self.loss, self.layers = shape, loss, layers
        self.p = into
        self.grads: list[int] = []
        self.states_made = False
        self.held = -1  # FSDP2: the all-gather output kept for the next copy-out
        self.tail: list[int] = []  # FSDP2: the tail unit's parameters, gathered from forward into backward
        self.reduce_input = -1  # FSDP2: the last reduce-scatter input (one kept)
        self.micro = 0
        self.accumulated: dict[int, list[int]] = {}  # FSDP2 without sync: unsharded gradients by unit
        self.released: list[int] = []  # a scripted layer's tensors freed once its output exists
        self.autograd_workspace = False  # the autograd thread's cuBLAS workspace is made

    def _kind(self, layer: int) -> int:
        return layer % len(self.shape.layer_trained)

    def _layer_forward(self, layer: int) -> tuple[list[int], int]:
        """A layer's saved tensors, with PEFT's adapter sums where they happen: the base output
        (``result = base(x)``) before the adapter's input copy; after its ``lora_A`` output the
        ``lora_B`` output, its scaled copy, the promoted sum, the result cast back; eager attention's
        score chain in place of the tensors it keeps; returns the keys and the forward working set
        left for the end of the layer (bytes)."""
        s, p = self.shape, self.p
        kind = s.saved_kind[layer] if layer < len(s.saved_kind) else layer % len(s.saved)
        script = s.forward_scripts[kind] if kind < len(s.forward_scripts) else None
        if script is not None:  # the layer's forward in code order, its transients with it
            kept, self.released = script.write(p)
            return kept, 0
        sums = s.adapter_sums[kind] if kind < len(s.adapter_sums) else ()
        chain = s.eager_chains[kind] if kind < len(s.eager_chains) else None
        replaced = chain.replaced if chain is not None else ()
        a, d = s.compute_bytes, s.adapter_bytes
        bases: dict[int, int] = {}
        keys: list[int] = []
        for position, nbytes in enumerate(s.saved[kind]):
            for number, (start, _, out) in enumerate(sums):
                if start == position:
                    bases[number] = p.alloc(out * a)
            if position not in replaced:
                keys.append(p.alloc(nbytes))
            elif chain is not None and position == replaced[0]:  # its kept tensors stand for the parts'
                keys += write_steps(p, chain.steps)
            for number, (_, end, out) in enumerate(sums):
                if end == position + 1:
                    made = p.alloc(out * d)
                    scaled = p.alloc(out * d)
                    p.free(made)
                    total = p.alloc(out * d)
                    p.free(scaled)
                    p.free(bases.pop(number, -1))
                    p.temporary(out * a)
                    p.free(total)
        largest = max((out * (a + 2 * d) for _, _, out in sums), default=0)
        return keys, max(0, s.forward_working - largest)

    def trained_tensors(self) -> list[int]:
        """Elements of every trained tensor in the model's parameter order, which is the optimizer's:
        the embedding, the layers, the head (``model.parameters()`` of a transformers model)."""
        s = self.shape
        found = [t for i in range(self.layers) for t in s.layer_trained[self._kind(i)]]
        first = list(s.edge_trained[:1]) if s.embedding_trained else []
        return first + found + list(s.edge_trained[len(first) :]) + list(s.extra_trained)

    def load(self) -> None:
        p, s = self.p, self.shape
        p.alloc(CUBLAS_WORKSPACE_BYTES)
        for nbytes in s.edge_params[:1]:
            p.alloc(nbytes)
        for i in range(self.layers):
            for nbytes in s.layer_params[self._kind(i)]:
                p.alloc(nbytes)
        for nbytes in s.edge_params[1:]:
            p.alloc(nbytes)
        if s.adapter_params:
            for elements in self.trained_tensors():
                p.alloc(elements * s.param_bytes)

    def _grad(self, elements: int) -> None:
        """A gradient appears; with an optimizer in backward it is stepped and freed at once. With
        sharded parameters it is one unit's flat reduce-scatter output on the reduce-scatter stream,
        cast to the gradients' dtype on ``grad_stream`` when the reduce dtype differs."""
        s, p = self.shape, self.p
        if s.gather_layer:
            out = p.alloc(elements * s.reduce_bytes // s.grads_sharded, Stream.REDUCE_SCATTER)
            key = out
            if s.reduce_bytes != s.grad_bytes:
                key = p.alloc(elements * s.grad_bytes // s.grads_sharded, s.grad_stream)
                p.free(out)
        else:
            key = p.alloc(elements * s.grad_bytes // s.grads_sharded)
        if s.in_backward:
            if not self.states_made:
                for _ in range(s.moments):
                    p.alloc(elements * s.state_bytes // s.states_sharded)
            p.free(key)
        else:
            self.grads.append(key)

    def _script(self, steps: tuple[tuple[str, str, int], ...], names: dict[str, int]) -> None:
        for op, name, nbytes in steps:
            if op == "+":
                names[name] = self.p.alloc(nbytes)
            elif name in names:
                self.p.free(names.pop(name))

    def forward(self) -> _Forward:
        """One micro-step's forward, up to the loss."""
        p, s = self.p, self.shape
        out = _Forward(at_end=[p.alloc(s.inputs)])
        copy_out = s.gather_copy_out
        self.held = -1
        if s.gather_embedding:  # the embedding's own unit, resharded after its forward
            params, self.held = unshard(p, self.held, s.gather_embedding, (s.gather_embedding,))
            hidden = p.alloc(s.hidden)
            p.free_all(params)
        elif copy_out and s.gather_tail and s.tied:  # the tied tail, gathered at the embedding and kept
            self.tail, self.held = unshard(p, self.held, s.gather_tail, s.tail_tensors)
            hidden = p.alloc(s.hidden)
        else:
            hidden = p.alloc(s.hidden)
        gathered: list[int] = [] if copy_out else [p.alloc(s.gather_edges, Stream.ALL_GATHER)]
        cache: list[int] = []
        for i in range(self.layers):
            if copy_out:
                gathered.append(-1)
                params, self.held = unshard(p, self.held, s.gather_layer, s.unsharded_layer[self._kind(i)])
            else:
                gathered.append(p.alloc(s.gather_layer, Stream.ALL_GATHER))
            casts = [p.alloc(c) for c in s.casts]
            layer, working_bytes = self._layer_forward(i)
            scores = write_steps(p, s.score_chain)  # the probabilities stay to the layer's end
            working = [p.alloc(piece) for piece in working_pieces(working_bytes, s.widths or (s.hidden,))]
            p.temporary(s.dequant)
            p.free_all(working)
            p.free_all(scores)
            new_hidden = p.alloc(s.hidden)
            p.free_all(self.released)
            p.free(hidden)
            hidden = new_hidden
            if copy_out:
                p.free_all(params)  # resharded after its forward
                gathered.pop()
            elif len(gathered) > 2:
                p.free(gathered.pop(1))
            (layer if s.casts_kept else cache).extend(casts)
            out.kept.append(layer)
        if copy_out:
            if s.gather_tail and not s.tied:
                self.tail, self.held = unshard(p, self.held, s.gather_tail, s.tail_tensors)
            if not s.loss_in_model:
                p.free(self.held)  # the root's post-forward frees the last all-gather output
        else:
            p.free_all(gathered[1:])
        out.at_end += [hidden, p.alloc(s.non_layer), *gathered[:1]]
        out.head = [p.alloc(s.head_cast)]
        self._script(self.loss.forward, out.names)
        if copy_out and s.loss_in_model:
            p.free(self.held)
        self.held = -1
        p.free_all(cache)  # the autocast cache is cleared when the forward's autocast region exits
        return out

    def _reduce(self, unsharded: list[int], elements: int, unit: int = -1) -> None:
        """FSDP2's post-backward reduce of one unit: the previous unit's reduce-scatter input
        freed (``reduce_scatter_states``, one kept), this unit's made on the compute stream, the
        unsharded gradients freed, the sharded gradient made on the reduce-scatter stream. Under
        gradient accumulation without sync (``no_sync``) the first micro-step keeps the unsharded
        gradients instead, and the last adds its own into them (in place) before reducing."""
        p, s = self.p, self.shape
        if s.no_sync and self.micro == 0:
            self.accumulated[unit] = unsharded
            return
        if s.no_sync:
            p.free_all(unsharded)
            unsharded = self.accumulated.pop(unit, [])
        p.free(self.reduce_input)
        self.reduce_input = p.alloc(elements * s.reduce_bytes)
        p.free_all(unsharded)
        self._grad(elements)

    def backward(self, out: _Forward, *, grads: bool) -> None:
        """One micro-step's backward; ``grads``: gradients are created (the first micro-step)."""
        p, s = self.p, self.shape
        copy_out = s.gather_copy_out
        self.reduce_input = -1
        self._script(self.loss.backward, out.names)
        head_grad = -1
        if copy_out and grads and (s.head_trained or (s.tied and s.embedding_trained)):
            head_grad = p.alloc(s.edge_trained[-1] * s.unsharded_bytes)  # the head's unsharded gradient
        tied = p.alloc(s.edge_trained[0] * s.grad_bytes // s.grads_sharded) if s.tied_grads else -1
        if head_grad >= 0 or tied >= 0:
            self._autograd_workspace()
        dhidden = p.alloc(s.hidden) if s.below_head or copy_out else -1
        self._autograd_workspace()
        if grads and s.head_trained and not copy_out:
            self._grad(s.edge_trained[-1])
        self._script((("-", "dlogits", 0),), out.names)
        p.free_all(out.head)
        if copy_out:  # the tail's pre-backward prefetches the last layer; its post-backward reduces
            self.held = p.alloc(s.gather_layer if self.layers else s.gather_embedding, Stream.ALL_GATHER)
            if not s.tied:
                p.free_all(self.tail)
                if grads and s.head_trained:
                    self._reduce([head_grad], s.edge_trained[-1] + s.tail_norm, self.layers + 1)
        for i in reversed(range(self.layers)):
            if not (s.below_head or copy_out):  # only the head trains: no layer's backward runs
                continue
            if copy_out:  # copy-out, the output freed, the next unit (or the embedding) prefetched
                gathered = prefetched(p, self.held, s.unsharded_layer[self._kind(i)])
                self.held = p.alloc(s.gather_layer if i else s.gather_embedding, Stream.ALL_GATHER)
                unsharded = [p.alloc(g) for g in s.unsharded_grads[self._kind(i)]] if grads else []
            else:
                gathered = [p.alloc(s.gather_layer, Stream.ALL_GATHER), p.alloc(s.gather_layer_grads)]
                unsharded = []
            recomputed = [p.alloc(nbytes) for nbytes in s.recomputed]
            working = [p.alloc(piece) for piece in working_pieces(s.working, s.widths or (s.hidden,))]
            p.temporary(s.dequant)
            if grads and copy_out:
                p.free_all(gathered)  # resharded after backward, before the reduce
                self._reduce(unsharded, sum(s.layer_trained[self._kind(i)]), i)
            elif grads:
                for elements in s.layer_trained[self._kind(i)]:
                    self._grad(elements)
            p.free_all(out.kept[i])
            p.free_all(recomputed)
            new_dhidden = p.alloc(s.hidden)
            p.free(dhidden)
            dhidden = new_dhidden
            p.free_all(working)
            p.free_all(gathered)
        if copy_out:
            self._edges_backward(grads, head_grad)
        else:
            self._embedding_grads(grads, tied)
        for name in list(out.names):
            p.free(out.names.pop(name))
        p.free(dhidden)
        p.free_all(out.at_end)

    def _autograd_workspace(self) -> None:
        """The autograd engine's device thread takes a cuBLAS handle of its own, and with it a
        workspace of its own (one per handle and stream: ``setWorkspaceForHandle``,
        CublasHandlePool.cpp), at the first backward's first matmul, right after that matmul's
        output (the head's first gradient); held to the end of the run (:mod:`vramlens.simulator._blas`)."""
        if not self.autograd_workspace:
            self.p.alloc(CUBLAS_WORKSPACE_BYTES)
            self.autograd_workspace = True

    def _embedding_grads(self, grads: bool, tied: int) -> None:
        """The end of a backward without FSDP2: the embedding's gradient (tied: its contribution
        summed out of place with the head's ``tied`` one, which is then freed), then the rest."""
        p, s = self.p, self.shape
        if s.tied_grads:
            own = p.alloc(s.edge_trained[0] * s.grad_bytes // s.grads_sharded)
            if grads:
                self._grad(s.edge_trained[0])
            else:
                p.temporary(s.edge_trained[0] * s.grad_bytes // s.grads_sharded)
            p.free_all([tied, own])
        elif grads and s.embedding_trained:
            self._grad(s.edge_trained[0])
        for elements in s.extra_trained if grads else ():
            self._grad(elements)

    def _edges_backward(self, grads: bool, head_grad: int) -> None:
        """FSDP2: the embedding's backward (its own unit, prefetched; or the tied tail, kept since
        forward, whose gradient sums the head's and the embedding's), then the root's final
        callback frees the last reduce-scatter input."""
        p, s = self.p, self.shape
        trained = grads and s.embedding_trained
        if s.gather_embedding:
            params, self.held = prefetched(p, self.held, (s.gather_embedding,)), -1
            grad = p.alloc(s.edge_trained[0] * s.unsharded_bytes) if trained else -1
            p.free_all(params)
            if trained:
                self._reduce([grad], s.edge_trained[0], self.layers)
        elif s.tied:
            p.free(self.held)
            self.held = -1
            grad = p.alloc(s.edge_trained[-1] * s.unsharded_bytes) if trained else -1
            total = p.alloc(s.edge_trained[-1] * s.unsharded_bytes) if trained else -1
            p.free_all([head_grad, grad])
            p.free_all(self.tail)
            if trained:
                self._reduce([total], s.edge_trained[-1] + s.tail_norm, self.layers + 1)
        p.free(self.held)
        self.held = -1
        p.free(self.reduce_input)
        self.reduce_input = -1

    def optimizer(self) -> None:
        p, s = self.p, self.shape
        if s.in_backward:
            self.states_made = True
            return
        tensors = self.trained_tensors()
        master = p.alloc(sum(tensors) * 4 // s.states_sharded if s.master_bytes else 0)
        if not self.states_made:
            for elements in tensors:
                for _ in range(s.moments):
                    p.alloc(elements * s.state_bytes // s.states_sharded)
            self.states_made = True
        if s.foreach:
            copies = [p.alloc(e * s.state_bytes // s.states_sharded) for e in tensors]
            p.free_all(copies)
        elif s.per_tensor_copies:
            for elements in tensors:
                pair = [p.alloc(elements * s.state_bytes // s.states_sharded) for _ in range(2)]
                p.free_all(pair)
        p.free(master)
        p.free_all(self.grads)


def step_pattern(
    shape: StepShape, loss: LossScript, *, layers: int, micro_steps: int = 1, into: Pattern | None = None
) -> Pattern:
    """Load, then two optimizer steps of ``micro_steps`` micro-steps each, for ``layers`` layers,
    written into ``into`` (a new :class:`Pattern` by default; a replaying one keeps only the peaks)."""
    writer = _Writer(shape, loss, layers, Pattern() if into is None else into)
    writer.load()
    for _ in range(2):
        for micro in range(min(micro_steps, 2)):
            writer.micro = micro
            writer.backward(writer.forward(), grads=micro == 0 or shape.no_sync)
        writer.optimizer()
    return writer.p
