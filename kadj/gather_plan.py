"""Which CPU loop nests have a gather-form adjoint: the stencil plan.

A loop nest qualifies when its iterations, indexed by the loop counters ``(i, j, ...)``,
each write only their own output elements (``y[i, j]``, at constant offsets of the
counters) and read the arrays that need adjoints at constant offsets of the counters
(``x[i + 1, j]``): the CPU counterpart of :func:`kadj.cuda.gather.gather_plan`, with
the loop counters in the role of the thread coordinates and the loop ranges in the role
of the launch.  :func:`cpu_stencil_plan` returns a :class:`StencilNest` describing the
nest (levels, counters, the gathered arrays with the offsets of their loads, the
stored arrays), or the reason why the kernel keeps the scatter form;
:func:`cpu_stencil_nests` the nests inside other loops (the stencil loops of a time
loop's steps) that qualify on their own.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from numba.core import types

from . import ir
from .kernel_memo import per_kernel


@dataclass(frozen=True)
class StencilNest:
    """A qualifying loop nest.

    levels:   the ForRange statements, outermost first (one per dimension).
    counters: {loop counter: dimension}.
    gathered: {array: (perm, offsets)}: ``perm[k]`` is the dimension indexing the
              array's dimension k, ``offsets`` the offset vectors (one entry per
              dimension) of its loads.
    stored:   {array: (perm, offset vector)} of the arrays the innermost body writes.
    hoisted:  the statements between the loop levels (loop-invariant, inactive).
    local:    the variables the innermost body assigns (its own per iteration).
    """

    levels: tuple
    counters: dict
    gathered: dict
    stored: dict
    hoisted: tuple
    local: frozenset
    defs: dict
    starts: tuple = ()      # the loops' (constant) starts

    @property
    def ndim(self):
        return len(self.levels)

    @property
    def body(self):
        return self.levels[-1].body

    def passes(self):
        """The offset vectors of the passes, the own pass (all zeros) first."""
        zero = tuple([0] * self.ndim)
        offs = {o for _, offsets in self.gathered.values() for o in offsets}
        return [zero] + sorted(offs - {zero})

    def offset(self, x):
        """(dimension, constant) when operand x is a loop counter plus a constant."""
        return coord_offset(x, self.counters, self.defs)

    def offset_vector(self, array, index):
        """The offset vector of an access ``array[index]`` in the array's gathered
        layout, or None when the index is not the gathered shifted counters."""
        perm = self.gathered[array][0]
        if len(index) != len(perm):
            return None
        vec = [0] * self.ndim
        for k, x in enumerate(index):
            co = self.offset(x)
            if co is None or co[0] != perm[k]:
                return None
            vec[co[0]] = co[1]
        return tuple(vec)


def _const(y, defs):
    if isinstance(y, ir.Const) and isinstance(y.value, int) and \
            not isinstance(y.value, bool):
        return y.value
    if isinstance(y, ir.Var):
        e = defs.get(y.name)
        if isinstance(e, ir.Const):
            return _const(e, defs)
        if isinstance(e, ir.Copy):
            return _const(e.src, defs)
    return None


def coord_offset(x, counters, defs, _depth=0):
    """(dimension, constant) when x is a counter plus a constant (possibly in several
    steps: ``im = i - 1; ip = im + 2``), else None."""
    if not isinstance(x, ir.Var) or _depth > 8:
        return None
    if x.name in counters:
        return counters[x.name], 0
    e = defs.get(x.name)
    if isinstance(e, ir.Copy):
        return coord_offset(e.src, counters, defs, _depth + 1)
    if isinstance(e, ir.Op) and e.fn in (operator.add, operator.sub) and not e.kws \
            and len(e.args) == 2:
        a, b = e.args
        sign = 1 if e.fn is operator.add else -1
        cb, ca = _const(b, defs), _const(a, defs)
        if cb is not None:
            inner = coord_offset(a, counters, defs, _depth + 1)
            if inner is not None:
                return inner[0], inner[1] + sign * cb
        if ca is not None and sign == 1:
            inner = coord_offset(b, counters, defs, _depth + 1)
            if inner is not None:
                return inner[0], inner[1] + ca
    return None


def _single_defs(kernel):
    """{variable: expression} of the variables assigned exactly once (kept per kernel:
    asked once per loop and array; read it, never change it)."""
    return per_kernel(kernel, "single defs", lambda: _count_single_defs(kernel))


def _count_single_defs(kernel):
    count, defs = {}, {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign):
            count[s.target] = count.get(s.target, 0) + 1
            defs[s.target] = s.expr
        elif isinstance(s, ir.ForRange):
            count[s.index] = count.get(s.index, 0) + 1
    return {v: e for v, e in defs.items() if count[v] == 1}


def _shifted(index, counters, defs, ndim):
    """(perm, offset vector) when ``index`` is every counter once, each plus a
    constant; else None."""
    co = [coord_offset(x, counters, defs) for x in index]
    if None in co or sorted(d for d, _ in co) != list(range(ndim)):
        return None
    vec = [0] * ndim
    for d, off in co:
        vec[d] = off
    return tuple(d for d, _ in co), tuple(vec)


def cpu_stencil_plan(kernel, an):
    """(:class:`StencilNest`, "") for a kernel whose adjoint may take the gather form,
    or (None, the reason it keeps the scatter form)."""
    if an.replay or an.restore_arrays or an.checkpoint:
        return None, "a loop of the adjoint is replayed or restores arrays"
    if an.stored & ir.loaded_elsewhere(kernel.body) & an.varied_arrays:
        return None, "an array is both read and written"
    nests = [s for s in kernel.body if isinstance(s, ir.ForRange)]
    if len(nests) != 1:
        return None, "the kernel does not consist of exactly one loop nest"
    for s in kernel.body:
        if s is nests[0]:
            continue
        if not isinstance(s, (ir.Assign, ir.Return)) or \
                isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc):
            return None, "the kernel has statements other than assignments around its " \
                         "loop nest"
    return nest_plan(kernel, an, nests[0], _single_defs(kernel))


def cpu_stencil_nests(kernel, an):
    """The stencil nests inside other loops (a time loop's steps) whose reverse may
    take the gather form, each as a :class:`StencilNest`, outermost candidates first.

    The rest of the adjoint keeps the scatter form; a nest's reverse only reorders the
    additions its own iterations make (each adjoint element collected once), so it
    qualifies on what happens inside it: its iterations independent, no array both
    read and written in it, no value it overwrites recorded (no pop inside its
    reverse), nothing saved around it, and no loop of the kernel replayed or
    checkpointed (a replay reruns forward code in the reverse sweep)."""
    if an.replay or an.checkpoint:
        return []
    defs = _single_defs(kernel)
    found = []

    def visit(stmts, inside):
        for s in stmts:
            if isinstance(s, ir.If):
                visit(s.then, inside)
                visit(s.orelse, inside)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                nest = None
                if inside and isinstance(s, ir.ForRange) and an.has_rev.get(id(s)):
                    nest, _why = _nested_plan(kernel, an, s, defs)
                if nest is not None:
                    found.append(nest)
                else:
                    visit(s.body, True)

    visit(kernel.body, False)
    return found


def _nested_plan(kernel, an, top, defs):
    """:func:`nest_plan` for loop ``top`` inside another loop, with the conditions a
    whole kernel meets by :func:`cpu_stencil_plan`'s own checks."""
    stmts = list(ir.walk(top.body))
    loaded, stored = ir.loaded_elsewhere(top.body), ir.stored_arrays(top.body)
    if loaded & stored & an.varied_arrays:
        return None, "an array is both read and written in the nest"
    if stored & an.restore_arrays or any(
            isinstance(x, ir.Assign) and x.target in an.pushed for x in stmts):
        return None, "the nest overwrites values the reverse sweep restores"
    loops = [top] + [x for x in stmts if isinstance(x, (ir.ForRange, ir.Loop))]
    if any(x.uid in an.loop_saved or x.uid in an.index_saved for x in loops):
        return None, "values are saved around a loop of the nest"
    nest, why = nest_plan(kernel, an, top, defs)
    if nest is not None and not faster_serial(nest):
        return None, "the nest's iterations compute more than sums and products, " \
                     "or it has three dimensions"
    return nest, why


def faster_serial(nest):
    """Is the serial gather form of ``nest`` expected to be faster than its scatter
    form?  Only when :func:`cheap` and in one or two dimensions: a serial 3-D gather
    form took 1.0-1.4 times the scatter form's time (``stencil_3d_7pt``, a 3-D
    diffusion with a variable coefficient; five shapes)."""
    return nest.ndim < 3 and cheap(nest)


def cheap(nest):
    """Does each iteration of ``nest`` compute only sums and products?  Each pass of
    the gather form recomputes its iteration's adjoint: with divisions or functions,
    computing it once per pass costs more than the scattered additions it saves
    (``flux_smoothing``'s limited fluxes; ``laplacian_9pt``'s ``/ 6.0``, nine
    divisions per element)."""
    return all(x.expr.fn in _CHEAP for x in ir.walk(nest.body)
               if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Op))


