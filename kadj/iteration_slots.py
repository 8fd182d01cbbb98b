"""Tape slots per iteration for the loops of a CPU adjoint asked to run in parallel.

A loop whose iterations each define values afresh that its reverse needs (a flag
``t4 = y[i] > 0`` deciding a branch, ``t = y[i]`` read before the iteration overwrites
``y[i]``) records them on a stack: from its second iteration on, at the top of the
iteration, the previous iteration's values are pushed (``_tape_f64[_sp_f64] = t``,
``_sp_f64 += 1``), and each reversed iteration but the first forward one pops them back
at its end, for the reversed iteration before it (:meth:`ForwardSweep.push_fresh`).
The stack pointer chains every iteration to the one before: such loops ran serially.

For a loop asked to run in parallel (``prange``, ``parallel=True``) the same values go
to fixed places instead: iteration ``i`` stores its own values at its end into row
``i`` of a two-dimensional view of the tape (``_slots_f64[i, 0] = t``), and its reversed
iteration loads them at its start (``t = _slots_f64[i, 0]``).  The pointer moves once
around each of the two loops, by the rows' total.  Every iteration's values, the last
one's included, go to the tape: the reservation already counted one save per iteration.
Each iteration then touches only its own row, and :func:`kadj.parallel.race_free` may
make both the forward sweep's loop and the reversed one ``numba.prange`` loops.

A value saved inside the iteration (a variable assigned twice in one iteration: its
first value is pushed before the second assignment and popped back at that
assignment's reverse) gets a place of its own in the row too, written and read where
the push and the pop were.

A loop nested in the forward sweep's loops (a ``prange`` in a time loop) gets rows for
each run: the views are taken where the run starts (the pointer then sits at the run's
block of the tape) and where its reverse starts, and the values each run left for its
reverse (pushed after the loop, popped before its reverse) are dropped, being in the
last iteration's row.

Handled: a loop at the adjoint's top level or nested so, over ``range(lo, hi)`` with
a constant ``lo >= 0``, whose tape traffic is that block of pushes and pushes among the body's own
statements (not in a branch nor an inner loop), mirrored by pops at the same places of
the reversed body, with no ``break``, ``continue`` or ``return``.  Anything else keeps
the stack; both forms are exact.  A tape too short for the rows
would make the view's ``reshape`` fail loudly, never write past the reservation.
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from .adj_refs import free_name, names
from .parallel import SLOTS, _SCALAR_NODES, _range_bounds, _the_for, forward_loops

_TAPE = (A.Push, A.Pop, A.PushArray, A.PopArray, A.Reserve, A.CapacityCheck)


def index_fresh_saves(fn, wanted):
    """Give the loops of ``fn`` (adjoint IR, tape planned) whose primal loop is in
    ``wanted`` per-iteration tape slots where they qualify: loops at the top level, and
    loops nested in the forward sweep's loops whose reversed loop sits in the reversed
    loops' bodies.  Returns the uids of the loops changed."""
    done = []
    for f, seq in forward_loops(fn.body):
        if f.loop not in wanted:
            continue
        found = _reversed(fn.body, f.loop)
        if found is None:
            continue
        rl, rseq = found
        if (seq is fn.body) == (rseq is fn.body) and _index(fn, f, seq, rl, rseq):
            done.append(f.loop)
    return done


def _reversed(seq, uid):
    """(the ReverseLoop of loop ``uid``, its sequence): at the top level, or directly in
    the body of a reversed loop's ``for`` (not under a branch); None elsewhere."""
    for x in seq:
        if isinstance(x, A.ReverseLoop):
            if x.loop == uid:
                return x, seq
            for y in x.body:
                if isinstance(y, A.For):
                    found = _reversed(y.body, uid)
                    if found is not None:
                        return found
    return None


def _ascending(loop):
    """(lo, hi) texts of a ``for`` over ``range(lo, hi)`` or ``range(lo, hi, 1)``."""
    try:
        call = ast.parse(loop.iter, mode="eval").body
    except SyntaxError:
        return None
    if len(getattr(call, "args", ())) == 3 and ast.unparse(call.args[2]) != "1":
        return None
    return _range_bounds(loop)


