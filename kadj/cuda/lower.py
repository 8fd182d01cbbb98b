"""Lowerings of the adjoint IR for CUDA: how a GPU thread's accumulations run, and
how the declaration nodes are spelled on a GPU.

A placement lowering is a function ``(writer, node) -> node | None`` that the writer
applies to each node as it is placed (``Writer.put``); it rewrites the nodes it is
about (an :class:`adj_ir.Accumulate` not yet decided, a :class:`adj_ir.Consume`) and
returns the others unchanged; None drops the node.  They run at placement, not after
the sweep, because a local sum's name is handed out in the order the sweep meets it.
They read and fill the build's :class:`kadj.cuda.context.CudaState` (``w.state``).

- :func:`accumulate`: the accumulation policy.  Per adjoint array, from its index
  expressions (:mod:`kadj.cuda.indexing`): plain ``+=`` for thread-private arrays;
  an element every thread may add to at a constant index (a coefficient) is summed in
  a local, then over the block (:func:`block_sum`), then added with one atomic per
  block; everything else is an atomic add.
- :func:`barriers`: which of the primal's barriers a replayed forward part meets.
- :func:`gather`: the gather form's passes (kadj.cuda.gather): a pass keeps only the
  contributions to this thread's own elements, summed in a local; the zero form keeps
  only the consumes.

The declaration lowerings (:data:`DECLARATIONS`, applied by
:func:`kadj.lowering.lower_declarations` after the build): :func:`block_sum` for
:class:`adj_ir.FinishScalar`, :func:`local_tape` (a bounded tape is a
``cuda.local.array``), :func:`local_array` (``cuda.local`` / ``cuda.shared`` arrays),
:func:`zero_array` (a shared array zeroed by the block together), :func:`local_sums`.

Complex values: numba-cuda has no atomic add of complex numbers, so the finished
function's complex atomic accumulations are each split into two float atomics on the
real and imaginary parts (:func:`complex_atomics`).

The tangent's lowerings (forward mode, :class:`kadj.tangent.TangentContext`):
:func:`tangent_barrier`, :func:`tangent_declare` (shared and local arrays declared
with their tangents), :func:`tangent_atomic` (the forward's atomics and their
tangents).
"""
from __future__ import annotations

from numba.core import types

from .. import adj_ir as A
from ..checkpoint_reverse import unravel

THREAD_ID = ("cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + cuda.blockDim.y * "
        "cuda.threadIdx.z)")


def accumulate(w, node):
    if not isinstance(node, A.Accumulate) or node.how is not None:
        return node
    t = node.target
    if not (isinstance(t, A.AdjElem) and node.op == "+="):
        return node
    arr, st = t.array, w.state
    if arr in st.private_arrays:
        st.plain_sites[arr] = st.plain_sites.get(arr, 0) + 1
        node.how = "plain"
        return node
    key = tuple(st.index.canonical(x) for x in t.index)
    if st.classes.get(arr) is not None and st.classes[arr].cls == "uniform" and \
            st.space.get(arr) is None and all(k and k[0] == "k" for k in key):
        values = tuple(k[1] for k in key)
        acc = st.uniform_acc.get((arr, values))
        if acc is None:
            acc = w.fresh(f"adj_{w.n(arr)}_" + "_".join(map(str, values)))
            st.uniform_acc[(arr, values)] = acc
        return A.Accumulate(A.Local(acc, arr, values), "+=", node.value, "local")
    st.atomic_sites[arr] = st.atomic_sites.get(arr, 0) + 1
    node.how = "atomic"
    return node


def barriers(w, node):
    """A replayed iteration that rewrites shared tiles replays the block's barriers
    too; other replays write no shared memory and skip them."""
    if isinstance(node, A.Barrier) and node.replayed and not w._replay_shared:
        return None
    return node


def gather(w, node):
    g = w.state.gather
    if isinstance(node, A.Consume):
        return node if g.form == "zero" else None
    if not isinstance(node, A.Accumulate) or node.how is not None:
        return node
    t = node.target
    own = not any(g.pass_offset)
    elem = isinstance(t, A.AdjElem)
    sink = isinstance(t, A.AdjVar) and t.var in g.sinks
    if g.form == "zero":
        return None if elem or sink else node
    if elem and t.array in g.plan:
        off = g.offset_of(t)
        if off == g.pass_offset:
            return A.Accumulate(g.acc[t.array], "+=", node.value, "local")
        if own and any(o < 0 for o in off):
            # an index below zero wraps around (x[-1] is the last element): no thread
            # gathers that element from here, so add it directly
            cond = " or ".join(f"{x} < 0" for x, o in zip(t.index_texts, g.offsets(t))
                               if o < 0)
            return A.If(cond, then=[A.Accumulate(t, "+=", node.value, "atomic")])
        return None
    if (elem or sink) and not own:
        return None
    return node


