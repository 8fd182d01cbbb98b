"""The gather form of a stencil's adjoint: no atomics on neighbour arrays.

In the scatter form each thread q adds the adjoint of its load ``u[q + o]`` into
``adj_u[q + o]`` with an atomic, for every offset ``o`` of the stencil.  In the gather
form each thread p *collects* the adjoint of its own element: for every offset ``o`` it
runs the adjoint of the thread ``q = p - o`` (a *pass*; the thread must exist in the
launch) and keeps only the contribution of that thread's load at offset ``o``, which is
``adj_u[p]``'s.  The sum goes into ``adj_u[p]`` with one plain ``+=``: p is the only
thread that writes it.  Everything else (the thread's own private arrays, scalar
arguments, arrays read at computed indices) is accumulated in the own pass ``o = 0``
only.  The compiler removes what a pass does not need.

A stored element's incoming adjoint is read by several threads (its neighbours' passes),
so it cannot be consumed in the same launch: a second kernel sets it to zero.

Used when the kernel qualifies (:func:`gather_plan`) and, at launch, when the grid has a
thread for every element of each gathered array (``adj_u[p]`` for every element p);
otherwise the scatter form runs.
"""
from __future__ import annotations

from numba.core import types

from .. import adj_ir as A
from .. import ir
from ..reverse import adjoint_source
from ..simplify import simplify
from ..tape_plan import plan_tape
from . import lower
from .writer import CudaWriter


def gather_plan(kernel, an, writer):
    """{array: (perm, offsets)} for the arrays to gather, or (None, reason).

    ``perm[k]`` is the launch dimension indexing the array's dimension k; ``offsets``
    the set of offset vectors (one entry per launch dimension) of its loads."""
    index = writer.index
    if any(isinstance(s, (ir.Barrier,)) for s in ir.walk(kernel.body)):
        return None, "the kernel uses barriers"
    if writer.allocs:
        return None, "the kernel allocates shared or local arrays"
    if an.replay or an.restore_arrays or an.checkpoint:
        return None, "a loop of the adjoint is replayed or restores arrays"
    if an.stored & an.loaded & an.varied_arrays:
        return None, "an array is both read and written"
    if not index.ndim:
        return None, "no cuda.grid / global thread index"
    loop_vars = {s.index for s in ir.walk(kernel.body) if isinstance(s, ir.ForRange)}
    if loop_vars & set(index.coord):
        return None, "thread coordinates from a grid-stride loop"
    why = _thread_ids_elsewhere(kernel, index)
    if why:
        return None, why
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Store) and (
                s.accumulate or writer.classes.get(s.array.name) is None or
                writer.classes[s.array.name].cls != "private"):
            if s.array.name in an.varied_arrays:
                return None, f"'{s.array.name}' is not written at the thread's own element"
    plan = {}
    for name, c in writer.classes.items():
        if c.cls != "neighbour" or name in an.stored:
            continue
        perm, offsets = None, set()
        for s in ir.walk(kernel.body):
            if not (isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and
                    s.expr.array.name == name):
                continue
            co = [index.coord_offset(x) for x in s.expr.index]
            if None in co or sorted(d for d, _ in co) != list(range(index.ndim)):
                return None, f"'{name}' is read at an index that is not a shifted thread " \
                             "coordinate"
            p = tuple(d for d, _ in co)
            if perm is not None and p != perm:
                return None, f"'{name}' is read with its dimensions in different orders"
            perm = p
            vec = [0] * index.ndim
            for d, off in co:
                vec[d] = off
            offsets.add(tuple(vec))
        if perm is not None:
            plan[name] = (perm, frozenset(offsets))
    if not plan:
        return None, "no neighbour array to gather"
    return plan, ""


