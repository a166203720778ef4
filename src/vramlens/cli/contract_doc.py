"""``docs/workload.md``, generated from the workload contract as the code declares it.

Every key of the declaration (:data:`vramlens.workload.keys.KEYS`: accepted values, unit,
description, flag, since) with its default (the dataclass fields of
:class:`~vramlens.workload.spec.Workload`, :class:`~vramlens.workload.spec.LoraConfig` and
:class:`~vramlens.workload.spec.Parallelism`), so the page cannot drift from the code; the CLI's
``--help`` shows the same declared line for each flag.
``python -m vramlens.cli.contract_doc > docs/workload.md`` rewrites it; a test checks it is current.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from vramlens.workload.keys import Key, Kind, keys_of
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


def _versions_accepted() -> str:
    from vramlens.workload.versions import PACKAGES

    return "a mapping of " + ", ".join(f"`{name}`" for name in PACKAGES) + " to a version"


def _alloc_conf_accepted() -> str:
    from vramlens.allocator._alloc_conf import IGNORED_KEYS, MODELED_KEYS

    modelled = ", ".join(f"`{key}`" for key in MODELED_KEYS)
    return f"`key:value` pairs, comma-separated: {modelled} (modelled); {', '.join(IGNORED_KEYS)} (accepted, no effect)"


#: The accepted values of keys that are not an enum, from the code that checks them.
_ACCEPTED = {Kind.VERSIONS: _versions_accepted, Kind.ALLOC_CONF: _alloc_conf_accepted}
_OWNERS: dict[str, type] = {"": Workload, "lora": LoraConfig, "parallel": Parallelism}


def _accepted(key: Key) -> str:
    if key.kind in _ACCEPTED:
        return _ACCEPTED[key.kind]()
    values = key.accepted()
    if " | " in values:
        values = " \\| ".join(f"`{value}`" for value in values.split(" | "))
    return values + (", or `null`" if key.nullable and values else "")


def key_row(key: Key) -> str:
    """One key's row: name, default (the dataclass field's), accepted values, unit, description
    (the declared line that ``--help`` shows too) and since when it exists."""
    field = next(f for f in dataclasses.fields(_OWNERS[key.block]) if f.name == key.name)
    flag = f"`--{key.flag_name}`" if key.flag_name else "argument"
    if key.kind is Kind.SWITCH:
        flag = f"`--{key.flag_name}/--no-{key.flag_name}`"
    what = key.help.replace("|", "/")
    return f"| `{key.path}` | {_default(field)} | {_accepted(key)} | {key.unit} | {what} | {flag} | {key.since} |"


def _table(block: str) -> list[str]:
    head = ["| key | default | accepted | unit | what it is | CLI | since |", "|---|---|---|---|---|---|---|"]
    return head + [key_row(key) for key in keys_of(block)]


def contract_markdown() -> str:
    """The contract page as Markdown."""
    lines = [_HEAD, *_table("")]
    lines += ["", "## `lora:`", "", *_table("lora")]
    lines += ["", "## `parallel:`", "", *_table("parallel")]
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
