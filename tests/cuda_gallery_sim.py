"""Gradient checks of the CUDA gallery (kernels/cuda) in the CUDA simulator.

Run by tests/test_cuda_gallery.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/cuda_gallery_sim.py stencils [case ...]

Runs :func:`kadj.testing.check_grad_cuda` on every case of the named gallery module
(or only the named cases) and prints one line per case:
``CASE <name> OK <max abs error> <seconds>`` or ``CASE <name> FAIL <message>``.
The module name ``selfcheck`` instead checks that check_grad_cuda rejects adjoints
that are wrong in known ways.

Shared and local arrays are uninitialised on a GPU, but the simulator allocates them
with ``np.empty``, which often hands out zeroed memory and so hides a kernel (or a
generated adjoint) that reads slots nobody wrote.  Fresh floating-point shared and
local arrays are therefore filled with NaN here.
"""
import os
import sys
import threading
import time
import traceback

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402

from kadj.testing import check_grad_cuda  # noqa: E402
from kernels.cuda import load  # noqa: E402


def poison_scratch_arrays():
    """Fill fresh floating-point shared/local arrays of the simulator with NaN.

    The shared-array replacement keeps the simulator's rule (one allocation per block
    and source line, keyed by the caller's file and line) and takes a lock, so that
    threads of a block that reach the line together get the same array.
    """
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared_array = kernelapi.FakeCUDAShared.array
    local_array = kernelapi.FakeCUDALocal.array
    lock = threading.Lock()

    def shared(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:      # dynamic shared memory
            return shared_array(self, shape, dtype, alignment)
        if not isinstance(dtype, np.dtype) and hasattr(dtype, "key"):
            dtype = numpy_support.as_dtype(dtype)
        frame = traceback.extract_stack(sys._getframe(1), limit=1)[-1]
        caller = (frame.filename, frame.lineno)
        with lock:
            arr = self._allocations.get(caller)
            if arr is None:
                arr = np.empty(shape, dtype)
                if arr.dtype.kind == "f":
                    arr[...] = np.nan
                self._allocations[caller] = arr
        return arr

    def local(self, shape, dtype, alignment=None):
        arr = local_array(self, shape, dtype, alignment)
        if arr.dtype.kind == "f":
            arr[...] = np.nan
        return arr

    kernelapi.FakeCUDAShared.array = shared
    kernelapi.FakeCUDALocal.array = local


def run_case(case, seed=0):
    args = case.make_args(np.random.default_rng(seed))
    return check_grad_cuda(case.kernel, case.config, args, rtol=case.rtol, seed=seed)


class _Tampered:
    """A differentiated kernel whose adjoint launch is followed by
    ``damage(adjoint_buffers, forward_args)``."""

    def __init__(self, kernel, damage):
        self.kernel, self.damage = kernel, damage
        self.__name__ = kernel.__name__
        self.forward = kernel.forward
        self.adjoint_plan = kernel.adjoint_plan
        self.adjoint = _TamperedAdjoint(self)

    def __getitem__(self, config):
        return self.kernel[config]


class _TamperedAdjoint:
    def __init__(self, owner):
        self.owner = owner

    def __getitem__(self, config):
        def launch(*args):
            k = self.owner.kernel
            n = len(k.arg_names)
            k.adjoint[config](*args)
            self.owner.damage(args[n:], args[:n])
        return launch


def selfcheck():
    """check_grad_cuda must reject a wrong scalar adjoint, a wrong array element
    and an adjoint that modifies a forward argument."""
    from kernels.cuda.stencils import heat1d_guarded

    def wrong_scalar(bufs, fwd):
        bufs[2][0] *= 1.01

    def wrong_element(bufs, fwd):
        bufs[0][5] += 1e-3

    def touches_forward(bufs, fwd):
        fwd[1][3] += 1.0

    for name, damage, expect in (("wrong_scalar_adjoint", wrong_scalar, "'alpha'"),
                                 ("wrong_array_element", wrong_element, "u[5]"),
                                 ("modified_forward_argument", touches_forward,
                                  "modified its forward argument 'u_new'")):
        args = [np.random.default_rng(3).random(13), np.zeros(13), 0.2]
        try:
            check_grad_cuda(_Tampered(heat1d_guarded, damage), (2, 8), args)
        except AssertionError as exc:
            ok = expect in str(exc)
            msg = "" if ok else f"message lacks {expect!r}: {exc}"
        else:
            ok, msg = False, "check_grad_cuda accepted a wrong adjoint"
        status = "OK 0 0s" if ok else "FAIL " + msg.replace("\n", " | ")
        print(f"CASE check_grad_cuda_rejects_{name} {status}", flush=True)


def main(argv):
    module, wanted = argv[0], set(argv[1:])
    poison_scratch_arrays()
    import warp_sim_api             # the simulator has no warp shuffles (kernels/cuda/warps)
    warp_sim_api.install()
    if module == "selfcheck":
        return selfcheck()
    for case in load(module):
        if wanted and case.name not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            res = run_case(case)
            print(f"CASE {case.name} OK {res.max_abs_error:.3e} "
                  f"{time.perf_counter() - t0:.2f}s", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {case.name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
