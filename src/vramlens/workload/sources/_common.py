"""Tables and small mappers more than one reader uses: HF optimizer names, attention names,
precision from dtype words, ignore lists, and the walk that lists not-modelled keys."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from vramlens.workload.sources._mapping import MappingBuilder

__all__ = [
    "HF_ATTENTION",
    "HF_OPTIMIZERS",
    "ignored",
    "list_leftovers",
    "map_hf_optimizer",
]

#: transformers ``TrainingArguments.optim`` (``OptimizerNames``) -> (optimizer, implementation or None).
#: ``adamw_torch`` builds ``torch.optim.AdamW`` without ``fused``, which picks the foreach kernels on
#: CUDA (``torch.optim.optimizer._default_to_fused_or_foreach``); ``adamw_torch_fused`` passes
#: ``fused=True`` (transformers ``Trainer.get_optimizer_cls_and_kwargs``).
HF_OPTIMIZERS: Final[dict[str, tuple[str, str | None]]] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_apex_fused": ("adamw", "fused"),
    "adamw_hf": ("adamw", "per-tensor"),
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
    "adamw_torch_4bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("paged-adamw-8bit", None),
    "paged_adamw_32bit": ("paged-adamw", None),
    "paged_adamw": ("paged-adamw", None),
    "adafactor": ("adafactor", None),
    "sgd": ("sgd", None),
    "lion_32bit": ("lion", None),
}
_NOT_EXACT: Final = {"adamw_torch_4bit": "torchao 4-bit AdamW state, read as 8-bit (larger)"}

#: ``attn_implementation`` values -> workload attention.
HF_ATTENTION: Final[dict[str, str]] = {
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "sdpa": "sdpa",
    "eager": "eager",
}


def map_hf_optimizer(out: MappingBuilder, key: str, name: Any) -> None:
    """Set optimizer (and implementation) from a transformers ``optim`` name, or list it as not modelled."""
    text = str(name).strip().lower()
    if text not in HF_OPTIMIZERS:
        out.not_modelled(key, name, "no memory model for this optimizer; the default adamw stands in")
        return
    optimizer, impl = HF_OPTIMIZERS[text]
    out.set("optimizer", optimizer, key, shown=name, why=_NOT_EXACT.get(text, ""))
    if impl is not None:
        out.set("optimizer_impl", impl, key, shown=name)


def ignored(key: str, names: frozenset[str], prefixes: tuple[str, ...]) -> bool:
    """A key known not to change GPU memory (logging, data paths, schedules, evaluation, hub)."""
    return key in names or key.startswith(prefixes)


#: Words of keys that never change GPU memory, for every format (learning rate, logging, saving, hub).
COMMON_IGNORED_PREFIXES: Final = (
    "wandb", "mlflow", "comet", "hub_", "push_to_hub", "logging", "log_", "save", "eval", "output",
    "learning_rate", "lr", "warmup", "weight_decay", "seed", "report_to", "run_name", "resume",
    "dataset", "dataloader", "tokenizer", "num_epochs", "num_train_epochs", "max_steps", "adam_", "max_grad_norm",
    "gradient_clipping", "clip_grad", "metric", "early_stopping", "trust_remote_code", "revision",
    "cache_dir", "tensorboard", "profil", "debug", "local_rank", "ddp_timeout", "chat_template",
)  # fmt: skip


def list_leftovers(
    out: MappingBuilder,
    data: Mapping[str, Any],
    *,
    used: Iterable[str],
    ignore: Callable[[str], bool],
    prefix: str = "",
) -> None:
    """List every key of ``data`` that was neither used nor known to be irrelevant (and is set)."""
    seen = set(used)
    for key, value in data.items():
        name = str(key)
        if name in seen or ignore(name) or value is None or value is False or value == "" or value == []:
            continue
        out.not_modelled(prefix + name, value)
