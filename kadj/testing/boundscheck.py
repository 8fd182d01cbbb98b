"""Bounds-checked adjoints for CPU kernels.

The adjoint of a CPU differentiated kernel is recompiled with numba's
``boundscheck=True``, so that an out-of-bounds access in it raises ``IndexError``
(and fails the check) instead of reading or corrupting memory.  The jitted functions
its source defines beside it (the bodies of parallel loops, :mod:`kadj.row_outline`)
are recompiled the same way, and the copy calls those copies.  The recompiled
functions are kept per adjoint, in memory only.  ``NUMBA_BOUNDSCHECK`` in the
environment overrides it, as it overrides every numba ``boundscheck`` option.
"""
from __future__ import annotations

import types
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
    """``compiled.function``, recompiled with ``boundscheck=True`` (and otherwise its
    own options: a parallel adjoint stays parallel) unless it has bounds checks already
    (or ``NUMBA_BOUNDSCHECK`` decides for every function)."""
    from numba import config

    if (config.BOUNDSCHECK is not None or kernel._options().get("boundscheck")
            or compiled.function.targetoptions.get("boundscheck")):
        return compiled.function
    py_func = compiled.function.py_func
    checked = _CHECKED.get(py_func)
    if checked is None:
        checked = _checked_copy(compiled.function, {})
        _CHECKED[py_func] = checked
    return checked


def _checked_copy(dispatcher, copied):
    """``dispatcher``'s function jitted with its own options and ``boundscheck=True``,
    over a copy of its globals (``copied``, filled here) in which every jitted function
    its own source defines (a dispatcher whose Python function shares those globals)
    is such a copy too.

    Not cached on disk: numba's cache key ignores the boundscheck option."""
    from numba import njit
    from numba.core.registry import CPUDispatcher

    py_func = dispatcher.py_func
    shared = py_func.__globals__
    if not copied:
        copied.update(shared)
        for name, value in shared.items():
            if (isinstance(value, CPUDispatcher) and value.py_func is not py_func
                    and value.py_func.__globals__ is shared):
                copied[name] = _checked_copy(value, copied)
    own = {k: v for k, v in dispatcher.targetoptions.items()
           if k not in ("cache", "nopython")}
    return njit(cache=False, **dict(own, boundscheck=True))(_rebound(py_func, copied))


def _rebound(py_func, globals_):
    """``py_func`` reading its globals from ``globals_``."""
    f = types.FunctionType(py_func.__code__, globals_, py_func.__name__,
                           py_func.__defaults__, py_func.__closure__)
    f.__kwdefaults__ = py_func.__kwdefaults__
    f.__qualname__, f.__module__ = py_func.__qualname__, py_func.__module__
    return f
