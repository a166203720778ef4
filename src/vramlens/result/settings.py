"""What a report assumed: the settings line its first lines show, and the inputs that apply.

``settings`` names the values the answer depends on most - batch, sequence (or context),
precision, the optimizer and its implementation, the framework (or engine) - with what was
left at its default and what ``auto`` became, so nobody reads a number without knowing what
it assumed. ``applicable_inputs`` lists the workload keys that matter for the report's mode
and method, flat (``lora.rank``, ``parallel.gpus``), for the HTML report's inputs table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from vramlens.result.report import MemoryReport

__all__ = ["Setting", "applicable_inputs", "settings", "settings_dicts", "settings_line", "settings_lines"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Setting:
    """One setting as the report states it."""

    key: str
    value: str
    source: str
    """``"default"`` (the contract's default: not given, or given as the default), ``"given"``, or
    ``"auto"`` (what ``auto`` became)."""
    why: str = ""
    """For ``auto``: whose choice it is (``"hf's default"``)."""

    def text(self) -> str:
        if self.source == "default":
            return f"{self.key} {self.value} (default)"
        if self.source == "auto":
            return f"{self.key} {self.value} (auto)"
        return f"{self.key} {self.value}"


@cache
def _defaults() -> dict[str, Any]:
    from vramlens.workload.spec import Workload

    return {
        f.name: getattr(f.default, "value", f.default)
        for f in dataclasses.fields(Workload)
        if f.default is not dataclasses.MISSING
    }


def settings(report: MemoryReport) -> list[Setting]:
    """The report's main settings, or [] when the report has no workload (a foreign snapshot)."""
    workload = _main_keys(report.workload)
    if not workload or workload.get("mode") not in ("train", "infer"):
        return []
    defaults = _defaults()

    def given(key: str) -> Setting:
        value = workload.get(key)
        return Setting(key=key, value=str(value), source="default" if value == defaults.get(key) else "given")

    if workload["mode"] == "infer":
        return [given("batch"), _tokens(workload, defaults), given("precision"), given("kv_dtype"), _engine(workload)]
    return [given("batch"), given("seq"), given("precision"), given("optimizer"), *_implementation(workload, given)]


_MAIN_KEYS = ("mode", "batch", "seq", "precision", "optimizer", "optimizer_impl", "framework", "context", "prompt",
              "generate", "kv_dtype", "engine")  # fmt: skip


def _main_keys(workload: Any) -> dict[str, Any]:
    """The keys the settings read, as plain values, from a Workload or a workload dict (no full
    conversion: the web page asks for this on every change)."""
    if isinstance(workload, Mapping):
        return {key: workload.get(key) for key in _MAIN_KEYS}
    if workload is None or not hasattr(workload, "mode"):
        return {}
    return {key: getattr(getattr(workload, key, None), "value", getattr(workload, key, None)) for key in _MAIN_KEYS}


def _tokens(workload: Mapping[str, Any], defaults: Mapping[str, Any]) -> Setting:
    context = workload.get("context")
    if context is not None:
        return Setting(key="context", value=str(context), source="given")
    prompt, generate = workload.get("prompt"), workload.get("generate")
    default = prompt == defaults["prompt"] and generate == defaults["generate"]
    return Setting(key="prompt + generate", value=f"{prompt} + {generate}", source="default" if default else "given")


def _engine(workload: Mapping[str, Any]) -> Setting:
    if workload.get("framework") == "vllm":
        return Setting(key="engine", value="vllm", source="given")
    value = workload.get("engine")
    return Setting(key="engine", value=str(value), source="default" if value == _defaults()["engine"] else "given")


def _implementation(workload: Mapping[str, Any], given: Any) -> list[Setting]:
    """The optimizer implementation and the framework, with what ``auto`` became."""
    from vramlens.resolve.frameworks import FRAMEWORKS
    from vramlens.workload.options import Framework

    framework = str(workload.get("framework"))
    known = {f.value for f in FRAMEWORKS}
    profile = (
        FRAMEWORKS[Framework.HF if framework == "auto" else Framework(framework)]
        if framework in known | {"auto"}
        else None
    )
    items = []
    if workload.get("optimizer_impl") == "auto" and profile is not None:
        items.append(Setting(key="optimizer_impl", value=profile.optimizer_impl.value, source="auto",
                             why=f"= {profile.name.value}'s"))  # fmt: skip
    else:
        items.append(given("optimizer_impl"))
    if framework == "auto":
        items.append(Setting(key="framework", value="hf", source="auto", why="= hf"))
    else:
        items.append(given("framework"))
    return items


def settings_lines(report: MemoryReport) -> list[str]:
    """Two short lines: the values (``settings: batch 4, seq 2048, ...``) and which of them are
    defaults or what ``auto`` became; [] without a workload."""
    items = settings(report)
    if not items:
        return []
    values = "settings: " + ", ".join(f"{s.key} {s.value}" for s in items)
    defaults = [s.key for s in items if s.source == "default"]
    autos = [f"{s.key} {s.why}" if s.why else s.key for s in items if s.source == "auto"]
    parts = [f"defaults: {', '.join(defaults)}" if defaults else "no defaults used"]
    if autos:
        parts.append(f"auto: {', '.join(autos)}")
    return [values, f"  ({'; '.join(parts)}; flags change any of them)"]


def settings_line(report: MemoryReport) -> str | None:
    """:func:`settings_lines` on one line; None without a workload."""
    lines = settings_lines(report)
    return " ".join(line.strip() for line in lines) if lines else None


def settings_dicts(report: MemoryReport) -> list[dict[str, Any]]:
    """The settings as JSON: ``[{key, value, source, why}]``."""
    return [dataclasses.asdict(s) for s in settings(report)]


#: Workload keys that only training / only inference reads.
_TRAIN_ONLY = frozenset({
    "method", "lora", "optimizer", "optimizer_impl", "optimizer_in_backward", "seq", "grad_accum", "packing",
    "recompute", "recompute_every", "loss", "float8", "kernels", "moe_capacity_factor", "fsdp_wrap",
})  # fmt: skip
_INFER_ONLY = frozenset({
    "prompt", "generate", "context", "kv_dtype", "engine", "gpu_memory_utilization", "max_num_seqs", "block_size",
    "max_num_batched_tokens",
})  # fmt: skip
_VLLM_ONLY = frozenset({"gpu_memory_utilization", "max_num_seqs", "block_size"})


def applicable_inputs(workload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The workload's keys that apply to its mode, method and engine, flattened (``lora.rank``,
    ``parallel.gpus``), as ``(key, text)``; lists are comma-separated, None is ``-``."""
    mode = workload.get("mode")
    rows: list[tuple[str, str]] = []
    for key, value in workload.items():
        if (mode == "infer" and key in _TRAIN_ONLY) or (mode == "train" and key in _INFER_ONLY):
            continue
        if key in _VLLM_ONLY and workload.get("engine") != "vllm" and workload.get("framework") != "vllm":
            continue
        if key == "lora" and workload.get("method") not in ("lora", "qlora", "freeze"):
            continue
        if key == "context" and value is None:
            continue
        if isinstance(value, Mapping):
            rows.extend((f"{key}.{sub}", _text(item)) for sub, item in value.items() if item is not None)
        else:
            rows.append((key, _text(value)))
    return rows


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    return str(value) or "none"
