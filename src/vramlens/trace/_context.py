""" "Where am I" for the tracker: the running module, the phase and the default category.

Hooks only, no tensor accounting (that is the dispatch mode's job, in ``tracker.py``):

* global module forward pre/post hooks keep a stack of the modules running their forward;
  a multi-grad hook on each module's outputs marks the module whose backward starts;
* global optimizer step pre/post hooks mark the optimizer step, and after each step the
  optimizer's state tensors are re-labelled ``optimizer_state``;
* post-accumulate-grad hooks on registered trainable parameters re-label their gradients;
* the autograd engine's current graph task (``torch._C._current_graph_task_id()``, -1
  outside backward) tells the backward pass apart.

Phases: an explicit phase (``tracker.phase("prefill")``) wins; otherwise
``optimizer_step`` inside an optimizer step, ``backward`` inside the autograd engine,
``forward`` inside a module's forward, and between those the last phase seen (so a loss
computed after the model's forward still belongs to ``forward``). Before anything runs the
phase is ``load``.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.optim.optimizer as optim_hooks
from torch.nn.modules import module as module_hooks

from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, TimelineBuilder
from vramlens.trace.frames import is_user_frame

__all__ = ["RunContext", "optimizer_state_tensors"]

_ACTIVATIONS = CATEGORY_ORDER.index(Category.ACTIVATIONS)
_TEMPORARY = CATEGORY_ORDER.index(Category.TEMPORARY)
_OTHER = CATEGORY_ORDER.index(Category.OTHER)
#: Frames from these packages are left out of captured stacks (they are the machinery, not the user's code:
#: torch's dispatch and vramlens's own tracker, simulator and command line).
_SKIPPED_PATHS = ("/torch/", "/contextlib.py", "/weakref.py")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
_MAX_FRAMES = 24
#: Frames walked at most per stack (deep recursion stays bounded).
_MAX_WALK = 256

Recategorize = Callable[[list[Any], Category], None]


def optimizer_state_tensors(optimizer: Any) -> list[Any]:
    """Every tensor an optimizer keeps in its state (moments, step counters)."""
    state = optimizer.state.values()
    return [value for entry in state for value in entry.values() if isinstance(value, torch.Tensor)]


class RunContext:
    """Hook state of one tracker: module stack, phase, optimizer and backward flags."""

    def __init__(self, events: TimelineBuilder, recategorize: Recategorize) -> None:
        self._events = events
        self._recategorize = recategorize
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._stack: list[int] = []
        self._stack_names: list[str] = []
        self._explicit: list[int] = []
        self._backward_module = -1
        self._in_optimizer = False
        self._sticky = self.code("load")
        self._phases = {name: self.code(name) for name in ("forward", "backward", "optimizer_step")}
        self._handles: list[Any] = []
        self._gradient_handles: list[Any] = []

    def code(self, phase: str) -> int:
        """Table index of a phase name."""
        return self._events.code("phase", phase)

    # -- installation ------------------------------------------------------------------
    def install(self) -> None:
        """Register the global hooks (removed by :meth:`uninstall`)."""
        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._forward_pre),
            module_hooks.register_module_forward_hook(self._forward_post, always_call=True),
            optim_hooks.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim_hooks.register_optimizer_step_post_hook(self._optimizer_post),
        ]

    def uninstall(self) -> None:
        """Remove every hook this context registered."""
        for handle in self._handles + self._gradient_handles:
            handle.remove()
        self._handles, self._gradient_handles = [], []

    def name_modules(self, model: Any, prefix: str) -> None:
        """Learn the qualified names of a model's modules (the root is named by its class)."""
        root = prefix or type(model).__name__
        for name, module in model.named_modules():
            self._names.setdefault(module, f"{root}.{name}" if name else root)

    def watch_gradients(self, model: Any) -> None:
        """Re-label each trainable parameter's gradient as ``gradients`` when it is accumulated."""
        for parameter in model.parameters():
            if parameter.requires_grad:
                handle = parameter.register_post_accumulate_grad_hook(self._gradient_ready)
                self._gradient_handles.append(handle)

    @contextmanager
    def explicit_phase(self, name: str) -> Iterator[None]:
        """Force the phase to ``name`` inside the block."""
        self._explicit.append(self.code(name))
        try:
            yield
        finally:
            self._explicit.pop()

    # -- queries (called for every event) ----------------------------------------------
    def where(self) -> tuple[int, int]:
        """(phase, module) now, asking autograd for its graph task once (called for every event):
        the explicit phase, else the optimizer step, backward (module: the one whose backward
        began last), forward (the innermost running module) or the last phase seen."""
        in_backward = torch._C._current_graph_task_id() != -1
        stack = self._stack
        module = stack[-1] if stack else (self._backward_module if in_backward else -1)
        if self._explicit:
            return self._explicit[-1], module
        if self._in_optimizer:
            phase = self._phases["optimizer_step"]
        elif in_backward:
            phase = self._phases["backward"]
        elif stack:
            phase = self._phases["forward"]
        else:
            return self._sticky, module
        self._sticky = phase
        return phase, module

    def new_category(self) -> int:
        """Category of a storage created now (before any re-labelling): activations inside a
        module's forward (and after it, in the forward phase), temporaries in the optimizer,
        in backward outside recomputed forwards and in explicit phases outside modules."""
        if self._in_optimizer:
            return _TEMPORARY
        if self._stack:
            return _ACTIVATIONS
        if torch._C._current_graph_task_id() != -1:
            return _TEMPORARY
        if self._explicit:
            return _TEMPORARY
        return _ACTIVATIONS if self._sticky == self._phases["forward"] else _OTHER

    def stack_code(self) -> int:
        """Index of the current Python stack (user frames only, innermost last)."""
        frames: list[str] = []
        frame = sys._getframe(1)
        walked = 0
        while frame is not None and walked < _MAX_WALK:
            walked += 1
            path = frame.f_code.co_filename.replace("\\", "/")
            if not path.startswith(_PACKAGE) and not any(part in path for part in _SKIPPED_PATHS):
                frames.append(f"{path}:{frame.f_lineno} in {frame.f_code.co_name}")
            frame = frame.f_back  # type: ignore[assignment]
        if len(frames) > _MAX_FRAMES:  # the innermost frames, then the user's own among the rest
            half = _MAX_FRAMES // 2
            frames = frames[:half] + [f for f in frames[half:] if is_user_frame(f)][:half]
        return self._events.code("stack", "\n".join(reversed(frames)))

    # -- hooks -------------------------------------------------------------------------
    def _module_name(self, module: Any) -> str:
        """A module's qualified name. A module made while the model runs (PEFT's proxies for
        adapters on fused experts) has none: it is named inside the module running it, so that
        what it allocates stays with its layer."""
        name = self._names.get(module)
        if name is None:
            name = type(module).__name__
            if self._stack_names:
                name = f"{self._stack_names[-1]}.<{name}>"
        return name

    def _module_code(self, module: Any) -> int:
        return self._events.code("module", self._module_name(module))

    def _forward_pre(self, module: Any, args: Any) -> None:
        if not self._stack and not self._in_optimizer and torch._C._current_graph_task_id() == -1:
            flat = [item for item in torch.utils._pytree.tree_leaves(args) if isinstance(item, torch.Tensor)]
            self._recategorize(flat, Category.INPUTS)
        name = self._module_name(module)
        self._stack.append(self._events.code("module", name))
        self._stack_names.append(name)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if self._stack_names:
            self._stack_names.pop()
        code = self._stack.pop() if self._stack else self._module_code(module)
        if not torch.is_grad_enabled():
            return
        leaves = torch.utils._pytree.tree_leaves(output)
        needing = [item for item in leaves if isinstance(item, torch.Tensor) and item.requires_grad]
        if needing:
            torch.autograd.graph.register_multi_grad_hook(needing, self._backward_starter(code), mode="any")

    def _backward_starter(self, code: int) -> Callable[[Any], None]:
        def started(_: Any) -> None:
            self._backward_module = code

        return started

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = True
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._recategorize(grads, Category.GRADIENTS)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._in_optimizer = False
        self._sticky = self._phases["optimizer_step"]
        self._recategorize(optimizer_state_tensors(optimizer), Category.OPTIMIZER_STATE)

    def _gradient_ready(self, parameter: Any) -> None:
        if parameter.grad is not None:
            self._recategorize([parameter.grad], Category.GRADIENTS)
