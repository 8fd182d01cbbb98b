"""LLVM's optimisation of a serial CPU adjoint, run once over its whole module.

numba optimises the LLVM IR of a function it compiles three times over: each function
on its own at O3 as its module is added to the code library (``_optimize_functions``),
then the library's final module (the function, its Python wrapper and what they link)
by a "cheap" pipeline (inlining at O0, loop rotation, instruction combining and jump
threading, so that numba's reference-count pruning sees whole functions), then by the
full O3 module pipeline, which runs every function pass of the first again after
inlining and ends with the reference-count pruning pass.  An adjoint is two to three
times its forward's code, and the first two rounds cost about a tenth of its compile.

:class:`LeanCodeLibrary` is numba's CPU code library with the first two rounds left
out: functions are added as numba lowered them (with the target's data layout), and
the final module goes through the full O3 pipeline alone (with numba's reference-count
pruning where numba would run it).  :class:`LeanLibrary`, a pass of both of
:class:`kadj.ssa_free.AdjointCompiler`'s pipelines before lowering, gives the function
such a library; parallel adjoints (numba's own pipeline) and every forward keep
numba's.  Functions linked in (numba's own overloads, ``np.empty`` and the like) were
optimised by numba as usual when they were compiled.

The machine code differs (the passes run in another order), what it computes does not:
every CPU gallery adjoint gives bit for bit the gradients of numba's three rounds, but
for the sums LLVM may reassociate (``_sum_add``), which another pass order may add in
another order (tests/test_lean_library.py), and runs as fast (one thread, alternating,
best of 9, about 10^5 elements: geometric mean new/old 1.00, every kernel within
0.94-1.05).  ``KADJ_LEAN_LLVM=0`` keeps numba's rounds (to compare).

The adjoint's Python wrapper (each argument unboxed, the adjoint called, every unboxed
array released: straight-line code run once per call, about a quarter of an adjoint's
optimised instructions) is left unoptimised (``optnone``, which every pass skips and
instruction selection compiles as at O0; :meth:`LeanCodeLibrary.leave_unoptimised`,
called by :class:`kadj.lean_lowering.LeanLower`): a call costs a few hundredths of a
microsecond more, the compile about a twentieth less.  ``KADJ_LEAN_WRAPPER=0`` keeps
it optimised (to compare).
"""
from __future__ import annotations

import os

from numba.core import config
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.runtime.nrtopt import remove_redundant_nrt_refct

__all__ = ["LeanCodeLibrary", "LeanLibrary", "enabled", "wrapper_left_unoptimised"]


def enabled():
    """Whether adjoints get a :class:`LeanCodeLibrary` (``KADJ_LEAN_LLVM``, default on)."""
    return os.environ.get("KADJ_LEAN_LLVM", "1") != "0"


def wrapper_left_unoptimised():
    """Whether an adjoint's Python wrapper is compiled without optimisation
    (``KADJ_LEAN_WRAPPER``, default on)."""
    return os.environ.get("KADJ_LEAN_WRAPPER", "1") != "0"


class LeanCodeLibrary(JITCodeLibrary):
    """numba's CPU (JIT) code library whose final module is optimised once, at O3, but
    for the functions named by :meth:`leave_unoptimised`."""

    def leave_unoptimised(self, name):
        """Compile the function ``name`` (of a module added to this library) without
        optimisation: LLVM's ``optnone`` (and the ``noinline`` it requires), which
        every optimisation pass skips and which instruction selection compiles as at
        O0.  For code that runs once per call, not per element: an adjoint's Python
        wrapper (the arguments unboxed, the adjoint called, the references
        released)."""
        self.__dict__.setdefault("_unoptimised", set()).add(name)

    def _optimize_functions(self, ll_module):
        # numba's per-function O3 round, left to the module pipeline; the data layout
        # it sets is kept
        ll_module.data_layout = self._codegen._data_layout

    def _optimize_final_module(self):
        if not config.LLVM_REFPRUNE_PASS:   # numba's pruning outside LLVM, as numba does
            self._final_module = remove_redundant_nrt_refct(self._final_module)
        for name in sorted(self.__dict__.get("_unoptimised", ())):
            fn = self._final_module.get_function(name)
            fn.add_function_attribute("noinline")
            fn.add_function_attribute("optnone")
        mpm, pb = self._codegen._module_pass_manager()   # O3, then the pruning pass
        with self._recorded_timings.record("Module passes (full optimization)", pb):
            mpm.run(self._final_module, pb)


@register_pass(mutates_CFG=False, analysis_only=True)
class LeanLibrary(FunctionPass):
    """Give the function a :class:`LeanCodeLibrary` unless it has a library already
    (numba's lowering creates one only when none is set) or the target's code generator
    uses a library class other than numba's JIT one."""
    _name = "kadj_lean_library"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        if state.library is None and enabled():
            codegen = state.targetctx.codegen()
            if getattr(codegen, "_library_class", None) is JITCodeLibrary:
                lib = LeanCodeLibrary(codegen, state.func_id.func_qualname)
                lib.enable_object_caching()      # as numba's lowering does, for its cache
                state.library = lib
        return False
