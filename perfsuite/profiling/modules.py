"""Module ranges for torch.profiler: every ``nn.Module``'s forward as a
``module::NAME (Class)`` range, so that a profile's time, Python included,
can be attributed to the module it ran in (perfsuite.profiling.trace_summary
makes the module rows; the attribution diff ranks them).

Global forward hooks (``torch.nn.modules.module.register_module_forward_*``)
need no change to a workload's model: the first module entered with no module
open is a root, and its ``named_modules()`` name every module under it
(a DDP/DataParallel root's ``module.`` prefix dropped). The hooks open ranges
only while a profiler records, and are installed for the profiler's
with-block only (StepProfiler).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.autograd import profiler as autograd_profiler

from .trace_summary import MODULE_PREFIX

__all__ = ["ModuleRanges", "module_label"]

_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def module_label(qualified: str, module: Any) -> str:
    """``features.0.0 (Conv2d)``; a root is ``(root) (MobileNetV2)``."""
    return f"{qualified or '(root)'} ({type(module).__name__})"


class ModuleRanges:
    """Install with ``with ModuleRanges():``; ranges only while profiling."""

    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleRanges:
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre)]
        try:
            self._handles.append(hooks.register_module_forward_hook(self._post, always_call=True))
        except TypeError:  # torch < 2.1: no always_call; a forward that raises leaves its range to __exit__
            self._handles.append(hooks.register_module_forward_hook(self._post))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        stack = getattr(self._local, "stack", [])
        while stack:
            _, ranged = stack.pop()
            if ranged is not None:
                ranged.__exit__(None, None, None)

    def _name(self, module: Any, stack: list) -> str:
        name = self._names.get(module)
        if name is None:
            if not stack:  # a root: name every module under it
                wrapper = type(module).__name__ in _WRAPPERS
                for qualified, sub in module.named_modules():
                    if wrapper and qualified.startswith("module."):
                        qualified = qualified[len("module."):]
                    self._names.setdefault(sub, module_label(qualified, sub))
                name = self._names.get(module)
            if name is None:
                name = module_label("", module) if not stack else f"? ({type(module).__name__})"
                self._names[module] = name
        return name

    def _pre(self, module: Any, args: Any) -> None:
        stack = self._local.__dict__.setdefault("stack", [])
        ranged = None
        if autograd_profiler._is_profiler_enabled:
            ranged = autograd_profiler.record_function(MODULE_PREFIX + self._name(module, stack))
            ranged.__enter__()
        stack.append((module, ranged))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        stack = getattr(self._local, "stack", None)
        if not stack or stack[-1][0] is not module:
            return
        _, ranged = stack.pop()
        if ranged is not None:
            ranged.__exit__(None, None, None)
