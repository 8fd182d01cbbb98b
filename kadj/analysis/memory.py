"""Which arrays hold, at reverse time, what the forward sweep read: shared tiles that a
loop rewrites at each iteration, arrays stored after a loop."""
from __future__ import annotations

from .. import ir
from .rewrites import own_rows, rewritten_before_read

def rewritten_each_iteration(loop, arr):
    """Does every iteration of ``loop`` write shared array ``arr`` before reading it (a
    statement of the body itself, or an ``if`` both of whose arms write the same element
    before reading it: ``if j < n: s[tx] = x[j] else: s[tx] = 0.0``)?  Then an
    iteration reads what it wrote (after a barrier: a tile), never an earlier
    iteration's contents."""
    return _stored_first(loop.body, arr) is not None


def _stored_first(seq, arr):
    """The index (as text) of the store into ``arr`` that the statements ``seq`` make
    on every path before any of them reads ``arr``, or None."""
    for x in seq:
        if isinstance(x, ir.Store) and x.array.name == arr:
            return repr(tuple(x.index))
        if isinstance(x, ir.If):
            then, orelse = _stored_first(x.then, arr), _stored_first(x.orelse, arr)
            if then is not None and then == orelse:
                return then
        if any(isinstance(y, ir.Assign) and isinstance(y.expr, ir.Load) and
               y.expr.array.name == arr for y in ir.walk([x])):
            return None
    return None


def rewriting_loop(a, uid, arr):
    """The uid of a loop enclosing loop ``uid`` that rewrites shared array ``arr`` at
    each iteration (CUDA tiles), or, without checkpoints, the innermost loop around or
    at loop ``uid`` whose iterations rewrite scratch array ``arr`` whole before reading
    it (:func:`.rewrites.rewritten_before_read`) or touch only their own row of argument
    ``arr`` (:func:`.rewrites.own_rows`); or None."""
    itself = False     # (a tile is rewritten by a loop around the one reading it)
    if arr in a.shared_scratch:
        rewrites = rewritten_each_iteration
    elif not a.carried_replay and arr not in getattr(a, "scratch_kept", ()) and \
            (arr in a.scratch_arrays or arr in a.work_arrays):
        itself = True

        def rewrites(outer, arr):
            return rewritten_before_read(a, outer, arr) or own_rows(a, outer, arr)
    else:
        return None
    found = None

    def visit(stmts, stack):
        nonlocal found
        for x in stmts:
            if isinstance(x, ir.If):
                visit(x.then, stack)
                visit(x.orelse, stack)
            elif isinstance(x, (ir.ForRange, ir.Loop)):
                if x.uid == uid:
                    for outer in reversed(stack + [x] if itself else stack):
                        if rewrites(outer, arr):
                            found = outer.uid
                            return
                    return
                visit(x.body, stack + [x])

    visit(a.kernel.body, [])
    return found


def stored_during_or_after(a, uid, arr, index=None):
    """Can a store into ``arr`` run after (or during) loop ``uid`` in the forward
    sweep?  If not, a load that the loop's reverse recomputes reads the value the
    forward read, and ``arr`` need not be restored.  With the load's ``index``: the
    later iterations of an enclosing ``for s in range(...)`` do not count when the load
    and every store into ``arr`` in that loop read row ``s`` (``c[s, i]``, the same
    position of the index): each iteration writes only its own row."""
    order = list(ir.walk(a.kernel.body))
    pos = next(k for k, x in enumerate(order)
               if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == uid)
    for x in order[pos:]:
        if isinstance(x, ir.Store) and x.array.name == arr:
            return True
    # enclosing loops run their whole body again
    for x in order[:pos]:
        if isinstance(x, (ir.ForRange, ir.Loop)) and any(
                y is order[pos] for y in ir.walk(x.body)) and \
                arr in ir.stored_arrays(x.body) and not _own_rows(a, x, arr, index):
            return True
    return False


def _own_rows(a, loop, arr, index):
    """Do ``index`` and every store into ``arr`` in ``loop``'s body have ``loop``'s
    counter, bound by no other loop nor assignment, at one position of the index, and
    is the counter never negative (row -1 is the last row, which a later iteration may
    own)?"""
    if index is None or not isinstance(loop, ir.ForRange) or not ir.never_negative(loop):
        return False
    s = ir.Var(loop.index)
    binds = [x for x in ir.walk(a.kernel.body)
             if isinstance(x, ir.ForRange) and x.index == loop.index or
             isinstance(x, ir.Assign) and x.target == loop.index]
    if binds != [loop]:
        return False
    stores = [x.index for x in ir.walk(loop.body)
              if isinstance(x, ir.Store) and x.array.name == arr]
    return any(all(len(ix) == len(index) and ix[p] == s for ix in stores)
               for p in range(len(index)) if index[p] == s)


def written_behind(a, loop, load):
    """Does ``load`` (an :class:`ir.Load` in ``loop``'s body) read an element the loop
    wrote behind itself?  On the CPU (no checkpoints), for a loop going up by 1 that
    stores the 1-D array only at ``i + s`` and reads it here at ``i + r`` with
    ``r < s`` (or going down by 1, with ``r > s``), every index at or above 0 (from the
    loop's constant start, or going down its constant stop), outside any other loop,
    with no store into the array after it: each later iteration writes an element
    further on, so the element read keeps, to the end of the forward sweep and at the
    loop's reverse, the value the iteration read (a recurrence's ``y[i - 1]``, a back
    substitution's ``x[i + 1]``).  Such a load is recomputed, not recorded, and its
    array is not restored for it."""
    from ..gather_plan import _const, _single_defs, coord_offset
    if a.carried_replay or not isinstance(loop, ir.ForRange) or len(load.index) != 1:
        return False
    step = loop.step.value if isinstance(loop.step, ir.Const) else None
    if step not in (1, -1) or isinstance(step, bool):
        return False
    defs = _single_defs(a.kernel)
    bound = _const(loop.start, defs) if step == 1 else _const(loop.stop, defs)
    lowest = None if bound is None else bound if step == 1 else bound + 1
    counters = {loop.index: 0}
    read = coord_offset(load.index[0], counters, defs)
    if lowest is None or read is None or lowest + read[1] < 0:
        return False
    arr, write = load.array.name, None
    for x in ir.walk(loop.body):
        if isinstance(x, (ir.Break, ir.Continue, ir.Return)):
            return False
        if isinstance(x, ir.Store) and x.array.name == arr:
            at = coord_offset(x.index[0], counters, defs) if len(x.index) == 1 else None
            if at is None or write not in (None, at[1]):
                return False
            write = at[1]
    if write is None or lowest + write < 0 or (read[1] - write) * step >= 0:
        return False
    inside = {id(x) for x in ir.walk(loop.body)}
    seen = False
    for x in ir.walk(a.kernel.body):
        if x is loop:
            seen = True
        elif isinstance(x, (ir.ForRange, ir.Loop)) and not seen and id(loop) in {
                id(y) for y in ir.walk(x.body)}:
            return False        # an enclosing loop runs this one again
        elif seen and id(x) not in inside and isinstance(x, ir.Store) and \
                x.array.name == arr:
            return False        # a store after the loop
    return True


def loop_of(a, uid):
    """The loop statement of ``uid``."""
    return next(x for x in ir.walk(a.kernel.body)
                if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == uid)
