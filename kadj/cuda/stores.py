"""One writer per stored element: the check behind a plain store's adjoint.

The adjoint of a plain store ``y[idx] = v`` reads the element's adjoint into ``v``'s and
sets it to zero (kadj.reverse, ``rev_store``).  That is right when one thread stores the
element.  When several threads store it (benign in the forward if they all store the
same value: ``sm[0] = x[cuda.blockIdx.x]`` run by every thread of a block, ``y[0] = a``
by every thread), each of them reads the whole adjoint before any sets it to zero: on
a GPU the gradient is counted up to once per thread.

So every plain store of a differentiated value into a global or shared array must be
*single-writer*: for each component of the thread's identity that can vary
(:mod:`kadj.cuda.threads`; within a block for shared memory), either the index depends
on it, or an enclosing guard fixes it (``if cuda.threadIdx.x == 0:``, ``if i == 0:``
with ``i = cuda.grid(1)``, or ``if cuda.threadIdx.x != 0: return`` before the store).
An index that depends on the thread in a way kadj cannot invert (``y[perm[i]]``) is
trusted to give each thread its own element, as DESIGN.md's rule for GPU kernels (threads
communicate through disjoint writes) asks of the kernel's author.
"""
from __future__ import annotations

import operator

from .. import ir
from ..errors import DifferentiationError
from .threads import XYZ, ThreadDeps, intrinsic_components


def _name(comp):
    kind, d = comp
    return f"{'threadIdx' if kind == 't' else 'blockIdx'}.{XYZ[d]}"


class _Guards:
    """Components fixed by a condition: ``a == b`` with one side recovering components
    of the thread (threadIdx, blockIdx, a thread coordinate, plus or minus or times a
    thread-independent value) and the other side thread-independent."""

    def __init__(self, kernel, index, deps):
        self.index, self.deps = index, deps
        self.defs = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Assign):
                self.defs.setdefault(s.target, []).append(s.expr)

    def _def(self, x):
        if isinstance(x, ir.Var):
            es = self.defs.get(x.name)
            if es is not None and len(es) == 1:
                return es[0]
        return None

    def recovered(self, x, depth=0):
        """Components whose values follow from the value of ``x`` (frozenset), or
        None when kadj cannot tell."""
        if not isinstance(x, ir.Var) or depth > 8:
            return None
        if x.name in self.index.coord:
            d = self.index.coord[x.name]
            return frozenset({("t", d), ("b", d)})
        e = self._def(x)
        if e is None:
            return None
        if isinstance(e, ir.Copy):
            return self.recovered(e.src, depth + 1)
        comps = intrinsic_components(e)
        if comps is not None:
            path = e.fn.path
            one = path == "grid" or path.split(".")[0] in ("threadIdx", "blockIdx")
            return comps if one and (path != "grid" or len(comps) == 2) else None
        if isinstance(e, ir.Item) and e.value.name in self.deps.grid_tuple:
            return frozenset({("t", e.index), ("b", e.index)})
        if isinstance(e, ir.Op) and len(e.args) == 2 and e.fn in (
                operator.add, operator.sub, operator.mul):
            a, b = e.args
            for this, other in ((a, b), (b, a)):
                if e.fn is operator.mul and not (
                        isinstance(other, ir.Const) and isinstance(other.value, int) and
                        other.value != 0):
                    continue
                if self.deps.invariant(other):
                    got = self.recovered(this, depth + 1)
                    if got is not None:
                        return got
        return None

    def of(self, cond):
        """(fixed in the then-branch, fixed in the else-branch) of ``if cond``."""
        none = (frozenset(), frozenset())
        e = self._def(cond)
        if isinstance(e, ir.Op) and e.fn is bool and len(e.args) == 1:
            e = self._def(e.args[0])
        if not (isinstance(e, ir.Op) and len(e.args) == 2 and
                e.fn in (operator.eq, operator.ne)):
            return none
        a, b = e.args
        for this, other in ((a, b), (b, a)):
            if self.deps.invariant(other):
                got = self.recovered(this)
                if got:
                    return (got, frozenset()) if e.fn is operator.eq else \
                        (frozenset(), got)
        return none


_REMEDY = {
    "shared": "guard the store so one thread of the block writes it, e.g. `if "
              "cuda.threadIdx.x == 0:` (then cuda.syncthreads() before other threads "
              "read it), or write each thread's own element (sm[cuda.threadIdx.x])",
    "global": "guard the store so one thread writes it, e.g. `if i == 0:` with i = "
              "cuda.grid(1) (or `if cuda.threadIdx.x == 0:` when the index depends on "
              "cuda.blockIdx.x), or write each thread's own element (y[i])",
}


def _exits(seq):
    return bool(seq) and isinstance(seq[-1], ir.Return)


def check_single_writers(kernel, index, space, an):
    """Refuse (:class:`DifferentiationError`) a plain store of a differentiated value
    into a global or shared array that several threads would make (module doc)."""
    block, grid = index.block_dims, index.grid_dims   # thread_dims(kernel)
    deps = ThreadDeps(kernel)
    guards = _Guards(kernel, index, deps)
    in_block = frozenset(("t", d) for d in block)
    in_grid = in_block | frozenset(("b", d) for d in grid)

    def check(s, fixed):
        arr = s.array.name
        where = space.get(arr, "global")
        if s.accumulate or where == "local" or arr not in an.varied_arrays or \
                not an.active(s.value):
            return
        needed = in_block if where == "shared" else in_grid
        covered = set(fixed)
        for x in s.index:
            covered |= deps.of(x)
        missing = sorted(needed - covered)
        if not missing:
            return
        names = " or ".join(_name(c) for c in missing)
        who = "every thread of a block stores" if where == "shared" and \
            len(missing) == len(needed) else \
            "every thread stores" if len(missing) == len(needed) else \
            f"threads that differ only in {names} store"
        raise DifferentiationError(
            f"{who} the same element of the {where} array '{arr}' (its index "
            f"does not depend on {names}, and no enclosing `if` picks one thread); the "
            "adjoint of a store reads the element's adjoint and sets it to zero, which "
            "each of those threads would do at once, counting the gradient once per "
            "thread", kernel=kernel.name, loc=s.loc,
            construct="element stored by several threads",
            remedy=_REMEDY[where])

    def visit(seq, fixed):
        for s in seq:
            if isinstance(s, ir.Store):
                check(s, fixed)
            elif isinstance(s, ir.If):
                then_fix, else_fix = guards.of(s.cond)
                visit(s.then, fixed | then_fix)
                visit(s.orelse, fixed | else_fix)
                # `if tid != 0: return` guards what follows
                if _exits(s.then):
                    fixed = fixed | else_fix
                if _exits(s.orelse):
                    fixed = fixed | then_fix
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                visit(s.body, fixed)

    visit(kernel.body, frozenset())
