"""Reversal strategy per loop: ascending (iterations independent: their adjoints run
in forward order), replayed per iteration (with checkpoints of the carried state), and
values saved once around a loop instead of at each iteration."""
from __future__ import annotations

from numba.core import types

from .. import ir
from .memory import rewriting_loop, rewritten_each_iteration, stored_during_or_after
from .needed import partial_reads, records_in_branches, walk_reversed
from .rewrites import own_rows, rewritten_before_read
from .recompute import reads_outside

def order_free(loop, a):
    """True when the reversed iterations of ``loop`` may run in forward order: nothing
    is recorded on a tape inside it, no active value is carried from one iteration to
    the next, every store into an array with an adjoint hits an element indexed by the
    loop variable at one position of the index, the same in every store into that
    array (distinct per iteration: the variable is never negative, since ``y[-1]`` is
    ``y[n - 1]``), and no array the loop stores is also loaded in it (but for what it
    held on entry, at the element stores write: :func:`kadj.ir.loaded_elsewhere`).  Then
    each iteration's adjoint reads only adjoints of its own stored elements and only
    adds (commutatively) into others."""
    inner = list(ir.walk(loop.body))
    if loop.uid in a.index_saved or not ir.never_negative(loop):
        return False
    stored = ir.stored_arrays(loop.body)
    if stored & ir.loaded_elsewhere(loop.body):
        return False
    if stored & a.restore_arrays or _rewrites_row(loop, a):
        return False
    active_assigned = set()
    positions = {}     # array -> index positions holding the loop variable in every store
    counter = ir.Var(loop.index)
    for s in inner:
        if isinstance(s, (ir.Loop, ir.Break, ir.Continue, ir.Return, ir.Barrier)):
            return False
        if isinstance(s, ir.Assign):
            if s.target in a.pushed:
                return False
            if s.target in a.varied:
                active_assigned.add(s.target)
        if isinstance(s, ir.Store) and s.array.name in a.varied_arrays:
            at = {p for p, x in enumerate(s.index) if x == counter}
            positions[s.array.name] = positions.get(s.array.name, at) & at
            if not positions[s.array.name]:
                return False    # (y[i, j] and y[j, i]: iterations i and j share one)
    # an active value carried from one iteration into the next orders the adjoints
    if active_assigned & upward_exposed(loop):
        return False
    if reads_outside(a, loop, active_assigned):
        return False
    return True


def upward_exposed(loop):
    """Variables the loop assigns that an iteration may read before assigning them
    (values carried in from the previous iteration)."""
    assigned_in = ir.assigned(loop.body)
    out = set()

    def visit(seq, defined):
        defined = set(defined)
        for x in seq:
            out.update((ir.stmt_reads(x) & assigned_in) - defined - {getattr(loop, "index", None)})
            if isinstance(x, ir.Assign):
                defined.add(x.target)
            elif isinstance(x, ir.If):
                d1 = visit(x.then, defined)
                d2 = visit(x.orelse, defined)
                defined |= (d1 & d2)
            elif isinstance(x, ir.ForRange):
                visit(x.body, defined | {x.index})
                visit(x.body, defined | {x.index} | ir.assigned(x.body))
            elif isinstance(x, ir.Loop):
                visit(x.body, defined)
        return defined

    visit(loop.body, set())
    return out


