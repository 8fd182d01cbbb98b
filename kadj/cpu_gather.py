"""The gather form of a CPU stencil's adjoint: each adjoint element written once.

In the scatter form the reversed iteration q adds the adjoint of its load ``u[q + o]``
into ``adj_u[q + o]``, for every offset o of the stencil: three (five, nine) scattered
``+=`` per iteration, which do not vectorise.  In the gather form a loop runs over the
*input* elements p (the forward range shifted by every offset, clipped to the arrays):
for every offset o it runs the adjoint of the iteration ``q = p - o`` (a *pass*; the
iteration must be in the forward range) and keeps only the contribution of that
iteration's load at offset o, which is ``adj_u[p]``'s.  The sum goes into ``adj_u[p]``
with one ``+=``.  A loop of its own over the forward range after the gather loop
consumes the stored elements' incoming adjoints (read by the passes of several
elements, they cannot be consumed in the gather loop).  Everything else an iteration
adds (scalar arguments, values computed before the loop, arrays read at other indices)
must count once per iteration: when it is all scalar sums, one pass adds it (the own
pass ``o = 0`` when there is one; any pass meets every iteration exactly once), which
saves reading the inputs again; otherwise (``coef[k]``) the loop after the gather loop
adds it.  A serial 1-D form also consumes, in its interior, the outputs' adjoints of the
iteration at p minus the largest offset (every pass reading them has run: the edges
first, then the interior going up); the loop after consumes the rest.

The p range is split so that the innermost loop has an interior without branches
(every pass's iteration exists there: the passes run unguarded) and edges where each
pass checks that its iteration exists; the compiler vectorises the interior and shares
the passes' common loads.  :func:`kadj.gather_plan.cpu_stencil_plan` says which loop
nests qualify; the rest of the kernel (the statements before and after the nest) is
written as in the scatter form.

When the nest was asked to run in parallel (``prange``, ``parallel=True``), the form's
outermost loops (:attr:`GatherWriter.outer_loops`) become ``numba.prange`` loops where
:func:`kadj.parallel.parallelise_loops` finds them race-free: the loop over the elements
(in 1-D its interior) and the loop after it; a row's sums are a reduction over the
threads (:mod:`kadj.row_outline` returns them from the rows' function).
"""
from __future__ import annotations

from numba.core import types

from . import adj_ir as A
from .adj_refs import USE, roles_of
from .lowering import lower_declarations
from .reverse import Writer
from .simplify import simplify


