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

Handled: a loop at the adjoint's top level, over ``range(lo, hi)`` with a constant
``lo >= 0``, whose only tape traffic is that block of pushes (mirrored by one block of
pops at the end of the reversed body), with no ``break``, ``continue`` or ``return``.
Anything else keeps the stack; both forms are exact.  A tape too short for the rows
would make the view's ``reshape`` fail loudly, never write past the reservation.
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from .adj_refs import free_name, names
from .parallel import SLOTS, _SCALAR_NODES, _range_bounds, _the_for

_TAPE = (A.Push, A.Pop, A.PushArray, A.PopArray, A.Reserve, A.CapacityCheck)


def index_fresh_saves(fn, wanted):
    """Give the top-level loops of ``fn`` (adjoint IR, tape planned) whose primal loop
    is in ``wanted`` per-iteration tape slots where they qualify.  Returns the uids of
    the loops changed."""
    done = []
    for f in list(fn.body):
        if isinstance(f, A.For) and f.primal and f.loop in wanted:
            rl = next((x for x in fn.body if isinstance(x, A.ReverseLoop) and
                       x.loop == f.loop), None)
            if rl is not None and _index(fn, f, rl):
                done.append(f.loop)
    return done


def _ascending(loop):
    """(lo, hi) texts of a ``for`` over ``range(lo, hi)`` or ``range(lo, hi, 1)``."""
    try:
        call = ast.parse(loop.iter, mode="eval").body
    except SyntaxError:
        return None
    if len(getattr(call, "args", ())) == 3 and ast.unparse(call.args[2]) != "1":
        return None
    return _range_bounds(loop)


def _index(fn, f, rl):
    bounds = _ascending(f)
    found = _the_for(rl)
    if bounds is None or found is None or tuple(found[1:]) != bounds:
        return False
    r = found[0]
    lo, hi = bounds
    pushes = _block(f.body[:1], f"{f.var} > {lo}", A.Push)
    pops = _block(r.body[-1:], f"{r.var} > {lo}", A.Pop)
    if not pushes or pops is None or len(pops) != len(pushes):
        return False
    if any(p.kind != q.kind or q.cond is not None or p.once
           for p, q in zip(pushes, reversed(pops))):
        return False
    rest_f, rest_r = f.body[1:], r.body[:-1]
    if any(not isinstance(x, _SCALAR_NODES) for x in A.walk(rest_f + rest_r)):
        return False    # other tape traffic, exits
    if any(f.var in names(p.value) for p in pushes):
        return False    # (values of the previous iteration's counter: never written so)
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

    stores = [A.Comment("# this iteration's values, for its reverse (its own row of "
                        "the tape)")]
    for p in pushes:
        stores.append(A.Assign(f"{slots[p.kind]}[{row}, {column[id(p)]}]", p.value))
    loads = [A.Comment("# this iteration's values (its row of the tape)")]
    for q in pops:
        value = f"{slots[q.kind]}[{rrow}, {column[id(q)]}]"
        loads.append(A.Assign(q.target, value + (" != 0" if q.boolean else "")))
    f.body[:] = rest_f + stores
    r.body[:] = loads + rest_r
    at = next(k for k, x in enumerate(fn.body) if x is f)
    fn.body[at:at + 1] = [A.Assign(trips, count)] + views() + [f] + [
        A.Assign(f"_sp_{k}", _times(n, trips), "+=") for k, n in sorted(per_kind.items())]
    at = next(k for k, x in enumerate(fn.body) if x is rl)
    fn.body[at:at] = [A.Assign(f"_sp_{k}", _times(n, trips), "-=")
                      for k, n in sorted(per_kind.items())] + views()
    return True


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
