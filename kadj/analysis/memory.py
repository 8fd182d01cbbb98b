"""Which arrays hold, at reverse time, what the forward sweep read: shared tiles that a
loop rewrites at each iteration, arrays stored after a loop."""
from __future__ import annotations

from .. import ir
from .rewrites import own_rows, rewritten_before_read

def rewritten_each_iteration(loop, arr):
    """Does every iteration of ``loop`` write shared array ``arr`` (a statement of the
    body itself, not under a branch) before reading it?  Then an iteration reads what
    it wrote (after a barrier: a tile), never an earlier iteration's contents."""
    first_store = None
    for k, x in enumerate(loop.body):
        if isinstance(x, ir.Store) and x.array.name == arr:
            first_store = k
            break
    if first_store is None:
        return False
    for x in ir.walk(loop.body[:first_store]):
        if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                x.expr.array.name == arr:
            return False
    return True


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


def stored_during_or_after(a, uid, arr):
    """Can a store into ``arr`` run after (or during) loop ``uid`` in the forward
    sweep?  If not, a load that the loop's reverse recomputes reads the value the
    forward read, and ``arr`` need not be restored."""
    order = list(ir.walk(a.kernel.body))
    pos = next(k for k, x in enumerate(order)
               if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == uid)
    for x in order[pos:]:
        if isinstance(x, ir.Store) and x.array.name == arr:
            return True
    # enclosing loops run their whole body again
    for x in order[:pos]:
        if isinstance(x, (ir.ForRange, ir.Loop)) and any(
                y is order[pos] for y in ir.walk(x.body)) and arr in ir.stored_arrays(x.body):
            return True
    return False
