"""Run configs people already have, read into the workload contract (``vramlens estimate --from FILE``).

One module per format, one registry (:data:`FORMATS`, in ``_formats.py``): axolotl YAML, torchtune recipe YAML,
litgpt YAML, DeepSpeed JSON, accelerate config YAML, a TRL / HF ``TrainingArguments`` command
line and a ``vllm serve`` command line. Each reader maps what it knows to workload keys with a
note per mapping (the report prints them as assumptions), lists the keys that matter for memory
but have no workload equivalent, and ignores keys that do not matter (logging, data paths,
schedules). Files are parsed, never executed. Of the keys the files themselves do not hold, a
command line's ``PYTORCH_CUDA_ALLOC_CONF=...`` sets ``alloc_conf`` (:func:`shared.map_environment`);
no format carries ``versions`` (``--versions`` gives them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vramlens._lazy import lazy_attribute

if TYPE_CHECKING:
    from vramlens.workload.sources._formats import FORMATS, SourceFormat
    from vramlens.workload.sources._mapping import SourcedWorkload, SourceNote
    from vramlens.workload.sources.read import parse_run_config, read_run_config

__all__ = ["FORMATS", "SourceFormat", "SourceNote", "SourcedWorkload", "parse_run_config", "read_run_config"]

#: Where each public name lives: importing the package (or its format registry, which
#: ``vramlens estimate`` needs for its ``--from-format`` choices) loads no reader.
_LAZY = {
    "FORMATS": "vramlens.workload.sources._formats",
    "SourceFormat": "vramlens.workload.sources._formats",
    "SourceNote": "vramlens.workload.sources._mapping",
    "SourcedWorkload": "vramlens.workload.sources._mapping",
    "parse_run_config": "vramlens.workload.sources.read",
    "read_run_config": "vramlens.workload.sources.read",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(globals(), _LAZY, name)
