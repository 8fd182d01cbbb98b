"""Needed and pushed values (TBR, "to be recorded", as in Tapenade): the values the
reverse sweep reads; of those, the ones the forward overwrites (assigned in a loop or
more than once) and cannot recompute are pushed on a tape before being overwritten and
popped in the reverse sweep.  Arrays are restored the same way only when a recomputed
statement reads them in the reverse of a loop during or after which a store into them
can run (otherwise they hold, at that loop's reverse, what the forward read)."""
from __future__ import annotations

from .. import ir, ops, rules
from .memory import loop_of, rewriting_loop, stored_during_or_after, written_behind
from .recompute import index_read_outside

def partial_reads(s, a):
    """Variables the adjoint of Assign ``s`` reads (it must be active)."""
    e = s.expr
    out = set()
    if isinstance(e, ir.Load):
        if e.array.name in a.varied_arrays:
            out |= ir.var_names(e.index)
    elif isinstance(e, ir.Op):
        rule = rules.lookup(e.fn)
        if rule is not None:
            args = [ops.var(x.name) if isinstance(x, ir.Var) else ops.const(
                x.value if isinstance(x, ir.Const) and isinstance(x.value, (int, float))
                else 0.0) for x in e.args]
            contribs = rules.expand(rule, ops.var(ir.COTANGENT), ops.var(s.target), args)
            for x, c in zip(e.args, contribs):
                if c is not None and a.active(x):
                    out |= ops._lift(c).variables()
            out.discard(ir.COTANGENT)
    return out


def walk_reversed(stmts, a):
    """The statements of ``stmts`` (nested ones included) that the reverse sweep
    visits: it does not enter a loop without reverse code (``has_rev``), so values
    recorded inside such a loop would never be popped (:func:`.loops.find_loop_saved`
    saves them once around it instead)."""
    for s in stmts:
        yield s
        if isinstance(s, ir.If):
            yield from walk_reversed(s.then, a)
            yield from walk_reversed(s.orelse, a)
        elif isinstance(s, (ir.ForRange, ir.Loop)) and a.has_rev.get(id(s)):
            yield from walk_reversed(s.body, a)


def records_in_branches(s, a):
    """Do the branches of If ``s`` record values that the reverse sweep pops (then it
    re-decides ``s`` in reverse, reading its condition)?"""
    return any(isinstance(x, ir.Assign) and x.target in a.pushed
               for x in walk_reversed(s.then + s.orelse, a))


def needed(body, a, extra=()):
    """``extra``: variables needed besides those the adjoints read (the values the
    replays of replayed loops read, :func:`.loops.replay_reads`)."""
    while not _needed_once(body, a, extra):
        pass