def block_sum(w, node):
    """The lowering of :class:`adj_ir.FinishScalar`: the adjoints every thread adds to
    (scalar arguments ``node.names``, uniform elements) are summed over the block
    first, then added with one global atomic per block.  Real floating-point sums call
    :mod:`kadj.cuda.block_sum` (warp shuffles on a GPU); others (complex) go through 32
    shared-memory slots filled by atomics (lane ``tid % 32``, so a warp's threads hit
    distinct banks) and summed by thread 0."""
    from . import block_sum as bs
    names = node.names
    # (local value, dtype, buffer, index, what) of every sum to reduce over the block
    sinks = [(w.cast(w.adj(n), w.T[n]), w.T[n], w.adj_buf(n), "0", n) for n in names]
    for (arr, values), acc in w.state.uniform_acc.items():
        idx = values[0] if len(values) == 1 else "(" + ", ".join(map(str, values)) + ")"
        sinks.append((acc, w.T[arr].dtype, w.adj(arr), str(idx), arr))
    if not sinks:
        return []
    out = []
    put = A.Builder(out).put
    put(1, A.Comment("# ---- adjoints every thread adds to: summed over the block, one "
                     "atomic per block ----"))

    def report(what, idx, how):
        if what in names:
            w.state.scalar_report[what] = how
        else:
            w.state.uniform_report[f"{what}[{idx.strip('()')}]"] = how
        w.state.atomic_sites[what] = w.state.atomic_sites.get(what, 0) + 1

    slotted = []
    for value, dt, buf, idx, what in sinks:
        fn = bs.for_dtype(dt)
        if fn is None:
            slotted.append((value, dt, buf, idx, what))
            continue
        g = w.state.gather
        row = g.slot_rows.get(what) if g is not None and what in names else None
        if row is not None:
            fn = bs.slot_functions(dt)[0]
            put(1, A.Call(f"{w.bind(fn, fn.__name__)}({g.slots}, {row}, {value})"))
            report(what, idx, f"block-reduced: warp shuffles, one global atomic per "
                              f"block into {bs.SLOTS} slots, summed by the consume kernel")
            continue
        put(1, A.Call(f"{w.bind(fn, fn.__name__)}({buf}, {idx}, {value})"))
        report(what, idx, "block-reduced: warp shuffles, one global atomic per block")
    if not slotted:
        return out
    w.state.slot_sums += len(slotted)
    tid = w.fresh("tid")
    put(1, A.Assign(tid, THREAD_ID))
    reds = []
    for value, dt, buf, idx, what in slotted:
        red = w.fresh(f"red_{buf[4:]}")
        reds.append(red)
        put(1, A.Assign(red, f"cuda.shared.array(32, {w.bind(dt, str(dt))})"))
        put(1, A.If(f"{tid} < 32"))
        put(2, A.Assign(f"{red}[{tid}]", w.zero(dt)))
        report(what, idx, "block-reduced: 32 shared-memory slots, one global atomic "
                          "per block")
    put(1, A.Barrier())
    for red, (value, dt, buf, idx, what) in zip(reds, slotted):
        put(1, A.Accumulate(A.AdjElem(what, (), red, (f"{tid} % 32",)), "+=", value,
                            "atomic"))
    put(1, A.Barrier())
    put(1, A.If(f"{tid} == 0"))
    lane = w.fresh("w")
    used = w.fresh("slots")
    put(2, A.Assign(used, "min(32, cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z)"))
    for red, (value, dt, buf, idx, what) in zip(reds, slotted):
        total = w.fresh("total")
        put(2, A.Assign(total, f"{red}[0]"))
        put(2, A.For(lane, f"range(1, {used})"))
        put(3, A.Assign(total, f"{red}[{lane}]", "+="))
        put(2, A.Accumulate(A.AdjElem(what, (), buf, (idx,)), "+=", total, "atomic"))
    return out


def uniform_init_nodes(w):
    """The local sums of uniform elements, zeroed in the prologue."""
    return [A.Assign(acc, w.zero(w.T[arr].dtype))
            for (arr, _), acc in w.state.uniform_acc.items()]


def local_tape(w, node):
    """A bounded tape: a ``cuda.local.array`` of the size :func:`kadj.tape_plan.plan_tape`
    found for this kind."""
    assert node.policy == "bounded", node
    dt = {"f64": types.float64, "f32": types.float32, "i64": types.int64}[node.kind]
    return [A.Assign(f"_tape_{node.kind}", f"cuda.local.array({node.size}, "
                                           f"{w.bind(dt, str(dt))})"),
            A.Assign(f"_sp_{node.kind}", "0")]


def local_array(w, node):
    dt = w.bind(node.dtype, node.hint or str(node.dtype))
    return [A.Assign(node.name, f"cuda.{node.space}.array({node.size!r}, {dt})")]


