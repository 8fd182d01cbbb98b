"""Recomputation: per ``for ... in range`` loop, the statements at the top of its body
whose values depend only on the loop index, on variables the loop does not assign and
on arrays the loop does not write.  The reverse sweep recomputes them at the start of
each reversed iteration instead of storing them: a loop whose reverse needs only such
values (stencils, maps, most reductions) needs no tape.

Also recomputed: cheap arithmetic (``+ - * /``, comparisons, ``abs``, ``min``,
``max``) of such values and of at most one value the iteration records anyway
(:func:`_recorded`: assigned once in the kernel, unconditionally in the loop's body,
before anything in the iteration reads it).  Recomputing it reads that value, which
makes it needed, so recorded; at the top of each reversed iteration it holds that
iteration's value.  An in-place update ``v = u[i]; t3 = v * v; t4 = v - t3 * v; u[i] =
v + c * t4`` then records ``v`` alone instead of ``v``, ``t3`` and ``t4``: never more
values than before, and less memory traffic, which is what such loops are bound by.
Transcendental functions are not recomputed from recorded values (a ``sin`` costs
more than recording its result)."""
from __future__ import annotations

import operator
from dataclasses import replace

from numba.core import types

from .. import ir
from ..kernel_memo import per_kernel
from .memory import written_behind

def recompute(stmts, a, wanted=None):
    """Fill ``a.recompute`` and ``a.recompute_vars`` for the loops of ``stmts``;
    ``wanted``: see :func:`_choose`."""
    for s in stmts:
        if isinstance(s, ir.If):
            recompute(s.then, a, wanted)
            recompute(s.orelse, a, wanted)
        elif isinstance(s, ir.Loop):
            recompute(s.body, a, wanted)
        elif isinstance(s, ir.ForRange):
            recompute(s.body, a, wanted)
            _recompute_loop(s, a, wanted)


def reads_outside(a, loop, names):
    """Does a statement of the kernel outside ``loop`` read one of ``names``?"""
    return bool(_read_outside(a.kernel, loop) & names)


def _read_outside(kernel, loop):
    """The names the statements of ``kernel`` outside ``loop`` read."""
    def compute():
        inside = set(map(id, ir.walk(loop.body)))
        read = set()
        for s in ir.walk(kernel.body):
            if id(s) in inside or s is loop:
                continue
            read |= ir.stmt_reads(s)
        return loop, frozenset(read)    # (the loop kept: its id is not reused)
    return per_kernel(kernel, ("outside", id(loop)), compute)[1]


def index_read_outside(a, loop):
    """Is the loop variable read outside the loop, other than inside another loop that
    binds the same name (``for i`` twice)?"""
    return any(s is not loop for s in _index_readers(a.kernel, loop.index))


def _index_readers(kernel, index):
    """The statements of ``kernel`` outside the bodies of its loops over ``index``
    that read ``index``."""
    def compute():
        own = set()
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.ForRange) and s.index == index:
                own |= set(map(id, ir.walk(s.body)))
        return tuple(s for s in ir.walk(kernel.body)
                     if id(s) not in own and index in ir.stmt_reads(s))
    return per_kernel(kernel, ("readers", index), compute)


def _recompute_loop(loop, a, wanted=None):
    sums = _iteration_sums(loop, a)
    while True:
        chosen, rvars = _choose(loop, a, sums, wanted)
        # an iteration's sum is recomputed only with every one of its assignments
        partial = {v for v in sums & rvars
                   if sum(isinstance(x, ir.Assign) and x.target == v
                          for x in ir.walk(chosen)) != a.assign_count.get(v, 0)}
        if not partial:
            break
        sums -= partial
    a.recompute[loop.uid] = tuple(chosen)
    a.recompute_vars[loop.uid] = rvars


def _iteration_sums(loop, a):
    """Variables each iteration sums from scratch and reads only once summed
    (``f = 0.0``, ``if i > 0: f += k * (x[i - 1] - x[i])``, ..., then ``a[i] = f / m``):
    assigned only in the loop's body, outside its inner loops; first by a statement of
    the body's top level that does not read it, before any other mention; then only by
    ``v = v + e``, ``v = e + v`` or ``v = v - e`` (whose adjoints need no value of
    ``v``); read elsewhere in the body only after its last assignment, and not after
    the loop.  Recomputing all its assignments in order at the top of a reversed
    iteration gives the value every read of the reverse sweep needs: the sum."""
    order = list(ir.walk_level(loop.body))
    assigns = {}
    for k, x in enumerate(order):
        if isinstance(x, ir.Assign):
            assigns.setdefault(x.target, []).append(k)
    loops = [x for x in order if isinstance(x, (ir.ForRange, ir.Loop))]
    nested = ir.assigned(loops)
    read_nested = set().union(*(ir.stmt_reads(x) for x in ir.walk(loops)))
    out = set()
    for v, where in assigns.items():
        if len(where) < 2 or len(where) != a.assign_count.get(v, 0) or v in nested or \
                v == loop.index:
            continue
        first = order[where[0]]
        if not any(first is x for x in loop.body) or v in ir.stmt_reads(first):
            continue
        mentions = [k for k, x in enumerate(order) if v in ir.stmt_reads(x)]
        if any(k < where[0] for k in mentions):
            continue
        accumulating = {_summing(order, k, v, loop.body) for k in where[1:]}
        if None in accumulating:
            continue
        if any(k < where[-1] for k in mentions if k not in accumulating):
            continue
        if v in read_nested or reads_outside(a, loop, {v}):
            continue
        out.add(v)
    return out


