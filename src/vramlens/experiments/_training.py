"""The pieces of an experiment's training step: model, techniques, optimizer, data and loss.

The step is what transformers users write (``out = model(input_ids=ids, labels=ids);
out.loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)``): the model's
output (its logits) stays alive through backward, as the estimator's ``hf`` profile and the
simulator assume (``FrameworkProfile.keeps_logits``).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramlens._extras import require
from vramlens.errors import InputError
from vramlens.experiments.matrix import RunSpec, is_module_reference
from vramlens.experiments.techniques import TechniqueName

__all__ = ["LOSS_CHUNKS", "Trainee", "batches", "build_trainee", "compile_settings"]

#: Sequence chunks of ``chunked-loss`` (the estimator's hf profile assumes 8: ``chunked_loss_chunks``).
LOSS_CHUNKS = 8


@dataclass(kw_only=True)
class Trainee:
    """A model ready to train: ``step(ids)`` runs one optimizer step and returns the loss."""

    model: Any
    optimizers: list[Any]
    """Every optimizer (one per parameter with ``fused-optimizer``); their state is registered
    with the tracker."""
    step: Callable[[Any], float]
    vocab_size: int
    notes: list[str]


def _has(spec: RunSpec, name: TechniqueName) -> bool:
    return any(a.name is name for a in spec.techniques)


def _dtype(torch: Any, spec: RunSpec) -> Any:
    return torch.bfloat16 if _has(spec, TechniqueName.BF16) else torch.float32


def _hf_model(spec: RunSpec, torch: Any) -> tuple[Any, int]:
    """transformers' model of a catalog name / config (random weights) on the run's device."""
    from vramlens.model.resolve import load_model
    from vramlens.simulator.build import hf_config
    from vramlens.workload.options import AttentionImpl

    transformers = require("transformers", purpose="vramlens experiment")
    model_spec = load_model(spec.model if isinstance(spec.model, str) else dict(spec.model))
    config = hf_config(model_spec, AttentionImpl.SDPA)
    with warnings.catch_warnings(), torch.device(spec.device):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=_dtype(torch, spec))
    return model, int(model_spec.vocab_size)


def _user_model(spec: RunSpec, torch: Any) -> tuple[Any, int]:
    """A user's ``module:callable`` factory's model; its vocabulary from ``vocab_size`` or ``config.vocab_size``."""
    module_name, func_name = str(spec.model).split(":")
    try:
        factory = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as error:
        raise InputError(f"model: cannot import {spec.model!r} ({error})") from None
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model: {spec.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    vocab = getattr(model, "vocab_size", None) or getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int):
        raise InputError(f"model: {spec.model!r}'s module needs a vocab_size (or config.vocab_size) for its tokens")
    return model.to(device=spec.device, dtype=_dtype(torch, spec)), vocab


def _checkpointing(model: Any) -> str:
    """Activation checkpointing of every layer, transformers' way (non-reentrant)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x renamed the method
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise InputError("techniques: checkpoint needs a model with gradient_checkpointing_enable (transformers)")
    return "checkpoint: transformers activation checkpointing (non-reentrant) on every decoder layer"


def _optimizer(torch: Any, spec: RunSpec, params: list[Any]) -> Any:
    """torch's default implementation on the device: per-tensor on CPU, foreach on CUDA."""
    if _has(spec, TechniqueName.OPTIMIZER_8BIT):
        bnb = require("bitsandbytes", purpose="the 8bit-optimizer technique")
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    foreach = spec.device != "cpu"
    if spec.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2, foreach=foreach)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)


