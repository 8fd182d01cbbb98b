"""Buffer swaps at the end of a time loop: ``u, un = un, u``.

A time loop that computes the next state into a second array and then swaps the two
names (or rotates three: ``u_prev, u, u_next = u, u_next, u_prev``) rebinds array
names, which the analysis does not model: to it, a name is one array.  Rebinding
follows a fixed permutation, though, so the loop's iterations cycle through a known
order of bindings.  :func:`rewrite` unrolls such a loop by the permutation's order m,
renaming the arrays in the j-th copy of the body as the j-th power of the permutation
binds them, so that every name denotes one array again:

    for t in range(lo, hi):             _n = max(hi - lo, 0)
        step(u -> un)                   for _p in range(_n // m):
        u, un = un, u          =>           t = lo + m * _p;     step(u -> un)
    rest(u, un)                             t = lo + m * _p + 1; step(un -> u)
                                        if _n % m == 1:
                                            t = lo + m * (_n // m); step(u -> un)
                                            rest(un, u)
                                        else:
                                            rest(u, un)

The code after the loop is copied into the arms of the remainder's test, each with the
binding the loop leaves (only where it names a swapped array: otherwise it follows
once).  The result computes exactly what the kernel computes, element for element, and
the arrays the user passed end as the kernel leaves them.

Handled: a ``for`` over ``range(lo, hi)`` (step 1) at the kernel's top level whose body
ends with assignments of array names that permute them (numba's temporaries
included), the names assigned nowhere else (but for scratch arrays allocated before the
loop at the top level), and no ``break``, ``continue`` or ``return`` in the body.  Anything else keeps the rebinding, which the analysis refuses
by name (:func:`kadj.analysis.activity.count_assignments`).
"""
from __future__ import annotations

import builtins
import itertools
import operator
from dataclasses import replace

from numba.core import types

from . import ir

__all__ = ["rewrite"]

#: the longest permutation unrolled (a rotation of this many arrays)
MAX_ORDER = 4


def rewrite(kernel):
    """``kernel`` with every top-level time loop that ends by permuting array names
    unrolled by the permutation's order; ``kernel`` itself when it has none."""
    for at, s in enumerate(kernel.body):
        if isinstance(s, ir.ForRange):
            found = _permuting_tail(kernel, at, s)
            if found is not None:
                return rewrite(_unrolled(kernel, at, s, *found))
    return kernel


def _is_array(kernel, name):
    return isinstance(kernel.types.get(name), types.Array)


def _permuting_tail(kernel, at, loop):
    """(permutation {name: name bound after the body}, length of the tail) of ``loop``
    (statement ``at`` of the kernel), or None."""
    body = loop.body
    k = 0
    while k < len(body):
        s = body[len(body) - 1 - k]
        if not (isinstance(s, ir.Assign) and isinstance(s.expr, ir.Copy) and
                isinstance(s.expr.src, ir.Var) and _is_array(kernel, s.target) and
                _is_array(kernel, s.expr.src.name)):
            break
        k += 1
    if k < 2:
        return None
    tail, head = body[len(body) - k:], body[:len(body) - k]
    bound = {}
    for s in tail:
        bound[s.target] = bound.get(s.expr.src.name, s.expr.src.name)
    # (a scratch array allocated before the loop, at the top level, is assigned there)
    allocated = [s for s in kernel.body[:at]
                 if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc)]
    read_elsewhere, assigned_elsewhere = _outside(
        kernel.body, set(id(s) for s in tail) | set(map(id, allocated)))
    temps = {n for n in bound if n not in read_elsewhere and n not in kernel.args}
    perm = {n: bound[n] for n in bound if n not in temps}
    if not perm or set(perm.values()) != set(perm) or all(perm[n] == n for n in perm):
        return None
    if (set(perm) | temps) & assigned_elsewhere:
        return None
    if not (isinstance(loop.step, ir.Const) and loop.step.value == 1) or loop.parallel:
        return None
    if any(isinstance(s, (ir.Break, ir.Continue, ir.Return)) for s in ir.walk(head)):
        return None
    if loop.index in ir.assigned(head):
        return None
    if _order(perm) > MAX_ORDER:
        return None
    return perm, k


def _outside(stmts, skip=frozenset()):
    """(names read, names assigned) by the statements other than those in ``skip``
    (ids), nested ones included."""
    reads, assigned = set(), set()
    for s in ir.walk(stmts):
        if id(s) in skip:
            continue
        reads |= ir.stmt_reads(s)
        if isinstance(s, ir.Assign):
            assigned.add(s.target)
        elif isinstance(s, ir.ForRange):
            assigned.add(s.index)
    return reads, assigned


def _order(perm):
    power, m = dict(perm), 1
    while any(power[n] != n for n in power):
        power = {n: perm[power[n]] for n in power}
        m += 1
        if m > MAX_ORDER:
            break
    return m


def _powers(perm, m):
    """The bindings of the m copies: sigma_0 = identity, sigma_{j+1}(x) =
    sigma_j(perm(x))."""
    sigmas = [{n: n for n in perm}]
    for _ in range(m - 1):
        prev = sigmas[-1]
        sigmas.append({n: prev[perm[n]] for n in perm})
    return sigmas