def _needed_once(body, a, extra):
    """One pass of :func:`needed`; False when it restores an array without adjoint
    that it did not know of at its start (the pass is then repeated)."""
    needed = set(extra)
    # an array restored in the reverse sweep without an adjoint: its stores pop
    restored = a.restore_arrays - a.varied_arrays - a.unwritten

    def visit(stmts):
        any_rev = False
        for s in stmts:
            r = False
            if isinstance(s, ir.Assign):
                if s.target in a.varied:
                    needed.update(partial_reads(s, a))
                    r = True
            elif isinstance(s, ir.Store):
                if s.array.name in a.varied_arrays or s.array.name in restored:
                    needed.update(ir.var_names(s.index))
                    r = True
            elif isinstance(s, ir.If):
                r1 = visit(s.then)
                r2 = visit(s.orelse)
                r = r1 or r2
                if r:
                    needed.update(ir.var_names((s.cond,)))
            elif isinstance(s, ir.ForRange):
                r = visit(s.body)
                if r:
                    needed.update(ir.var_names((s.start, s.stop, s.step)))
            elif isinstance(s, ir.Loop):
                r = visit(s.body)
            elif isinstance(s, ir.Return):
                r = s.value is not None and a.active(s.value)
            elif isinstance(s, ir.Barrier):
                r = True  # mirrored in the reverse sweep
            a.has_rev[id(s)] = r
            any_rev = any_rev or r
        return any_rev

    visit(body)
    # recomputed statements read their operands at reverse time
    core = _recompute_closure(a, set(needed))
    changed = True
    while changed:
        changed = False
        for stmts in a.recompute.values():
            for s in ir.walk(stmts):
                for v in ir.stmt_reads(s):
                    if v not in needed:
                        needed.add(v)
                        changed = True
    # (what follows reads none of ``needed``: once for each recomputed load)
    for uid, stmts in a.recompute.items():
        for s in ir.walk(stmts):
            if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                    not s.expr.entry and s.expr.array.name not in a.unwritten and (
                    not a.carried_replay or s.target in core):
                if not stored_during_or_after(a, uid, s.expr.array.name,
                                              s.expr.index) or \
                        written_behind(a, loop_of(a, uid), s.expr):
                    # no store can run during or after the loop: at its reverse
                    # the array holds what the forward read
                    continue
                owner = rewriting_loop(a, uid, s.expr.array.name)
                if owner is not None and a.has_rev.get(id(loop_of(a, uid))) and \
                        _stored_later_in(a, owner, uid, s.expr.array.name):
                    owner = None     # the replayed iteration overwrites what it read
                if owner is not None:
                    # a tile rewritten at each iteration of an enclosing loop:
                    # replaying that iteration rewrites it (shared memory; a
                    # scratch array that each iteration rewrites whole)
                    a.force_replay.add(owner)
                    if s.expr.array.name not in a.shared_scratch:
                        a.scratch_owner[s.expr.array.name] = owner
                    continue
                if s.target not in core:
                    continue   # never emitted: its array needs no restoring
                a.restore_arrays.add(s.expr.array.name)
    a.restore_arrays &= (a.stored & a.loaded)
    if a.restore_arrays - a.varied_arrays - a.unwritten - restored:
        # newly restored arrays without adjoints: their stores have reverse code (the
        # pop), and so have the loops around them
        return False
    # loop indices are re-created by the reversed loop; save them when read outside it
    for s in ir.walk(body):
        if isinstance(s, ir.ForRange) and s.index in needed and \
                index_read_outside(a, s):
            a.index_saved.add(s.uid)
    needed.discard(None)
    a.needed = needed
    return True


def _recompute_closure(a, needed):
    """The variables the reverse sweep reads, with the recomputed statements that define
    them and what those read, transitively: a recomputed load outside this set is never
    emitted (kadj.reverse: _needed_recompute), so its array needs no restoring."""
    core = set(needed)
    changed = True
    while changed:
        changed = False
        for stmts in a.recompute.values():
            for x in ir.walk(stmts):
                if isinstance(x, ir.Assign) and x.target in core:
                    new = ir.stmt_reads(x) - core
                elif isinstance(x, ir.If) and any(
                        isinstance(y, ir.Assign) and y.target in core
                        for y in ir.walk(x.then + x.orelse)):
                    new = ir.stmt_reads(x) - core
                else:
                    continue
                if new:
                    core |= new
                    changed = True
    return core


def _stored_later_in(a, owner, uid, arr):
    """Does the body of loop ``owner`` store into ``arr`` after loop ``uid`` (nested
    in it), or in a loop around ``uid`` (whose next trip stores again after it)?
    Replaying an iteration of ``owner`` runs its whole body forward before its loops
    are reversed, so a load that loop ``uid``'s reverse recomputes (a loop with
    reverse code: a search for the maximum has none) would read what that later store
    left (a row read by one loop, then overwritten by the next:
    ``s += exp(x[r, j] - m)``, then ``x[r, j] = exp(x[r, j] - m) / s``)."""
    loop = next(x for x in ir.walk(a.kernel.body)
                if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == owner)
    order = list(ir.walk(loop.body))
    pos = next((k for k, x in enumerate(order)
                if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == uid), None)
    if pos is None:
        return False
    inside = {id(x) for x in ir.walk(order[pos].body)}
    if any(isinstance(x, ir.Store) and x.array.name == arr and id(x) not in inside
           for x in order[pos + 1:]):
        return True
    # a loop around loop ``uid`` (inside ``owner``) runs its stores again after it
    for x in order[:pos]:
        if isinstance(x, (ir.ForRange, ir.Loop)) and \
                any(y is order[pos] for y in ir.walk(x.body)) and \
                any(isinstance(y, ir.Store) and y.array.name == arr and
                    id(y) not in inside for y in ir.walk(x.body)):
            return True
    return False
