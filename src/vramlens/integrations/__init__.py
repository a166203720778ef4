"""Integrations with training frameworks. Each submodule needs its framework's extra:
:mod:`vramlens.integrations.hf` (``MemoryCallback`` for ``transformers.Trainer``) needs [hf].
Importing this package imports none of them."""

from __future__ import annotations

__all__: list[str] = []