def _thread_ids_elsewhere(kernel, index):
    """A pass runs another thread's adjoint by substituting its coordinates; anything
    else that tells threads apart (threadIdx, blockIdx, laneid, a cuda.grid tuple used
    otherwise) would still be this thread's.  Such uses rule the gather form out."""
    from .intrinsics import CudaIntrinsic
    defs = {s.target: s for s in ir.walk(kernel.body) if isinstance(s, ir.Assign)}
    ids = set()
    for v, s in defs.items():
        e = s.expr
        if v in index.coord:
            continue  # a coordinate itself: substituted in each pass
        if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic) and (
                e.fn.path.split(".")[0] in ("threadIdx", "blockIdx", "laneid") or
                e.fn.path == "grid"):
            ids.add(v)
    # copies of them, and the products blockIdx * blockDim, are part of the coordinate
    changed = True
    while changed:
        changed = False
        for v, s in defs.items():
            if v in ids or v in index.coord:
                continue
            e = s.expr
            if isinstance(e, (ir.Copy, ir.Item)) and ir.var_names(ir.operands(e)) & ids:
                ids.add(v)
                changed = True
            elif isinstance(e, ir.Op) and ir.var_names(e.args) & ids and any(
                    isinstance(t, ir.Assign) and t.target in index.coord and
                    v in ir.var_names(ir.operands(t.expr)) for t in defs.values()):
                ids.add(v)
                changed = True
    for s in ir.walk(kernel.body):
        reads = ir.stmt_reads(s) & ids
        if not reads:
            continue
        if isinstance(s, ir.Assign) and (s.target in index.coord or s.target in ids):
            continue
        return (f"the thread's identity ({', '.join(sorted(reads))}) is used other than "
                "to compute its coordinates")
    return ""


