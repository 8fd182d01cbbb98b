"""The adjoint IR of a CUDA kernel: kadj.reverse's Writer, one GPU thread at a time.

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
- **Loops that carry state** (per-thread time stepping, recurrences) are reversed from
  checkpoints (:mod:`kadj.checkpoint_reverse`, with :mod:`kadj.cuda.checkpoints` for
  each thread's own element of shared arrays).
"""
from __future__ import annotations

from numba.core import types

from .. import adj_ir as A
from .. import ir
from ..errors import DifferentiationError
from ..printer import Syntax
from ..reverse import Writer, adjoint_source
from ..simplify import simplify
from . import lower
from ..checkpoint_reverse import unravel
from .checkpoints import SharedCheckpoints
from .indexing import ThreadIndex, array_accesses
from .intrinsics import TABLE, CudaIntrinsic
from .stores import check_single_writers

DEFAULT_SLOTS = 24


class CudaWriter(SharedCheckpoints, Writer):
    syntax = Syntax(barrier="cuda.syncthreads()", atomic_add="cuda.atomic.add")
    lowerings = (lower.barriers, lower.accumulate)
    merge_repeated_loads = True   # one atomic per element and thread, not per load
    intrinsics = TABLE            # cuda.<path> in the source (the CUDA target's table)
    # memory policy of the forward sweep's liveness (kadj.memory_liveness)
    declares_allocations = True   # local/shared arrays are declared up front
    kernel_returns = False
    entry_state_live = True       # not an unset register at a loop's entry

    def __init__(self, kernel, an, slot_args, fname, slots=DEFAULT_SLOTS, cells=None):
        self.cells = dict(cells or {})
        super().__init__(kernel, an, slot_args, False, fname)
        from numba import cuda
        self.ns["cuda"] = cuda
        self.slots = int(slots)
        self.index = ThreadIndex(kernel, an.assign_count)
        self.allocs = {x.target: x for x in ir.walk(kernel.body)
                       if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc)}
        self.space = {name: x.expr.fn.path.split(".")[0]
                      for name, x in self.allocs.items()
                      if isinstance(x.expr.fn, CudaIntrinsic)}
        self.classes = {name: self.index.classify(name, idxs,
                                                  self.space.get(name, "global"))
                        for name, idxs in array_accesses(kernel).items()
                        if name in an.varied_arrays}
        self._live_arrays = set()
        self.private_arrays = {n for n, c in self.classes.items() if c.cls == "private"}
        self.atomic_sites = {}      # array -> atomics written
        self.plain_sites = {}       # array -> plain accumulations written
        self.tape_size = {}
        self.local_arrays = []      # (name, size, dtype name) declared in the prologue
        self.loop_report = []
        self.scalar_report = {}
        self.uniform_acc = {}       # (array, constant index) -> local accumulator
        self.uniform_report = {}

    # ---- shared and local arrays, barriers -----------------------------------------
    def _alloc_nodes(self):
        nodes = []
        tid = nthreads = None
        for name, s in self.allocs.items():
            shape, dtype = s.expr.args
            space = self.space[name]
            dt = self.bind(dtype.value, dtype.name or "dtype")
            shp = shape.value
            decl = f"cuda.{space}.array({shp!r}, {dt})"
            if name in self.a.loaded or name in self.a.varied_arrays:
                nodes.append(A.Assign(self.n(name), decl))
            if name not in self.a.varied_arrays:
                continue
            adj = self.adj(name)
            nodes.append(A.Assign(adj, decl))
            dims = shp if isinstance(shp, tuple) else (shp,)
            size = 1
            for d in dims:
                size *= d
            z = self.fresh("z")
            idx = unravel(z, dims)
            zero = self.zero(self.T[name].dtype)
            if space == "shared":
                if tid is None:
                    tid, nthreads = self.fresh("tid"), self.fresh("nthreads")
                    nodes.append(A.Assign(tid, lower.THREAD_ID))
                    nodes.append(A.Assign(nthreads, "cuda.blockDim.x * cuda.blockDim.y * "
                                                    "cuda.blockDim.z"))
                loop = A.For(z, f"range({tid}, {size}, {nthreads})")
            else:
                loop = A.For(z, f"range({size})")
            loop.body.append(A.Assign(f"{adj}[{idx}]", zero))
            nodes.append(loop)
        if tid is not None:
            nodes.append(A.Barrier())
        return nodes

    def local_array(self, hint, size, dtype):
        name = self.fresh(hint)
        self.local_arrays.append((name, size, self.bind(dtype, str(dtype))))
        return name

    # ---- scalar adjoints: one atomic per block --------------------------------------
    def finish_scalar_adjoints(self, names):
        lower.block_sum(self, names)

    # ---- bounded per-thread tape ----------------------------------------------------
    growable_tape = False  # the per-thread tape is sized statically

    def tape_init_nodes(self):
        self.tape_size = lower.bounded_tape(self.body, self.k.name)
        nodes = []
        for kind in sorted(self.tapes):
            dt = {"f64": types.float64, "f32": types.float32, "i64": types.int64}[kind]
            nodes.append(A.Assign(f"_tape_{kind}", f"cuda.local.array("
                                  f"{self.tape_size.get(kind, 1)}, {self.bind(dt, str(dt))})"))
            nodes.append(A.Assign(f"_sp_{kind}", "0"))
        for name, size, dt in self.local_arrays:
            nodes.append(A.Assign(name, f"cuda.local.array({size}, {dt})"))
        return nodes + self._alloc_nodes() + lower.uniform_init_nodes(self)

    # ---- checks -------------------------------------------------------------------
    def check(self):
        a, k = self.a, self.k
        if a.work_arrays:
            names = ", ".join(sorted(a.work_arrays))
            raise DifferentiationError(
                f"the kernel both reads and writes the array(s) {names} at elements other "
                "threads may touch (in-place updates are supported only at the thread's "
                "own element, x[i] with i from cuda.grid)", kernel=k.name,
                loc=self._first_store(a.work_arrays), construct="array read and written",
                remedy="write the result into a separate output array")
        restore = {x for x in a.restore_arrays if self.space.get(x) != "local"}
        if restore:
            raise DifferentiationError(
                "the adjoint would need earlier contents of overwritten arrays "
                f"({', '.join(sorted(restore))}): values read from them are "
                "overwritten later in the kernel and the reverse sweep cannot recompute "
                "them", kernel=k.name, loc=self._first_store(restore),
                construct="overwritten array",
                remedy="write new values into a separate array (double buffering) "
                       "instead of overwriting ones still needed")
        other = sorted(v for v in a.scratch_arrays if v not in self.space)
        if other:
            raise DifferentiationError(
                f"array allocation ({', '.join(other)}) inside a CUDA kernel",
                kernel=k.name, construct="array allocation",
                remedy="use cuda.local.array or cuda.shared.array")
        check_single_writers(k, self.index, self.space, a)

    def _first_store(self, arrays):
        for x in ir.walk(self.k.body):
            if isinstance(x, ir.Store) and x.array.name in arrays:
                return x.loc
        return None

    def report(self):
        arrays = {}
        for name, c in sorted(self.classes.items()):
            n_at = self.atomic_sites.get(name, 0)
            n_pl = self.plain_sites.get(name, 0)
            how = "atomic" if n_at else ("plain" if n_pl else "none")
            if any(a == name for a, _ in self.uniform_acc):
                how = "block-reduced"
            arrays[name] = {"class": c.cls, "accumulation": how, "why": c.why,
                            "atomic_sites": n_at, "plain_sites": n_pl}
        shared = {n for n, sp in self.space.items() if sp == "shared"}
        return {
            # atomic instructions written, in global memory (arrays, and one per block
            # per scalar) and in shared memory (shared arrays, the scalars' slots)
            "atomics": sum(v for k, v in self.atomic_sites.items() if k not in shared),
            "shared_atomics": sum(v for k, v in self.atomic_sites.items() if k in shared)
            + len(self.scalar_report) + len(self.uniform_report),
            "plain_accumulations": sum(self.plain_sites.values()),
            "private_arrays": tuple(sorted(self.private_arrays)),
            "arrays": arrays,
            "scalars": dict(self.scalar_report),
            "uniform_elements": dict(self.uniform_report),
            "loops": list(self.loop_report),
            "tape": dict(self.tape_size),
            "launch_ndim": self.index.ndim,
            # the dimensions whose threadIdx / blockIdx the kernel reads: an adjoint
            # launch may extend only along those (kadj.cuda.threads.check_launch_dims)
            "thread_dims": {"block": "".join("xyz"[d] for d in self.index.block_dims),
                            "grid": "".join("xyz"[d] for d in self.index.grid_dims)},
            "in_place_cells": {a: "the thread's own element, updated in place, held in "
                                  "a scalar" for a in sorted(self.cells)},
        }


def build_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS, cells=None):
    """The adjoint IR of a CUDA kernel (scatter form), before printing:
    (Function, CudaWriter)."""
    w = CudaWriter(kernel, an, slot_args, f"{kernel.name}_adjoint", slots=slots,
                   cells=cells)
    return A.built(simplify(w.build()), "scatter"), w


def write_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS, cells=None):
    fn, w = build_cuda_adjoint(kernel, an, slot_args, slots=slots, cells=cells)
    return adjoint_source(fn, w.syntax, w.ns), w.report(), w
