"""Memory a dispatch mode does not see as plain storages: wrapper subclasses and storage resizes.

Two ways tensor memory escapes a ``TorchDispatchMode`` that notes the storage of each
operator output (measured with FSDP2 on fake ranks, ``tests/simulator/test_distributed.py``):

* **Wrapper subclasses** (``DTensor`` and other traceable wrapper subclasses). The mode
  sees the operator on the wrapper (a ``DTensor`` op), not the operators on the local
  tensors it runs inside (the mode is popped while it runs). The wrapper's own storage
  has the *global* size (a 1000 x 128 bf16 ``DTensor`` sharded 4 ways reports 256,000 B,
  its rank's local tensor 64,000 B) and owns no memory: the memory is in the inner
  tensors that ``__tensor_flatten__`` names. :func:`plain_tensors` gives those.
* **Storage resizes.** ``UntypedStorage.resize_`` is a method on the storage, not an
  operator, so no dispatch mode sees it. FSDP2 frees and re-allocates the unsharded
  parameters of every layer that way (``free_storage`` / ``alloc_storage``,
  ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``), as torch's own ``MemTracker``
  notes (it patches ``resize_`` too). :func:`watch_resizes` reports each resize.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["ResizeWatch", "is_wrapper", "plain_tensors", "watch_resizes"]

#: Called after a storage was resized: (storage, bytes before, bytes after).
ResizeCallback = Callable[[Any, int, int], None]

_callbacks: list[ResizeCallback] = []
_original_resize: Any = None


def is_wrapper(tensor: Any) -> bool:
    """Whether ``tensor`` is a traceable wrapper subclass (``DTensor`` & co) whose memory is
    in inner tensors; ``FakeTensor`` and plain tensors are not."""
    return bool(is_traceable_wrapper_subclass(tensor))


def plain_tensors(tensors: Iterable[Any]) -> list[Any]:
    """The plain tensors that hold the memory of ``tensors``, in order.

    A plain tensor (also a ``FakeTensor``) stands for itself; a traceable wrapper subclass
    (``DTensor``: its ``_local_tensor``) for the tensors its ``__tensor_flatten__`` names,
    recursively. Non-tensor attributes it names (a ``DTensor`` names its device mesh) are
    skipped. Source: ``torch.utils._python_dispatch.is_traceable_wrapper_subclass``.
    """
    found: list[Any] = []
    for tensor in tensors:
        if not is_traceable_wrapper_subclass(tensor):
            found.append(tensor)
            continue
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name) for name in names]
        found.extend(plain_tensors(item for item in inner if isinstance(item, torch.Tensor)))
    return found


class ResizeWatch:
    """A registered resize callback; :meth:`remove` unregisters it (like a hook handle)."""

    def __init__(self, callback: ResizeCallback) -> None:
        self._callback = callback

    def remove(self) -> None:
        """Stop reporting resizes to this callback; the last removal restores ``resize_``."""
        global _original_resize
        if self._callback in _callbacks:
            _callbacks.remove(self._callback)
        if not _callbacks and _original_resize is not None:
            torch.UntypedStorage.resize_ = _original_resize  # type: ignore[method-assign]
            _original_resize = None


def watch_resizes(callback: ResizeCallback) -> ResizeWatch:
    """Call ``callback(storage, old_bytes, new_bytes)`` after every ``UntypedStorage.resize_``
    until the returned watch is removed. Several watches may be active at once (nested
    trackers); ``resize_`` is patched while at least one is."""
    global _original_resize
    if _original_resize is None:
        _original_resize = torch.UntypedStorage.resize_
        original = _original_resize

        def resize_(storage: Any, size: int) -> Any:
            before = storage.nbytes()
            result = original(storage, size)
            for watcher in list(_callbacks):
                watcher(storage, before, storage.nbytes())
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
    _callbacks.append(callback)
    return ResizeWatch(callback)
