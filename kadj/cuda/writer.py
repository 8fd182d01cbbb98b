"""The adjoint IR of a CUDA kernel: kadj.reverse's Writer, one GPU thread at a time.

The writer is the target-neutral one; the CUDA context (:mod:`kadj.cuda.context`)
gives it the policies, lowerings and state listed below.

Each thread of the adjoint kernel replays its forward part, then runs its reverse part
(DESIGN.md).  What changes from the CPU writer:

- **Accumulation into adjoint arrays** is chosen per array from its index expressions
  (:mod:`kadj.cuda.indexing`) by the lowering :func:`kadj.cuda.lower.accumulate`:
  plain ``+=`` for thread-private arrays, else ``cuda.atomic.add``.  Stores consume their element's adjoint with plain reads and
  writes (threads write disjoint elements: DESIGN.md's rule for GPU kernels); a forward
  ``cuda.atomic.add(a, i, v)`` is an increment whose adjoint reads ``adj_a[i]``.
- **Scalar arguments' adjoints** (``alpha``: the same for every thread) are summed
  over the block first: each thread adds its share into one of 32 shared-memory
  slots (lane ``tid % 32``, so a warp's threads hit distinct banks), then thread 0 adds
  the block's total with one global atomic (:func:`kadj.cuda.lower.block_sum`).
- **The tape is per thread and bounded**: ``cuda.local.array`` stacks whose size is
  the number of values recorded outside loops plus those of one replayed iteration.
  Recording inside a loop that is not replayed is refused.
- **Complex adjoints** (complex64/complex128 arrays and scalars, the CPU's convention
  dL/dx + i dL/dy): numba-cuda has no complex atomic add, so each complex atomic
  accumulation is two float atomics on the element's real and imaginary parts
  (:func:`kadj.cuda.lower.complex_atomics`, counted in the report's
  ``complex_atomics``).
- **Loops that carry state** (per-thread time stepping, recurrences) are reversed from
  checkpoints (:mod:`kadj.checkpoint_reverse`, with :mod:`kadj.cuda.checkpoints` for
  each thread's own element of shared arrays).
"""
from __future__ import annotations

from .. import adj_ir as A
from ..lowering import lower_declarations
from ..reverse import Writer, adjoint_source
from ..simplify import simplify
from .context import SYNTAX, cuda_context
from .lower import complex_atomics

DEFAULT_SLOTS = 24


def report(w):
    """The adjoint report of one scatter-form build (:func:`build_cuda_adjoint`)."""
    st = w.state
    arrays = {}
    for name, c in sorted(st.classes.items()):
        n_at = st.atomic_sites.get(name, 0)
        n_pl = st.plain_sites.get(name, 0)
        how = "atomic" if n_at else ("plain" if n_pl else "none")
        if any(a == name for a, _ in st.uniform_acc):
            how = "block-reduced"
        arrays[name] = {"class": c.cls, "accumulation": how, "why": c.why,
                        "atomic_sites": n_at, "plain_sites": n_pl}
    shared = {n for n, sp in st.space.items() if sp == "shared"}
    return {
        # atomic instructions written, in global memory (arrays, and one per block
        # per scalar) and in shared memory (shared arrays; the slots of block sums
        # that are not summed with warp shuffles)
        "atomics": sum(v for k, v in st.atomic_sites.items() if k not in shared),
        "shared_atomics": sum(v for k, v in st.atomic_sites.items() if k in shared)
        + st.slot_sums,
        "plain_accumulations": sum(st.plain_sites.values()),
        "private_arrays": tuple(sorted(st.private_arrays)),
        "arrays": arrays,
        "scalars": dict(st.scalar_report),
        "uniform_elements": dict(st.uniform_report),
        "loops": list(w.loop_report),
        "tape": dict(w.tape_size),
        "launch_ndim": st.index.ndim,
        # the dimensions whose threadIdx / blockIdx the kernel reads: an adjoint
        # launch may extend only along those (kadj.cuda.threads.check_launch_dims)
        "thread_dims": {"block": "".join("xyz"[d] for d in st.index.block_dims),
                        "grid": "".join("xyz"[d] for d in st.index.grid_dims)},
        # complex accumulations written as two float atomics (real, imaginary part)
        **({"complex_atomics": dict(st.complex_atomics)} if st.complex_atomics else {}),
        "in_place_cells": {a: _cell_text(arrays.get(a, {}).get("class"))
                           for a in sorted(st.cells)},
    }


def _cell_text(cls):
    if cls == "private":
        return "the thread's own element, updated in place, held in a scalar"
    # kadj.cuda.parity
    return ("the thread's own element of one colour (a red-black sweep), updated in "
            "place, held in a scalar; the other colour's elements it reads are written "
            "by no thread")


def build_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS, cells=None,
                       lowered=True):
    """The adjoint IR of a CUDA kernel (scatter form), before printing: (Function,
    Writer).  ``lowered=False``: its declaration nodes left as built
    (:mod:`kadj.lowering`), not simplified."""
    w = Writer(kernel, an, slot_args, False, f"{kernel.name}_adjoint",
               cuda_context(kernel, an, cells))
    w.slots = int(slots)
    fn = w.build()
    if not lowered:
        return fn, w
    fn = lower_declarations(fn, w, w.ctx.declarations)
    return A.built(complex_atomics(simplify(fn, w.T, joins=w.ctx.join_names), w), "scatter"), w


def write_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS, cells=None):
    fn, w = build_cuda_adjoint(kernel, an, slot_args, slots=slots, cells=cells)
    return adjoint_source(fn, SYNTAX, w.ns), report(w), w
