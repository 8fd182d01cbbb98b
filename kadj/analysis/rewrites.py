"""Scratch arrays that every iteration of a loop rewrites whole before reading them.

A kernel's 1-D scratch array ``c = np.empty(n)``, used only inside loop ``L``, whose
every iteration first stores ``c[0]``, ``c[1]``, ..., ``c[n - 1]`` (a constant index,
or a unit-step loop storing ``c[i]`` at its own index, unconditionally, and reading
nothing but that element after storing it) and only then reads ``c``, never reads what an earlier iteration of ``L`` (or the code before ``L``)
left in it.  Replaying one iteration of ``L`` then rewrites what that iteration reads:
the array needs no restoring, and ``L`` can be reversed one replayed iteration at a
time (a batched Thomas solve whose sweeps share two scratch rows).

The proof is syntactic and conservative; a kernel that it does not cover keeps the
path that records the overwritten elements.  It fails for an iteration that reads an
element before storing it (a warm start from the previous system's values), for
stores that leave an element unwritten before the first read (which then holds an
earlier iteration's value), for stores under a condition or in a loop that may be left
early, and for arrays used outside ``L``.
"""
from __future__ import annotations

from numba.core import types

from .. import ir
from ..gather_plan import _single_defs


def rewritten_before_read(a, loop, arr):
    """Is ``arr`` a 1-D scratch array of the kernel, used only in ``loop``'s body, that
    every iteration of ``loop`` stores at every index ``0 .. len(arr) - 1`` (statements
    of the body itself, in order) before any statement that reads it?"""
    kernel = a.kernel
    if arr not in a.scratch_arrays or arr in a.private_scratch or \
            arr in a.shared_scratch:
        return False
    t = kernel.types.get(arr)
    if not isinstance(t, types.Array) or t.ndim != 1:
        return False
    size = _alloc_size(kernel, a, arr)
    if size is None or not _used_only_in(kernel, loop, arr):
        return False
    defs = _single_defs(kernel)
    size = _resolve(size, defs, a)
    covered = []
    for x in loop.body:
        piece = _stored_range(x, arr, defs, a)
        if _loads(x, arr):
            if _covers(covered, size):
                return True
            if piece is None or not _reads_own_store(x, arr, defs):
                return False
        if piece is not None:
            covered.append(piece)
    return True     # never read in the loop


def own_rows(a, loop, arr):
    """Is ``arr`` an argument array of two or more dimensions that the kernel reads and
    writes only in ``loop``'s body, always at row ``i`` of ``loop``'s own index
    (``arr[i, j]``)?  Then the iterations touch disjoint rows, and iteration ``i`` finds
    its row as the kernel's caller passed it: a replayed iteration starts from the
    argument's row, restored, and needs no recorded element.  Reading ``arr[i - 1, j]``
    (a row of another iteration), or touching ``arr`` before or after ``loop``, fails
    the proof."""
    kernel = a.kernel
    if a.carried_replay or not isinstance(loop, ir.ForRange) or \
            arr not in a.work_arrays or loop.index in ir.assigned(loop.body) or \
            _in_a_loop(kernel.body, loop) is not False:
        # (a loop run several times finds the rows as its earlier runs left them)
        return False
    t = kernel.types.get(arr)
    if not isinstance(t, types.Array) or t.ndim < 2 or not ir.never_negative(loop):
        return False
    defs = _single_defs(kernel)
    inside = set(map(id, ir.walk(loop.body)))
    copies = ir.assigned(loop.body)

    def own(index):
        return len(index) >= 1 and arr not in ir.var_names(index) and \
            _is_index(index[0], loop.index, defs, copies)

    for x in ir.walk(kernel.body):
        if isinstance(x, ir.Assign):
            e = x.expr
            if isinstance(e, ir.Load) and e.array.name == arr:
                ok = id(x) in inside and own(e.index)
            elif isinstance(e, ir.Attr) and e.value.name == arr:
                ok = e.attr in ("shape", "ndim", "size", "dtype")
            else:
                ok = arr not in ir.var_names(ir.operands(e))
        elif isinstance(x, ir.Store) and x.array.name == arr:
            ok = id(x) in inside and x.accumulate is None and own(x.index) and \
                arr not in ir.var_names((x.value,))
        else:
            ok = arr not in ir.stmt_reads(x)
        if not ok:
            return False
    return True