def _summing(order, k, v, body):
    """Where the assignment ``order[k]`` of ``v`` adds into it: ``k`` itself for
    ``v = v + e``, ``v = e + v`` or ``v = v - e`` (``e`` not ``v``), or the position of
    ``t = v + e`` for ``v = t`` (numba's ``v += e``: the sum, then a copy) when that is
    the only assignment of ``t`` before it and the statement right before ``v = t`` in
    its sequence; None otherwise."""
    e = order[k].expr
    if isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
        defs = [j for j in range(k) if isinstance(order[j], ir.Assign) and
                order[j].target == e.src.name]
        if defs != [k - 1] or not _in_sequence(order, k - 1, k, body) or \
                not _adds_into(order[k - 1].expr, v):
            return None
        return k - 1
    return k if _adds_into(e, v) else None


def _in_sequence(order, j, k, body):
    """Is ``order[k]`` the statement right after ``order[j]`` in one sequence (the
    loop's ``body`` or an ``if`` arm)?  (In the walk, the last statement of an arm is
    followed by the statement after the ``if``.)"""
    seqs = [body] + [arm for x in order if isinstance(x, ir.If)
                     for arm in (x.then, x.orelse)]
    return any(a is order[j] and b is order[k]
               for seq in seqs for a, b in zip(seq, seq[1:]))


def _adds_into(e, v):
    """Is ``e`` ``v + x``, ``x + v`` or ``v - x`` (``x`` not ``v``)?"""
    if not isinstance(e, ir.Op) or e.kws or len(e.args) != 2:
        return False
    names = [x.name if isinstance(x, ir.Var) else None for x in e.args]
    if e.fn is operator.add:
        return names.count(v) == 1
    if e.fn is operator.sub:
        return names[0] == v and names[1] != v
    return False


def _choose(loop, a, sums, wanted=None):
    """The statements recomputed at the top of each reversed iteration, and the
    variables they define; ``sums``: the iteration's sums that may be recomputed;
    ``wanted``: values recorded without the cheap arithmetic of recorded values, which
    then may be recomputed instead (the module docstring)."""
    assigned_in = ir.assigned(loop.body)
    stored_in = ir.stored_arrays(loop.body)
    rvars = set()
    chosen = []
    own = {v: a.assign_count[v] for v in sums}

    recorded = _recorded(loop, a) if wanted else set()
    above = set()       # of those, the ones assigned above the statement at hand
    ext, ext_roots = [], {}     # cheap arithmetic of one recorded value

    def ok_operand(x):
        if not isinstance(x, ir.Var):
            return True
        n = x.name
        return n == loop.index or n in rvars or n not in assigned_in

    def ok_assign(s, allowed_count):
        e = s.expr
        if isinstance(e, ir.Alloc):
            return False
        if a.assign_count.get(s.target, 0) != allowed_count.get(s.target, 0):
            return False
        if isinstance(e, ir.Load) and e.array.name in stored_in and not e.entry and \
                not written_behind(a, loop, e):
            return False
        if isinstance(e, ir.Op) and getattr(e.fn, "_kadj_impure", False):
            return False
        return all(ok_operand(x) for x in ir.operands(e))

    def roots_of(s):
        """The recorded values ``s`` is cheap arithmetic of (through the values
        recomputed so), or None when it is not."""
        if not _cheap(s.expr) or a.assign_count.get(s.target, 0) != 1 or \
                reads_outside(a, loop, {s.target}):
            return None
        out = set()
        for x in ir.operands(s.expr):
            if isinstance(x, ir.Var) and not ok_operand(x):
                if x.name in ext_roots:
                    out |= ext_roots[x.name]
                elif x.name in above:
                    out.add(x.name)
                else:
                    return None
        return out

    for s in loop.body:
        if isinstance(s, ir.Assign) and s.target in recorded:
            above.add(s.target)
        if isinstance(s, ir.Assign):
            if ok_assign(s, {s.target: own.get(s.target, 1)}) and \
                    not reads_outside(a, loop, {s.target}):
                chosen.append(s)
                rvars.add(s.target)
            elif recorded:
                roots = roots_of(s)
                if roots is not None and len(roots) <= 1:
                    ext.append(s)
                    ext_roots[s.target] = roots
        elif isinstance(s, ir.If):
            inner = list(ir.walk((s,)))
            if any(isinstance(x, (ir.ForRange, ir.Loop, ir.Return)) for x in inner):
                continue
            if not ok_operand(s.cond) and not _decided_before(s, loop, a):
                continue
            counts = {}
            for x in inner:
                if isinstance(x, ir.Assign):
                    counts[x.target] = counts.get(x.target, 0) + 1
            counts.update((v, n) for v, n in own.items() if v in counts)
            multi = set()
            for arm in _arms(s):
                arm_counts = {}
                for x in ir.walk(arm):
                    if isinstance(x, ir.Assign):
                        arm_counts[x.target] = arm_counts.get(x.target, 0) + 1
                multi |= {t for t, c in arm_counts.items() if c > 1 and t not in own}
            rejected = {t for t in counts if a.assign_count.get(t, 0) != counts[t]
                        or t in multi or reads_outside(a, loop, {t})}
            while True:
                accepted, bad = set(), set()

                def visit(seq, avail):
                    avail = set(avail)
                    for x in seq:
                        if isinstance(x, ir.Assign):
                            saved_r = set(rvars)
                            rvars.update(avail)
                            good = x.target not in rejected and ok_assign(x, counts)
                            rvars.clear()
                            rvars.update(saved_r)
                            if good:
                                avail.add(x.target)
                                accepted.add(x.target)
                            else:
                                bad.add(x.target)
                        elif isinstance(x, ir.If):
                            c = x.cond
                            if isinstance(c, ir.Var) and c.name in assigned_in and \
                                    c.name not in avail and c.name not in rvars and \
                                    c.name != loop.index:
                                bad.update(y.target for y in ir.walk((x,))
                                           if isinstance(y, ir.Assign))
                                continue
                            a1 = visit(x.then, avail)
                            a2 = visit(x.orelse, avail)
                            avail |= (a1 | a2)
                    return avail

                visit(s.then, set())
                visit(s.orelse, set())
                newly = bad - rejected
                if not newly:
                    break
                rejected |= newly
            accepted -= rejected
            if accepted:
                chosen.append(_assigns_only(s, accepted))
                rvars |= accepted
    # of those, the ones whose values were recorded (``wanted``) and the ones these read
    keep = set(wanted or ()) & set(ext_roots)
    for s in reversed(ext):
        if s.target in keep:
            keep |= ir.stmt_reads(s) & set(ext_roots)
    ext = [s for s in ext if s.target in keep]
    return chosen + ext, rvars | {s.target for s in ext}