class GatherWriter(Writer):
    """The CPU writer with the loop nests of ``nests`` reversed in the gather form."""

    def __init__(self, kernel, an, slot_args, returns_value, fname, nests, serial=True):
        super().__init__(kernel, an, slot_args, returns_value, fname)
        self.nests = {id(n.levels[0]): n for n in nests}
        self.nest = None         # the nest being written
        self.serial = serial
        self._sums_pass = None   # the pass that also adds the iteration's sums, if any
        self._sums_kept = []     # the sums written in the loop of the sums
        self.lowerings = (self._gather_lowering,) + tuple(self.lowerings)
        self._pass = None        # the offset vector of the pass being written
        self._acc = {}           # gathered array -> its local sum (A.Local)
        self.outer_loops = []    # the form's outermost loops (A.For), for kadj.parallel

    # ---- the reversed nest -----------------------------------------------------------
    def rev_for(self, s, depth, loop_depth):
        nest = self.nests.get(id(s))
        if nest is None:
            return super().rev_for(s, depth, loop_depth)
        self.nest, self._sums_pass, self._sums_kept, self._acc = nest, None, [], {}
        try:
            self.write_gather(depth)
        finally:
            self.nest = None

    def write_gather(self, depth):
        nest, a = self.nest, self.a
        nd = nest.ndim
        self.comment(depth, nest.levels[0].loc)
        self.put(depth, A.Comment("# gather form: each element's adjoint is collected "
                                  "from the iterations that read it"))
        for level in nest.levels[:-1]:   # the statements between the loops: invariant
            self.recompute(self._needed_recompute(a.recompute.get(level.uid, ()), level),
                           depth)
        lo = [str(x) for x in nest.starts]
        hi = [self.o(s.stop) for s in nest.levels]
        passes = nest.passes()
        sums, sums_loop = self._sums(depth, lo, hi)
        if all(isinstance(x.target, A.AdjVar) for x in self._sums_kept):
            # scalar sums only: one pass adds them (it meets every iteration once), and
            # the loop after the gather loop only consumes the outputs' adjoints (the
            # values only the sums needed are dropped as dead by the readability passes)
            self._sums_pass = (0,) * nd if (0,) * nd in passes else passes[0]
            if _drop(sums.body, {id(x) for x in self._sums_kept}) != len(self._sums_kept):
                raise AssertionError("gather form: a sum not found in its loop")
            sums.what = "consume"
            sums.body[0].text = "# the outputs' adjoints consumed"
            _drop_unread(sums.body)
        self._outer(0, sums_loop)
        p = [self.fresh(f"p{d}_") for d in range(nd)]
        bounds = []   # (P_lo, P_hi, interior lo, interior hi) per dimension
        for d in range(nd):
            low = min(o[d] for o in passes)
            high = max(o[d] for o in passes)
            phi = _add(hi[d], high)
            bounds.append((nest.starts[d] + low, phi, nest.starts[d] + high,
                           _add(hi[d], low)))
        inner = nd - 1
        plo, phi, ilo, ihi = bounds[inner]
        # the interior of the innermost dimension: [ilo, ib) (ilo a constant, ib >= ilo:
        # the compiler then sees its indices in range and vectorises the loop)
        ib = self.fresh("b")
        at = depth
        for d in range(inner):
            self._outer(d, self.put(at, A.For(p[d],
                                              f"range({bounds[d][0]}, {bounds[d][1]})")))
            at += 1
        interior = f"max({ihi}, {ilo})"
        if inner:
            cond = " and ".join(f"{bounds[d][2]} <= {p[d]} < {bounds[d][3]}"
                                for d in range(inner))
            self.put(at, A.If(cond))
            self.put(at + 1, A.Assign(ib, interior))
            self.b.put_else(at)
            self.put(at + 1, A.Assign(ib, str(ilo)))
        else:
            self.put(at, A.Assign(ib, interior))
        self.put(at, A.Comment("# the edges: each pass checks that its iteration exists"))
        e = self.fresh("e")
        self._outer(inner, self.put(at, A.For(e, f"range({plo}, {phi} - ({ib} - {ilo}))")))
        self.put(at + 1, A.Assign(p[inner],
                                  f"{e} if {e} < {ilo} else {e} + ({ib} - {ilo})"))
        self._passes(at + 1, p, lo, hi, guarded=True)
        self.put(at, A.Comment("# the interior: every pass's iteration exists"))
        self._outer(inner, self.put(at, A.For(p[inner], f"range({ilo}, {ib})")))
        self._passes(at + 1, p, lo, hi, guarded=False)
        if self._sums_pass is not None and nd == 1 and self.serial:
            # the iteration q = p - (largest offset) has had every pass that reads its
            # outputs' adjoints (the edges ran first, the interior goes up): consumed
            # here, the loop after the gather loop consumes the rest
            last = bounds[0][2] - nest.starts[0]
            self.put(at + 1, A.Comment("# the iteration no later element reads: its "
                                       "outputs' adjoints consumed"))
            self.put(at + 1, A.Assign(self.n(nest.levels[0].index), _add(p[0], -last)))
            self._iteration(at + 1, "consume")
            sums_loop.iter = f"range({_add(ib, -last)}, {hi[0]})"
        self.b.put(depth, sums)

    def _passes(self, depth, p, lo, hi, guarded):
        """The element p's passes (each checking that its iteration exists when
        ``guarded``), then its gathered sums added into the arrays' adjoints."""
        nest = self.nest
        for name in sorted(nest.gathered):
            self._acc[name] = A.Local(self.fresh(f"acc_{self.n(name)}"), name)
            self.put(depth, A.Assign(self._acc[name], self.zero(self.T[name].dtype)))
        for off in nest.passes():
            at = depth
            q = [_add(p[d], -o) for d, o in enumerate(off)]
            self.put(depth, A.Comment(
                "# this iteration" if not any(off) else
                f"# the iteration that reads this element at offset {off}"))
            if guarded:
                self.put(depth, A.If(" and ".join(f"{lo[d]} <= {q[d]} < {hi[d]}"
                                                  for d in range(nest.ndim))))
                at += 1
            for d, level in enumerate(nest.levels):
                self.put(at, A.Assign(self.n(level.index), q[d]))
            self._iteration(at, off)
        for name in sorted(nest.gathered):
            perm = nest.gathered[name][0]
            target = A.AdjElem(name, (), self.adj(name), tuple(p[d] for d in perm))
            at = depth
            if guarded:   # an edge element may lie beyond an array the others outgrow
                self.put(depth, A.If(" and ".join(f"{p[d]} < {self.n(name)}.shape[{k}]"
                                                  for k, d in enumerate(perm))))
                at += 1
            self.put(at, A.Accumulate(target, "+=", self._acc[name].name, "plain"))

    def _iteration(self, depth, off):
        """One iteration's adjoint (its counters set), in the pass at offset ``off``
        ("sums": the loop after the gather loop, :meth:`_sums`; "consume": only the
        consumption of its outputs' adjoints)."""
        nest, a = self.nest, self.a
        inner = nest.levels[-1]
        for v in sorted(sorted(nest.local & a.varied), key=self.n):
            if isinstance(self.T.get(v), (types.Float, types.Complex)) and \
                    v not in self.single_use:
                self.put(depth, A.Assign(self.adj_var(v), self.zero(self.T[v])))
        self._pass = off
        self._last_loc = None
        try:
            self.recompute(self._needed_recompute(a.recompute.get(inner.uid, ()), inner),
                           depth)
            self.rev(inner.body, depth, nest.ndim,
                     frozenset(a.recompute_vars.get(inner.uid, set())))
        finally:
            self._pass = None
            self._last_loc = None
            self._fresh_names()

    def _sums(self, depth, lo, hi):
        """The loop over the forward range that adds what every iteration adds outside
        the gathered arrays (the scalar arguments' adjoints, arrays read at other
        indices) and then consumes the incoming adjoints of the elements it wrote
        (read by the passes of several elements, they are consumed after the gather
        loop).  Written first (the iteration's own names), placed last: (the block,
        its outermost loop)."""
        nest = self.nest
        with self.b.group(depth, A.Block("sums")) as block:
            self.put(depth, A.Comment("# each iteration's sums (scalars, other "
                                      "elements); its outputs' adjoints consumed"))
            loops = [self.put(depth + d, A.For(self.n(level.index),
                                               f"range({lo[d]}, {hi[d]})"))
                     for d, level in enumerate(nest.levels)]
            self._iteration(depth + nest.ndim, "sums")
        self.b.targets[depth].remove(block)
        return block, loops[0]

    def _outer(self, d, loop):
        """Note ``loop``, at dimension ``d`` of the nest, when it is an outermost loop
        of the form (which :func:`kadj.parallel.parallelise_loops` may make parallel)."""
        if d == 0:
            self.outer_loops.append(loop)

    def _fresh_names(self):
        """New names for the iteration's own variables in the next pass: each name is
        assigned once, so the readability passes can fold it."""
        mine = self.nest.local | set(self.nest.counters)
        for v in mine:
            self.names.pop(v, None)
        for key in [k for k in self.derived if k[1] in mine]:
            del self.derived[key]

    # ---- which accumulations a pass keeps ----------------------------------------------
    def _gather_lowering(self, w, node):
        off = self._pass
        if off is None:
            return node
        if isinstance(node, A.Consume):
            # consumed after the gather loop, or lagging behind it (serial 1-D)
            return node if off in ("sums", "consume") else None
        if not isinstance(node, A.Accumulate) or node.how is not None:
            return node
        t = node.target
        if isinstance(t, A.AdjVar) and t.var in self.nest.local:
            return node   # within the iteration
        gathered = None
        if isinstance(t, A.AdjElem) and t.array in self.nest.gathered:
            gathered = self.nest.offset_vector(t.array, t.index)
        if off == "sums":
            if gathered is None:
                self._sums_kept.append(node)
                return node
            return None
        if off == "consume":
            return None
        if gathered is None and off == self._sums_pass:
            return node         # the iteration's sums, added by this one pass
        if gathered != off:
            return None
        if node.op not in ("+=", "-="):
            raise AssertionError(f"gather form: {node.op} into {t.array}")
        return A.Accumulate(self._acc[t.array], node.op, node.value, "local")


