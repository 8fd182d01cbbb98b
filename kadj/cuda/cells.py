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

from .. import ir


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
        if arr not in param_arrays or not loads or not stores or c is None or \
                c.cls != "private":
            continue
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
            body = _rewrite(body, arr, operands, cell, ids, ir.var_names(operands))
            names.append(cell)
        cells[arr] = tuple(names)
    if not cells:
        return kernel, cells
    return dataclasses.replace(kernel, body=tuple(body), types=types), cells


def _count(stmt, ids):
    return sum(1 for x in ir.walk((stmt,)) if id(x) in ids)


def _rewrite(seq, arr, key, cell, ids, key_vars):
    """Place the cell's load in ``seq`` (or deeper) and rewrite the accesses."""
    holders = [s for s in seq if _count(s, ids)]
    if len(holders) == 1 and not any(id(x) in ids for x in (holders[0],)):
        h = holders[0]
        if isinstance(h, ir.If):
            n_then = sum(_count(x, ids) for x in h.then)
            n_else = sum(_count(x, ids) for x in h.orelse)
            if n_else == 0:
                return [dataclasses.replace(h, then=tuple(
                    _rewrite(h.then, arr, key, cell, ids, key_vars))) if x is h else x
                    for x in seq]
            if n_then == 0:
                return [dataclasses.replace(h, orelse=tuple(
                    _rewrite(h.orelse, arr, key, cell, ids, key_vars))) if x is h else x
                    for x in seq]
        elif isinstance(h, ir.ForRange) and h.index in key_vars:
            # a new element each iteration (grid-stride loop): a new cell each time
            return [dataclasses.replace(h, body=tuple(
                _rewrite(h.body, arr, key, cell, ids, key_vars))) if x is h else x
                for x in seq]
    out = []
    placed = False
    for s in seq:
        if not placed and _count(s, ids):
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


def owned_shared(kernel, shared):
    """{shared array: index operands} for the shared arrays every thread writes only at
    its own element (``sm[threadIdx.x]``): a thread can save and restore that element."""
    from .indexing import ThreadIndex
    index = ThreadIndex.of(kernel)
    keys = {}
    for st in ir.walk(kernel.body):
        if isinstance(st, ir.Store) and st.array.name in shared:
            if st.accumulate:
                keys.setdefault(st.array.name, set()).add(None)
                continue
            keys.setdefault(st.array.name, set()).add(
                index.owned_key(st.index, index.local, index.block_ndim))
    out = {}
    for name, ks in keys.items():
        if len(ks) == 1 and None not in ks:
            key = next(iter(ks))
            out[name] = tuple(ir.Var(v) if kind == "c" else ir.Const(v) for kind, v in key)
    return out