_CHEAP = frozenset([operator.add, operator.sub, operator.mul, operator.truediv,
                    operator.neg, operator.pos, operator.lt, operator.le, operator.gt,
                    operator.ge, operator.eq, operator.ne, abs, min, max])


def _cheap(e):
    """Is ``e`` cheap arithmetic (no function call worth its result's record)?  (Not a
    copy: the copies of a helper's inlined return value would stay as chains.)"""
    return isinstance(e, ir.Op) and not e.kws and e.fn in _CHEAP


def cheap_recorded(kernel, pushed):
    """Does a ``for`` loop of ``kernel`` assign one of the recorded values ``pushed``
    by cheap arithmetic (a candidate for :func:`_choose`'s ``wanted``)?"""
    return any(isinstance(s, ir.ForRange) and any(
        isinstance(x, ir.Assign) and x.target in pushed and _cheap(x.expr)
        for x in s.body) for s in ir.walk(kernel.body))


def _recorded(loop, a):
    """Scalars of ``loop``'s body whose value each reversed iteration holds at its top
    once they are recorded: assigned once in the kernel, by a statement of the body's
    own sequence (unconditionally), not read in the iteration before it, not the
    counter."""
    order = list(ir.walk(loop.body))
    out = set()
    for s in loop.body:
        if not isinstance(s, ir.Assign) or a.assign_count.get(s.target, 0) != 1 or \
                s.target == loop.index:
            continue
        if not isinstance(a.kernel.types.get(s.target), (types.Number, types.Boolean)):
            continue
        at = next(k for k, x in enumerate(order) if x is s)
        if any(s.target in ir.stmt_reads(x) for x in order[:at + 1]):
            continue
        out.add(s.target)
    return out


def _decided_before(s, loop, a):
    """Is the condition of the ``if`` ``s`` (a statement of ``loop``'s body) a variable
    that the body assigns once, above ``s``?  Not recomputable itself, it is then
    needed, so recorded, and at the top of each reversed iteration it holds that
    iteration's value: the arms' recomputable values can be recomputed under it
    (``if spent + cost[i] > budget: break`` before ``v = value[i]``)."""
    c = s.cond
    if not isinstance(c, ir.Var) or a.assign_count.get(c.name, 0) != 1 or \
            c.name == loop.index:
        return False
    for x in loop.body:
        if x is s:
            return False
        if isinstance(x, ir.Assign) and x.target == c.name:
            return True
        if c.name in ir.assigned([x]):
            return False
    return False


def _arms(s):
    yield s.then
    yield s.orelse


def _assigns_only(s, keep_targets=None):
    """The If with only its (kept) assignments: what the reverse sweep recomputes."""
    def keep(seq):
        out = []
        for x in seq:
            if isinstance(x, ir.Assign):
                if keep_targets is None or x.target in keep_targets:
                    out.append(x)
            elif isinstance(x, ir.If):
                sub = _assigns_only(x, keep_targets)
                if sub.then or sub.orelse:
                    out.append(sub)
        return tuple(out)

    return replace(s, then=keep(s.then), orelse=keep(s.orelse))