#: the operations of a stencil worth recomputing in every pass of the gather form
_CHEAP = frozenset({operator.add, operator.sub, operator.mul, operator.neg,
                    operator.pos})


def nest_plan(kernel, an, top, defs):
    """(:class:`StencilNest`, "") when the loop nest at ``top`` qualifies, else (None,
    the reason)."""
    levels, hoisted = [top], []
    while True:
        inner = [s for s in levels[-1].body if isinstance(s, ir.ForRange)]
        if not inner:
            break
        if len(inner) > 1:
            return None, "a loop holds more than one loop"
        hoisted += [s for s in levels[-1].body if s is not inner[0]]
        levels.append(inner[0])
    counters = {s.index: d for d, s in enumerate(levels)}
    body = levels[-1].body
    local = frozenset(ir.assigned(body))
    for d, s in enumerate(levels):
        if s.uid not in an.ascending:
            return None, "the iterations of a loop of the nest are not independent"
        if not (isinstance(s.step, ir.Const) and s.step.value == 1):
            return None, "a loop of the nest has a step other than 1"
        if _const(s.start, defs) is None:
            return None, "a loop of the nest starts at a value that is not a constant"
        if ir.var_names((s.start, s.stop)) & (set(counters) | set(ir.assigned(s.body))):
            return None, "the loop ranges of the nest are not rectangular"
    for s in hoisted:
        if not isinstance(s, ir.Assign) or isinstance(s.expr, ir.Alloc) or \
                s.target in an.varied:
            return None, "a statement between the loops of the nest is not an inactive " \
                         "assignment"
        if ir.stmt_reads(s) & (set(counters) | local):
            return None, "a statement between the loops of the nest depends on a counter"
    for s in ir.walk(body):
        if isinstance(s, (ir.ForRange, ir.Loop, ir.Break, ir.Continue, ir.Return,
                          ir.Barrier)):
            return None, "the innermost loop's body has loops or exits"
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc):
            return None, "the innermost loop's body allocates arrays"
    ndim = len(levels)
    stored = {}
    for s in ir.walk(body):
        if not isinstance(s, ir.Store) or s.array.name not in an.varied_arrays:
            continue
        if not any(x is s for x in body):
            return None, f"'{s.array.name}' is written under a condition"
        if s.accumulate:
            return None, f"'{s.array.name}' is incremented, not written"
        sh = _shifted(s.index, counters, defs, ndim)
        if sh is None:
            return None, f"'{s.array.name}' is not written at the iteration's own element"
        if s.array.name in stored:
            # (the gather reads an element's incoming adjoint for each store into it,
            # and a store that a later one overwrites must get none)
            if stored[s.array.name] != sh:
                return None, f"'{s.array.name}' is written at two elements per iteration"
            return None, f"'{s.array.name}' is written twice per iteration"
        stored[s.array.name] = sh
    if not stored:
        return None, "the nest writes no array with an adjoint"
    gathered, layouts = {}, {}
    for s in ir.walk(body):
        if not (isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load)):
            continue
        name = s.expr.array.name
        if name not in an.varied_arrays or name in stored or \
                not isinstance(kernel.types.get(name), types.Array):
            continue
        sh = _shifted(s.expr.index, counters, defs, ndim)
        if sh is None:
            continue   # read at another index: its adjoint is added in the own pass
        perm, vec = sh
        layouts.setdefault(name, perm)
        if layouts[name] == perm:
            gathered.setdefault(name, set()).add(vec)
    if not gathered:
        return None, "no array is read at shifted loop counters"
    if not any(any(o) for offs in gathered.values() for o in offs):
        return None, "no array is read at a neighbour's element (the scatter form of " \
                     "an elementwise loop already writes each element once)"
    for d, s in enumerate(levels):
        low = min(o[d] for offs in gathered.values() for o in offs)
        if _const(s.start, defs) + min(low, 0) < 0:
            return None, "an array is read below index 0 (numba wraps such an index " \
                         "around)"
    plan = {n: (layouts[n], frozenset(o)) for n, o in gathered.items()}
    starts = tuple(_const(s.start, defs) for s in levels)
    return StencilNest(tuple(levels), counters, plan, stored, tuple(hoisted), local,
                       defs, starts), ""