def _in_a_loop(stmts, loop, inside=False):
    """Does ``loop`` lie in the body of another loop?"""
    for x in stmts:
        if x is loop:
            return inside
        if isinstance(x, ir.If):
            found = _in_a_loop(x.then, loop, inside)
            if found is None:
                found = _in_a_loop(x.orelse, loop, inside)
            if found is not None:
                return found
        elif isinstance(x, (ir.ForRange, ir.Loop)):
            found = _in_a_loop(x.body, loop, True)
            if found is not None:
                return found
    return None


def _alloc_size(kernel, a, arr):
    """The length operand of ``arr``'s one allocation (outside every loop), or None."""
    allocs = [x for x in ir.walk(kernel.body)
              if isinstance(x, ir.Assign) and x.target == arr]
    if len(allocs) != 1 or not isinstance(allocs[0].expr, ir.Alloc) or \
            not allocs[0].expr.args or arr in a.in_loop:
        return None
    size = allocs[0].expr.args[0]
    if isinstance(size, ir.Var):
        defs = _single_defs(kernel)
        d = defs.get(size.name)
        if d is not None and isinstance(d, ir.Op) and d.fn is ir.make_tuple:
            if len(d.args) != 1:
                return None
            size = d.args[0]
    st = kernel.types.get(size.name) if isinstance(size, ir.Var) else None
    if isinstance(size, ir.Var) and not isinstance(st, types.Integer):
        return None
    if isinstance(size, ir.Const) and not isinstance(size.value, int):
        return None
    return size


def _used_only_in(kernel, loop, arr):
    """Every statement naming ``arr`` (other than its allocation) lies in ``loop``'s
    body, and names it only as the array of a load or a store (never passed on)."""
    inside = set(map(id, ir.walk(loop.body)))
    for x in ir.walk(kernel.body):
        if isinstance(x, ir.Assign) and x.target == arr:
            continue
        if isinstance(x, ir.Assign):
            e = x.expr
            named = arr in ir.var_names(ir.operands(e))
            direct = isinstance(e, ir.Load) and e.array.name == arr and \
                arr not in ir.var_names(e.index)
        elif isinstance(x, ir.Store):
            named = arr in ir.stmt_reads(x)
            direct = x.array.name == arr and arr not in ir.var_names(
                tuple(x.index) + (x.value,))
        else:
            named = arr in ir.stmt_reads(x)
            direct = False
        if named and (not direct or id(x) not in inside):
            return False
    return True


def _resolve(op, defs, a):
    """``op`` with copies followed (``n = t4`` gives ``t4``); None when it names a
    variable that may hold different values (assigned more than once, or in a loop)."""
    seen = 0
    while isinstance(op, ir.Var) and seen < 50:
        e = defs.get(op.name)
        if e is None:
            if op.name in a.assign_count and a.assign_count[op.name] > 0 or \
                    op.name not in a.kernel.args:
                return None
            return op
        if op.name in a.in_loop:
            return None
        if isinstance(e, ir.Copy) and isinstance(e.src, (ir.Var, ir.Const)):
            op = e.src
            seen += 1
            continue
        return op
    return op if isinstance(op, ir.Const) else None


def _loads(x, arr):
    """Does statement ``x`` read ``arr`` (a load, or an increment ``arr[i] += v``
    whose result depends on the element's earlier value)?"""
    return any(isinstance(y, ir.Assign) and isinstance(y.expr, ir.Load) and
               y.expr.array.name == arr or
               isinstance(y, ir.Store) and y.array.name == arr and
               y.accumulate in ("add", "sub") for y in ir.walk((x,)))


