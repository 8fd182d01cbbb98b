"""In-place updates of a thread's own element (``y[i] += a * x[i]``, ``x[i] += dt * v[i]``).

A kernel that reads and writes the same argument array needs, on the CPU, a work copy
in its adjoint.  On the GPU there is none to make, but when every access of the array
uses the thread's own element (class ``private`` in :mod:`kadj.cuda.indexing`), that
element behaves like a scalar variable of the thread: this pass gives it one, a *cell*.

- ``cell = y[i]`` is inserted once, before the first access, in the innermost statement
  sequence that holds every access (so under the same guards: ``if i < n``), and at the
  top of each iteration of a grid-stride loop whose variable is part of the index;
- each load ``t = y[i]`` becomes ``t = cell``;
- each store ``y[i] = v`` becomes ``cell = v`` followed by the store ``y[i] = cell``.

The adjoint then reads ``y[i]`` once, from the user's unmodified (pre-call) array, and
never writes it: the stores' reverse consumes ``adj_y[i]`` and the inserted load adds
the pre-call cotangent back, which is API.md's rule for in/out arrays.
"""
from __future__ import annotations

import dataclasses
import operator

from .. import ir
from .parity import checkerboard_key


def insert_cells(kernel, index, classes, param_arrays):
    """(kernel with cells, {array: cell variables}) for private in-place arrays."""
    accesses = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load):
            accesses.setdefault(s.expr.array.name, [set(), set()])[0].add(id(s))
        elif isinstance(s, ir.Store) and not s.accumulate:
            accesses.setdefault(s.array.name, [set(), set()])[1].add(id(s))
    cells = {}
    body = kernel.body
    types = dict(kernel.types)
    for arr, (loads, stores) in sorted(accesses.items()):
        c = classes.get(arr)
        if arr not in param_arrays or not loads or not stores or c is None:
            continue
        if c.cls != "private":
            # a checkerboard update: the own element a cell, the other loads of
            # elements no thread writes left as they are (kadj.cuda.parity)
            board = checkerboard_key(kernel, index, arr)
            if board is None:
                continue
            loads = loads - board[1]
        if any(isinstance(s, ir.Store) and s.accumulate and s.array.name == arr
               for s in ir.walk(body)):
            continue
        # one cell per element the thread owns (x[i]; or x[i, 0], x[i, 1] ...)
        by_key = {}
        for s in ir.walk(body):
            if id(s) in loads | stores:
                idx = tuple(s.expr.index) if isinstance(s, ir.Assign) else tuple(s.index)
                by_key.setdefault(index.owned_key(idx), set()).add(id(s))
        if None in by_key:
            continue
        names = []
        for n, (key, ids) in enumerate(by_key.items()):
            cell = f"{arr}__cell" if len(by_key) == 1 else f"{arr}__cell{n}"
            types[cell] = kernel.types[arr].dtype
            # the element, from the coordinates' own variables and the constants
            operands = tuple(ir.Var(v) if kind == "c" else ir.Const(v)
                             for kind, v in key)
            body = _rewrite(body, arr, operands, cell, ids, ir.var_names(operands),
                            read=bool(ids & loads))
            names.append(cell)
        cells[arr] = tuple(names)
    if not cells:
        return kernel, cells
    return dataclasses.replace(kernel, body=tuple(body), types=types), cells


def _count(stmt, ids):
    return sum(1 for x in ir.walk((stmt,)) if id(x) in ids)


def _rewrite(seq, arr, key, cell, ids, key_vars, read=True):
    """Place the cell's load in ``seq`` (or deeper) and rewrite the accesses; without
    ``read`` (a red-black sweep that only writes its own element) no load: the
    element's old value is never read, and its cotangent is consumed by the store."""
    holders = [s for s in seq if _count(s, ids)]
    if len(holders) == 1 and not any(id(x) in ids for x in (holders[0],)):
        h = holders[0]
        if isinstance(h, ir.If):
            n_then = sum(_count(x, ids) for x in h.then)
            n_else = sum(_count(x, ids) for x in h.orelse)
            if n_else == 0:
                inner = _rewrite(h.then, arr, key, cell, ids, key_vars, read)
                return [dataclasses.replace(h, then=tuple(inner)) if x is h else x
                        for x in seq]
            if n_then == 0:
                inner = _rewrite(h.orelse, arr, key, cell, ids, key_vars, read)
                return [dataclasses.replace(h, orelse=tuple(inner)) if x is h else x
                        for x in seq]
        elif isinstance(h, ir.ForRange) and h.index in key_vars:
            # a new element each iteration (grid-stride loop): a new cell each time
            return [dataclasses.replace(h, body=tuple(
                _rewrite(h.body, arr, key, cell, ids, key_vars, read))) if x is h else x
                for x in seq]
    out = []
    placed = False
    for s in seq:
        if not placed and _count(s, ids):
            if read:
                out.append(ir.Assign(cell, ir.Load(ir.Var(arr), key), loc=s.loc))
            placed = True
        out.extend(_replace(s, arr, cell, ids))
    return out