def _stepper(torch: Any, spec: RunSpec, model: Any) -> tuple[Callable[[], None], list[Any]]:
    """The optimizer step (a no-op with ``fused-optimizer``, whose hooks step in backward)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not _has(spec, TechniqueName.FUSED_OPTIMIZER):
        optimizer = _optimizer(torch, spec, params)

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step, [optimizer]
    # The PyTorch way (tutorial "optimizer step in backward"): one optimizer per parameter,
    # stepped by a hook as soon as the parameter's gradient is accumulated, which then frees it.
    per_param = {p: _optimizer(torch, spec, [p]) for p in params}

    def hook(parameter: Any) -> None:
        per_param[parameter].step()
        per_param[parameter].zero_grad(set_to_none=True)

    for parameter in params:
        parameter.register_post_accumulate_grad_hook(hook)
    return lambda: None, list(per_param.values())


def _chunked_loss(torch: Any, logits: Any, ids: Any) -> Any:
    """Mean next-token cross-entropy over :data:`LOSS_CHUNKS` sequence chunks, each up-cast to
    fp32 on its own (torchtune's ``CEWithChunkedOutputLoss``); labels shifted as transformers does."""
    labels = torch.nn.functional.pad(ids, (0, 1), value=-100)[..., 1:]
    total = logits.new_zeros((), dtype=torch.float32)
    for part, target in zip(logits.chunk(LOSS_CHUNKS, dim=1), labels.chunk(LOSS_CHUNKS, dim=1), strict=True):
        flat = part.reshape(-1, part.shape[-1]).float()
        total = total + torch.nn.functional.cross_entropy(flat, target.reshape(-1), ignore_index=-100, reduction="sum")
    return total / (labels != -100).sum()


def _loss_step(torch: Any, spec: RunSpec, model: Any, optimizer_step: Callable[[], None]) -> Callable[[Any], float]:
    chunked = _has(spec, TechniqueName.CHUNKED_LOSS)

    def step(ids: Any) -> float:
        if chunked:
            out = model(input_ids=ids)
            loss = _chunked_loss(torch, out.logits if hasattr(out, "logits") else out, ids)
        else:
            out = model(input_ids=ids, labels=ids)
            loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()
        value = float(loss.detach())
        del out, loss  # the outputs lived through backward, as in a user's loop
        optimizer_step()
        return value

    return step


def build_trainee(spec: RunSpec) -> Trainee:
    """The model with the run's techniques, its optimizer(s) and its step function."""
    torch = require("torch", purpose="vramlens experiment")
    torch.manual_seed(spec.seed)
    model, vocab = _user_model(spec, torch) if is_module_reference(spec.model) else _hf_model(spec, torch)
    model.train()
    notes = [_checkpointing(model)] if _has(spec, TechniqueName.CHECKPOINT) else []
    for name in (TechniqueName.DDP, TechniqueName.FSDP):
        if _has(spec, name):
            from vramlens.experiments.distributed import wrap_data_parallel

            model, note = wrap_data_parallel(torch, model, str(name))
            notes.append(note)
    optimizer_step, optimizers = _stepper(torch, spec, model)
    if spec.compiled:
        torch._dynamo.reset()  # compile afresh under this run's settings (the budget is read when compiling)
        model = torch.compile(model)
        budget = spec.memory_budget
        notes.append("compile: inductor" + ("" if budget is None else f", activation_memory_budget {budget:g}"))
    return Trainee(
        model=model,
        optimizers=optimizers,
        step=_loss_step(torch, spec, model, optimizer_step),
        vocab_size=vocab,
        notes=notes,
    )


@contextlib.contextmanager
def compile_settings(spec: RunSpec) -> Iterator[None]:
    """The compile memory budget in force while the run compiles (at its first step) and runs."""
    budget = spec.memory_budget
    if budget is None:
        yield
        return
    import torch._functorch.config as functorch_config

    with functorch_config.patch(activation_memory_budget=budget):
        yield


def batches(spec: RunSpec, vocab: int) -> list[Any]:
    """One ``[batch, seq]`` tensor of token ids per step, on the device: consecutive windows of the
    token file, else uniform random tokens (seeded)."""
    torch = require("torch", purpose="vramlens experiment")
    shape = (spec.batch, spec.seq)
    if spec.tokens is None:
        from vramlens.trace.ranks import rank_info

        generator = torch.Generator().manual_seed(spec.seed + rank_info().rank)  # each rank its own data
        return [torch.randint(0, vocab, shape, generator=generator).to(spec.device) for _ in range(spec.steps)]
    tokens = _read_tokens(Path(spec.tokens))
    span = spec.batch * spec.seq
    if len(tokens) < span:
        raise InputError(f"tokens: {spec.tokens!r} holds {len(tokens)} tokens; one batch needs {span}")
    out = []
    for step in range(spec.steps):
        start = (step * span) % (len(tokens) - span + 1)
        window = torch.as_tensor(tokens[start : start + span].astype("int64")).reshape(shape)
        if int(window.max()) >= vocab or int(window.min()) < 0:
            raise InputError(f"tokens: {spec.tokens!r} has ids outside the model's vocabulary [0, {vocab})")
        out.append(window.to(spec.device))
    return out


def _read_tokens(path: Path) -> Any:
    import numpy as np

    if not path.is_file():
        raise InputError(f"tokens: {str(path)!r} is not a file")
    if path.suffix == ".npy":
        try:  # mapped, not read: a header cannot make numpy allocate what it claims
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:
            raise InputError(f"tokens: {str(path)!r} is not a readable .npy file ({str(error)[:120]})") from None
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise InputError(f"tokens: {str(path)!r} must be a 1-D array of integers, got {array.dtype} {array.shape}")
        return array
    if path.suffix == ".bin":
        try:
            return np.memmap(path, dtype=np.uint16, mode="r")
        except (OSError, ValueError) as error:
            raise InputError(f"tokens: {str(path)!r} is not a readable .bin file ({str(error)[:120]})") from None
    raise InputError(f"tokens: {str(path)!r}; accepted: .npy (1-D integers) or .bin (uint16, nanoGPT's format)")
