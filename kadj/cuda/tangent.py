"""Forward mode of a CUDA kernel: the compiled tangent kernel
(``k.jvp[blocks, threads](...)``).

The tangent kernel's source is written by the host's tangent writer
(:class:`kadj.tangent.TangentWriter`) with the CUDA target's context
(:func:`kadj.cuda.context.tangent_context`): each thread runs its part of the forward
with the tangents alongside; nothing is recorded and nothing is accumulated across
threads, so there is no tape and no atomic of kadj's own.  What a GPU thread adds to
the host's tangent function comes from the target:

- the CUDA intrinsics are spelled as in the kernel (``cuda.grid(1)``,
  ``cuda.threadIdx.x``, from the target's table :data:`kadj.cuda.intrinsics.TABLE`);
  thread and block indices and sizes are integers, never active, so they have no
  tangent;
- ``cuda.syncthreads()`` stays where it is: the tangent of a shared array is a shared
  array declared the same way (``cuda.shared.array(shape, dtype)``, right after the
  primal's), written and read next to the primal between the same barriers; the tangent
  of a ``cuda.local.array`` is a local array of the same shape
  (:func:`kadj.cuda.lower.tangent_barrier`, :func:`kadj.cuda.lower.tangent_declare`);
- ``cuda.atomic.add(x, idx, v)`` in the forward is linear: its tangent is
  ``cuda.atomic.add(dot_x, idx, dot_v)`` (``atomic.sub``: the negated tangent); the
  forward's own atomic stays an atomic (:func:`kadj.cuda.lower.tangent_atomic`).
  ``atomic.max``/``min`` and the other atomics are refused by the structuring stage
  (:mod:`kadj.cuda.structure`), with their location.

The compiled tangent kernel (:class:`CompiledCudaTangent`) is ``cuda.jit`` of the printed
source, which starts with its imports like the adjoint's
(:func:`kadj.source_header.self_contained`).
"""
from __future__ import annotations

from dataclasses import dataclass

from numba.core import types


@dataclass(frozen=True)
class CompiledCudaTangent:
    """A compiled tangent kernel: ``launch(config, *args, *tangents)``."""

    plan: object
    source: str
    pyfunc: object          # the tangent kernel as a plain Python function
    kernel: object          # cuda.jit(pyfunc)
    disk_cached: bool = False

    def launch(self, config, *args):
        self.kernel[config](*args)

    def signature(self, arg_types):
        """numba signature of the tangent kernel for the forward's argument types: those,
        then one tangent per slot (a scalar's is a 1-element array)."""
        slots = tuple(t if isinstance(t, types.Array) else types.Array(t, 1, "C")
                      for t in (arg_types[i] for i in self.plan.adjoint_args))
        return tuple(arg_types) + slots


def compile_tangent(plan, source, pyfunc, disk_cached, jit_options):
    """The tangent kernel: ``cuda.jit`` (with the kernel's kept options) of ``pyfunc``."""
    from numba import cuda
    return CompiledCudaTangent(plan, source, pyfunc, cuda.jit(**jit_options)(pyfunc),
                               disk_cached)
