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

from dataclasses import dataclass, field

from .. import adj_ir as A
from .. import ir
from ..dead_saves import drop_dead_saves
from ..lowering import lower_declarations
from ..reverse import Writer, adjoint_source
from ..simplify import simplify
from ..tape_plan import plan_tape
from . import lower
from .guard_hoist import hoist_guards
from .context import SCATTER, SYNTAX, cuda_context


def gather_plan(kernel, an, writer):
    """{array: (perm, offsets)} for the arrays to gather, or (None, reason).

    ``perm[k]`` is the launch dimension indexing the array's dimension k; ``offsets``
    the set of offset vectors (one entry per launch dimension) of its loads."""
    st = writer.state
    index = st.index
    if any(isinstance(s, (ir.Barrier,)) for s in ir.walk(kernel.body)):
        return None, "the kernel uses barriers"
    if st.allocs:
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
                s.accumulate or st.classes.get(s.array.name) is None or
                st.classes[s.array.name].cls != "private"):
            if s.array.name in an.varied_arrays:
                return None, f"'{s.array.name}' is not written at the thread's own element"
    rebound = sorted(v for v in kernel.args if v in an.varied and
                     not isinstance(kernel.types.get(v), types.Array) and
                     v in ir.assigned(kernel.body))
    if rebound:
        # (each pass would reset its adjoint, which the passes share)
        return None, f"the scalar argument '{rebound[0]}' is assigned in the kernel"
    twice = _stored_twice(kernel.body, an.varied_arrays, index)
    if twice:
        return None, f"an element of '{twice}' may be written twice by its thread"
    plan = {}
    for name, c in st.classes.items():
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


def _stored_twice(body, arrays, index):
    """An array of ``arrays`` one of whose elements a thread may store twice (one
    store after another on a path, or a store in a loop), else None.  The gather form
    reads a stored element's incoming adjoint in every pass and consumes it only
    afterwards, so each element must carry the adjoint of one store: a store that a
    later one overwrites contributes nothing."""
    def count(seq):
        n = {}
        for s in seq:
            if isinstance(s, ir.Store) and s.array.name in arrays:
                key = (s.array.name, index.owned_key(tuple(s.index)))
                n[key] = n.get(key, 0) + 1
            elif isinstance(s, ir.If):
                a, b = count(s.then), count(s.orelse)
                for key in a.keys() | b.keys():
                    n[key] = n.get(key, 0) + max(a.get(key, 0), b.get(key, 0))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                for key in count(s.body):
                    n[key] = n.get(key, 0) + 2
        return n
    for (name, _), k in sorted(count(body).items(), key=lambda kv: repr(kv[0])):
        if k > 1:
            return name
    return None


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
        names = [n for n in sorted(reads) if not n.startswith("$")]   # not numba's own
        line = getattr(s.loc, "line", None)
        where = ", ".join(names) + (f", line {line}" if line else "") if names else \
            (f"line {line}" if line else "a value numba made")
        return (f"the thread's identity ({where}) is used other than to compute its "
                "coordinates")
    return ""


@dataclass(eq=False)
class GatherState:
    """The gather form's part of the CUDA state (``CudaState.gather``), read by the
    lowering :func:`kadj.cuda.lower.gather` and by :func:`coordinate`."""
    plan: dict              # array -> (perm, offsets) (gather_plan)
    form: str               # "gather" | "zero"
    index: object           # the kernel's ThreadIndex
    roots: dict             # id(expression) -> dimension of the thread coordinate
    pass_offset: tuple = ()
    acc: dict = field(default_factory=dict)     # array -> its local sum (A.Local)
    sinks: dict = field(default_factory=dict)   # scalar argument -> its adjoint's name
    slot_rows: dict = field(default_factory=dict)   # scalar argument -> row of slots
    slots: str = ""         # the slots parameter (kadj.cuda.block_sum), if any

    def offsets(self, target):
        """The offset of each index position of an access."""
        return [self.index.coord_offset(x)[1] for x in target.index]

    def offset_of(self, target):
        vec = [0] * self.index.ndim
        for x in target.index:
            d, off = self.index.coord_offset(x)
            vec[d] = off
        return tuple(vec)


