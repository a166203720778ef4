"""Remote-code ``model_type`` names whose modeling code is an architecture vramlens describes.

A checkpoint published with its own code (``auto_map`` in ``config.json``) is described only
when that code is, by citation, the code of a supported family. Each entry names the
family it is read as and the source that shows the code is the same; nothing else is ever
read as a look-alike (see "Any model" in the design notes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

__all__ = ["ALIASES", "Alias"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Alias:
    """One remote-code type and the supported family whose code it ships."""

    target: str
    """The supported ``model_type`` it is read as."""
    source: str
    """Why: the file or class of the checkpoint's code that is the target family's code."""
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Keys the remote code implies when absent, added before the target family reads the config
    (and before transformers builds it for a simulation)."""


ALIASES: Final[Mapping[str, Alias]] = MappingProxyType(
    {
        "kimi_k2": Alias(
            target="deepseek_v3",
            source=(
                "moonshotai/Kimi-K2-Instruct config.json auto_map: configuration_deepseek.DeepseekV3Config, "
                "modeling_deepseek.DeepseekV3ForCausalLM (DeepSeek-V3's code, architectures DeepseekV3ForCausalLM)"
            ),
        ),
        "RefinedWebModel": Alias(
            target="falcon",
            source=(
                "tiiuae/falcon-7b's original revision: auto_map to modelling_RW.RWForCausalLM, the code transformers' "
                "FalconForCausalLM was ported from (FalconConfig reads n_head/n_layer/multi_query); "
                "'RefinedWebModel' is the sequential (old) decoder architecture"
            ),
            defaults=MappingProxyType({"new_decoder_architecture": False}),
        ),
        "RefinedWeb": Alias(
            target="falcon",
            source=(
                "tiiuae/falcon-40b's original revision: auto_map to modelling_RW.RWForCausalLM (ported to transformers' "
                "FalconForCausalLM); 'RefinedWeb' is the new decoder architecture with n_head_kv grouped KV heads"
            ),
            defaults=MappingProxyType({"new_decoder_architecture": True}),
        ),
    }
)