def find_replay(stmts, a, inside_replay):
    """Loops whose iterations carry no state into the next one but record values on the
    tape inside them (an inner recurrence, a Newton iteration per element) are reversed
    by checkpointing each iteration: the forward sweep runs them without recording, and
    each reversed iteration first replays its own forward part, recording, then reverses
    it.  The tape then holds one iteration's values instead of the whole loop's."""
    for s in stmts:
        if isinstance(s, ir.If):
            find_replay(s.then, a, inside_replay)
            find_replay(s.orelse, a, inside_replay)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            # (with checkpoints, a loop nested in a replayed one is replayed within
            # each replayed iteration of the outer loop)
            ok = (not inside_replay or a.carried_replay) and _replayable(s, a)
            scratch = tuple(sorted(a.private_scratch & ir.stored_arrays(s.body)))
            # shared arrays that carry state through the loop, each thread's own element
            # checkpointed by that thread
            owned = tuple(sorted(x for x in a.owned_shared & ir.stored_arrays(s.body)
                                 if not rewritten_each_iteration(s, x)))
            if ok:
                a.replay_shared[s.uid] = tuple(sorted(
                    {x for x in a.shared_scratch & ir.stored_arrays(s.body)
                     if rewritten_each_iteration(s, x) or x in owned} |
                    set(rewritten_scratch(s, a))))
                a.checkpoint_owned[s.uid] = owned
            if isinstance(s, ir.Loop):
                if ok:
                    saved = {v for v in a.pushed if v in ir.assigned(s.body)}
                    carried = upward_exposed(s)
                    a.checkpoint[s.uid] = tuple(sorted(carried))
                    a.checkpoint_arrays[s.uid] = scratch
                    a.replay[s.uid] = tuple(sorted(saved | carried))
                find_replay(s.body, a, inside_replay or ok)
                continue
            if ok:
                body_assigned = ir.assigned(s.body)
                saved = {v for v in a.pushed if v in body_assigned}
                carried = upward_exposed(s)
                if carried or scratch or owned or any(
                        isinstance(x, (ir.Break, ir.Continue))
                        for x in ir.walk_level(s.body)):
                    # (scratch arrays the loop writes are state too: checkpointed)
                    a.checkpoint[s.uid] = tuple(sorted(carried))
                    a.checkpoint_arrays[s.uid] = scratch
                    saved |= carried
                a.replay[s.uid] = tuple(sorted(saved))
                # a value defined afresh at the top of each replayed iteration need not
                # be recorded there: the replay of the earlier iteration redefines it
                seen = set()
                exposed = upward_exposed(s)
                for x in s.body:
                    if isinstance(x, ir.Assign) and x.target not in seen and \
                            x.target not in exposed and x.target not in ir.stmt_reads(x):
                        a.replay_fresh.add(id(x))
                    for y in ir.walk((x,)):
                        seen |= ir.stmt_reads(y)
                        if isinstance(y, ir.Assign):
                            seen.add(y.target)
            find_replay(s.body, a, inside_replay or ok)


def _replayable(loop, a):
    if isinstance(loop, ir.Loop) and not a.carried_replay:
        return False
    if loop.uid in a.ascending or loop.uid in a.index_saved or not a.has_rev.get(id(loop)):
        return False
    inner = list(ir.walk(loop.body))
    needs_tape = any(isinstance(x, ir.Loop) for x in inner) or any(
        isinstance(x, ir.Assign) and x.target in a.pushed for x in inner) or any(
        isinstance(x, ir.ForRange) and x.uid in a.index_saved for x in inner) or \
        loop.uid in a.force_replay or _rewrites_row(loop, a)
    if not needs_tape:
        return False
    for x in ir.walk_level(loop.body):
        # (with checkpoints, each replayed iteration runs in a one-trip loop that its
        # break/continue leave)
        if isinstance(x, (ir.Break, ir.Continue)) and not a.carried_replay:
            return False
    if any(isinstance(x, ir.Return) for x in inner):
        return False
    stored = ir.stored_arrays(loop.body)
    if stored & ir.loaded_arrays(loop.body) or stored & a.restore_arrays:
        harmless, owners = stale_loads(loop, a)
        a.tile_owners |= owners
        if not harmless:
            return False
    # a replayed iteration executes no store into an array but a thread's private
    # scratch: it could not record the elements overwritten in an array restored later
    if stored & (a.restore_arrays - a.private_scratch):
        return False
    if any(isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc) for x in inner):
        return False
    return a.carried_replay or not upward_exposed(loop)


def _rewrites_row(loop, a):
    """Does the loop write a private array of run-time length (a GPU thread's own
    row, kadj.cuda.own_rows)?  Recording its overwritten elements would need an
    unbounded tape: the loop is replayed from checkpoints instead, never ascending."""
    rows = {x.target for x in ir.walk(a.kernel.body) if isinstance(x, ir.Assign) and
            isinstance(x.expr, ir.Alloc) and x.expr.args and
            isinstance(getattr(x.expr.args[0], "value", None), str)}
    return bool(rows & ir.stored_arrays(loop.body))


def stale_loads_harmless(loop, a):
    """With checkpoints (``a.carried_replay``): may a replayed iteration of ``loop``
    read arrays the kernel writes, although they then hold later contents?  Yes when
    no value loaded from them reaches anything the replay must get right: a value the
    reverse sweep reads, the carried state, a recorded value, a branch condition, an
    index or a loop bound (an in-place sum ``sm[t] += sm[t + s]`` in a shared-memory
    reduction: its adjoint needs no values)."""
    return stale_loads(loop, a)[0]