def _stored_range(x, arr, defs, a):
    """(lo, hi) operands of the indices ``[lo, hi)`` that statement ``x`` stores into
    ``arr`` whenever it runs, or None: a plain store at a constant index, or a loop of
    step 1, never left early, storing ``arr[i]`` at its own index ``i`` in a statement
    of its body itself."""
    if isinstance(x, ir.Store) and x.array.name == arr and x.accumulate is None and \
            len(x.index) == 1:
        k = _resolve(x.index[0], defs, a)
        if isinstance(k, ir.Const) and isinstance(k.value, int) and k.value >= 0:
            return ir.Const(k.value), ir.Const(k.value + 1)
        return None
    if not isinstance(x, ir.ForRange) or x.step != ir.Const(1):
        return None
    if any(isinstance(y, (ir.Break, ir.Continue, ir.Return, ir.Loop))
           for y in ir.walk(x.body)) or x.index in ir.assigned(x.body):
        return None
    lo, hi = _resolve(x.start, defs, a), _resolve(x.stop, defs, a)
    if lo is None or hi is None:
        return None
    for y in x.body:
        if isinstance(y, ir.Store) and y.array.name == arr and y.accumulate is None and \
                len(y.index) == 1 and _is_index(y.index[0], x.index, defs):
            return lo, hi
    return None


def _reads_own_store(loop, arr, defs):
    """Does each iteration of ``loop`` (a unit-step loop storing ``arr[i]``) store
    ``arr[i]`` before any other use of ``arr``, and then read and write only
    ``arr[i]``, its own element (``p[j] = exp(...)``; ``s += p[j]``)?"""
    copies = ir.assigned(loop.body)

    def own(index):
        return len(index) == 1 and _is_index(index[0], loop.index, defs, copies)

    stored = False
    for x in loop.body:
        if not stored:
            if isinstance(x, ir.Store) and x.array.name == arr and \
                    x.accumulate is None and own(x.index):
                stored = True
            elif _mentions(x, arr):
                return False
            continue
        for y in ir.walk((x,)):
            if isinstance(y, ir.Assign) and isinstance(y.expr, ir.Load) and \
                    y.expr.array.name == arr:
                if not own(y.expr.index):
                    return False
            elif isinstance(y, ir.Store) and y.array.name == arr:
                if y.accumulate is not None or not own(y.index) or \
                        arr in ir.var_names((y.value,)):
                    return False
            elif arr in ir.stmt_reads(y):
                return False
    return stored


def _mentions(x, arr):
    return any(arr in ir.stmt_reads(y) for y in ir.walk((x,)))


def _is_index(op, index, defs, copies=None):
    """Is ``op`` the loop index ``index`` (directly or through copies; with ``copies``,
    only copies made by variables in that set: those the loop's body assigns)?"""
    for _ in range(50):
        if not isinstance(op, ir.Var):
            return False
        if op.name == index:
            return True
        e = defs.get(op.name)
        if not isinstance(e, ir.Copy) or copies is not None and op.name not in copies:
            return False
        op = e.src
    return False


def _covers(pieces, size):
    """Do the index ranges ``pieces`` chain from 0 up to ``size`` (``[0, b1)``,
    ``[b1, b2)``, ..., ``[bk, size)``: together they cover ``[0, size)`` whatever the
    values of the bounds)?"""
    if size is None:
        return False
    cur, left = ir.Const(0), list(pieces)
    while not _same(cur, size):
        nxt = next((p for p in left if _same(p[0], cur)), None)
        if nxt is None:
            return False
        left.remove(nxt)
        cur = nxt[1]
    return True


def _same(x, y):
    if isinstance(x, ir.Const) and isinstance(y, ir.Const):
        return type(x.value) is type(y.value) and x.value == y.value
    return isinstance(x, ir.Var) and isinstance(y, ir.Var) and x.name == y.name
