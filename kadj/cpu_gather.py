"""The gather form of a CPU stencil's adjoint: each adjoint element written once.

In the scatter form the reversed iteration q adds the adjoint of its load ``u[q + o]``
into ``adj_u[q + o]``, for every offset o of the stencil: three (five, nine) scattered
``+=`` per iteration, which do not vectorise.  In the gather form a loop runs over the
*input* elements p (the forward range shifted by every offset, clipped to the arrays):
for every offset o it runs the adjoint of the iteration ``q = p - o`` (a *pass*; the
iteration must be in the forward range) and keeps only the contribution of that
iteration's load at offset o, which is ``adj_u[p]``'s.  The sum goes into ``adj_u[p]``
with one ``+=``.  Everything else (scalar arguments, values computed before the loop,
arrays read at other indices) is accumulated in the own pass ``o = 0`` only, so each
iteration counts once, in a loop of its own over the forward range after the gather
loop, which also consumes the stored elements' incoming adjoints (read by the passes of
several elements, they cannot be consumed in the gather loop).

The p range is split so that the innermost loop has an interior without branches
(every pass's iteration exists there: the passes run unguarded) and edges where each
pass checks that its iteration exists; the compiler vectorises the interior and shares
the passes' common loads.  :func:`kadj.gather_plan.cpu_stencil_plan` says which loop
nests qualify; the rest of the kernel (the statements before and after the nest) is
written as in the scatter form.

When the nest was asked to run in parallel (``prange``, ``parallel=True``), the form's
outermost loops (:attr:`GatherWriter.outer_loops`) become ``numba.prange`` loops where
:func:`kadj.parallel.parallelise_loops` finds them race-free: the loop over the elements
(in 1-D its interior) and the sums' loop.
"""
from __future__ import annotations

from numba.core import types

from . import adj_ir as A
from .lowering import lower_declarations
from .reverse import Writer
from .simplify import simplify


class GatherWriter(Writer):
    """The CPU writer with the loop nest of ``nest`` reversed in the gather form."""

    def __init__(self, kernel, an, slot_args, returns_value, fname, nest):
        super().__init__(kernel, an, slot_args, returns_value, fname)
        self.nest = nest
        self.lowerings = (self._gather_lowering,) + tuple(self.lowerings)
        self._pass = None        # the offset vector of the pass being written
        self._acc = {}           # gathered array -> its local sum (A.Local)
        self.outer_loops = []    # the form's outermost loops (A.For), for kadj.parallel

    # ---- the reversed nest -----------------------------------------------------------
    def rev_for(self, s, depth, loop_depth):
        if s is not self.nest.levels[0]:
            return super().rev_for(s, depth, loop_depth)
        self.write_gather(depth)

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
        sums = self._sums(depth, lo, hi)
        passes = nest.passes()
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
        (None: the loop of the sums, :meth:`_sums`)."""
        nest, a = self.nest, self.a
        inner = nest.levels[-1]
        for v in sorted(sorted(nest.local & a.varied), key=self.n):
            if isinstance(self.T.get(v), (types.Float, types.Complex)) and \
                    v not in self.single_use:
                self.put(depth, A.Assign(self.adj_var(v), self.zero(self.T[v])))
        self._pass = "sums" if off is None else off
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
        loop).  Its sums are a loop of their own: they do not keep the gather loop from
        vectorising.  Written first (the iteration's own names), placed last."""
        nest = self.nest
        with self.b.group(depth, A.Block("sums")) as block:
            self.put(depth, A.Comment("# each iteration's sums (scalars, other "
                                      "elements); its outputs' adjoints consumed"))
            for d, level in enumerate(nest.levels):
                self._outer(d, self.put(depth + d, A.For(self.n(level.index),
                                                         f"range({lo[d]}, {hi[d]})")))
            self._iteration(depth + nest.ndim, None)
        self.b.targets[depth].remove(block)
        return block

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
            return node if off == "sums" else None   # consumed after the gather loop
        if not isinstance(node, A.Accumulate) or node.how is not None:
            return node
        t = node.target
        if isinstance(t, A.AdjVar) and t.var in self.nest.local:
            return node   # within the iteration
        gathered = None
        if isinstance(t, A.AdjElem) and t.array in self.nest.gathered:
            gathered = self.nest.offset_vector(t.array, t.index)
        if off == "sums":
            return node if gathered is None else None
        if gathered != off:
            return None
        if node.op not in ("+=", "-="):
            raise AssertionError(f"gather form: {node.op} into {t.array}")
        return A.Accumulate(self._acc[t.array], node.op, node.value, "local")


def _add(text, k):
    """``text + k`` as source text, folded when ``text`` is an integer literal."""
    try:
        return str(int(text) + k)
    except ValueError:
        pass
    if k == 0:
        return text
    return f"{text} + {k}" if k > 0 else f"{text} - {-k}"


def build_gather_adjoint(kernel, an, slot_args, returns_value, nest, lowered=True):
    """The adjoint IR of a CPU kernel with its stencil nest in the gather form:
    (Function, writer), as :func:`kadj.reverse.build_adjoint`."""
    w = GatherWriter(kernel, an, slot_args, returns_value, f"{kernel.name}_adjoint", nest)
    w.slots = None
    fn = w.build()
    if not lowered:
        return fn, w
    fn = lower_declarations(fn, w, w.ctx.declarations)
    return A.built(simplify(fn), "gather"), w