def _replace(s, arr, cell, ids):
    if id(s) in ids:
        if isinstance(s, ir.Assign):
            return [ir.Assign(s.target, ir.Copy(ir.Var(cell)), loc=s.loc)]
        return [ir.Assign(cell, ir.Copy(s.value), loc=s.loc),
                dataclasses.replace(s, value=ir.Var(cell))]
    if isinstance(s, ir.If):
        return [dataclasses.replace(
            s, then=tuple(x for y in s.then for x in _replace(y, arr, cell, ids)),
            orelse=tuple(x for y in s.orelse for x in _replace(y, arr, cell, ids)))]
    if isinstance(s, (ir.ForRange, ir.Loop)):
        return [dataclasses.replace(
            s, body=tuple(x for y in s.body for x in _replace(y, arr, cell, ids)))]
    return [s]


def owned_shared(kernel, shared, index=None):
    """{shared array: key} for the shared arrays whose every element a loop rewrites is
    the writing thread's own (``sm[threadIdx.x]``, ``a[tx + 1]``): a thread can save and
    restore that element around the loop.  The key is the element's index, one
    ``(kind, value)`` per position: ``("c", text)`` for a block coordinate (plus a
    non-negative constant: ``"tx + 1"``), ``("k", n)`` for a constant, ``("r", n)`` for
    any other index along an axis of n <= ROWS elements (a ping-pong buffer's row,
    ``buf[1 - p, tx]``: the thread owns its element of every row).

    Every store into the array inside a loop must use that key.  Stores at other
    elements (a halo or boundary cell set by one thread: ``if tx == 0: a[0] = 0.0``)
    are allowed outside every loop, before the first store inside one: no loop changes
    those elements, and nothing changes them after the loops read them."""
    from .indexing import ThreadIndex
    index = ThreadIndex.of(kernel) if index is None else index
    out = {}
    for name in sorted(shared):
        key = _owned_key(kernel, name, index)
        if key is not None:
            out[name] = key
    return out


ROWS = 4    # the most rows along an axis whose index a thread does not own


def _shared_key(index, st, shape):
    """The thread's own element of shared-array store ``st`` (see :func:`owned_shared`),
    or None; ``shape`` is the array's (constant) shape, None when unknown."""
    if st.accumulate:
        return None
    key = index.owned_key(st.index, index.local, index.block_ndim)
    if key is not None:
        return key
    key, dims = [], []
    for pos, x in enumerate(st.index):
        k = index.canonical(x, index.local)
        if k is None and isinstance(x, ir.Var):
            e = index.defs.get(x.name)
            if isinstance(e, ir.Op) and e.fn is operator.add and len(e.args) == 2:
                a, b = e.args
                if isinstance(a, ir.Const) or a.name in index.consts:
                    a, b = b, a
                ka, kb = index.canonical(a, index.local), index.canonical(b, index.local)
                if ka is not None and kb is not None and ka[0] == "c" and \
                        kb[0] == "k" and kb[1] >= 0:
                    k = ("c", f"{ka[1]} + {kb[1]}" if kb[1] else ka[1])
                    x = a
        if k is None and shape is not None and len(shape) == len(st.index) and \
                shape[pos] <= ROWS:
            k = ("r", shape[pos])
        if k is None:
            return None
        if k[0] == "c":
            dims.append(index.local[x.name])
        key.append(k)
    if not index.block_ndim or sorted(dims) != list(range(index.block_ndim)):
        return None
    return tuple(key)


def _owned_key(kernel, name, index):
    stores = []           # (store, ids of the loops around it), in program order

    def visit(seq, loops):
        for st in seq:
            if isinstance(st, ir.Store) and st.array.name == name:
                stores.append((st, loops))
            elif isinstance(st, ir.If):
                visit(st.then, loops)
                visit(st.orelse, loops)
            elif isinstance(st, (ir.ForRange, ir.Loop)):
                visit(st.body, loops | {id(st)})

    visit(kernel.body, frozenset())
    shape = None
    for st in ir.walk(kernel.body):
        if isinstance(st, ir.Assign) and st.target == name and \
                isinstance(st.expr, ir.Alloc) and st.expr.args and \
                isinstance(st.expr.args[0], ir.Const):
            shape = st.expr.args[0].value
            shape = tuple(shape) if isinstance(shape, tuple) else (shape,)
    keys = [_shared_key(index, st, shape) for st, _ in stores]
    if keys and len(set(keys)) == 1 and keys[0] is not None:
        return keys[0]
    own = {k for k, (_, loops) in zip(keys, stores) if loops and k is not None}
    if len(own) != 1:
        return None
    key = own.pop()
    first = min(n for n, (k, (_, loops)) in enumerate(zip(keys, stores))
                if loops and k == key)
    key_loops = set().union(*(loops for k, (_, loops) in zip(keys, stores) if k == key))
    # the other elements: stored before the first store at the key inside a loop, and
    # in no loop that stores at the key
    if any(k != key and (n > first or loops & key_loops)
           for n, (k, (_, loops)) in enumerate(zip(keys, stores))):
        return None
    return key
