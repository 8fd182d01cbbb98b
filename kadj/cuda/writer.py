"""The adjoint of a CUDA kernel: kadj.reverse's Writer, one GPU thread at a time.

Each thread of the adjoint kernel replays its forward part, then runs its reverse part
(DESIGN.md).  What changes from the CPU writer:

- accumulations into adjoint arrays (``adj_x[idx] += v``) become
  ``cuda.atomic.add(adj_x, idx, v)`` unless the access is *thread-private*: every load
  and store of ``x`` in the kernel uses exactly the index built from ``cuda.grid(n)``'s
  components (each component once, all n of them), and those index variables are
  assigned once.  Then no other thread touches that element and ``+=`` is safe.
  Stores consume their element's adjoint with plain reads and writes (threads write
  disjoint elements: DESIGN.md's rule for GPU kernels);
- scalar arguments' adjoints are accumulated in a per-thread local and added to the
  1-element buffer with one ``cuda.atomic.add(adj_a_buf, 0, adj_a)`` per thread;
- CUDA intrinsics are written as ``cuda.<path>``;
- no tapes, no work copies, no allocations (refused with DifferentiationError).
"""
from __future__ import annotations

import re

from numba.core import types

from .. import ir
from ..errors import DifferentiationError
from ..reverse import AdjointSource, Writer
from .structure import SPECIAL_REGS, CudaIntrinsic

_ACCUM = re.compile(r"^(adj_[A-Za-z_]\w*)\[([^\[\]]*)\] \+= (.*)$")


def _grid_index_vars(kernel, assign_count):
    """{variable: (grid call id, component)} for the components of cuda.grid(n)."""
    comp = {}
    ndims = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Op) and \
                s.expr.fn == CudaIntrinsic("grid") and assign_count.get(s.target) == 1:
            n = s.expr.args[0].value if s.expr.args and isinstance(s.expr.args[0],
                                                                  ir.Const) else None
            if n == 1:
                comp[s.target] = (s.target, 0)
            elif n in (2, 3):
                comp[("tuple", s.target)] = (s.target, None)
            ndims[s.target] = n
    changed = True
    while changed:
        changed = False
        for s in ir.walk(kernel.body):
            if not isinstance(s, ir.Assign) or s.target in comp or \
                    assign_count.get(s.target) != 1:
                continue
            e = s.expr
            if isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
                src = e.src.name
                if src in comp:
                    comp[s.target] = comp[src]
                    changed = True
                elif ("tuple", src) in comp:
                    comp[("tuple", s.target)] = comp[("tuple", src)]
                    comp[s.target] = None  # marker: the tuple itself
                    changed = True
            elif isinstance(e, ir.Item) and ("tuple", e.value.name) in comp:
                call = comp[("tuple", e.value.name)][0]
                comp[s.target] = (call, e.index)
                changed = True
    return {k: v for k, v in comp.items() if isinstance(k, str) and v is not None}, ndims


class CudaWriter(Writer):
    def __init__(self, kernel, an, slot_args, fname):
        super().__init__(kernel, an, slot_args, False, fname)
        from numba import cuda
        self.ns["cuda"] = cuda
        self.private_arrays = self._find_private_arrays()
        self.atomic_count = 0
        self.plain_count = 0

    # ---- index analysis -----------------------------------------------------------
    def _find_private_arrays(self):
        k, a = self.k, self.a
        comps, ndims = _grid_index_vars(k, a.assign_count)
        accesses = {}
        for s in ir.walk(k.body):
            if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load):
                accesses.setdefault(s.expr.array.name, []).append(s.expr.index)
            elif isinstance(s, ir.Store):
                accesses.setdefault(s.array.name, []).append(s.index)
        private = set()
        for arr, idxs in accesses.items():
            ok = True
            keys = set()
            for idx in idxs:
                if not all(isinstance(x, ir.Var) and x.name in comps for x in idx):
                    ok = False
                    break
                cs = [comps[x.name] for x in idx]
                calls = {c for c, _ in cs}
                dims = sorted(d for _, d in cs)
                if len(calls) != 1:
                    ok = False
                    break
                call = next(iter(calls))
                if dims != list(range(ndims[call])):
                    ok = False
                    break
                keys.add(tuple(cs))
            if ok and len(keys) == 1:
                private.add(arr)
        return private

    # ---- rendering ----------------------------------------------------------------
    def bind(self, obj, hint):
        if isinstance(obj, CudaIntrinsic):
            return "cuda." + obj.path
        return super().bind(obj, hint)

    def expr(self, e):
        if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic) and \
                e.fn.path in SPECIAL_REGS:
            return "cuda." + e.fn.path
        return super().expr(e)

    def emit(self, depth, text):
        m = _ACCUM.match(text)
        if m:
            buf, index, value = m.groups()
            arr = buf[4:]
            scalar = arr.endswith("_buf") and arr[:-4] in self.slot_args and \
                not isinstance(self.T.get(arr[:-4]), types.Array)
            if scalar or self._array_of(arr) not in self.private_arrays:
                idx = index if "," not in index else f"({index})"
                self.atomic_count += 1
                text = f"cuda.atomic.add({buf}, {idx}, {value})"
            else:
                self.plain_count += 1
        super().emit(depth, text)

    def _array_of(self, rendered):
        for v, nm in self.names.items():
            if nm == rendered:
                return v
        return rendered

    # ---- checks -------------------------------------------------------------------
    def check(self):
        a, k = self.a, self.k
        if a.work_arrays:
            names = ", ".join(sorted(a.work_arrays))
            raise DifferentiationError(
                f"the kernel both reads and writes the array(s) {names}; the CUDA adjoint "
                "does not support this yet", kernel=k.name,
                construct="array read and written",
                remedy="write the result into a separate output array")
        if a.pushed or a.restore_arrays or a.scratch_arrays:
            raise DifferentiationError(
                "the kernel overwrites values its adjoint needs (a loop-carried value or "
                "a reassigned variable), which needs a tape; the CUDA adjoint does not "
                "support tapes yet", kernel=k.name, construct="taped value",
                remedy="assign each value once (new names), or keep loops free of "
                       "carried values")

    def write(self):
        self.check()
        source, params = super().write()
        if self.tapes:
            raise DifferentiationError(
                "the CUDA adjoint of this kernel would need a tape (loop trip counts or "
                "overwritten values), which is not supported yet", kernel=self.k.name,
                construct="tape", remedy="use loops with range() and no early exit")
        return source, params


def write_cuda_adjoint(kernel, an, slot_args):
    fname = f"{kernel.name}_adjoint"
    w = CudaWriter(kernel, an, slot_args, fname)
    source, params = w.write()
    report = {"atomics": w.atomic_count, "plain_accumulations": w.plain_count,
              "private_arrays": tuple(sorted(w.private_arrays))}
    return AdjointSource(name=fname, source=source, namespace=w.ns,
                         param_names=params), report