def _drop(nodes, gone):
    """Remove the nodes whose ids are in ``gone`` from ``nodes`` and their bodies;
    returns how many."""
    count = len(nodes)
    nodes[:] = [x for x in nodes if id(x) not in gone]
    count -= len(nodes)
    for x in nodes:
        for seq in x.children():
            count += _drop(seq, gone)
    return count


def _drop_unread(nodes):
    """Remove from ``nodes`` (the loop that only consumes the outputs' adjoints), to a
    fixpoint, the recomputed values of the iteration (plain names assigned there) that
    nothing in it reads: they are the iteration's own, and code after the loop reverses
    statements that ran before it.  (In a nest inside another loop the readability
    passes would keep them: the forward sweep reads the same names.)"""
    while True:
        flat = list(A.walk(nodes))
        used = {n for x in flat for n, role in roles_of(x) if role == USE}
        gone = {id(x) for x in flat if isinstance(x, A.Assign) and x.op == "=" and
                isinstance(x.target, str) and x.target.isidentifier() and
                not x.target.startswith("_") and x.target not in used}
        if not gone:
            return
        _drop(nodes, gone)


def _add(text, k):
    """``text + k`` as source text, folded when ``text`` is an integer literal."""
    try:
        return str(int(text) + k)
    except ValueError:
        pass
    if k == 0:
        return text
    return f"{text} + {k}" if k > 0 else f"{text} - {-k}"


def build_gather_adjoint(kernel, an, slot_args, returns_value, nest, lowered=True,
                         serial=True):
    """The adjoint IR of a CPU kernel with its stencil nest (a
    :class:`kadj.gather_plan.StencilNest`, or a list of them: the nests inside other
    loops, :func:`kadj.gather_plan.cpu_stencil_nests`) in the gather form: (Function,
    writer), as :func:`kadj.reverse.build_adjoint`.  ``serial``: no loop of the form
    will run in parallel."""
    nests = list(nest) if isinstance(nest, (list, tuple)) else [nest]
    w = GatherWriter(kernel, an, slot_args, returns_value, f"{kernel.name}_adjoint",
                     nests, serial)
    w.slots = None
    fn = w.build()
    if not lowered:
        return fn, w
    fn = lower_declarations(fn, w, w.ctx.declarations)
    return A.built(simplify(fn, w.T, joins=w.ctx.join_names), "gather"), w
