"""Bounds-checked adjoints for CPU kernels.

The adjoint of a CPU differentiated kernel is recompiled with numba's
``boundscheck=True``, so that an out-of-bounds access in it raises ``IndexError``
(and fails the check) instead of reading or corrupting memory.  The recompiled
function is kept per adjoint, in memory only.  ``NUMBA_BOUNDSCHECK`` in the
environment overrides it, as it overrides every numba ``boundscheck`` option.
"""
from __future__ import annotations

import weakref

_CHECKED = weakref.WeakKeyDictionary()   # adjoint py_func -> bounds-checked dispatcher


class _BoundsChecked:
    """A CPU differentiated kernel whose adjoint runs compiled with bounds checking."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.__name__ = kernel.__name__

    @classmethod
    def wrap(cls, kernel):
        from ..kernel import DifferentiatedKernel  # testing sits on top of the pipeline

        cpu = isinstance(kernel, DifferentiatedKernel) and kernel.target.name == "cpu"
        return cls(kernel) if cpu else kernel

    def forward(self, *args):
        return self.kernel.forward(*args)

    def adjoint_plan(self, *args):
        return self.kernel.adjoint_plan(*args)

    def adjoint(self, *args, adj_return=1.0):
        n = len(self.kernel.arg_names)
        compiled = self.kernel.compiled(*args[:n])
        call = list(args)
        if compiled.plan.returns_value:
            call.append(float(adj_return))
        # every tape new memory of exactly its reserved size: a push past it fails
        return _checked_function(self.kernel, compiled)(*call, *compiled.fresh_memory())


def _checked_function(kernel, compiled):
    """``compiled.function``, recompiled with ``boundscheck=True`` unless it has bounds
    checks already (or ``NUMBA_BOUNDSCHECK`` decides for every function)."""
    from numba import config, njit

    options = kernel._options()
    if config.BOUNDSCHECK is not None or options.get("boundscheck"):
        return compiled.function
    py_func = compiled.function.py_func
    checked = _CHECKED.get(py_func)
    if checked is None:
        # not cached on disk: numba's cache key ignores the boundscheck option
        checked = njit(cache=False, **dict(options, boundscheck=True))(py_func)
        _CHECKED[py_func] = checked
    return checked