def zero_array(w, node):
    """Each thread zeroes a local array; the block zeroes a shared one together, each
    thread every ``nthreads``-th element from its own (the barrier after the
    declarations, :meth:`kadj.reverse.Writer.declarations`, waits for all)."""
    size = 1
    for d in node.dims:
        size *= d
    z = w.fresh("z")
    out = []
    if node.space == "shared":
        ids = w.state.block_ids
        if ids is None:
            ids = w.state.block_ids = (w.fresh("tid"), w.fresh("nthreads"))
            out.append(A.Assign(ids[0], THREAD_ID))
            out.append(A.Assign(ids[1], "cuda.blockDim.x * cuda.blockDim.y * "
                                        "cuda.blockDim.z"))
        loop = A.For(z, f"range({ids[0]}, {size}, {ids[1]})")
    else:
        loop = A.For(z, f"range({size})")
    loop.body.append(A.Assign(f"{node.name}[{unravel(z, node.dims)}]", node.zero))
    return out + [loop]


def local_sums(w, node):
    """The local sums of uniform elements, zeroed in the prologue."""
    return uniform_init_nodes(w)


#: the CUDA target's lowerings of the declaration nodes (kadj.lowering)
DECLARATIONS = {"FinishScalar": block_sum, "TapeDecl": local_tape,
                "LocalArray": local_array, "ZeroArray": zero_array,
                "LocalSums": local_sums}


def _is_complex_target(w, t):
    if not isinstance(t, A.AdjElem):
        return False
    ty = w.T.get(t.array)
    return isinstance(getattr(ty, "dtype", ty), types.Complex)


def complex_atomics(fn, w):
    """numba-cuda has no atomic add of complex values: each atomic accumulation into a
    complex element (an adjoint array's, a block sum's slot) becomes two float atomics,
    on the real and the imaginary parts of the element (``adj.real`` / ``adj.imag``,
    views of the array's real pairs), the value read once.  Each thread's addition is
    exact per part, so the result is the complex sum, in some order per part.  Run on
    the finished function (after :func:`kadj.simplify.simplify`)."""
    split = w.state.complex_atomics

    def rewrite(body):
        out = []
        for node in body:
            for child in node.children():
                child[:] = rewrite(child)
            if not (isinstance(node, A.Accumulate) and node.how == "atomic" and
                    _is_complex_target(w, node.target)):
                out.append(node)
                continue
            t, value = node.target, node.value
            if not value.isidentifier():
                tmp = w.fresh(f"c_{t.base.lstrip('_')}")
                out.append(A.Assign(tmp, value))
                value = tmp
            for part in ("real", "imag"):
                view = A.AdjElem(t.array, t.index, f"{t.base}.{part}", t.index_texts)
                out.append(A.Accumulate(view, node.op, f"{value}.{part}", "atomic"))
            split[t.array] = split.get(t.array, 0) + 1
        return out

    for body in fn.children():
        body[:] = rewrite(body)
    return fn


# ---- the tangent's lowerings (kadj.tangent.TangentContext) ------------------------------
def tangent_barrier(w, s, out):
    """``cuda.syncthreads()`` stays where it is: a shared array's tangent is written and
    read next to the primal between the same barriers."""
    out.append(A.Barrier(loc=s.loc))


def tangent_declare(w, s, out):
    """A ``cuda.shared.array`` / ``cuda.local.array`` and its tangent, declared alike
    (a shared one is shared by the block, a local one private to the thread), right
    after it; False for allocations that are not the target's."""
    from .intrinsics import CudaIntrinsic
    if not isinstance(s.expr.fn, CudaIntrinsic):
        return False
    w.comment(s.loc, out)
    decl = w.expr(s.expr)
    out.append(A.Assign(w.n(s.target), decl))
    if w.active_array(s.target):
        out.append(A.Assign(w.dot(s.target), decl))
    return True


def tangent_atomic(w, s, out):
    """``cuda.atomic.add(x, idx, v)`` in the forward is linear: its tangent is
    ``cuda.atomic.add(dot_x, idx, dot_v)`` (``atomic.sub``: the negated tangent),
    before the forward's own atomic, which stays an atomic.  The winner's store of a
    ``cuda.atomic.max``/``min`` is refused (:mod:`kadj.cuda.atomic_extrema`)."""
    if s.accumulate == "claim":
        from .atomic_extrema import refuse_tangent
        refuse_tangent(w.k.name, s)
    arr = s.array.name
    index = tuple(s.index)
    texts = tuple(w.o(i) for i in index)
    sign = "-" if s.accumulate == "sub" else ""
    w.comment(s.loc, out)
    if w.active_array(arr) and w.active(s.value):
        out.append(A.Accumulate(A.AdjElem(arr, index, w.dot(arr), texts), "+=",
                                sign + w.dot(s.value.name), "atomic"))
    value = w.o(s.value)
    if sign:
        value = f"-{value}" if value.isidentifier() else f"-({value})"
    out.append(A.Accumulate(A.AdjElem(arr, index, w.arr(arr), texts), "+=", value,
                            "atomic"))