def _index(fn, f, seq, rl, rseq):
    bounds = _ascending(f)
    nested = seq is not fn.body
    found = _the_for(rl, (A.If,) if nested else ())   # (the pops of a run's exit)
    if bounds is None or found is None or tuple(found[1:]) != bounds:
        return False
    r = found[0]
    lo, hi = bounds
    exits = _exits(f, seq, rl, r, f"{hi} > {lo}") if nested else ()
    if exits is None or nested and sum(isinstance(x, A.If) for x in rl.body) != \
            (1 if exits else 0):
        return False
    fresh = _block(f.body[:1], f"{f.var} > {lo}", A.Push)
    rest_f = f.body if fresh is None else f.body[1:]
    back = _block(r.body[-1:], f"{r.var} > {lo}", A.Pop)
    rest_r = r.body if back is None else r.body[:-1]
    fresh, back = fresh or [], back or []
    inner = _top_level(rest_f, A.Push)
    inner_back = _top_level(rest_r, A.Pop)
    if inner is None or inner_back is None or len(fresh) != len(back):
        return False    # other tape traffic (in a branch, a nested loop), exits
    pushes, pops = fresh + inner, inner_back + back
    if not pushes or len(pops) != len(pushes):
        return False
    if any(p.kind != q.kind or q.cond is not None or p.once
           for p, q in zip(pushes, reversed(pops))):
        return False
    if any(f.var in names(p.value) for p in fresh):
        return False    # (values of the previous iteration's counter: never written so)
    if exits and [p.value for p in exits[1]] != [p.value for p in fresh]:
        return False    # (the values a run left are this iteration's fresh ones)
    # each push's place in its kind's row; pops mirror the pushes
    column, per_kind = {}, {}
    for p in pushes:
        column[id(p)] = per_kind.get(p.kind, 0)
        per_kind[p.kind] = column[id(p)] + 1
    for p, q in zip(pushes, reversed(pops)):
        column[id(q)] = column[id(p)]
    trips = free_name(fn, "_rows")
    slots = {}
    for kind in sorted(per_kind):
        slots[kind] = free_name(fn, f"{SLOTS}{kind}", taken=set(slots.values()) | {trips})
    count = f"max(0, {hi})" if lo == "0" else f"max(0, {hi} - {lo})"
    row = f.var if lo == "0" else f"{f.var} - {lo}"
    rrow = r.var if lo == "0" else f"{r.var} - {lo}"

    def views():
        return [A.Assign(slots[k], f"_tape_{k}[_sp_{k}:_sp_{k} + {_times(n, trips)}]"
                                   f".reshape(({trips}, {n}))")
                for k, n in sorted(per_kind.items())]

    def store(p):
        return A.Assign(f"{slots[p.kind]}[{row}, {column[id(p)]}]", p.value)

    def load(q):
        value = f"{slots[q.kind]}[{rrow}, {column[id(q)]}]"
        return A.Assign(q.target, value + (" != 0" if q.boolean else ""))

    def placed(seq, kind, write):
        out = []
        for x in seq:
            if isinstance(x, kind):
                if x.note:
                    out.append(A.Comment(f"# {x.note}"))
                out.append(write(x))
            elif not isinstance(x, A.CapacityCheck):
                out.append(x)
        return out

    stores = [A.Comment("# this iteration's values, for its reverse (its own row of "
                        "the tape)")] + [store(p) for p in fresh] if fresh else []
    loads = [A.Comment("# this iteration's values (its row of the tape)")] + [
        load(q) for q in back] if back else []
    f.body[:] = placed(rest_f, A.Push, store) + stores
    r.body[:] = loads + placed(rest_r, A.Pop, load)
    if exits:
        # the last iteration's values are in its row: nothing left to save after a run
        seq[:] = [x for x in seq if x is not exits[0]]
        rl.body[:] = [x for x in rl.body if x is not exits[2]]
    at = next(k for k, x in enumerate(seq) if x is f)
    seq[at:at + 1] = [A.Assign(trips, count)] + views() + [f] + [
        A.Assign(f"_sp_{k}", _times(n, trips), "+=") for k, n in sorted(per_kind.items())]
    at = next(k for k, x in enumerate(rseq) if x is rl)
    # (a nested run's row count anew: the forward's is the last run's)
    rseq[at:at] = ([A.Assign(trips, count)] if nested else []) + [
        A.Assign(f"_sp_{k}", _times(n, trips), "-=")
        for k, n in sorted(per_kind.items())] + views()
    return True


def _exits(f, seq, rl, r, ran):
    """``(if, its pushes, the reversed if)``: what a nested loop pushes after each run
    (the values its last iteration left, ``if hi > lo:`` right after the loop) and the
    pops that mirror them before its reversed loop; ``()`` when there are none; None
    for any other tape traffic there."""
    at = next(k for k, x in enumerate(seq) if x is f)
    after = seq[at + 1] if at + 1 < len(seq) else None
    rat = next((k for k, x in enumerate(rl.body) if x is r), None)
    before = rl.body[rat - 1] if rat else None
    if not any(isinstance(y, _TAPE) for x in (after, before) if x is not None
               for y in A.walk([x])):
        return ()
    pushes = _block([after], ran, A.Push)
    pops = _block([before], ran, A.Pop)
    if not pushes or not pops or len(pushes) != len(pops) or any(
            p.kind != q.kind or q.cond is not None for p, q in zip(pushes, reversed(pops))):
        return None
    return after, pushes, before


def _top_level(seq, kind):
    """The ``kind`` nodes (pushes or pops) among the statements ``seq`` themselves, or
    None when other tape traffic (or a push or pop inside a compound statement), a
    ``break``, ``continue`` or ``return`` is anywhere in ``seq``."""
    out = []
    for x in seq:
        if isinstance(x, kind):
            out.append(x)
        elif isinstance(x, A.CapacityCheck) and not x.needed:
            continue
        elif any(not isinstance(y, _SCALAR_NODES) for y in A.walk([x])):
            return None
    return out


def _block(seq, cond, kind):
    """The ``kind`` nodes (pushes or pops) of the one ``if cond:`` that is ``seq``,
    holding nothing else but comments and capacity checks found unneeded; else None."""
    if len(seq) != 1 or not isinstance(seq[0], A.If) or seq[0].cond != cond or \
            seq[0].orelse:
        return None
    out = []
    for x in seq[0].then:
        if isinstance(x, kind):
            out.append(x)
        elif isinstance(x, A.CapacityCheck) and not x.needed:
            continue
        elif not isinstance(x, A.Comment):
            return None
    return out


def _times(n, text):
    return text if n == 1 else f"{n} * {text}"
