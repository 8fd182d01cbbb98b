"""Running maxima and minima: record where, not every value.

A loop that keeps a running extremum, ``m = max(m, x[i])`` (or ``min``, either argument
order, also numba's ``t = max(m, v); m = t``) or ``if <condition>: m = x[i]`` (the
condition may read ``m``), reverses through every iteration: each one decides whether
``m``'s adjoint goes to that iteration's value or further back, so the tape recorded
``m`` at every iteration (``n`` entries for ``np.max`` of ``n`` elements).  Only the
last iteration that set ``m`` gets the adjoint.  This rewrite (CPU, before the analysis)
keeps the loop's comparisons on a copy ``m_run`` that no derivative flows through,
records the loop counter at each iteration that sets it (``m_at``: one integer), and
after the loop reads the winning value again::

    m_run = m; m_at = -1
    for i in range(...):
        v = x[i]
        if not (m_run >= v): m_at = i     # max(m, v): v wins where m >= v fails
        m_run = max(m_run, v)
    if m_at >= 0:
        v_at = x[m_at]                    # the value's computation, at i = m_at
        if v_at == m_run: m = v_at        # the adjoint flows here only
        else: m = detach(m_run)          # (NaN: max kept m_run, no derivative)

The adjoint then adds ``m``'s adjoint to one element, as kadj's rule for ``max``
(ties to the first argument) routed it through the reversed loop, and the loop itself
has no reverse code.  For ``if c: m = v`` the last assignment is the value itself, so
``m = v_at`` always.

It applies where the loop has no ``break``, ``continue`` or ``return`` and its counter
is never negative (-1 marks "no iteration set it"; ``x[-1]`` is the last element); ``m`` is a real
scalar assigned once in the loop (at its top level, or alone in an ``if`` there) and
read in it only by that ``max``/``min`` or by the statements before the ``if`` that
compute non-real values (the condition); and the value is a variable or a load whose
computation in the loop (statements at its top level, each assigned once in the
kernel, reading the counter, values the loop does not assign and arrays it does not
write) can run again after the loop with the counter at ``m_at``.
"""
from __future__ import annotations

import collections
import operator
from dataclasses import replace

from numba.core import types

from . import ir, rules
from .cachedir import cached_njit

_INEXACT = types.Float


@cached_njit(inline="always")
def detach(x):
    """``x``, through which no derivative flows (its rule contributes nothing)."""
    return x


rules.register(detach, domain=(), name="detach")(lambda g, out, x: (None,))

#: the extremum functions and the rule's "first argument wins" test (ties go first)
_FIRST_WINS = {max: operator.ge, min: operator.le}


def rewrite(kernel):
    """``kernel`` with every qualifying running extremum rewritten (itself if none)."""
    counts = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign):
            counts[s.target] = counts.get(s.target, 0) + 1
        elif isinstance(s, ir.ForRange):
            counts[s.index] = counts.get(s.index, 0) + 1
    state = _State(kernel, counts)
    body = state.seq(kernel.body)
    if not state.changed:
        return kernel
    return replace(kernel, body=body, types=state.types)