def _roots(kernel, index):
    """{id(expr): dimension} of the expressions that produce thread coordinates."""
    out = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign) and s.target in index.coord:
            e = s.expr
            if not (isinstance(e, ir.Copy) and isinstance(e.src, ir.Var) and
                    e.src.name in index.coord):
                out[id(e)] = index.coord[s.target]
    return out


def coordinate(w, e):
    """A thread coordinate's expression, in a pass: the coordinate of the thread at
    the pass's offset back from this one (``_p0 - 1``); None for other expressions."""
    g = w.state.gather
    d = g.roots.get(id(e))
    if d is None:
        return None
    off = g.pass_offset[d]
    return f"_p{d}" if off == 0 else (f"_p{d} - {off}" if off > 0 else f"_p{d} + {-off}")


def gather_writer(kernel, an, slot_args, plan, mode, cells=None):
    """The writer of the gather kernel (``mode="gather"``) or of the kernel that
    consumes the stored elements' adjoints (``mode="zero"``)."""
    ctx = cuda_context(kernel, an, cells, lowerings=(lower.gather,) + SCATTER,
                       expressions=(coordinate,))
    index = ctx.state.index
    ctx.state.gather = GatherState(plan, mode, index, _roots(kernel, index))
    return Writer(kernel, an, slot_args, False, f"{kernel.name}_adjoint_{mode}", ctx)


def build_passes(w):
    """The adjoint IR of the gather or zero kernel: one pass per offset (the own pass
    first), each the thread's forward and reverse sweeps with the coordinates of the
    thread that far back (:func:`coordinate`), its accumulations kept or dropped by
    the lowering :func:`kadj.cuda.lower.gather`."""
    g = w.state.gather
    w.check()
    k, a = w.k, w.a
    w.liveness()
    w.find_single_use()
    g.sinks = {n: w.adj(n) for n in w.slot_args
               if not isinstance(w.T.get(n), types.Array)}
    params = w.adjoint_params()
    g.slot_rows = slot_rows(w)
    if g.slot_rows:
        g.slots = "_slots"
        while g.slots in w.used:
            g.slots += "_"
        w.used.add(g.slots)
        params.append(g.slots)
    nd = g.index.ndim
    ps = ", ".join(f"_p{d}" for d in range(nd))
    gs = ", ".join(f"_g{d}" for d in range(nd))
    what = ("gather form: each thread collects its own elements' adjoints"
            if g.form == "gather" else
            "consumes the incoming adjoints of the elements the kernel wrote")
    fn = A.Function(w.fname, tuple(params),
                    f"Adjoint of {k.name}, {what} (generated by kadj).",
                    body=w.body, temps=w.temp_names)
    w.put(1, A.Assign(ps, f"cuda.grid({nd})"))
    w.put(1, A.Assign(gs, f"cuda.gridsize({nd})"))
    prologue = w.put(1, A.Block("prologue"))  # the tape: known once written
    passes = [tuple([0] * nd)]
    if g.form == "gather":
        for name in sorted(g.plan):
            g.acc[name] = A.Local(w.fresh(f"acc_{w.n(name)}"), name)
            w.put(1, A.Assign(g.acc[name], w.zero(w.T[name].dtype)))
        passes += sorted({o for _, offs in g.plan.values() for o in offs} - set(passes))
    inits = []  # (block, pass) of the adjoints' initialisations
    for n_pass, off in enumerate(passes):
        g.pass_offset = off
        depth = 1
        if any(off):
            w.put(1, A.Comment(f"# the thread at offset {off} back: its adjoint's "
                               f"contribution to this thread's elements"))
            conds = " and ".join(f"0 <= _p{d} - {o} < _g{d}" if o >= 0 else
                                 f"0 <= _p{d} + {-o} < _g{d}"
                                 for d, o in enumerate(off) if o)
            w.put(1, A.If(conds))
            depth = 2
        else:
            w.put(1, A.Comment("# this thread"))
        inits.append((w.put(depth, A.Block("adjoint initialisations")), n_pass))
        w._last_loc = None
        w.open_frame(depth)
        w.fwd(k.body, depth, loop_depth=0)
        w.close_frame()
        w._last_loc = None
        w.rev(k.body, depth, loop_depth=0)
    g.pass_offset = tuple([0] * nd)
    if g.form == "gather":
        for name in sorted(g.plan):
            perm, _ = g.plan[name]
            bounds = " and ".join(f"_p{d} < {w.n(name)}.shape[{kk}]"
                                  for kk, d in enumerate(perm))
            w.put(1, A.If(bounds))
            target = A.AdjElem(name, (), w.adj(name), tuple(f"_p{d}" for d in perm))
            w.put(2, A.Accumulate(target, "+=", g.acc[name].name, "plain"))
        w.put(1, A.FinishScalar(w.scalar_adjoints()))
    else:
        for node in slot_totals(w):
            w.put(1, node)
    w.put(1, A.Return("None"))
    for block, n_pass in inits:
        # the scalar arguments' adjoints come from the own pass only
        block.body += [A.Assign(w.adj_var(v), w.zero(w.T[v]))
                       for v in sorted(sorted(a.varied), key=w.n)
                       if isinstance(w.T.get(v), (types.Float, types.Complex)) and
                       v not in w.single_use and (n_pass == 0 or v not in g.sinks)]
    prologue.body += w.declarations() + [
        A.Assign(w.n(v), w.zero(w.T.get(v))) for v in sorted(w.declare, key=w.n)]
    from ..runtime_helpers import _trips
    w.ns["_trips"] = _trips
    drop_dead_saves(fn)     # (a restore nothing reads: kadj.dead_saves)
    w.tape_size = plan_tape([fn], w.growable_tape, k.name)
    return fn