def _unrolled(kernel, at, loop, perm, k):
    m = _order(perm)
    sigmas = _powers(perm, m)
    head = loop.body[:len(loop.body) - k]
    rest = kernel.body[at + 1:]
    uids = itertools.count(max((s.uid for s in ir.walk(kernel.body)
                                if isinstance(s, (ir.ForRange, ir.Loop))), default=0) + 1)
    typs = dict(kernel.types)
    taken = set(typs) | set(kernel.args) | ir.assigned(kernel.body)

    def fresh(base, typ):
        for i in itertools.count():
            name = f"_{base}" if i == 0 else f"_{base}{i}"
            if name not in taken:
                taken.add(name)
                typs[name] = typ
                return name

    loc = loop.loc
    idx_t = typs.get(loop.index, types.intp)
    count, trips = fresh("swap_n", idx_t), fresh("swap_trips", idx_t)
    groups, left = fresh("swap_groups", idx_t), fresh("swap_left", idx_t)
    p, base = fresh("swap_p", idx_t), fresh("swap_t", idx_t)

    def op(target, fn, *args):
        return ir.Assign(target, ir.Op(fn, tuple(args)), loc=loc)

    from_zero = isinstance(loop.start, ir.Const) and loop.start.value == 0

    def offset(target, first):
        """``target = lo + first`` (``first`` a variable just assigned)."""
        return () if from_zero else (op(target, operator.add, loop.start, ir.Var(first)),)

    def step(j, start_var):
        """Copy j of the body: the counter set, the arrays bound as sigma_j binds
        them."""
        counter = ir.Assign(loop.index, ir.Copy(ir.Var(start_var)), loc=loc) if j == 0 \
            else op(loop.index, operator.add, ir.Var(start_var), ir.Const(j))
        return (counter, *_renamed(head, sigmas[j], uids))

    counting = (
        *(() if from_zero else (op(count, operator.sub, loop.stop, loop.start),)),
        op(trips, builtins.max, loop.stop if from_zero else ir.Var(count), ir.Const(0)),
        op(groups, operator.floordiv, ir.Var(trips), ir.Const(m)),
        op(left, operator.mod, ir.Var(trips), ir.Const(m)),
    )
    body = [op(base, operator.mul, ir.Var(p), ir.Const(m)), *offset(base, base)]
    for j in range(m):
        body.extend(step(j, base))
    unrolled = ir.ForRange(p, ir.Const(0), ir.Var(groups), ir.Const(1), tuple(body),
                           loc=loc, uid=next(uids), parallel=False)
    mentions = _outside(rest)[0] & set(perm)
    last = fresh("swap_last", idx_t)
    tail_start = (op(last, operator.mul, ir.Var(groups), ir.Const(m)), *offset(last, last))

    def arm(r):
        """The remainder's r steps, and the code after the loop if it must follow."""
        out = list(tail_start) if r else []
        for j in range(r):
            out.extend(step(j, last))
        if mentions:
            out.extend(_renamed(rest, sigmas[r], uids) if r else rest)
        return tuple(out)

    dispatch = arm(0)
    for r in range(m - 1, 0, -1):
        cond = fresh("swap_left_is", types.boolean)
        dispatch = (op(cond, operator.eq, ir.Var(left), ir.Const(r)),
                    ir.If(ir.Var(cond), arm(r), dispatch, loc=loc))
    new_body = (*kernel.body[:at], *counting, unrolled, *dispatch,
                *(() if mentions else rest))
    return replace(kernel, body=tuple(new_body), types=typs)


def _renamed(stmts, names, uids):
    """Fresh copies of ``stmts`` (every statement a new object, every loop a new uid)
    reading and writing array ``names[x]`` wherever they name ``x``."""
    def sub(x):
        return ir.Var(names[x.name]) if isinstance(x, ir.Var) and x.name in names else x

    def expr(e):
        if isinstance(e, ir.Copy):
            return replace(e, src=sub(e.src))
        if isinstance(e, (ir.Op, ir.Alloc)):
            return replace(e, args=tuple(map(sub, e.args)),
                           kws=tuple((k, sub(v)) for k, v in e.kws))
        if isinstance(e, ir.Load):
            return replace(e, array=sub(e.array), index=tuple(map(sub, e.index)))
        if isinstance(e, (ir.Attr, ir.Item)):
            return replace(e, value=sub(e.value))
        return e

    out = []
    for s in stmts:
        if isinstance(s, ir.Assign):
            s = replace(s, expr=expr(s.expr))
        elif isinstance(s, ir.Store):
            s = replace(s, array=sub(s.array), index=tuple(map(sub, s.index)),
                        value=sub(s.value))
        elif isinstance(s, ir.If):
            s = replace(s, cond=sub(s.cond), then=_renamed(s.then, names, uids),
                        orelse=_renamed(s.orelse, names, uids))
        elif isinstance(s, ir.ForRange):
            s = replace(s, start=sub(s.start), stop=sub(s.stop), step=sub(s.step),
                        body=_renamed(s.body, names, uids), uid=next(uids))
        elif isinstance(s, ir.Loop):
            s = replace(s, body=_renamed(s.body, names, uids), uid=next(uids))
        elif isinstance(s, ir.Return):
            s = replace(s, value=sub(s.value))
        else:
            s = replace(s)
        out.append(s)
    return tuple(out)
