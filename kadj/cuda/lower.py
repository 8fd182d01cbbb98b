"""Lowerings of the adjoint IR for CUDA: how a GPU thread's accumulations run.

A lowering is a function ``(writer, node) -> node | None`` that the writer applies to
each node as it is placed (``Writer.put``); it rewrites the nodes it is about (an
:class:`adj_ir.Accumulate` not yet decided, a :class:`adj_ir.Consume`) and returns the
others unchanged; None drops the node.  They run at placement, not after the sweep,
because a local sum's name is handed out in the order the sweep meets it.

- :func:`accumulate`: the accumulation policy.  Per adjoint array, from its index
  expressions (:mod:`kadj.cuda.indexing`): plain ``+=`` for thread-private arrays;
  an element every thread may add to at a constant index (a coefficient) is summed in
  a local, then over the block (:func:`block_sum`), then added with one atomic per
  block; everything else is an atomic add.
- :func:`barriers`: which of the primal's barriers a replayed forward part meets.
- :func:`gather`: the gather form's passes (kadj.cuda.gather): a pass keeps only the
  contributions to this thread's own elements, summed in a local; the zero form keeps
  only the consumes.
"""
from __future__ import annotations

from .. import adj_ir as A
from ..errors import DifferentiationError

THREAD_ID = ("cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * "
        "cuda.threadIdx.z)")


def accumulate(w, node):
    if not isinstance(node, A.Accumulate) or node.how is not None:
        return node
    t = node.target
    if not (isinstance(t, A.AdjElem) and node.op == "+="):
        return node
    arr = t.array
    if arr in w.private_arrays:
        w.plain_sites[arr] = w.plain_sites.get(arr, 0) + 1
        node.how = "plain"
        return node
    key = tuple(w.index.canonical(x) for x in t.index)
    if w.classes.get(arr) is not None and w.classes[arr].cls == "uniform" and \
            w.space.get(arr) is None and all(k and k[0] == "k" for k in key):
        values = tuple(k[1] for k in key)
        acc = w.uniform_acc.get((arr, values))
        if acc is None:
            acc = w.fresh(f"adj_{w.n(arr)}_" + "_".join(map(str, values)))
            w.uniform_acc[(arr, values)] = acc
        return A.Accumulate(A.Local(acc, arr, values), "+=", node.value, "local")
    w.atomic_sites[arr] = w.atomic_sites.get(arr, 0) + 1
    node.how = "atomic"
    return node


def barriers(w, node):
    """A replayed iteration that rewrites shared tiles replays the block's barriers
    too; other replays write no shared memory and skip them."""
    if isinstance(node, A.Barrier) and node.replayed and not w._replay_shared:
        return None
    return node


def gather(w, node):
    if isinstance(node, A.Consume):
        return node if w.form == "zero" else None
    if not isinstance(node, A.Accumulate) or node.how is not None:
        return node
    t = node.target
    own = not any(w.pass_offset)
    elem = isinstance(t, A.AdjElem)
    sink = isinstance(t, A.AdjVar) and t.var in w._sinks
    if w.form == "zero":
        return None if elem or sink else node
    if elem and t.array in w.plan:
        off = w._offset_of(t)
        if off == w.pass_offset:
            return A.Accumulate(w.acc[t.array], "+=", node.value, "local")
        if own and any(o < 0 for o in off):
            # an index below zero wraps around (x[-1] is the last element): no thread
            # gathers that element from here, so add it directly
            cond = " or ".join(f"{x} < 0" for x, o in zip(t.index_texts, w._offsets(t))
                               if o < 0)
            return A.If(cond, then=[A.Accumulate(t, "+=", node.value, "atomic")])
        return None
    if (elem or sink) and not own:
        return None
    return node