def stale_loads(loop, a):
    """:func:`stale_loads_harmless`, and the loops enclosing ``loop`` that the answer
    relies on being replayed (they rewrite a shared tile that ``loop`` reads at each
    iteration: replaying such an iteration rewrites the tile).  Changes nothing.

    Without checkpoints a replayed iteration stores only into the arrays it rewrites
    whole or owns a row of (:func:`rewritten_scratch`): the loads are harmless when
    every array the loop loads and the kernel stores is one of those, and the loop is
    replayed for them (``force_replay``: else they would be restored element by
    element).  Other loops keep their strategy: replaying a loop whose arrays need no
    restoring gains nothing (an out-of-place row softmax)."""
    if not a.carried_replay:
        risky = (ir.loaded_arrays(loop.body) & a.stored) - a.unwritten
        return not risky or (loop.uid in a.force_replay and
                             risky <= set(rewritten_scratch(loop, a))), frozenset()
    body = list(ir.walk(loop.body))
    stored_in = ir.stored_arrays(loop.body)
    # per-thread scratch arrays that the loop writes are checkpointed with its state;
    # those nobody writes during or after the loop still hold what the loop read
    owners = set()

    def is_fresh(x):
        if (x in a.private_scratch and x in stored_in) or x in a.unwritten or \
                (x in a.shared_scratch and rewritten_each_iteration(loop, x)) or \
                (x in a.owned_shared and x in stored_in):
            return True
        owner = replayed_tile(a, loop, x)
        if owner is not None:
            owners.add(owner)
            return True
        return not stored_during_or_after(a, loop.uid, x)

    fresh = {x for x in a.stored if is_fresh(x)}
    owners = frozenset(owners)
    tainted = set()
    changed = True
    while changed:
        changed = False
        for x in body:
            if isinstance(x, ir.Assign) and x.target not in tainted:
                e = x.expr
                if (isinstance(e, ir.Load) and e.array.name in a.stored and
                        not e.entry and e.array.name not in fresh) or \
                        ir.var_names(ir.operands(e)) & tainted:
                    tainted.add(x.target)
                    changed = True
    if not tainted:
        return True, owners
    critical = set(a.needed) | set(a.pushed) | upward_exposed(loop)
    for x in body:
        if isinstance(x, ir.If):
            critical |= ir.var_names((x.cond,))
        elif isinstance(x, ir.ForRange):
            critical |= ir.var_names((x.start, x.stop, x.step))
        elif isinstance(x, ir.Store):
            critical |= ir.var_names(x.index)
        elif isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load):
            critical |= ir.var_names(x.expr.index)
    return not (tainted & critical), owners


def rewritten_scratch(loop, a):
    """Without checkpoints: the kernel's scratch arrays that ``loop`` stores and that
    each of its iterations rewrites whole before reading them
    (:func:`.rewrites.rewritten_before_read`), and the argument arrays of which each
    iteration touches only its own row (:func:`.rewrites.own_rows`: a replayed
    iteration first restores that row).  A replayed iteration executes its stores into
    them: it then reads what it wrote, and they need no recorded elements."""
    if a.carried_replay:
        return ()
    kept = getattr(a, "scratch_kept", ())
    return tuple(sorted(
        x for x in ir.stored_arrays(loop.body) if x not in kept and (
            x in a.scratch_arrays and rewritten_before_read(a, loop, x) or
            x in a.work_arrays and own_rows(a, loop, x))))


def replayed_tile(a, loop, arr):
    """Is ``arr`` a shared tile that a loop enclosing ``loop`` rewrites at each
    iteration?  Then that loop is replayed (forced), and ``loop``, replayed inside its
    replayed iteration, reads the tile of that iteration.  Returns that loop's uid or
    None."""
    if not a.carried_replay:
        return None
    return rewriting_loop(a, loop.uid, arr)


def reverse_reads(stmts, a):
    """Variables the reverse sweep of ``stmts`` reads (replayed loops: everything their
    bodies read, since they re-execute)."""
    out = set()
    for s in ir.walk(stmts):
        if isinstance(s, ir.Assign):
            if s.target in a.varied:
                out |= partial_reads(s, a)
        elif isinstance(s, ir.Store):
            # (an array restored without an adjoint: the reverse puts the element's old
            # value back at the store's index, kadj.reverse_sweep.rev_store)
            if s.array.name in a.varied_arrays or (
                    s.array.name in a.restore_arrays and s.array.name not in a.unwritten):
                out |= ir.var_names(s.index)
        elif isinstance(s, ir.If):
            # (re-decided in reverse also to pop the values its branches recorded, or
            # saved around a loop inside them: conditions_around_saves)
            if a.has_rev.get(id(s)) or records_in_branches(s, a) or \
                    _saves_around_loops(s, a):
                out |= ir.var_names((s.cond,))
        elif isinstance(s, ir.ForRange):
            if a.has_rev.get(id(s)):
                out |= ir.var_names((s.start, s.stop, s.step))
            for r in ir.walk(a.recompute.get(s.uid, ())):
                out |= ir.stmt_reads(r)
        if isinstance(s, (ir.ForRange, ir.Loop)) and s.uid in a.replay:
            # (a while loop replayed from checkpoints too)
            for r in ir.walk(s.body):
                out |= ir.stmt_reads(r)
    return out


