"""One variable per web: a scalar name that the kernel uses for unrelated values gets
one name per value it holds.

numba's IR (without SSA) keeps the kernel's own names, so a temporary reused by two
loops (``t = sin(x[i])`` in one, ``t = cos(x[i])`` in the next) is one variable to the
analysis: the second loop overwrites what the first left in ``t``, and the adjoint saves
``t`` before every assignment of the second loop and restores it in reverse, although
no value of the first loop is ever read in the second.  A *web* is a set of assignments
of one name that reach a common read (joined transitively): the values a read may see.
Each web of a name is a variable of its own, so :func:`split` gives every web after the
first a fresh name (``t_2``), and the analysis sees two variables, each assigned anew in
every iteration of its loop: nothing is saved, each iteration is replayed.

The reaching assignments are computed over the region tree (sequences, ``if`` arms,
``for`` and ``while True`` loops with ``break`` and ``continue``, ``return``), to a fixed
point around each loop.  Only scalars (numbers and booleans) are split, never an
argument, and a web that holds a ``for`` loop's counter (read after the loop) or the
value a name has on entry (a read that no assignment may reach first) keeps the name.
The result computes exactly what the kernel computes: every read sees the same values
under the new names.
"""
from __future__ import annotations

from dataclasses import replace

from numba.core import types

from . import ir

__all__ = ["split"]

_ENTRY = ("entry",)


def split(kernel):
    """``kernel`` (:class:`kadj.ir.Kernel`) with every web of a scalar variable after
    the first renamed; ``kernel`` itself when no name holds more than one web."""
    tracked = {n for n in ir.assigned(kernel.body)
               if n not in kernel.args and _scalar(kernel.types.get(n))}
    if not tracked:
        return kernel
    flow = _Flow(tracked)
    flow.seq(kernel.body, (), {n: frozenset([(_ENTRY, n)]) for n in tracked})
    roots = _roots(flow)
    renames = _renames(flow, kernel, roots)
    if not renames:
        return kernel
    typs = dict(kernel.types)
    for root, new in renames.items():
        typs[new] = kernel.types[flow.defs[root]]
    body = _Rewrite(flow, roots, renames).seq(kernel.body, ())
    return replace(kernel, body=tuple(body), types=typs)


def _scalar(typ):
    return isinstance(typ, (types.Number, types.Boolean))


# ---- reaching assignments ------------------------------------------------------------
class _Flow:
    """Which assignments reach each read.  An assignment is named by its position in
    the tree (a path of indices), the value on entry by ``(_ENTRY, name)``."""

    def __init__(self, tracked):
        self.tracked = tracked
        self.reads = {}        # (path, name) -> set of definitions
        self.defs = {}         # definition -> name
        self.counters = set()  # definitions that are a for loop's counter
        self.loops = []        # per enclosing loop: [break states, continue states]

    def use(self, path, names, state):
        for n in names:
            if n in self.tracked:
                self.reads.setdefault((path, n), set()).update(state[n])

    def define(self, path, name, state, counter=False):
        if name in self.tracked:
            self.defs[path] = name
            if counter:
                self.counters.add(path)
            state[name] = frozenset([path])

    def seq(self, stmts, path, state):
        """The state after ``stmts`` (None when control never falls through)."""
        for k, s in enumerate(stmts):
            if state is None:
                return None
            state = self.stmt(s, path + (k,), state)
        return state

    def stmt(self, s, path, state):
        if isinstance(s, ir.Assign):
            self.use(path, ir.stmt_reads(s), state)
            self.define(path, s.target, state)
            return state
        if isinstance(s, ir.If):
            self.use(path, ir.stmt_reads(s), state)
            return _join(self.seq(s.then, path + (0,), dict(state)),
                         self.seq(s.orelse, path + (1,), dict(state)))
        if isinstance(s, ir.ForRange):
            self.use(path, ir.stmt_reads(s), state)
            return self.loop(s.body, path, state, s.index)
        if isinstance(s, ir.Loop):
            return self.loop(s.body, path, state, None)
        if isinstance(s, ir.Break):
            self.loops[-1][0].append(state)
            return None
        if isinstance(s, ir.Continue):
            self.loops[-1][1].append(state)
            return None
        if isinstance(s, ir.Return):
            self.use(path, ir.stmt_reads(s), state)
            return None
        self.use(path, ir.stmt_reads(s), state)
        return state

    def loop(self, body, path, entry, counter):
        """A ``for`` loop (``counter`` its index) or ``while True``: the body runs from
        the head, whose state joins the entry and every way back, until nothing
        changes; a ``for`` loop also leaves from the head."""
        head = entry
        while True:
            self.loops.append([[], []])
            inner = dict(head)
            if counter is not None:
                self.define(path, counter, inner, counter=True)
            end = self.seq(body, path + (0,), inner)
            breaks, continues = self.loops.pop()
            back = head
            for st in [end] + continues:
                back = _join(back, st)
            if back == head:
                break
            head = back
        out = head if counter is not None else None
        if counter is not None and counter in self.tracked:
            # after a for loop, its counter holds the entry's or the last iteration's
            out = dict(head)
            out[counter] = head[counter] | frozenset([path])
        for st in breaks:
            out = _join(out, st)
        return out