def block_sum(w, names):
    """Add the adjoints every thread adds to (scalar arguments ``names``, uniform
    elements) over the block first: each thread adds its share into one of 32
    shared-memory slots (lane ``tid % 32``, so a warp's threads hit distinct banks),
    then thread 0 adds the block's total with one global atomic."""
    # (local value, dtype, buffer, index, what) of every sum to reduce over the block
    sinks = [(w.cast(w.adj(n), w.T[n]), w.T[n], w.adj_buf(n), "0", n) for n in names]
    for (arr, values), acc in w.uniform_acc.items():
        idx = values[0] if len(values) == 1 else "(" + ", ".join(map(str, values)) + ")"
        sinks.append((acc, w.T[arr].dtype, w.adj(arr), str(idx), arr))
    if not sinks:
        return
    put = w.put
    put(1, A.Comment("# ---- adjoints every thread adds to: summed over the block, one "
                     "atomic per block ----"))
    tid = w.fresh("tid")
    put(1, A.Assign(tid, THREAD_ID))
    reds = []
    for value, dt, buf, idx, what in sinks:
        red = w.fresh(f"red_{buf[4:]}")
        reds.append(red)
        put(1, A.Assign(red, f"cuda.shared.array(32, {w.bind(dt, str(dt))})"))
        put(1, A.If(f"{tid} < 32"))
        put(2, A.Assign(f"{red}[{tid}]", w.zero(dt)))
        how = "block-reduced: 32 shared-memory slots, one global atomic per block"
        if what in names:
            w.scalar_report[what] = how
        else:
            w.uniform_report[f"{what}[{idx.strip('()')}]"] = how
    put(1, A.Barrier())
    for red, (value, dt, buf, idx, what) in zip(reds, sinks):
        put(1, A.Accumulate(A.AdjElem(what, (), red, (f"{tid} % 32",)), "+=", value,
                            "atomic"))
    put(1, A.Barrier())
    put(1, A.If(f"{tid} == 0"))
    lane = w.fresh("w")
    used = w.fresh("slots")
    put(2, A.Assign(used, "min(32, cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z)"))
    for red, (value, dt, buf, idx, what) in zip(reds, sinks):
        total = w.fresh("total")
        put(2, A.Assign(total, f"{red}[0]"))
        put(2, A.For(lane, f"range(1, {used})"))
        put(3, A.Assign(total, f"{red}[{lane}]", "+="))
        put(2, A.Accumulate(A.AdjElem(what, (), buf, (idx,)), "+=", total, "atomic"))
        w.atomic_sites[what] = w.atomic_sites.get(what, 0) + 1


def bounded_tape(nodes, kernel_name):
    """The bounded per-thread tape: {kind: entries} for the pushes of ``nodes``.  A
    push runs, before the tape is popped back, as many times as the product of the
    constant trip counts of the kernel's loops around it since the replayed iteration
    it belongs to (if any); a loop without a constant trip count around a push makes
    the tape unbounded, which a GPU thread cannot have."""
    sizes = {}

    def add(kind, n):
        sizes[kind] = sizes.get(kind, 0) + n

    def visit(seq, m):
        for x in seq:
            if isinstance(x, A.Push):
                if x.once:
                    add(x.kind, 1)
                elif m is None:
                    raise DifferentiationError(
                        "a loop overwrites values its adjoint needs, and this loop cannot "
                        "be reversed from checkpoints (a while loop, a break/continue, a "
                        "nested loop that records values, or an array both read and "
                        "written in it); a GPU thread's tape must be bounded",
                        kernel=kernel_name, loc=x.loc,
                        construct="unbounded tape in a loop",
                        remedy="use `for ... in range(...)` loops without break, keep "
                               "inner loops free of overwritten values, or assign each "
                               "value once")
                else:
                    add(x.kind, m)
            elif isinstance(x, A.PushArray):
                add(x.kind, x.size)
            elif isinstance(x, A.Block) and x.what == "replayed iteration":
                visit(x.body, 1)
            elif isinstance(x, (A.For, A.While)) and x.primal:
                trip = x.trip if isinstance(x, A.For) else None
                visit(x.body, None if m is None or trip is None else m * trip)
            else:
                for body in x.children():
                    visit(body, m)
    visit(nodes, 1)
    return sizes


def uniform_init_nodes(w):
    """The local sums of uniform elements, zeroed in the prologue."""
    return [A.Assign(acc, w.zero(w.T[arr].dtype)) for (arr, _), acc in w.uniform_acc.items()]
