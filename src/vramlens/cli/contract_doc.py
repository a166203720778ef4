"""``docs/workload.md``, generated from the workload contract as the code declares it.

Every key with its default (the dataclass fields of :class:`~vramlens.workload.spec.Workload`,
:class:`~vramlens.workload.spec.LoraConfig` and :class:`~vramlens.workload.spec.Parallelism`), its
accepted values (the enums of :mod:`vramlens.workload.options`) and its description (the field's
docstring where it has one, else the CLI flag's help), so the page cannot drift from the code.
``python -m vramlens.cli.contract_doc > docs/workload.md`` rewrites it; a test checks it is current.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from enum import Enum
from typing import Any

from vramlens.workload.spec import LoraConfig, Parallelism, Workload

__all__ = ["contract_markdown"]

_HEAD = """# The workload contract

Every engine (`vramlens estimate`, `simulate`, `plan`, the web API) takes the same workload: a
`vramlens.Workload`, a plain dict, or a YAML/JSON file (`-c run.yaml`) with the keys below. CLI
flags use the same names with dashes (`--grad-accum`; `lora.*` keys are `--lora-rank` etc., and
`parallel.*` keys are plain: `--gpus`, `--tp`, `--shard`); flags override the file. Unknown keys
and values are one-line errors that name the key and list what is accepted. `auto` means "what
the framework does by default", and the report's first lines and its assumptions say what was
chosen. A run config you already have (axolotl, torchtune, litgpt, DeepSpeed, accelerate, a
TRL / `TrainingArguments` command line, `vllm serve`) is read into these keys with `--from FILE`
(a command line's `PYTORCH_CUDA_ALLOC_CONF=...` sets `alloc_conf`; no format carries `versions`).

This page is generated from the code (`python -m vramlens.cli.contract_doc > docs/workload.md`).
"""


def _docstrings(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after its annotation in the class body)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def _flag_help() -> dict[str, str]:
    from vramlens.cli.estimate import FLAGS, SWITCHES

    return {path: text for path, text in {**FLAGS, **SWITCHES}.values()}


def _default(field: dataclasses.Field[Any]) -> str:
    if field.name == "versions":  # pairs in the dataclass, a mapping in files and dicts
        return "`{}`"
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        return "(see below)"
    else:
        return "required"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None:
        return "`null`"
    if value == "":
        return '`""`'
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    return f"`{value}`"


def _accepted(field: dataclasses.Field[Any]) -> str:
    """The values of the field's enum (its annotation names one of :mod:`vramlens.workload.options`)."""
    from vramlens.workload import options

    if field.name in _ACCEPTED:
        return _ACCEPTED[field.name]()
    enum = getattr(options, str(field.type).split("|")[0].strip(), None)
    if isinstance(enum, type) and issubclass(enum, Enum):
        return " \\| ".join(f"`{member.value}`" for member in enum)
    return ""


def _versions_accepted() -> str:
    from vramlens.estimate.versions import PACKAGES

    return "a mapping of " + ", ".join(f"`{name}`" for name in PACKAGES) + " to a version"


def _alloc_conf_accepted() -> str:
    from vramlens.allocator._alloc_conf import IGNORED_KEYS, MODELED_KEYS

    modelled = ", ".join(f"`{key}`" for key in MODELED_KEYS)
    return f"`key:value` pairs, comma-separated: {modelled} (modelled); {', '.join(IGNORED_KEYS)} (accepted, no effect)"


#: The accepted values of keys that are not an enum, from the code that checks them.
_ACCEPTED = {"versions": _versions_accepted, "alloc_conf": _alloc_conf_accepted}

#: What a key whose values are an enum means (the values themselves come from the enum).
_MEANING = {
    "mode": "training or inference",
    "framework": "the stack whose defaults `auto` settings take (`auto`: hf for training)",
    "method": "what is trained",
    "precision": "dtypes of weights, gradients and states (mixed: fp32 master weights + bf16/fp16 compute)",
    "quant": "frozen base weights (QLoRA) or inference weights",
    "optimizer": "the optimizer",
    "optimizer_impl": "its step's implementation (`auto`: the framework's own)",
    "recompute": "activation checkpointing",
    "attention": "the attention kernel (`auto`: the framework's)",
    "loss": "the loss path (`auto`: the framework's)",
    "kv_dtype": "inference: KV cache dtype (`auto`: the compute dtype)",
    "engine": "inference: transformers generate or vLLM",
    "parallel.pp_schedule": "pipeline schedule",
}


def _rows(owner: type, prefix: str, flags: dict[str, str]) -> list[str]:
    docs = _docstrings(owner)
    rows = []
    for field in dataclasses.fields(owner):
        if field.name in ("lora", "parallel"):
            continue
        key = f"{prefix}{field.name}"
        text = docs.get(field.name) or flags.get(key, "")
        accepted = _accepted(field)
        if accepted and " | " in text:  # a flag's help that only lists the values
            text = _MEANING.get(key, "")
        text = text.replace("``", "`").replace(":class:", "").replace(":mod:", "").replace(":data:", "")
        rows.append(f"| `{key}` | {_default(field)} | {accepted} | {text.replace('|', '/')} |")
    return rows


def contract_markdown() -> str:
    """The contract page as Markdown."""
    flags = _flag_help()
    lines = [_HEAD, "| key | default | accepted | what it is |", "|---|---|---|---|"]
    lines += _rows(Workload, "", flags)
    lines += ["", "## `lora:`", "", "| key | default | accepted | what it is |", "|---|---|---|---|"]
    lines += _rows(LoraConfig, "lora.", flags)
    lines += ["", "## `parallel:`", "", "| key | default | accepted | what it is |", "|---|---|---|---|"]
    lines += _rows(Parallelism, "parallel.", flags)
    lines += [
        "",
        "## The report",
        "",
        "`MemoryReport.to_dict()` (what `--format json` prints) has at least: `peak` "
        "(`allocated_bytes`, `reserved_bytes`, `device_bytes`, `phase`), `breakdown` at the peak, `phases`, "
        "`safe` (each level's figure that at least 95% of public measurements stay at or below, with its margins), "
        "`fits` (null without a GPU; on the safe device figure), `headroom_bytes` (capacity minus that figure), "
        "`assumptions`, "
        "`peak_terms` for estimates (`allocated`: the terms alive at the peak, which add up to `allocated_bytes`; "
        "`allocator` and `runtime`: what `reserved_bytes` and `device_bytes` add, each term with `name`, "
        "`category`, `bytes`, `formula` and when it is `alive`), "
        "`settings` (batch, sequence, precision, optimizer and its implementation, framework: which are "
        "defaults, what `auto` became), `engine` and the normalized `workload` with every default filled in. "
        "Inference adds `serving` (KV needed; for vLLM the pool, `engine_starts` and `batch_fits_pool`). "
        "All bytes are per GPU.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - the generator's entry point
    print(contract_markdown(), end="")