def _join(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if a is b:
        return a
    return {n: a[n] | b[n] if a[n] is not b[n] else a[n] for n in a}


# ---- webs -----------------------------------------------------------------------------
def _roots(flow):
    """Each definition's web, named by the web's first definition (union-find over
    the definitions that reach a common read)."""
    parent = {}

    def find(d):
        while parent.get(d, d) != d:
            d = parent[d]
        return d

    for defs in flow.reads.values():
        defs = sorted(defs, key=_order)
        for d in defs[1:]:
            a, b = find(defs[0]), find(d)
            if a != b:
                parent[max(a, b, key=_order)] = min(a, b, key=_order)
    return {d: find(d) for d in list(flow.defs) + [(_ENTRY, n) for n in flow.tracked]}


def _renames(flow, kernel, roots):
    """``{web: new name}`` for the webs that get a name of their own."""
    webs = {}          # name -> {root: [definitions]}
    for d, name in flow.defs.items():
        webs.setdefault(name, {}).setdefault(roots[d], []).append(d)
    entry_roots = {roots[(_ENTRY, n)] for n in flow.tracked}
    taken = _all_names(kernel)
    out = {}
    for name, groups in sorted(webs.items()):
        if len(groups) < 2:
            continue
        keep = [r for r, ds in groups.items()
                if r in entry_roots or any(d in flow.counters for d in ds)]
        movable = sorted((r for r in groups if r not in keep), key=_order)
        if not keep:
            movable = movable[1:]      # the first web keeps the name
        k = 2
        for root in movable:
            while f"{name}_{k}" in taken:
                k += 1
            out[root] = f"{name}_{k}"
            taken.add(out[root])
    return out


def _order(d):
    """Definitions in program order, the entry values first."""
    return (0, d[1]) if d[0] == _ENTRY else (1, d)


def _all_names(kernel):
    names = set(kernel.types) | set(kernel.args) | ir.assigned(kernel.body)
    for s in ir.walk(kernel.body):
        names |= ir.stmt_reads(s)
    return names


# ---- renaming -------------------------------------------------------------------------
class _Rewrite:
    def __init__(self, flow, roots, renames):
        self.flow, self.roots, self.renames = flow, roots, renames

    def web_name(self, d, name):
        return self.renames.get(self.roots[d], name)

    def seq(self, stmts, path):
        return tuple(self.stmt(s, path + (k,)) for k, s in enumerate(stmts))

    def names(self, path, names):
        """The new names of the variables a statement reads (all the definitions that
        reach one read are in one web)."""
        out = {}
        for n in names:
            defs = self.flow.reads.get((path, n))
            if defs:
                new = self.web_name(next(iter(defs)), n)
                if new != n:
                    out[n] = new
        return out

    def stmt(self, s, path):
        reads = self.names(path, ir.stmt_reads(s))
        if isinstance(s, ir.Assign):
            target = self.web_name(path, s.target) if path in self.flow.defs \
                else s.target
            expr = _rename_expr(s.expr, reads) if reads else s.expr
            return s if (target, expr) == (s.target, s.expr) else \
                replace(s, target=target, expr=expr)
        if isinstance(s, ir.Store):
            if not reads:
                return s
            return replace(s, array=_ren(s.array, reads),
                           index=tuple(_ren(x, reads) for x in s.index),
                           value=_ren(s.value, reads))
        if isinstance(s, ir.If):
            return replace(s, cond=_ren(s.cond, reads), then=self.seq(s.then, path + (0,)),
                           orelse=self.seq(s.orelse, path + (1,)))
        if isinstance(s, ir.ForRange):
            return replace(s, start=_ren(s.start, reads), stop=_ren(s.stop, reads),
                           step=_ren(s.step, reads), body=self.seq(s.body, path + (0,)))
        if isinstance(s, ir.Loop):
            return replace(s, body=self.seq(s.body, path + (0,)))
        if isinstance(s, ir.Return) and s.value is not None and reads:
            return replace(s, value=_ren(s.value, reads))
        return s


def _ren(x, names):
    if isinstance(x, ir.Var) and x.name in names:
        return ir.Var(names[x.name])
    return x


def _rename_expr(e, names):
    if isinstance(e, ir.Copy):
        return ir.Copy(_ren(e.src, names))
    if isinstance(e, (ir.Op, ir.Alloc)):
        return replace(e, args=tuple(_ren(a, names) for a in e.args),
                       kws=tuple((k, _ren(v, names)) for k, v in e.kws))
    if isinstance(e, ir.Load):
        return replace(e, array=_ren(e.array, names),
                       index=tuple(_ren(x, names) for x in e.index))
    if isinstance(e, (ir.Attr, ir.Item)):
        return replace(e, value=_ren(e.value, names))
    raise TypeError(e)