def replay_reads(stmts, a):
    """Scalars the replay of a replayed loop reads from outside the loop.  The replay
    runs in the reverse sweep, after the reverse of everything that follows the loop
    (in a replayed iteration of an enclosing loop: after the statements of that
    iteration that follow it), so these values must be restored to their versions
    before the loop: they are needed, like the values an adjoint reads.  (What the
    loop assigns is recomputed by the replay or, when carried, checkpointed.)"""
    out = set()
    for s in ir.walk(stmts):
        if isinstance(s, (ir.ForRange, ir.Loop)) and s.uid in a.replay:
            reads = set()
            for r in ir.walk(s.body):
                reads |= ir.stmt_reads(r)
            out |= reads - ir.assigned(s.body)
    T = a.kernel.types
    return {v for v in out if isinstance(T.get(v), (types.Number, types.Boolean))}


def find_loop_saved(stmts, a, suppressed, inside_replay):
    """A variable a loop overwrites but whose values the loop's own reverse never reads
    (an accumulator ``s += ...`` read only after the loop) is not recorded at each
    iteration: its value before the loop is saved once and restored after the loop's
    reverse sweep.

    A loop without reverse code (``has_rev`` false: a search loop whose trips carry no
    derivative) pops nothing in the reverse sweep, so nothing may be pushed inside it:
    every recorded value it overwrites is saved once around it instead, also inside a
    replayed iteration (whose replay records, and whose reverse pops only where the
    reverse sweep goes).  So a push inside a loop is made only where the loop's reverse
    pops it.

    Outside replayed loops, a value whose entry value no reverse reads (the statements
    before the loop, back to an assignment of it, read it neither in reverse nor in
    their own partials: ``s = 0.0`` before ``for j: s += a[i, j] * v[j]``) is not saved
    at all (``loop_unsaved``): after the loop's reverse, the next value anything reads
    is the one that assignment's own record restores."""
    for k, s in enumerate(stmts):
        if isinstance(s, ir.If):
            find_loop_saved(s.then, a, suppressed, inside_replay)
            find_loop_saved(s.orelse, a, suppressed, inside_replay)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            is_replay = s.uid in a.replay
            inner_supp = suppressed
            no_reverse = not a.has_rev.get(id(s))
            if no_reverse or not (is_replay or inside_replay):
                assigned_in = ir.assigned(s.body)
                cand = {v for v in a.pushed if v in assigned_in} - suppressed
                if not no_reverse:
                    # (the loop itself too: what its reverse recomputes at each
                    # iteration, ``if t3: w = 0.5``, reads that iteration's values)
                    cand -= reverse_reads([s], a)
                if isinstance(s, ir.ForRange):
                    cand.discard(s.index)
                if cand:
                    unread = set() if no_reverse or is_replay or inside_replay else \
                        {v for v in cand if _entry_unread(stmts[:k], v, a)}
                    if cand - unread:
                        a.loop_saved[s.uid] = tuple(sorted(cand - unread))
                    if unread:
                        a.loop_unsaved[s.uid] = tuple(sorted(unread))
                    inner_supp = suppressed | cand
            find_loop_saved(s.body, a, inner_supp, inside_replay or is_replay)


def _entry_unread(before, v, a):
    """Does no reverse read ``v``'s value on entry to a loop preceded by ``before`` in
    its sequence: walking back, an assignment of ``v`` comes before any statement whose
    reverse reads ``v`` (that assignment's own partials included) and before any
    compound statement that assigns it?"""
    for p in reversed(before):
        if v in reverse_reads([p], a):
            return False
        if isinstance(p, ir.Assign) and p.target == v:
            return True
        if isinstance(p, (ir.If, ir.ForRange, ir.Loop)) and v in ir.assigned([p]):
            return False
    return False


def conditions_around_saves(stmts, a):
    """The conditions of the ifs that the reverse sweep enters only to pop what the
    forward saved around a loop inside them (:func:`find_loop_saved`, a saved loop
    index): without reverse code of their own they would be decided in reverse by
    values of another iteration (a ``while`` loop's entry test around a value saved
    once around the loop)."""
    out = set()
    for s in walk_reversed(stmts, a):
        if isinstance(s, ir.If) and _saves_around_loops(s, a):
            out |= ir.var_names((s.cond,))
    return out


def _saves_around_loops(s, a):
    """Does If ``s`` hold (where the reverse sweep goes) a loop around which values are
    saved: a saved loop index, values :func:`find_loop_saved` saved, or a loop without
    reverse code that assigns a recorded value (which it will save, also before
    :func:`find_loop_saved` has run)?"""
    for x in walk_reversed(s.then + s.orelse, a):
        if isinstance(x, (ir.ForRange, ir.Loop)) and (
                x.uid in a.loop_saved or x.uid in a.index_saved or
                (not a.has_rev.get(id(x)) and a.pushed & ir.assigned(x.body))):
            return True
    return False
