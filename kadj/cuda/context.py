"""The CUDA target's part in building one adjoint: a :class:`kadj.lowering.Context`.

The writer is the target-neutral :class:`kadj.reverse.Writer`; what makes its adjoint a
GPU thread's is data and functions handed to it here:

- the state (:class:`CudaState`) its lowerings read and fill: the thread indexing
  (:class:`kadj.cuda.indexing.ThreadIndex`), the memory space of each array the kernel
  allocates, the class of each adjoint array (private, neighbour, uniform, ...), the
  accumulations written (for the adjoint report, :func:`kadj.cuda.writer.report`);
- the lowerings (:mod:`kadj.cuda.lower`): accumulation policy, barriers, bounded tape,
  ``cuda.local`` / ``cuda.shared`` arrays, the block sum of scalar adjoints;
- the refusals (:func:`check`) and the policies of the forward sweep's liveness.

Forward mode's counterpart is :func:`tangent_context`: the one
:class:`kadj.tangent.TangentWriter` gets the CUDA spellings and the tangent lowerings
of :mod:`kadj.cuda.lower` (barriers kept, shared/local arrays declared with their
tangents, the forward's atomics and their tangents).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from ..complex_check import is_complex, tape_refusal
from ..errors import DifferentiationError
from ..lowering import Context
from ..printer import Syntax
from ..tangent import TangentContext
from . import lower, own_rows as rows_, warp
from .checkpoints import own_element
from .indexing import ArrayClass, ThreadIndex, array_accesses, own_rows
from .intrinsics import TABLE, CudaIntrinsic
from .stores import check_single_writers

SYNTAX = Syntax(barrier="cuda.syncthreads()", atomic_add="cuda.atomic.add", select="")
SCATTER = (lower.barriers, lower.accumulate)


@dataclass(eq=False)
class CudaState:
    """What the CUDA lowerings of one build read (the first fields) and fill."""
    cells: dict             # arrays updated in place at the thread's own element
    index: ThreadIndex
    allocs: dict            # array -> the kernel's allocation statement
    space: dict             # array -> "local" | "shared"
    classes: dict           # adjoint array -> its class (kadj.cuda.indexing)
    private_arrays: set
    atomic_sites: dict = field(default_factory=dict)   # array -> atomics written
    plain_sites: dict = field(default_factory=dict)    # array -> plain accumulations
    scalar_report: dict = field(default_factory=dict)
    uniform_acc: dict = field(default_factory=dict)    # (array, index) -> local sum
    uniform_report: dict = field(default_factory=dict)
    slot_sums: int = 0          # block sums through shared-memory slots (one atomic each)
    block_ids: object = None    # (tid, nthreads) names, once a shared array is zeroed
    gather: object = None       # the gather form's passes (kadj.cuda.gather)
    complex_atomics: dict = field(default_factory=dict)  # array -> atomics split in two
    rows: object = None         # the own-row arrays' buffers (kadj.cuda.own_rows)


def cuda_state(kernel, an, cells=None):
    index = ThreadIndex(kernel, an.assign_count)
    allocs = {x.target: x for x in ir.walk(kernel.body)
              if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc)}
    space = {name: x.expr.fn.path.split(".")[0] for name, x in allocs.items()
             if isinstance(x.expr.fn, CudaIntrinsic)}
    classes = {name: index.classify(name, idxs, space.get(name, "global"))
               for name, idxs in array_accesses(kernel).items()
               if name in an.varied_arrays}
    classes.update(_row_private(kernel, index, classes, space))
    rows = rows_.arrays_of(kernel)
    classes.update(rows_.classes(rows, classes))
    return CudaState(dict(cells or {}), index, allocs, space, classes,
                     {n for n, c in classes.items() if c.cls == "private"},
                     rows=rows_.RowState(rows) if rows else None)


def _row_private(kernel, index, classes, space):
    """Argument arrays that only the thread's own row is read or written of (``x[r, j]``
    with ``r = cuda.grid(1)``, any column; :func:`kadj.cuda.indexing.own_rows`): no
    other thread touches that row, so the adjoint adds into ``adj_x[r, j]`` with a
    plain ``+=``."""
    cands = [n for n, c in classes.items() if c.cls == "arbitrary" and n not in space]
    if not cands:
        return {}
    out = {}
    for name in sorted(own_rows(index, kernel, cands)):
        out[name] = ArrayClass(name, "private", f"every access is in the thread's own "
                                                f"row {name}[i, :] (i from cuda.grid(1))")
    return out


def cuda_context(kernel, an, cells=None, lowerings=SCATTER, expressions=()):
    """The context of one CUDA build: scatter-form lowerings unless given others
    (the gather form's, with its coordinate substitution ``expressions``)."""
    from numba import cuda
    state = cuda_state(kernel, an, cells)
    if state.rows is not None:      # run-time-length rows: kadj.cuda.own_rows
        lowerings = (rows_.lower_saves,) + tuple(lowerings)
        declarations = rows_.declarations(lower.DECLARATIONS)
    else:
        declarations = lower.DECLARATIONS
    return Context(syntax=SYNTAX, lowerings=lowerings, declarations=declarations,
                   intrinsics=TABLE, expressions=expressions, checks=(check,),
                   own_element=own_element, growable_tape=False,
                   merge_repeated_loads=True,   # one atomic per element and thread
                   declares_allocations=True,   # local/shared arrays: in the prologue
                   kernel_returns=False,
                   entry_state_live=True,       # not an unset register at loop entry
                   join_names=False,            # guard chains as numba wrote them
                   space=state.space, namespace={"cuda": cuda}, state=state)


def tangent_context():
    """The CUDA target's part in building a tangent kernel (forward mode)."""
    from numba import cuda
    return TangentContext(syntax=SYNTAX, intrinsics=TABLE, namespace={"cuda": cuda},
                          barrier=lower.tangent_barrier, declare=lower.tangent_declare,
                          accumulate=lower.tangent_atomic, op_tangent=warp.tangent_term)


def check(w):
    """The CUDA target's refusals of a kernel it cannot differentiate."""
    a, k, st = w.a, w.k, w.state
    rows = own_rows(st.index, k, a.work_arrays) if a.work_arrays else set()
    if a.work_arrays and rows == set(a.work_arrays):
        _refuse_own_rows(k, st.index, sorted(rows))
    if a.work_arrays:
        names = ", ".join(sorted(a.work_arrays))
        raise DifferentiationError(
            f"the kernel both reads and writes the array(s) {names} at elements other "
            "threads may touch (in-place updates are supported only at the thread's "
            "own element, x[i] with i from cuda.grid, or in a red-black sweep that "
            "writes one colour under a test such as (i + j) % 2 == color and reads "
            "the other colour under the same test)", kernel=k.name,
            loc=_first_store(k, a.work_arrays), construct="array read and written",
            remedy="write the result into a separate output array")
    restore = {x for x in a.restore_arrays if st.space.get(x) != "local"}
    if restore:
        raise DifferentiationError(
            "the adjoint would need earlier contents of overwritten arrays "
            f"({', '.join(sorted(restore))}): values read from them are "
            "overwritten later in the kernel and the reverse sweep cannot recompute "
            "them", kernel=k.name, loc=_first_store(k, restore),
            construct="overwritten array",
            remedy="write new values into a separate array (double buffering) "
                   "instead of overwriting ones still needed" + (
                       "; a loop that reads every element of a shared array (v[j]) "
                       "that the same iteration then overwrites (v[tid] = ...) can "
                       "read a per-thread copy instead: copy it into a "
                       "cuda.local.array at the iteration's start (for j: vl[j] = "
                       "v[j], then cuda.syncthreads()) and read vl[j]"
                       if any(st.space.get(x) == "shared" for x in restore)
                       else ""))
    other = sorted(v for v in a.scratch_arrays if v not in st.space)
    if other:
        raise DifferentiationError(
            f"array allocation ({', '.join(other)}) inside a CUDA kernel",
            kernel=k.name, construct="array allocation",
            remedy="use cuda.local.array or cuda.shared.array")
    check_single_writers(k, st.index, st.space, a)
    _check_complex_saves(k, a)


def _refuse_own_rows(k, index, names):
    """Arrays read and written only in the running thread's own row (``y[i, j]``, i
    from ``cuda.grid(1)``) that :mod:`kadj.cuda.own_rows` does not rewrite (3-D
    arrays, grid-stride loops, a row rewritten in nested loops, atomics)."""
    shown = ", ".join(names)
    why = "; ".join(filter(None, (rows_.unsupported(k, index, n) for n in names)))
    raise DifferentiationError(
        f"the kernel updates the running thread's own row of the array(s) {shown} in "
        f"place ({names[0]}[i, ...] with i from cuda.grid(1)), in a form kadj does not "
        f"reverse: {why} (supported: the row of a 2-D array picked by a coordinate "
        "assigned once at the kernel's top level, rewritten outside loops or in "
        "loops not nested in others)", kernel=k.name, loc=_first_store(k, names),
        construct="thread's own row updated in place",
        remedy="read no argument array that the kernel writes: carry running values "
               "in scalars (v = f(v); y[i, t] = v) and recompute a stage's values "
               "where they are needed (y[i, j] = math.exp(x[i, j] - m) / s)")


def _check_complex_saves(k, a):
    """A thread-local or own-element array a loop reversed from checkpoints saves on
    the tape element by element: the bounded tape holds real values only, so a
    complex one is refused (a complex scalar is saved as its two parts)."""
    saved = set()
    for names in list(a.checkpoint_arrays.values()) + list(a.checkpoint_owned.values()):
        saved.update(names)
    cplx = sorted(n for n in saved if is_complex(k.types.get(n)))
    if cplx:
        err = tape_refusal(k.types[cplx[0]])
        raise DifferentiationError(
            f"the complex array(s) {', '.join(cplx)} would have to be saved on the "
            "tape of a loop reversed from checkpoints, which holds real values only",
            kernel=k.name, loc=_first_store(k, cplx), construct=err.construct,
            remedy="keep the complex values in two real arrays (real and imaginary "
                   "parts), or in scalars")


def _first_store(kernel, arrays):
    for x in ir.walk(kernel.body):
        if isinstance(x, ir.Store) and x.array.name in arrays:
            return x.loc
    return None
