"""Activation elements per token, counted by hooking module outputs of one fake forward pass.

The idea is the one in the guide "Visualize and understand GPU memory in PyTorch" (seed
``002``, section "Estimating Memory Requirements", subsection "Activations"): register a
forward hook on modules and sum the sizes of their outputs. Here it runs on the real
transformers model of any spec the simulator can build (fake CPU tensors, no weights), in
training mode with autograd on, for a ``batch x seq`` input, and hooks *leaf* modules only,
so that nothing is counted twice (the guide hooks every module: a decoder layer's output is
also its MLP's output, which is also ``down_proj``'s output).

The guide's heuristic, quoted from that subsection::

    A = 4.6894 x 10^-4 x N + 1.8494 x 10^6      (activations per token, N = parameters)
    Activation Memory = A x B x L x P           (B batch, L sequence length, P bytes per element)

Note on ``A``: the guide's hook appends ``output.numel() * output.element_size()``, so the
number it fits is bytes, not elements, of a float32 model (``from_pretrained`` default),
hooked on every module at ``seq = 1`` in eval mode. Rebuilding its Qwen2.5-1.5B example that
way gives exactly its 5,065,216 = 4 x 1,266,304 elements, of which 1,137,280 are leaf outputs.
``A x P`` therefore counts the element size twice; this module reports the formula as written
(``heuristic_bytes_per_token``) and the ratio of the counted bytes to it.

Hooked outputs are not what training keeps: autograd saves some inputs instead of outputs,
functions that are not modules (attention kernels, residual adds, the norms' fp32 upcasts,
the loss) save tensors no hook sees, and some hooked outputs are freed at once. So the same
forward also runs under :class:`~vramlens.trace.tracker.MemoryTracker`, and
``saved_bytes`` is what is still alive when it ends (with the loss computed from ``labels``,
as HF Trainer does): the activation memory backward actually needs, plus the outputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vramlens._extras import require
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.simulator.build import SimulationError, build_model, real_code_paths, torch_dtype
from vramlens.workload.load import load_workload
from vramlens.workload.spec import Workload

__all__ = [
    "HEURISTIC_INTERCEPT",
    "HEURISTIC_SLOPE",
    "HEURISTIC_SOURCE",
    "ActivationCount",
    "ModuleRow",
    "count_activations",
    "count_workload_activations",
    "heuristic_activations_per_token",
]

#: Slope of the guide's fit, activations per token per parameter.
HEURISTIC_SLOPE = 4.6894e-4
#: Intercept of the guide's fit, activations per token.
HEURISTIC_INTERCEPT = 1.8494e6
HEURISTIC_SOURCE = (
    "seed 002 'Visualize and understand GPU memory in PyTorch', section 'Estimating Memory Requirements' > "
    "'Activations': A = 4.6894e-4 x N + 1.8494e6 per token, Activation Memory = A x B x L x P"
)


def heuristic_activations_per_token(num_parameters: int) -> float:
    """The guide's ``A`` for a model of ``num_parameters`` parameters (its "activations" per token)."""
    return HEURISTIC_SLOPE * num_parameters + HEURISTIC_INTERCEPT


@dataclass(frozen=True, kw_only=True)
class ModuleRow:
    """Outputs of one leaf module (for decoder-layer modules: summed over every layer)."""

    name: str
    """Path inside a decoder layer (``self_attn.q_proj``) or, outside the layers, the full module path."""
    module_type: str
    """Class name, e.g. ``Linear``."""
    in_layers: bool
    """True for modules of the decoder layers."""
    calls: int
    """Forward calls hooked (one per layer for layer modules)."""
    elements: int
    """Output elements over the whole ``batch x seq`` forward."""
    nbytes: int
    """Output bytes over the whole forward, at the outputs' own dtypes."""


