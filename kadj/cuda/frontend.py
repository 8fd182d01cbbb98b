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
on it.  Under ``NUMBA_ENABLE_CUDASIM=1`` numba-cuda's typing modules cannot be imported;
:func:`type_kernel` then types through the simulator shim (:mod:`kadj.cuda.shim`),
which mirrors numba-cuda's declarations so that both paths give the same typed IR, the
same verdict and the same adjoint.

Both paths end the same way (:func:`type_kernel`):

- a typing failure is a :class:`~kadj.DifferentiationError` at numba's location, with
  numba's own message as its cause (that message names each path's own templates);
- the IR is normalized (:mod:`kadj.cuda.normalize`): indices that numba's constant
  inference took for constants (``s[tx, ty]``, ``tx = cuda.threadIdx.x``) are variable
  indices again, and numba's copies into a branch's merge variables are in one order.
"""
from __future__ import annotations

import copy
import functools

from numba.core.compiler import Flags

from ..frontend import _run
from .normalize import index_by_variables, sort_phi_copies


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

    from .ptx_cc import for_cc        # called device functions (cmath's) type without a GPU

    typingctx, targetctx = contexts()
    with for_cc(None):
        return _run(py_func, typingctx, targetctx, arg_types, "cuda", flags=_flags(),
                    context=numba_target_override())


def simulator_enabled():
    from numba.cuda.core import config
    return bool(getattr(config, "ENABLE_CUDASIM", False))


def type_kernel(py_func, arg_types):
    """Typed IR of a CUDA kernel: numba-cuda's typing context, or under the simulator
    the shim; the same IR either way (see the module docstring)."""
    from numba.core import types
    from numba.core.errors import TypingError

    from ..errors import DifferentiationError
    try:
        if simulator_enabled():
            from .shim import type_with_shim
            tk = type_with_shim(py_func, arg_types)
        else:
            tk = type_cuda_kernel(py_func, arg_types)
    except TypingError as exc:
        if any(isinstance(t, types.NoneType) for t in arg_types):
            raise  # a None argument: explained by the caller (kadj.validate)
        # numba's wording names the typing path's own templates: the verdict is kadj's
        raise DifferentiationError(
            "numba cannot type this kernel for the CUDA target with these argument "
            "types", kernel=py_func.__name__, loc=getattr(exc, "loc", None),
            construct="typing",
            remedy="numba's own message is the cause shown above this error; fix the "
                   "kernel (or the arguments) so that it compiles with numba.cuda.jit"
        ) from exc
    index_by_variables(tk.func_ir, tk.calltypes)
    sort_phi_copies(tk.func_ir)
    return tk