class _State:
    def __init__(self, kernel, counts):
        self.k = kernel
        self.counts = counts
        self.types = dict(kernel.types)
        self.changed = False

    def fresh(self, base, t):
        """A new variable of type ``t``: ``base`` itself if free (a name of the
        adjoint), else with a number; temporaries (``$...``) always numbered."""
        k = 0 if not base.startswith("$") else 1
        while True:
            name = f"{base}{k}" if k else base
            if name not in self.types:
                self.types[name] = t
                return name
            k += 1

    def seq(self, stmts):
        out = []
        for s in stmts:
            if isinstance(s, ir.If):
                out.append(replace(s, then=self.seq(s.then), orelse=self.seq(s.orelse)))
            elif isinstance(s, ir.Loop):
                out.append(replace(s, body=self.seq(s.body)))
            elif isinstance(s, ir.ForRange):
                s = replace(s, body=self.seq(s.body))
                out += self.loop(s)
            else:
                out.append(s)
        return tuple(out)

    # ---- one loop ----------------------------------------------------------------
    def loop(self, loop):
        """The statements replacing ``loop``: itself, or the rewritten loop with what
        comes before and after it."""
        if loop.parallel or not ir.never_negative(loop) or any(
                isinstance(x, (ir.Break, ir.Continue, ir.Return))
                for x in ir.walk(loop.body)):
            return [loop]
        before, after = [], []
        for m in sorted(self._candidates(loop)):
            found = self._one(loop, m)
            if found is not None:
                loop, pre, post = found
                before += pre
                after += post
        return before + [loop] + after

    def _candidates(self, loop):
        """The floating-point variables the loop's body assigns once and the kernel
        assigns more than once."""
        in_loop = collections.Counter(s.target for s in ir.walk(loop.body)
                                      if isinstance(s, ir.Assign))
        return {v for v, n in in_loop.items()
                if n == 1 and isinstance(self.types.get(v), _INEXACT) and
                self.counts.get(v, 0) > 1}

    def _one(self, loop, m):
        body = loop.body
        form = self._form_max(body, m) or self._form_if(body, m)
        if form is None:
            return None
        kind, where, value = form
        slice_ = self._slice(loop, value)
        if slice_ is None:
            return None
        mt = self.types[m]
        run = self.fresh(f"{m}_run", mt)
        at = self.fresh(f"{m}_at", types.intp)
        loc = body[where].then[0].loc if kind == "if" else body[where].loc
        new_body = [self._reading(x, m, run) for x in body]
        counter = ir.Copy(ir.Var(loop.index))
        if kind == "if":
            s = body[where]
            assign = s.then[0]
            new_body[where] = replace(s, then=(ir.Assign(run, assign.expr, loc=assign.loc),
                                               ir.Assign(at, counter, loc=assign.loc)))
        else:
            fn, op_at, v_first = kind
            op_stmt = body[op_at]
            a, b = (ir.Var(run) if x == ir.Var(m) else x for x in op_stmt.expr.args)
            keep = self.fresh("$keep", types.boolean)
            taken = self.fresh("$taken", types.boolean)
            test = [ir.Assign(keep, ir.Op(_FIRST_WINS[fn], (a, b)), loc=loc)]
            if v_first:
                cond = ir.Var(keep)
            else:
                test.append(ir.Assign(taken, ir.Op(operator.not_, (ir.Var(keep),)),
                                      loc=loc))
                cond = ir.Var(taken)
            test.append(ir.If(cond, (ir.Assign(at, counter, loc=loc),), (), loc=loc))
            new_body[op_at:op_at] = test
            shift = len(test)
            if op_at == where:
                new_body[where + shift] = ir.Assign(run, ir.Op(fn, (a, b)), loc=loc)
            else:
                new_body[op_at + shift] = replace(op_stmt, expr=ir.Op(fn, (a, b)))
                new_body[where + shift] = ir.Assign(run, ir.Copy(ir.Var(op_stmt.target)),
                                                    loc=loc)
        pre = [ir.Assign(run, ir.Copy(ir.Var(m)), loc=loop.loc),
               ir.Assign(at, ir.Copy(ir.Const(-1)), loc=loop.loc)]
        again, vk = self._again(slice_, value, loop.index, at, loc)
        if kind == "if":
            final = again + [ir.Assign(m, ir.Copy(vk), loc=loc)]
        else:
            same = self.fresh("$same", types.boolean)
            final = again + [
                ir.Assign(same, ir.Op(operator.eq, (vk, ir.Var(run))), loc=loc),
                ir.If(ir.Var(same), (ir.Assign(m, ir.Copy(vk), loc=loc),),
                      (ir.Assign(m, ir.Op(detach, (ir.Var(run),)), loc=loc),), loc=loc)]
        found = self.fresh("$found", types.boolean)
        post = [ir.Assign(found, ir.Op(operator.ge, (ir.Var(at), ir.Const(0))), loc=loc),
                ir.If(ir.Var(found), tuple(final), (), loc=loc)]
        self.changed = True
        return replace(loop, body=tuple(new_body)), pre, post

    # ---- the two forms -------------------------------------------------------------
    def _reads(self, body, m):
        return [k for k, x in enumerate(body)
                if any(m in ir.stmt_reads(y) for y in ir.walk((x,)))]

    def _form_max(self, body, m):
        """``m = max(m, v)`` (or through a temporary) at the top level of ``body``:
        (("max"/"min" fn, index of the call, v is the first argument), index of the
        assignment of ``m``, v)."""
        at = [k for k, x in enumerate(body) if isinstance(x, ir.Assign) and x.target == m]
        if len(at) != 1:
            return None
        where = at[0]
        s = body[where]
        op_at = where
        if isinstance(s.expr, ir.Copy) and isinstance(s.expr.src, ir.Var):
            t = s.expr.src.name
            defs = [k for k, x in enumerate(body[:where])
                    if isinstance(x, ir.Assign) and x.target == t]
            if len(defs) != 1 or self.counts.get(t, 0) != 1:
                return None
            op_at = defs[0]
            if self._reads(body, t) != [where] or self._read_elsewhere(t, body[where]):
                return None
        e = body[op_at].expr
        if not isinstance(e, ir.Op) or e.fn not in _FIRST_WINS or e.kws or \
                len(e.args) != 2:
            return None
        a, b = e.args
        mv = ir.Var(m)
        if (a == mv) == (b == mv):
            return None
        v = b if a == mv else a
        if not isinstance(v, ir.Var) or v.name == m:
            return None
        if self._reads(body, m) != [op_at]:
            return None
        return (e.fn, op_at, a != mv), where, v

    def _read_elsewhere(self, t, own):
        return any(t in ir.stmt_reads(x) for x in ir.walk(self.k.body) if x is not own)

    @staticmethod
    def _reading(s, m, run):
        """Statement ``s`` of the loop's top level with its reads of ``m`` made reads of
        ``run`` (only assignments read ``m`` there, by the forms' conditions)."""
        if not isinstance(s, ir.Assign) or m not in ir.stmt_reads(s):
            return s
        return replace(s, expr=_renamed(s.expr, {m: run}))

    def _form_if(self, body, m):
        """``if c: m = v`` at the top level of ``body``, ``m`` read only before it to
        compute non-real values: ("if", index of the ``if``, v)."""
        for k, s in enumerate(body):
            if isinstance(s, ir.If) and len(s.then) == 1 and not s.orelse and \
                    isinstance(s.then[0], ir.Assign) and s.then[0].target == m:
                expr = s.then[0].expr
                if isinstance(expr, ir.Copy) and isinstance(expr.src, ir.Var):
                    value = expr.src
                elif isinstance(expr, ir.Load):
                    value = expr
                else:
                    return None
                if isinstance(value, ir.Var) and value.name == m or \
                        m in ir.var_names(ir.operands(expr)):
                    return None
                reads = self._reads(body, m)
                if any(r >= k for r in reads):
                    return None
                for r in reads:
                    x = body[r]
                    if not isinstance(x, ir.Assign) or \
                            isinstance(self.types.get(x.target), (types.Float,
                                                                  types.Complex)):
                        return None
                return "if", k, value
        return None

    # ---- the value, again after the loop -------------------------------------------
    def _slice(self, loop, value):
        """The statements of ``loop``'s top level that compute ``value`` (a Var or a
        Load), in order, when they can run again after the loop; else None."""
        body = loop.body
        assigned = ir.assigned(body)
        stored = ir.stored_arrays(body)
        pos = {x.target: k for k, x in enumerate(body) if isinstance(x, ir.Assign)}
        need = []
        todo = [value]
        seen = set()
        while todo:
            x = todo.pop()
            if isinstance(x, ir.Load):
                if x.array.name in stored or x.array.name in assigned:
                    return None
                todo += list(x.index)
                continue
            if not isinstance(x, ir.Var) or x.name in seen:
                continue
            seen.add(x.name)
            if x.name == loop.index or x.name not in assigned:
                continue
            if x.name not in pos or self.counts.get(x.name, 0) != 1:
                return None
            s = body[pos[x.name]]
            e = s.expr
            if isinstance(e, (ir.Alloc, ir.Attr)) or \
                    isinstance(e, ir.Op) and getattr(e.fn, "_kadj_impure", False):
                return None
            need.append(pos[x.name])
            if isinstance(e, ir.Load):
                todo.append(e)
            else:
                todo += list(ir.operands(e))
        return [body[k] for k in sorted(need)]

    def _again(self, stmts, value, counter, at, loc):
        """``stmts`` (and ``value``) again with the counter at ``at``: (statements,
        the value's operand)."""
        names = {counter: at}
        out = []
        for s in stmts:
            new = self.fresh(f"${s.target.lstrip('$')}_at", self.types[s.target])
            out.append(ir.Assign(new, _renamed(s.expr, names), loc=s.loc))
            names[s.target] = new
        if isinstance(value, ir.Load):
            vk = self.fresh("$value_at", self.types[value.array.name].dtype)
            out.append(ir.Assign(vk, _renamed(value, names), loc=loc))
            return out, ir.Var(vk)
        return out, ir.Var(names.get(value.name, value.name))


def _renamed(e, names):
    """Expression ``e`` reading ``names[v]`` wherever it reads a variable ``v`` of
    ``names``."""
    def sub(x):
        return ir.Var(names[x.name]) if isinstance(x, ir.Var) and x.name in names else x
    if isinstance(e, ir.Copy):
        return ir.Copy(sub(e.src))
    if isinstance(e, ir.Op):
        return replace(e, args=tuple(map(sub, e.args)),
                       kws=tuple((k, sub(v)) for k, v in e.kws))
    if isinstance(e, ir.Load):
        return ir.Load(e.array, tuple(map(sub, e.index)))
    if isinstance(e, ir.Item):
        return ir.Item(sub(e.value), e.index)
    raise TypeError(e)