@dataclass(frozen=True, kw_only=True)
class ActivationCount:
    """Hooked leaf-module outputs of one training forward, the bytes it keeps alive, and the guide's heuristic.

    Totals are over the ``batch x seq`` forward; ``*_per_token`` properties divide by
    ``tokens``. Bytes are raw tensor bytes (no allocator rounding).
    """

    model: str
    batch: int
    seq: int
    precision: str
    attention: str
    num_parameters: int
    """Parameters of the built model (a tied embedding and head counted once), the guide's ``N``."""
    activation_bytes: int
    """Bytes per activation element of the compute dtype, the guide's ``P``."""
    rows: tuple[ModuleRow, ...]
    """Per leaf module, in first-call order."""
    per_layer_elements: tuple[int, ...]
    """Output elements of each decoder layer's leaf modules (empty when no layer stack was found)."""
    saved_bytes: int
    """Tensor bytes still alive at the end of forward beyond weights, buffers and inputs:
    what autograd saved for backward plus the outputs (logits, loss)."""
    output_bytes: int
    """The part of ``saved_bytes`` held by the model's outputs (logits, loss)."""

    @property
    def tokens(self) -> int:
        """Tokens in the forward: ``batch x seq``."""
        return self.batch * self.seq

    @property
    def elements(self) -> int:
        """Output elements of all leaf modules."""
        return sum(row.elements for row in self.rows)

    @property
    def nbytes(self) -> int:
        """Output bytes of all leaf modules."""
        return sum(row.nbytes for row in self.rows)

    @property
    def elements_per_token(self) -> float:
        """Leaf-module output elements per token."""
        return self.elements / self.tokens

    @property
    def bytes_per_token(self) -> float:
        """Leaf-module output bytes per token, at the outputs' dtypes."""
        return self.nbytes / self.tokens

    @property
    def by_module_type(self) -> dict[str, int]:
        """Output elements per module class (``Linear``, ``LlamaRMSNorm``, ...), whole forward."""
        totals: dict[str, int] = {}
        for row in self.rows:
            totals[row.module_type] = totals.get(row.module_type, 0) + row.elements
        return totals

    @property
    def non_layer_elements(self) -> int:
        """Output elements of modules outside the decoder layers (embedding, final norm, lm_head, ...)."""
        return sum(row.elements for row in self.rows if not row.in_layers)

    @property
    def saved_bytes_per_token(self) -> float:
        """Bytes alive at the end of forward (saved for backward, plus outputs) per token."""
        return self.saved_bytes / self.tokens

    @property
    def heuristic_per_token(self) -> float:
        """The guide's ``A`` for this model's parameter count."""
        return heuristic_activations_per_token(self.num_parameters)

    @property
    def heuristic_bytes_per_token(self) -> float:
        """The guide's activation memory per token, ``A x P``, in bytes."""
        return self.heuristic_per_token * self.activation_bytes

    @property
    def heuristic_elements_per_token(self) -> float:
        """``A / 4``: the guide's ``A`` read as what it measured, float32 bytes, hence elements per token
        (of every module, nested ones included; see the module docstring)."""
        return self.heuristic_per_token / 4

    @property
    def heuristic_source(self) -> str:
        """Where the heuristic comes from, and the formula."""
        return HEURISTIC_SOURCE

    @property
    def heuristic_ratio(self) -> float:
        """Counted output bytes per token over the heuristic's bytes per token."""
        return self.bytes_per_token / self.heuristic_bytes_per_token

    @property
    def saved_ratio(self) -> float:
        """Bytes alive at the end of forward per token over the heuristic's bytes per token."""
        return self.saved_bytes_per_token / self.heuristic_bytes_per_token

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: the fields, the per-token figures (elements, bytes) and the heuristic."""
        return {
            "model": self.model,
            "batch": self.batch,
            "seq": self.seq,
            "precision": self.precision,
            "attention": self.attention,
            "tokens": self.tokens,
            "num_parameters": self.num_parameters,
            "elements_per_token": self.elements_per_token,
            "bytes_per_token": self.bytes_per_token,
            "non_layer_elements_per_token": self.non_layer_elements / self.tokens,
            "per_layer_elements_per_token": [n / self.tokens for n in self.per_layer_elements],
            "by_module_type": self.by_module_type,
            "modules": [vars(row) for row in self.rows],
            "saved_bytes_per_token": self.saved_bytes_per_token,
            "output_bytes_per_token": self.output_bytes / self.tokens,
            "heuristic": {
                "activations_per_token": self.heuristic_per_token,
                "activation_bytes": self.activation_bytes,
                "bytes_per_token": self.heuristic_bytes_per_token,
                "elements_per_token_if_fp32_bytes": self.heuristic_elements_per_token,
                "ratio": self.heuristic_ratio,
                "saved_ratio": self.saved_ratio,
                "source": self.heuristic_source,
            },
        }


def count_activations(
    model: str | ModelSpec | Mapping[str, Any],
    *,
    batch: int | str = 1,
    seq: int | str = 2048,
    precision: str = "bf16",
    attention: str = "sdpa",
) -> ActivationCount:
    """Count the activations of one training forward of ``model`` (a name, config path/dict or spec).

    ``seq`` also accepts ``8k``; bad values are one-line :class:`~vramlens.errors.InputError`.
    """
    spec = load_model(dict(model) if isinstance(model, Mapping) else model)
    workload = load_workload(
        {"model": spec, "mode": "train", "batch": batch, "seq": seq, "precision": precision, "attention": attention}
    )
    return count_workload_activations(spec, workload)


def count_workload_activations(spec: ModelSpec, workload: Workload) -> ActivationCount:
    """Count the activations of one training forward of a resolved workload (batch, seq, precision, attention, LoRA)."""
    require("torch", purpose="vramlens activations")
    require("transformers", purpose="vramlens activations")
    from vramlens.resolve.context import resolve_training
    from vramlens.simulator._run import _failure

    ctx = resolve_training(spec, workload)
    try:
        with real_code_paths():
            return _run(ctx)
    except SimulationError:
        raise
    except Exception as error:  # any failure inside foreign model code
        raise _failure(spec, error) from None


def _run(ctx: Any) -> ActivationCount:
    """Build the model of a :class:`~vramlens.resolve.context.TrainingContext`, hook it, run one forward."""
    torch = require("torch", purpose="vramlens activations")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vramlens.trace.tracker import MemoryTracker

    spec, workload = ctx.spec, ctx.workload
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    dtype = torch_dtype(workload.precision, ctx.frozen_bytes)
    model = build_model(spec, workload, dtype=dtype, attention=ctx.attention, fake_mode=fake_mode)
    model.train()
    collector = _Collector(_layer_stack(torch, model, spec.num_layers))
    handles = [
        module.register_forward_hook(collector.hook(name, type(module).__name__))
        for name, module in model.named_modules()
        if next(iter(module.children()), None) is None
    ]
    tracker = MemoryTracker(clock="event")
    tracker.register_model(model)
    try:
        saved, outputs = _forward(torch, model, ctx, fake_mode, tracker)
    finally:
        tracker.close()
        for handle in handles:
            handle.remove()
    return ActivationCount(
        model=spec.name,
        batch=workload.batch,
        seq=workload.seq,
        precision=workload.precision.value,
        attention=ctx.attention.value,
        num_parameters=sum(p.numel() for p in model.parameters()),
        activation_bytes=ctx.compute_bytes,
        rows=collector.rows(),
        per_layer_elements=tuple(collector.per_layer),
        saved_bytes=saved,
        output_bytes=outputs,
    )


def _forward(torch: Any, model: Any, ctx: Any, fake_mode: Any, tracker: Any) -> tuple[int, int]:
    """Run one forward with the loss; return (bytes alive at its end beyond the start, bytes of outputs)."""
    workload = ctx.workload
    with fake_mode:
        ids = torch.randint(0, ctx.spec.vocab_size, (workload.batch, workload.seq))
        tracker.register(ids, "inputs")
        before = tracker.current
        amp = torch.autocast("cpu", dtype=torch_dtype(workload.precision, 2)) if ctx.autocast else None
        with tracker, torch.enable_grad():
            with amp if amp is not None else contextlib.nullcontext():
                out = model(input_ids=ids, labels=ids)
            if amp is not None:  # accelerate's convert_outputs_to_fp32, as in simulate/train.py
                out["logits"] = out["logits"].float()
            saved = tracker.current - before
            storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in (out.logits, out.loss)}
        del out
    return saved, sum(storages.values())


def _layer_stack(torch: Any, model: Any, num_layers: int) -> str | None:
    """Path of the ``ModuleList`` holding the decoder layers (the first one of ``num_layers`` modules)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return str(name)
    return None


