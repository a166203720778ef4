"""The registry of run-config formats, declared once: name, description, kind and the module
that reads it. Importing it loads no reader (``vramlens estimate`` without ``--from`` needs only
the names for its ``--from-format`` choices); a reader's module is imported on first use."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from vramlens.workload.sources._mapping import SourcedWorkload
    from vramlens.workload.sources.shared import ReadContext

__all__ = ["FORMATS", "SourceFormat"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFormat:
    """One kind of run config: how to recognise it and how to read it."""

    name: str
    description: str
    kind: str
    """"document" (YAML/JSON mapping) or "command" (a command line)."""
    module: str
    """The reader module under ``vramlens.workload.sources``: it defines ``detect`` and ``read``."""

    def detect(self, content: Any) -> bool:
        """Whether ``content`` (a mapping, or a command line's tokens) is this format."""
        return bool(import_module(f"vramlens.workload.sources.{self.module}").detect(content))

    def read(self, content: Any, ctx: ReadContext) -> SourcedWorkload:
        """Map ``content`` to workload keys."""
        reader = import_module(f"vramlens.workload.sources.{self.module}")
        result: SourcedWorkload = reader.read(content, ctx)
        return result


#: Every format, in detection order (the first whose ``detect`` accepts the content reads it).
FORMATS: Final[dict[str, SourceFormat]] = {
    f.name: f
    for f in (
        SourceFormat(name="axolotl", description="axolotl YAML", kind="document", module="axolotl"),
        SourceFormat(name="torchtune", description="torchtune recipe YAML", kind="document", module="torchtune"),
        SourceFormat(name="litgpt", description="litgpt finetune/pretrain YAML", kind="document", module="litgpt"),
        SourceFormat(name="deepspeed", description="DeepSpeed JSON", kind="document", module="deepspeed"),
        SourceFormat(name="accelerate", description="accelerate config YAML", kind="document", module="accelerate"),
        SourceFormat(name="vllm", description="a vllm serve command line", kind="command", module="vllm"),
        SourceFormat(
            name="trl", description="a TRL / transformers TrainingArguments command line", kind="command", module="trl"
        ),
    )
}
