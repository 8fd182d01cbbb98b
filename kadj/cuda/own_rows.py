"""A thread's own row of a 2-D argument array, read and rewritten in place.

``y[i, j]`` with ``i`` the thread's coordinate (``cuda.grid(1)``, a 1-D launch) and
every load and store of ``y`` in that row: no other thread touches the row
(:func:`kadj.cuda.indexing.own_rows`), so the row is the thread's private array, like a
``cuda.local.array`` except that its length is known only at launch.  The preparation
(:func:`attach`) rewrites each access ``y[i, j]`` into ``y__row[j]``, where ``y__row``
is declared as a thread-local array of symbolic length; the analysis and the writer
then treat it exactly as a local scratch array (restored stores, loops reversed from
checkpoints that save the whole array).  Only the spelling of its memory changes
(the lowerings here):

- every run-time-length array of the adjoint lives in one global buffer per own-row
  array, ``kadj_rows_y`` of shape ``(threads, K, n)`` (an extra parameter the launch
  allocates, :func:`buffers`): thread ``t = cuda.grid(1)`` uses ``kadj_rows_y[t]``,
  its ``K`` rows of length ``n = y.shape[1]``; the buffers live on the device (NumPy
  arguments too) and come from :mod:`kadj.buffer_pool`, so a repeated launch reuses
  the previous launch's blocks;
- ``y__row`` is ``kadj_rows_y[i, 0]``, filled in the prologue with the pre-call row
  ``y[i, :]`` (the user's array is only read);
- its adjoint ``adj_y__row`` is the user's ``adj_y[i]`` itself: it holds the incoming
  cotangent of the row's final values, and the reverse sweep leaves there the
  cotangent of its pre-call values (API.md's rule for in/out arrays);
- the checkpoint slots of a loop that rewrites the row (``S`` copies of it) and the
  row saved on entry to such a loop are further rows of ``kadj_rows_y[i]``.

Memory: ``threads * K * n`` elements per own-row array (threads: of the launch),
``K = 1 + sum over the checkpointed loops that rewrite the row of (S + 1)`` (``S``:
the ``checkpoints`` option).  Time: as for a local array, O(log n) replayed
iterations per reversed one.

Refused (located, :func:`kadj.cuda.context.check`): rows of arrays of three or more
dimensions, rows picked by a grid-stride loop, a row rewritten in a loop nested in
another loop, atomics into the row, and rows another thread touches (``y[i + 1, j]``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
from numba.core import types

from .. import adj_ir as A
from .. import ir
from .indexing import ThreadIndex, own_rows
from .intrinsics import CudaIntrinsic

PREFIX = "kadj_rows_"       # the adjoint's buffer parameter of array y: kadj_rows_y
ROW = "__row"               # y's row as a private array: y__row
LEN = "kadj_n_"             # the row length's name in the adjoint: kadj_n_y


def buffer_name(arr):
    return PREFIX + arr


def row_name(arr):
    return arr + ROW


def _loops_around(body, arr):
    """The largest number of loops around a store into ``arr``."""
    deepest = 0

    def visit(seq, depth):
        nonlocal deepest
        for s in seq:
            if isinstance(s, ir.Store) and s.array.name == arr:
                deepest = max(deepest, depth)
            elif isinstance(s, ir.If):
                visit(s.then, depth)
                visit(s.orelse, depth)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                visit(s.body, depth + 1)
    visit(body, 0)
    return deepest


def unsupported(kernel, index, arr):
    """Why the own row of ``arr`` is not rewritten (None when it is)."""
    t = kernel.types[arr]
    if t.ndim != 2:
        return f"{arr} has {t.ndim} dimensions (rows of 2-D arrays are supported)"
    first = None
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Store) and s.array.name == arr:
            if s.accumulate:
                return f"an atomic update of {arr}"
            first = first or s.index[0]
    key = index.canonical(first)
    if key is None or key[1] in index.loops:
        return "the row is picked by a grid-stride loop's variable"
    for s in ir.walk(kernel.body):
        if arr in ir.stmt_reads(s) and not (
                isinstance(s, ir.Store) and s.array.name == arr or
                isinstance(s, ir.Assign) and isinstance(s.expr, (ir.Load, ir.Attr)) and
                getattr(s.expr, "array", getattr(s.expr, "value", None)) == ir.Var(arr)):
            return f"{arr} is used otherwise than by its elements and its shape"
    if _defined_at(kernel.body, key[1]) < 0:
        return f"the thread coordinate {key[1]} is not assigned at the kernel's top level"
    if _loops_around(kernel.body, arr) > 1:
        return f"{arr}'s row is rewritten in a loop nested in another loop"
    return None


def candidates(kernel, cells=()):
    """(index, {own-row arrays}) of ``kernel``: parameters read and written in the
    running thread's own row only (not a cell's array)."""
    index = ThreadIndex.of(kernel)
    params = {a for a in kernel.args if isinstance(kernel.types.get(a), types.Array)}
    work = (params & ir.loaded_arrays(kernel.body) & ir.stored_arrays(kernel.body)) \
        - set(cells)
    return index, own_rows(index, kernel, work) if work else set()


def attach(kernel, cells=()):
    """(kernel, rewritten arrays): each supported own-row array's accesses rewritten
    into those of its private row array (module doc), its buffer parameter added."""
    index, rows = candidates(kernel, cells)
    rows = sorted(a for a in rows if unsupported(kernel, index, a) is None)
    if not rows:
        return kernel, ()
    tys = dict(kernel.types)
    body = tuple(kernel.body)
    decls, coords = [], {}
    for arr in rows:
        t = kernel.types[arr]
        row = row_name(arr)
        tys[row] = types.Array(t.dtype, 1, "C")
        tys[buffer_name(arr)] = types.Array(t.dtype, 3, "C")
        first = next(x.index[0] for x in ir.walk(body)
                     if isinstance(x, ir.Store) and x.array.name == arr)
        coords[arr] = ir.Var(index.canonical(first)[1])   # the coordinate's root
        body = _rewrite(body, arr, row)
        decls.append(ir.Assign(row, ir.Alloc(CudaIntrinsic("local.array"), (
            ir.Const(LEN + arr), ir.GlobalRef(t.dtype, name=str(t.dtype)))),
            loc=kernel.loc))
    args = tuple(kernel.args) + tuple(buffer_name(a) for a in rows)
    # the links right after the coordinates' definitions (unsupported() found them)
    at = max(_defined_at(body, c.name) for c in coords.values()) + 1
    body = tuple(decls) + body[:at] + _links(rows, coords, tys) + body[at:]
    return dataclasses.replace(kernel, args=args, body=body, types=tys), tuple(rows)


def _defined_at(body, name):
    """The position of the top-level statement assigning ``name``, or -1."""
    for pos, s in enumerate(body):
        if isinstance(s, ir.Assign) and s.target == name:
            return pos
    return -1


def _links(rows, coords, tys):
    """``if False: y__row[0] = y[i, 0]``, never run, right after ``i`` is assigned:
    the analyses, which do not follow control, see the row take its values from ``y``
    (its activity, the usefulness of its stores).  The prologue fills the row
    (:func:`declarations`)."""
    flag = "kadj_never"
    tys[flag] = types.boolean
    body = []
    for arr in rows:
        t = f"kadj_first_{arr}"
        tys[t] = tys[arr].dtype
        body.append(ir.Assign(t, ir.Load(ir.Var(arr), (coords[arr], ir.Const(0)))))
        body.append(ir.Store(ir.Var(row_name(arr)), (ir.Const(0),), ir.Var(t)))
    return (ir.Assign(flag, ir.Copy(ir.Const(False))),
            ir.If(ir.Var(flag), tuple(body), ()))


def _rewrite(seq, arr, row):
    out = []
    for s in seq:
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                s.expr.array.name == arr:
            s = dataclasses.replace(s, expr=ir.Load(ir.Var(row), tuple(s.expr.index[1:])))
        elif isinstance(s, ir.Store) and s.array.name == arr:
            s = dataclasses.replace(s, array=ir.Var(row), index=tuple(s.index[1:]))
        elif isinstance(s, ir.If):
            s = dataclasses.replace(s, then=_rewrite(s.then, arr, row),
                                    orelse=_rewrite(s.orelse, arr, row))
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            s = dataclasses.replace(s, body=_rewrite(s.body, arr, row))
        out.append(s)
    return tuple(out)


def without_rows(kernel, policy, rows):
    """(kernel, policy) before the rewriting, for forward mode (which updates the rows
    in place as the kernel does), or None when nothing was rewritten."""
    if not rows:
        return None
    names = {row_name(a) for a in rows}
    return kernel, dict(policy, private_scratch=set(policy["private_scratch"]) - names)


def tangent_inputs(prepared, facts, plan):
    """(prepared, facts) for the tangent kernel: those of the kernel before the
    rewriting when it rewrote own rows."""
    before = prepared.extra.get("without_rows")
    if before is None:
        return prepared, facts
    from ..analysis import analyze
    kernel, policy = before
    slots = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    extra = {k: v for k, v in prepared.extra.items() if k != "without_rows"}
    return (dataclasses.replace(prepared, kernel=kernel, analysis=policy, extra=extra),
            analyze(kernel, slots, plan.returns_value, **policy))


def classes(rows, known):
    """The accumulation classes of the own-row arrays and of their rows (both
    private: the adjoint adds into the running thread's row of ``adj_y``)."""
    from .indexing import ArrayClass
    out = {}
    for arr in rows:
        for name, why in ((arr, f"the thread's own row {arr}[i, :], updated in place"),
                          (row_name(arr), f"{arr}[i, :] held per thread in "
                                          f"{buffer_name(arr)}")):
            if name in known:
                out[name] = ArrayClass(name, "private", why)
    return out


def arrays_of(kernel):
    """The own-row arrays a prepared kernel was rewritten for."""
    return tuple(a[len(PREFIX):] for a in kernel.args if a.startswith(PREFIX))


# ---- the adjoint's spelling of run-time-length arrays ---------------------------------
@dataclasses.dataclass(eq=False)
class RowState:
    """Per build: the own-row arrays and the rows of their buffers handed out."""
    arrays: tuple                                   # own-row arrays (user's names)
    used: dict = dataclasses.field(default_factory=dict)     # array -> rows handed out
    entries: dict = dataclasses.field(default_factory=dict)  # (array, key) -> [entry names]
    thread: object = None                           # name of the row index variable


def _array_of(size):
    """The own-row array whose length ``size`` (an int, a text, a tuple) mentions."""
    for d in (size if isinstance(size, tuple) else (size,)):
        if isinstance(d, str) and d.startswith(LEN):
            return d[len(LEN):]
    return None


def _take(w, arr, count):
    rs = w.state.rows
    k = rs.used.get(arr, 0)
    rs.used[arr] = k + count
    return k


def _thread(w, out):
    """The running thread's index (``cuda.grid(1)``: the row it owns, and its part of
    each buffer, which has one per launched thread)."""
    rs = w.state.rows
    if rs.thread is None:
        rs.thread = w.fresh("row")
        out.append(A.Assign(rs.thread, "cuda.grid(1)"))
        for arr in rs.arrays:
            out.append(A.Assign(LEN + arr, f"{buffer_name(arr)}.shape[2]"))
    return rs.thread


def declarations(table):
    """The CUDA declaration lowerings ``table`` with run-time-length arrays spelled as
    rows of the buffers (module doc)."""
    def local_array(w, node):
        arr = _array_of(node.size)
        if arr is None:
            return table["LocalArray"](w, node)
        out = []
        t = _thread(w, out)
        buf = buffer_name(arr)
        if node.name == w.adj(row_name(arr)) and arr in w.slot_args:
            # (a thread past the last row never touches it: the kernel's accesses
            # to the row are its only uses, under the kernel's own guards)
            adj = w.adj(arr)
            out.append(A.Assign(node.name, f"{adj}[min({t}, {adj}.shape[0] - 1)]"))
        elif node.name == w.n(row_name(arr)):
            k = _take(w, arr, 1)
            out.append(A.Assign(node.name, f"{buf}[{t}, {k}]"))
            src, z = w.n(arr), w.fresh("z")
            cond = A.If(f"{t} < {src}.shape[0]")
            loop = A.For(z, f"range({LEN + arr})")
            loop.body.append(A.Assign(f"{node.name}[{z}]", f"{src}[{t}, {z}]"))
            cond.then.append(loop)
            out.append(cond)
        elif node.name == w.adj(row_name(arr)):   # no adjoint asked for y: zeroed
            out.append(A.Assign(node.name, f"{buf}[{t}, {_take(w, arr, 1)}]"))
        else:       # checkpoint slots: (S, n)
            slots = node.size[0]
            k = _take(w, arr, slots)
            out.append(A.Assign(node.name, f"{buf}[{t}, {k}:{k + slots}]"))
        return out

    def zero_array(w, node):
        arr = _array_of(node.dims)
        if arr is None:
            return table["ZeroArray"](w, node)
        if arr in w.slot_args:
            return []       # the user's adj_y row: it holds the incoming cotangent
        z = w.fresh("z")
        loop = A.For(z, f"range({LEN + arr})")
        loop.body.append(A.Assign(f"{node.name}[{z}]", node.zero))
        return [loop]

    return dict(table, LocalArray=local_array, ZeroArray=zero_array)


def lower_saves(w, node):
    """A placed node: the whole row saved on entry to a checkpointed loop
    (``PushArray`` of run-time size) goes into a row of the buffer, restored from it
    (``PopArray``) last in, first out."""
    if not isinstance(node, (A.PushArray, A.PopArray)):
        return node
    arr = _array_of(node.size)
    if arr is None:
        return node
    rs = w.state.rows
    # (paired by what is saved, last in first out per key: the reverse sweep visits
    # an if's branches in their forward order, so one stack for all would pair the
    # then-branch's restore with the else-branch's save)
    stack = rs.entries.setdefault((arr, node.key), [])
    if isinstance(node, A.PushArray):
        name = w.fresh(f"entry_{arr}")
        w.slot_arrays.append(A.LocalArray(name, (1, node.size), None, "local"))
        stack.append(name)
        dst, src = f"{name}[0, {node.var}]", node.elem
    else:
        name = stack.pop()
        dst, src = node.elem, f"{name}[0, {node.var}]"
    loop = A.For(node.var, f"range({node.size})")
    loop.body.append(A.Assign(dst, src))
    return loop


def report(w, arg_names):
    """[{array, arg (position), param, rows (K)}] for the launch (JSON-able)."""
    rs = w.state.rows
    if rs is None:
        return []
    left = {a: names for (a, _), names in rs.entries.items() if names}
    if left:    # every row saved on entry to a loop is restored after its reverse
        raise AssertionError(f"rows saved but never restored: {left}")
    return [{"array": a, "arg": arg_names.index(a), "param": buffer_name(a),
             "rows": rs.used.get(a, 1)} for a in rs.arrays]


def of(comp):
    return comp.report.get("own_rows") or []


def signature_extra(comp, fwd_types):
    return tuple(types.Array(fwd_types[e["arg"]].dtype, 3, "C") for e in of(comp))


def _threads(config):
    count = 1
    for d in config[:2]:
        for x in (tuple(d) if isinstance(d, (tuple, list)) else (d,)):
            count *= int(x)
    return count


def buffers(comp, fwd, config):
    """The buffers of the adjoint launch ``config`` (module doc), one part per launched
    thread (threads past the last row too: a loop they run may save and restore the
    row they would own), zeroed, on the device: from :mod:`kadj.buffer_pool` (for CuPy
    arguments from CuPy's pool), also when the arguments are NumPy arrays, since the
    host never reads them.  A repeated launch takes the blocks the previous one
    released when its buffers were dropped: it allocates nothing."""
    from .. import arrays, buffer_pool
    out = []
    for e in of(comp):
        a = fwd[e["arg"]]
        shape = (max(_threads(config), 1), e["rows"], a.shape[1])
        if arrays.kind(a) == "cupy":
            out.append(arrays.zeros(shape, np.dtype(a.dtype), a))
        else:
            out.append(buffer_pool.zeros(shape, np.dtype(a.dtype)))
    return tuple(out)