class _Collector:
    """Forward hooks' tallies: per leaf module (layer modules merged by path inside the layer) and per layer."""

    def __init__(self, layer_stack: str | None) -> None:
        self._prefix = f"{layer_stack}." if layer_stack is not None else None
        self._tally: dict[tuple[str, bool], list[int]] = {}
        self._types: dict[tuple[str, bool], str] = {}
        self.per_layer: list[int] = []

    def hook(self, name: str, module_type: str) -> Callable[[Any, Any, Any], None]:
        """A forward hook adding the output sizes of module ``name`` to its row (and layer)."""
        torch = require("torch", purpose="vramlens activations")
        from torch.utils._pytree import tree_flatten

        layer, key = self._place(name)
        self._types.setdefault(key, module_type)

        def record(module: Any, inputs: Any, output: Any) -> None:
            flat, _ = tree_flatten(output)
            tensors = [item for item in flat if isinstance(item, torch.Tensor)]
            elements = sum(int(t.numel()) for t in tensors)
            tally = self._tally.setdefault(key, [0, 0, 0])
            tally[0] += 1
            tally[1] += elements
            tally[2] += sum(int(t.numel()) * t.element_size() for t in tensors)
            if layer is not None:
                self.per_layer.extend([0] * (layer + 1 - len(self.per_layer)))
                self.per_layer[layer] += elements

        return record

    def _place(self, name: str) -> tuple[int | None, tuple[str, bool]]:
        if self._prefix is not None and name.startswith(self._prefix):
            index, _, rest = name[len(self._prefix) :].partition(".")
            if index.isdigit():
                return int(index), (rest, True)
        return None, (name, False)

    def rows(self) -> tuple[ModuleRow, ...]:
        """The tallies as rows, in first-call order."""
        return tuple(
            ModuleRow(
                name=name,
                module_type=self._types[(name, in_layers)],
                in_layers=in_layers,
                calls=calls,
                elements=elements,
                nbytes=nbytes,
            )
            for (name, in_layers), (calls, elements, nbytes) in self._tally.items()
        )
