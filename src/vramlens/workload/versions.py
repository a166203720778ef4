"""Memory behaviour that changed between library versions: one table, keyed by the version that changed it.

A workload's ``versions`` (e.g. ``{"transformers": "4.35", "vllm": "0.6"}``) names the libraries
its run used; a package it does not name is the installed one when there is one (read from its
metadata, never imported), else :data:`CURRENT`, the release the rest of vramlens describes.
:func:`older_than` tells the estimator whether the behaviour *before* a rule's change applies.

Each :class:`VersionRule` names the release that introduced today's behaviour, what happened
before it, and the change (pull request or release) that made it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Final

__all__ = [
    "CURRENT",
    "PACKAGES",
    "VERSION_RULES",
    "VersionRule",
    "older_than",
    "parse_version",
    "resolved_versions",
    "rule_note",
]

#: The releases the estimator's other rules and constants describe (``.ci/constraints.txt``,
#: ``estimate/infer/engines.py``).
CURRENT: Final = {"transformers": "5.23", "torch": "2.13", "vllm": "0.21"}
PACKAGES: Final = tuple(sorted(CURRENT))
_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[.+\-]?[0-9A-Za-z.+\-]*)?$")


@dataclass(frozen=True, kw_only=True, slots=True)
class VersionRule:
    """A behaviour that changed in ``package`` at release ``since``."""

    name: str
    package: str
    since: str
    before: str
    """What happened before ``since`` (what the estimator does for an older version)."""
    change: str
    """The change that introduced the current behaviour."""


VERSION_RULES: Final = {
    rule.name: rule
    for rule in (
        VersionRule(
            name="generate_cache",
            package="transformers",
            since="4.42",
            before="generate() kept the KV cache as legacy tuples, referenced through each decode step while the "
            "model built the new one: the old and the new cache at once at the step's end",
            change="DynamicCache (huggingface/transformers#26681, v4.36) became generate()'s default cache "
            "in place of the legacy tuples in #31491 (v4.42)",
        ),
        VersionRule(
            name="logits_to_keep",
            package="transformers",
            since="4.45",
            before="generate()'s prefill computed the logits of every prompt position, up-cast to fp32",
            change="num_logits_to_keep: generate() computes the last position's logits only "
            "(huggingface/transformers#31292, v4.45)",
        ),
        VersionRule(
            name="loss_upcast",
            package="transformers",
            since="4.46",
            before="the causal-LM forward up-cast all logits to fp32 (logits.float()) and returned them: the "
            "logits a training loop keeps are fp32",
            change="logits keep the model's dtype; the loss up-casts inside ForCausalLMLoss "
            "(v4.45 deprecation note 'Starting from v4.46, the logits model output will have the same type as "
            "the model'; huggingface/transformers#34147)",
        ),
        VersionRule(
            name="sdpa_default",
            package="transformers",
            since="4.36",
            before="attention auto meant eager attention (the s x s matrix is kept)",
            change="torch SDPA became the default attn_implementation for supported models "
            "(huggingface/transformers#26572, v4.36)",
        ),
        VersionRule(
            name="sdpa_enable_gqa",
            package="torch",
            since="2.5",
            before="transformers repeated grouped keys and values to every head before SDPA, so fp32 attention "
            "ran the memory-efficient kernel (no s x s probabilities kept)",
            change="scaled_dot_product_attention gained enable_gqa in torch v2.5, which transformers passes when "
            "there is no mask (use_gqa_in_sdpa); only the math backend takes it in fp32",
        ),
        VersionRule(
            name="lazy_module_loading",
            package="torch",
            since="1.13",
            before="CUDA kernels were loaded eagerly into the context (about 1000 MiB)",
            change="torch sets CUDA_MODULE_LOADING=LAZY when unset (pytorch/pytorch#86509, v1.13)",
        ),
        VersionRule(
            name="cudagraphs_in_budget",
            package="vllm",
            since="0.21",
            before="CUDA graphs were captured after the KV pool was sized, on top of gpu_memory_utilization",
            change="the memory profiler counts CUDA graphs inside the budget "
            "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default, vLLM 0.21)",
        ),
    )
}


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"4.35"`` -> (4, 35, 0); None when ``text`` is not a release number."""
    found = _VERSION.match(text.strip())
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0), int(found.group(3) or 0)


@cache
def _installed(package: str) -> str | None:
    """The installed version of ``package``: read from the name of its ``.dist-info`` folder on
    ``sys.path`` (``transformers-5.23.0.dist-info``, the installed-distribution layout of PEP 376
    and the binary distribution format), else from :func:`importlib.metadata.version` (eggs,
    zip imports). The scan keeps ``importlib.metadata`` (and the ``email`` and ``zipfile``
    modules it loads, 50 ms) out of ``vramlens estimate``."""
    found = _dist_info_version(package)
    if found is not None:
        return found
    if all(os.path.isdir(entry) or not os.path.exists(entry) for entry in sys.path if entry):
        return None  # every path entry is a plain folder and none has the package's metadata
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _dist_info_version(package: str) -> str | None:
    """The version in the first ``{name}-{version}.dist-info`` folder of ``package`` on
    ``sys.path`` (names compared normalised: lower case, runs of ``-_.`` as ``_``)."""
    return _dist_infos().get(_normalised(package))


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@cache
def _dist_infos() -> dict[str, str]:
    """Normalised distribution name -> version of every ``.dist-info`` folder on ``sys.path``
    (the first entry of a name wins, as the import system's order)."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[: -len(".dist-info")].partition("-")
                if version:
                    found.setdefault(_normalised(dist), version)
    return found


@lru_cache(maxsize=256)
def resolved_versions(versions: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Every known package's version: the workload's, else the installed one, else :data:`CURRENT`."""
    named = dict(versions)
    return {package: named.get(package) or _installed(package) or CURRENT[package] for package in PACKAGES}


@lru_cache(maxsize=1024)
def older_than(versions: tuple[tuple[str, str], ...], rule: str) -> bool:
    """Whether the run's version of the rule's package predates the rule (the old behaviour applies)."""
    found = VERSION_RULES[rule]
    version = parse_version(resolved_versions(versions)[found.package])
    since = parse_version(found.since)
    return version is not None and since is not None and version < since


def rule_note(versions: tuple[tuple[str, str], ...], rule: str) -> str:
    """The report's line for a rule whose old behaviour applies to the run."""
    found = VERSION_RULES[rule]
    version = resolved_versions(versions)[found.package]
    return f"{found.package} {version} < {found.since}: {found.before} (changed by {found.change})"
