"""Frontend for ``@cuda.jit`` kernels: typed Numba IR from numba-cuda's typing context.

kadj's CPU frontend pipeline (:class:`kadj.frontend._FrontendPipeline`: numba's untyped
passes, inlining of jitted callees, type inference, stop) runs unchanged; only the
contexts differ:

- typing: ``numba.cuda.descriptor.cuda_target.typing_context`` (a
  ``numba.cuda.target.CUDATypingContext``), which knows ``cuda.grid``, ``threadIdx``,
  ``cuda.atomic.add``, libdevice math...;
- target: a copy of ``cuda_target.target_context`` whose ``call_conv`` property does not
  need a function descriptor (numba's ``_make_subtarget`` asks for it to build the
  error model; nothing is lowered here);
- the whole run happens inside ``numba.cuda.utils.numba_target_override()`` so that
  intrinsics registered for the CUDA target resolve (their templates are filtered by
  ``numba.core.target_extension.get_local_target``);
- NRT off (the CUDA context's ``enable_nrt`` is read-only).

The IR is numba.core's (``numba.core.ir``), like the CPU path, so kadj.structurize works
on it.  Under ``NUMBA_ENABLE_CUDASIM=1`` numba-cuda's real typing modules are still
importable (they need no driver); :func:`real_dispatcher_for` rebuilds a real
(non-simulator) device dispatcher so device helpers can be inlined.
"""
from __future__ import annotations

import copy
import functools

from numba.core.compiler import Flags

from ..frontend import _run


@functools.lru_cache(maxsize=None)
def contexts():
    """(typing context, typing-only target context) of numba-cuda."""
    from numba.cuda.core.callconv import CUDACallConv
    from numba.cuda.descriptor import cuda_target

    base = cuda_target.target_context

    class _TypingOnlyCUDATargetContext(type(base)):
        @property
        def call_conv(self):
            return CUDACallConv(self)

    ctx = copy.copy(base)
    ctx.__class__ = _TypingOnlyCUDATargetContext
    return cuda_target.typing_context, ctx


def _flags():
    flags = Flags()
    flags.enable_ssa = False
    flags.nrt = False
    return flags


def type_cuda_kernel(py_func, arg_types):
    """Typed IR of a CUDA kernel's Python function for ``arg_types``."""
    from numba.cuda.utils import numba_target_override

    typingctx, targetctx = contexts()
    return _run(py_func, typingctx, targetctx, arg_types, "cuda", flags=_flags(),
                context=numba_target_override())