class GatherWriter(CudaWriter):
    """Writes the gather kernel (``mode="gather"``) or the kernel that consumes the
    stored elements' adjoints (``mode="zero"``)."""

    lowerings = (lower.gather, lower.barriers, lower.accumulate)

    def __init__(self, kernel, an, slot_args, fname, plan, mode, cells=None):
        super().__init__(kernel, an, slot_args, fname, cells=cells)
        self.plan, self.form = plan, mode
        self.pass_offset = None
        self.acc = {}
        self._coord_roots = self._roots()

    def _roots(self):
        """{id(expr): dimension} of the expressions that produce thread coordinates."""
        out = {}
        for s in ir.walk(self.k.body):
            if isinstance(s, ir.Assign) and s.target in self.index.coord:
                e = s.expr
                if not (isinstance(e, ir.Copy) and isinstance(e.src, ir.Var) and
                        e.src.name in self.index.coord):
                    out[id(e)] = self.index.coord[s.target]
        return out

    def expr(self, e):
        d = self._coord_roots.get(id(e))
        if d is not None:
            off = self.pass_offset[d]
            return f"_p{d}" if off == 0 else (f"_p{d} - {off}" if off > 0 else
                                              f"_p{d} + {-off}")
        return super().expr(e)

    def _offsets(self, target):
        """The offset of each index position of an access."""
        return [self.index.coord_offset(x)[1] for x in target.index]

    def _offset_of(self, target):
        vec = [0] * self.index.ndim
        for x in target.index:
            d, off = self.index.coord_offset(x)
            vec[d] = off
        return tuple(vec)

    def finish_scalar_adjoints(self, names):
        if self.form == "gather":
            super().finish_scalar_adjoints(names)

    def build(self):
        self.check()
        k, a = self.k, self.a
        self.liveness()
        self.find_single_use()
        self._sinks = {n: self.adj(n) for n in self.slot_args
                       if not isinstance(self.T.get(n), types.Array)}
        params = self.adjoint_params()
        nd = self.index.ndim
        ps = ", ".join(f"_p{d}" for d in range(nd))
        gs = ", ".join(f"_g{d}" for d in range(nd))
        what = ("gather form: each thread collects its own elements' adjoints"
                if self.form == "gather" else
                "consumes the incoming adjoints of the elements the kernel wrote")
        fn = A.Function(self.fname, tuple(params),
                        f"Adjoint of {k.name}, {what} (generated by kadj).",
                        body=self.body, temps=self.temp_names)
        self.put(1, A.Assign(ps, f"cuda.grid({nd})"))
        self.put(1, A.Assign(gs, f"cuda.gridsize({nd})"))
        prologue = self.put(1, A.Block("prologue"))  # the tape: known once written
        passes = [tuple([0] * nd)]
        if self.form == "gather":
            for name in sorted(self.plan):
                self.acc[name] = A.Local(self.fresh(f"acc_{self.n(name)}"), name)
                self.put(1, A.Assign(self.acc[name], self.zero(self.T[name].dtype)))
            passes += sorted({o for _, offs in self.plan.values() for o in offs} -
                             set(passes))
        inits = []  # (block, pass) of the adjoints' initialisations
        for n_pass, off in enumerate(passes):
            self.pass_offset = off
            depth = 1
            if any(off):
                self.put(1, A.Comment(f"# the thread at offset {off} back: its adjoint's "
                                      f"contribution to this thread's elements"))
                conds = " and ".join(f"0 <= _p{d} - {o} < _g{d}" if o >= 0 else
                                     f"0 <= _p{d} + {-o} < _g{d}"
                                     for d, o in enumerate(off) if o)
                self.put(1, A.If(conds))
                depth = 2
            else:
                self.put(1, A.Comment("# this thread"))
            inits.append((self.put(depth, A.Block("adjoint initialisations")), n_pass))
            self._last_loc = None
            self.open_frame(depth)
            self.fwd(k.body, depth, loop_depth=0)
            self.close_frame()
            self._last_loc = None
            self.rev(k.body, depth, loop_depth=0)
        self.pass_offset = tuple([0] * nd)
        if self.form == "gather":
            for name in sorted(self.plan):
                perm, _ = self.plan[name]
                bounds = " and ".join(f"_p{d} < {self.n(name)}.shape[{kk}]"
                                      for kk, d in enumerate(perm))
                self.put(1, A.If(bounds))
                target = A.AdjElem(name, (), self.adj(name),
                                   tuple(f"_p{d}" for d in perm))
                self.put(2, A.Accumulate(target, "+=", self.acc[name].name, "plain"))
            self.finish_scalar_adjoints([
                n for n in self.slot_args
                if not isinstance(self.T.get(n), types.Array) and n in a.varied])
        self.put(1, A.Return("None"))
        for block, n_pass in inits:
            # the scalar arguments' adjoints come from the own pass only
            block.body += [A.Assign(self.adj_var(v), self.zero(self.T[v]))
                           for v in sorted(sorted(a.varied), key=self.n)
                           if isinstance(self.T.get(v), types.Float) and
                           v not in self.single_use and (n_pass == 0 or v not in self._sinks)]
        prologue.body += self.tape_init_nodes() + [
            A.Assign(self.n(v), self.zero(self.T.get(v)))
            for v in sorted(self.declare, key=self.n)]
        from ..runtime_helpers import _trips
        self.ns["_trips"] = _trips
        plan_tape([fn], self.growable_tape)
        return fn


def build_gather(kernel, an, slot_args, plan, mode, cells=None):
    """The adjoint IR of the gather kernel (``mode="gather"``) or of the kernel that
    consumes the stored elements' adjoints (``mode="zero"``): (Function, writer)."""
    w = GatherWriter(kernel, an, slot_args, f"{kernel.name}_adjoint_{mode}", plan, mode,
                     cells=cells)
    return A.built(simplify(w.build()), mode), w


def write_gather(kernel, an, slot_args, plan, cells=None):
    """(gather AdjointSource, zero AdjointSource) for a qualifying kernel."""
    out = []
    for mode in ("gather", "zero"):
        fn, w = build_gather(kernel, an, slot_args, plan, mode, cells=cells)
        out.append(adjoint_source(fn, w.syntax, w.ns))
    return tuple(out)
