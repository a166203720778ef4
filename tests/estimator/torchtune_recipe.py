"""Ground truth for torchtune's own single-device recipes: the peak live tensor bytes of two
steps of ``FullFinetuneRecipeSingleDevice.train()`` / ``LoRAFinetuneRecipeSingleDevice.train()``
(torchtune 0.6.1, ``recipes/*_finetune_single_device.py``) on a tiny Llama 3 built by
torchtune's own builder (random weights, nothing downloaded), tracked with vramlens'
``StorageTracker``.

The recipe object runs its own ``_setup_model`` (compile, activation checkpointing, the
offloading context, LoRA's trainable parameters), ``_setup_optimizer`` (optimizer in backward:
``training.register_optim_in_bwd_hooks``), the loss of the config (``CEWithChunkedOutputLoss``
and ``model.set_num_output_chunks``) and ``train()`` itself; only what reads files is replaced
(the checkpointer: the model's own random state dict; the tokenizer and dataset: rows of random
token ids in torchtune's batch format; the metric logger: nothing). Needs the [fidelity] extra
(torchtune, torchao); imported by tests only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hf_step import TINY_LLAMA


@dataclass(frozen=True, kw_only=True)
class TorchtuneRun:
    """One torchtune recipe configuration, expressed for both torchtune and a vramlens workload."""

    method: str = "full"
    lora_output: bool = False
    """``apply_lora_to_output``: a LoRA adapter on the output projection (the LM head)."""
    compile: bool = False
    optimizer_in_bwd: bool = False
    checkpointing: bool = False
    offloading: bool = False
    loss: str = "chunked"
    batch: int = 4
    seq: int = 128
    model: tuple[tuple[str, Any], ...] = tuple(TINY_LLAMA.items())
    """The model, as a transformers config (built with torchtune's builder of the same shape)."""

    def workload(self) -> dict[str, Any]:
        from vramlens.model.resolve import model_from_config

        workload: dict[str, Any] = {
            "model": model_from_config(dict(self.model)),
            "framework": "torchtune",
            "precision": "bf16",  # dtype: bf16 (every config): weights, gradients and states in bf16
            "method": self.method,
            "batch": self.batch,
            "seq": self.seq,
            "loss": self.loss,
            "optimizer_impl": "fused",  # optimizer: {_component_: torch.optim.AdamW, fused: True}
            "optimizer_in_backward": self.optimizer_in_bwd,
            "compile": self.compile,
            "recompute": ("offload" if self.offloading else "full") if self.checkpointing else "none",
        }
        if self.method == "lora":
            targets = ["q_proj", "v_proj", *(["lm_head"] if self.lora_output else [])]
            workload["lora"] = {"rank": 8, "alpha": 16, "targets": targets}
        return workload

    def _model_block(self) -> dict[str, Any]:
        """The config's ``model``: torchtune's Llama 3 builder (or its LoRA builder) of ``model``'s shape."""
        hf = dict(self.model)
        model: dict[str, Any] = {
            "vocab_size": hf["vocab_size"],
            "num_layers": hf["num_hidden_layers"],
            "num_heads": hf["num_attention_heads"],
            "num_kv_heads": hf["num_key_value_heads"],
            "embed_dim": hf["hidden_size"],
            "intermediate_dim": hf["intermediate_size"],
            "max_seq_len": hf["max_position_embeddings"],
        }
        if self.method == "lora":
            model.update(
                _component_="torchtune.models.llama3.lora_llama3",
                lora_attn_modules=["q_proj", "v_proj"],
                apply_lora_to_mlp=False,
                apply_lora_to_output=self.lora_output,
                lora_rank=8,
                lora_alpha=16,
            )
        else:
            model["_component_"] = "torchtune.models.llama3.llama3"
        return model

    def recipe_config(self) -> Any:
        """The recipe config (as a torchtune YAML would give it), minus what reads files."""
        from omegaconf import OmegaConf

        lora_only: dict[str, Any] = {}
        if self.method == "lora":  # every LoRA config has one; the LoRA recipe steps it unconditionally
            lora_only["lr_scheduler"] = {
                "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                "num_warmup_steps": 1,
            }
        loss = {
            "chunked": "torchtune.modules.loss.CEWithChunkedOutputLoss",
            "full": "torch.nn.CrossEntropyLoss",
        }[self.loss]
        return OmegaConf.create(
            {
                "output_dir": "/nonexistent",
                "device": "cpu",
                "dtype": "bf16",
                "seed": 0,
                "model": self._model_block(),
                "optimizer": {"_component_": "torch.optim.AdamW", "fused": True, "lr": 2e-5},
                "loss": {"_component_": loss},
                "batch_size": self.batch,
                "epochs": 1,
                "max_steps_per_epoch": 2,
                "gradient_accumulation_steps": 1,
                "optimizer_in_bwd": self.optimizer_in_bwd,
                "compile": self.compile,
                "enable_activation_checkpointing": self.checkpointing,
                "enable_activation_offloading": False,  # the recipe refuses it off CUDA; set below
                "resume_from_checkpoint": False,
                "checkpointer": {"model_type": "LLAMA3"},
                "clip_grad_norm": None,
                "log_every_n_steps": 1,
                **lora_only,
            }
        )


class _NoLogger:
    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Batches(list[dict[str, Any]]):
    """Two batches in torchtune's format (``padded_collate_sft``: ``tokens`` and ``labels``)."""

    class _Sampler:
        def set_epoch(self, epoch: int) -> None:
            pass

    sampler = _Sampler()


def _recipe_class(module: str, name: str) -> Any:
    """A recipe class, loaded from its file as ``tune run`` does (``torchtune/_cli/run.py``:
    ``ROOT / "recipes" / recipe.file_path``; the ``recipes`` directory is not an importable package)."""
    import importlib.util

    from torchtune._cli.run import ROOT

    if module not in sys.modules:
        spec = importlib.util.spec_from_file_location(module, ROOT / "recipes" / f"{module}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module])
    return getattr(sys.modules[module], name)


def _recipe(run: TorchtuneRun) -> Any:
    """The recipe object after its ``setup`` (files replaced as the module docstring says)."""
    import torch
    from torchtune import config, training

    cfg = run.recipe_config()
    if run.method == "lora":
        cls = _recipe_class("lora_finetune_single_device", "LoRAFinetuneRecipeSingleDevice")
    else:
        cls = _recipe_class("full_finetune_single_device", "FullFinetuneRecipeSingleDevice")
    recipe = cls(cfg)
    recipe._enable_activation_offloading = run.offloading
    with training.set_default_dtype(torch.bfloat16):
        state = config.instantiate(cfg.model).state_dict()  # the checkpoint: random weights
    recipe._metric_logger = _NoLogger()
    recipe._compile = run.compile
    if run.method == "lora":
        recipe._save_adapter_weights_only = False
        recipe._model = recipe._setup_model(
            cfg_model=cfg.model,
            enable_activation_checkpointing=run.checkpointing,
            enable_activation_offloading=run.offloading,
            compile_model=run.compile,
            base_model_state_dict={k: v for k, v in state.items() if "lora" not in k},
        )
        recipe._optimizer = recipe._setup_optimizer(cfg_optimizer=cfg.optimizer)
    else:
        recipe._model = recipe._setup_model(
            cfg_model=cfg.model,
            enable_activation_checkpointing=run.checkpointing,
            enable_activation_offloading=run.offloading,
            compile_model=run.compile,
            model_state_dict=state,
        )
        recipe._optimizer = recipe._setup_optimizer(cfg_optimizer=cfg.optimizer, optimizer_in_bwd=run.optimizer_in_bwd)
    recipe._loss_fn = config.instantiate(cfg.loss)
    if run.compile:
        recipe._loss_fn = training.compile_loss(recipe._loss_fn)
    if recipe._loss_fn.__class__.__name__ == "CEWithChunkedOutputLoss":
        recipe._model.set_num_output_chunks(recipe._loss_fn.num_output_chunks)
    vocab = dict(run.model)["vocab_size"]
    batches = _Batches()
    for _ in range(2):
        tokens = torch.randint(0, vocab, (run.batch, run.seq))
        batches.append({"tokens": tokens, "labels": tokens.clone()})
    recipe._dataloader = batches
    recipe._steps_per_epoch = 2
    recipe.global_step = 0
    scheduler = cfg.get("lr_scheduler", None)
    recipe._lr_scheduler = None if scheduler is None else recipe._setup_lr_scheduler(scheduler, 2, -1)
    recipe._profiler = recipe._setup_profiler(None)
    recipe.ignore_labels_cache = torch.full((run.batch, 1), recipe._loss_fn.ignore_index)
    recipe.save_checkpoint = lambda epoch: None
    return recipe


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torchtune with its warnings silenced (torchao's on import, torchtune's deprecations)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import_torchtune()
        yield


#: Functions torchtune 0.6.1 imports from ``torchao.quantization`` (``torchtune/training/quantization.py``,
#: for its quantize and QAT recipes) that torchao removed in 0.15 (replaced by config classes).
_REMOVED_IN_TORCHAO_015 = ("int4_weight_only", "int8_dynamic_activation_int4_weight")


def _removed_torchao_names() -> None:
    """Stand-ins, raising if called, for the torchao functions torchtune 0.6.1 imports but torchao
    0.17 no longer has. torchao must be 0.16 or 0.17: PEFT 0.21 refuses torchao below 0.16 (an
    ImportError whenever transformers' quantizers look for it) and torchao 0.18 moved
    ``torchao.dtypes.nf4tensor``, which torchtune's LoRA modules import. The fine-tuning recipes
    never call these two (torchtune's quantize and QAT recipes do)."""
    import torchao
    import torchao.quantization

    def stand_in(name: str) -> Any:
        def removed(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"torchao {torchao.__version__} has no {name} (removed in 0.15)")

        return removed

    for name in _REMOVED_IN_TORCHAO_015:
        if not hasattr(torchao.quantization, name):
            setattr(torchao.quantization, name, stand_in(name))


def import_torchtune() -> None:
    """Import torchtune without its side effect on the process: with ``hf_transfer`` installed
    (a dependency of torchtune) its ``__init__`` sets ``HF_HUB_ENABLE_HF_TRANSFER=1``, on which
    huggingface_hub (imported later by any test) raises a FutureWarning, an error under pytest's
    ``filterwarnings = error``. The variable is held at "0" while torchtune loads, then removed."""
    if "torchtune" in sys.modules:
        return
    key = "HF_HUB_ENABLE_HF_TRANSFER"
    before = os.environ.get(key)
    os.environ[key] = before if before is not None else "0"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _removed_torchao_names()
            import torchtune  # noqa: F401
    finally:
        if before is None:
            os.environ.pop(key, None)


class _Stream:
    """A CUDA stream's synchronization calls, as no-ops (CPU work is ordered already)."""

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self) -> None:
        return None


@contextlib.contextmanager
def cuda_like_offloading(tracker: Any) -> Iterator[None]:
    """torchtune's ``OffloadActivations`` (training/_activation_offloading.py) run on CPU with the
    memory behaviour of its CUDA path: its streams and events become no-ops, the copy it makes with
    ``torch.empty_like(activation, pin_memory=True, device="cpu")`` is host memory the tracker does
    not count (made with the tracker paused), and ``.to("cuda")`` on that copy in backward makes a
    new device tensor, which it counts. Everything else is torchtune's code: which tensors it
    offloads (``min_offload_size``, not the output head), and the forward stash of the last
    ``max_fwd_stash_size`` activations and the backward stash that keep device copies alive."""
    import torch

    class HostCopy(torch.Tensor):
        def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            with torch._C.DisableTorchFunctionSubclass():
                return torch.Tensor.clone(self)  # the device copy brought back

    empty_like = torch.empty_like

    def host_empty_like(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") != "cpu" or "pin_memory" not in kwargs:
            return empty_like(tensor, *args, **kwargs)
        kwargs.pop("pin_memory")
        with tracker.paused():
            return empty_like(tensor, *args, **kwargs).as_subclass(HostCopy)

    saved = (torch.cuda.default_stream, torch.cuda.Stream, torch.cuda.stream, torch.Tensor.record_stream)
    torch.cuda.default_stream = lambda *args, **kwargs: _Stream()  # type: ignore[assignment]
    torch.cuda.Stream = _Stream  # type: ignore[assignment,misc]
    torch.cuda.stream = lambda stream: contextlib.nullcontext()  # type: ignore[assignment]
    torch.Tensor.record_stream = lambda self, stream: None  # type: ignore[method-assign]
    torch.empty_like = host_empty_like
    try:
        yield
    finally:
        torch.cuda.default_stream, torch.cuda.Stream, torch.cuda.stream, torch.Tensor.record_stream = saved
        torch.empty_like = empty_like


def measure_torchtune(run: TorchtuneRun) -> int:
    """Peak live tensor bytes of the recipe's ``train()`` over two optimizer steps."""
    import torch

    from vramlens.trace.tracker import StorageTracker

    torch.manual_seed(0)
    tracker = StorageTracker()
    offloading = cuda_like_offloading(tracker) if run.offloading else contextlib.nullcontext()
    with _quiet(), offloading:
        recipe = _recipe(run)
        tracker.register([list(recipe._model.parameters()), list(recipe._model.buffers())])
        with tracker:
            recipe.train()
    if run.compile:
        torch._dynamo.reset()  # leave no traced torchtune layers behind for later compiles
    return tracker.peak


def compiled_layer_saved_per_token(run: TorchtuneRun) -> float:
    """Bytes per token one decoder layer of ``run``'s model keeps for backward when compiled as
    ``training.compile_model`` compiles it (Inductor), counted with saved-tensor hooks outside any
    tracker (parameters and buffers left out; every other saved tensor grows with the tokens)."""
    import torch

    torch.manual_seed(0)
    torch._dynamo.reset()  # frames other runs traced (an earlier compile: true recipe) would count against its cache
    with _quiet():
        from torchtune import config, training

        with training.set_default_dtype(torch.bfloat16):
            model = config.instantiate(run.recipe_config().model)
        training.compile_model(model, verbose=False)
        resident = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        kept: dict[int, int] = {}

        def pack(tensor: Any) -> Any:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in resident:
                kept[storage.data_ptr()] = storage.nbytes()
            return tensor

        hidden = torch.randn(run.batch, run.seq, dict(run.model)["hidden_size"], dtype=torch.bfloat16)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model.layers[0](hidden.requires_grad_())
        assert type(out.grad_fn).__name__ == "CompiledFunctionBackward", "the layer did not compile"
    return sum(kept.values()) / (run.batch * run.seq)