def slot_rows(w):
    """{scalar argument: row} of the scalar adjoints whose block sums go into slots
    (real floating point; :mod:`kadj.cuda.block_sum`)."""
    from .block_sum import slot_functions
    names = [n for n in w.scalar_adjoints() if slot_functions(w.T[n]) is not None]
    return {n: row for row, n in enumerate(names)}


def slot_totals(w):
    """The consume kernel's last statements: block 0 adds each row of slots to its
    scalar adjoint's buffer and zeroes the row."""
    from .block_sum import slot_functions
    g = w.state.gather
    out = []
    if g.slot_rows:
        out.append(A.Comment("# the scalar adjoints' block sums, spread over slots by "
                             "the gather kernel: summed by block 0"))
    for name, row in g.slot_rows.items():
        tot = slot_functions(w.T[name])[1]
        out.append(A.Call(f"{w.bind(tot, tot.__name__)}({g.slots}, {row}, "
                          f"{w.adj_buf(name)}, 0)"))
    return out


def build_gather(kernel, an, slot_args, plan, mode, cells=None, lowered=True):
    """The adjoint IR of the gather kernel (``mode="gather"``) or of the kernel that
    consumes the stored elements' adjoints (``mode="zero"``): (Function, writer).
    ``lowered=False``: its declaration nodes left as built, not simplified."""
    w = gather_writer(kernel, an, slot_args, plan, mode, cells=cells)
    fn = build_passes(w)
    if not lowered:
        return fn, w
    fn = lower_declarations(fn, w, w.ctx.declarations)
    fn = hoist_guards(simplify(fn, w.T, joins=w.ctx.join_names))
    return A.built(lower.complex_atomics(fn, w), mode), w


def write_gather(kernel, an, slot_args, plan, cells=None):
    """(gather AdjointSource, zero AdjointSource, rows of slots) for a qualifying
    kernel: both kernels take a trailing float64 array of shape ``(rows, SLOTS *
    STRIDE)`` (:mod:`kadj.cuda.block_sum`) when ``rows`` is not 0."""
    out, rows = [], []
    for mode in ("gather", "zero"):
        fn, w = build_gather(kernel, an, slot_args, plan, mode, cells=cells)
        out.append(adjoint_source(fn, SYNTAX, w.ns))
        rows.append(w.state.gather.slot_rows)
    assert rows[0] == rows[1], rows     # the two kernels agree on every row's scalar
    return out[0], out[1], len(rows[0])
