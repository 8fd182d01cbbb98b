"""Normalization of a CUDA kernel's typed numba IR, the same for both typing paths
(:func:`kadj.cuda.frontend.type_kernel`).

- :func:`index_by_variables`: numba's constant inference takes ``cuda.threadIdx.x`` for a
  constant (numba-cuda's stub has an ``x`` property, and so has the simulator shim's)
  and rewrites ``s[tx, ty]`` into a ``static_getitem``/``StaticSetItem`` whose index is
  a tuple of property objects; the index becomes the tuple variable again, so that the
  structurizer sees ``s[tx, ty]`` as it sees any other variable index.
- :func:`sort_phi_copies`: numba's copies into a branch's merge variables come in an
  order that depends on string hashing, which varies between processes; sorted, every
  process writes the same adjoint.
"""
from __future__ import annotations

import numpy as np
from numba.core import ir as nir


def sort_phi_copies(func_ir):
    """numba writes the copies into a branch's merge variables (``$phi150.1 = i``) in
    an order that depends on string hashing (it varies between processes): sort each
    run of them by name, where none reads another, so that every process (with or
    without the simulator) writes the same adjoint."""
    def is_phi(st):
        return isinstance(st, nir.Assign) and isinstance(st.value, nir.Var) and \
            st.target.name.startswith("$phi")

    for block in func_ir.blocks.values():
        body, pos = block.body, 0
        while pos < len(body):
            end = pos
            while end < len(body) and is_phi(body[end]):
                end += 1
            run = body[pos:end]
            if len(run) > 1 and not ({st.value.name for st in run} &
                                     {st.target.name for st in run}):
                body[pos:end] = sorted(run, key=lambda st: st.target.name)
            pos = end + 1


def _constant_index(index):
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, np.integer, slice)) or i is None for i in items)


def index_by_variables(func_ir, calltypes=None):
    """Undo numba's static indexing by non-integer "constants" (``cuda.threadIdx.x``
    taken for its stub's property object): ``static_getitem``/``StaticSetItem`` whose
    index holds such objects become ``getitem``/``SetItem`` by the index variable."""
    calltypes = {} if calltypes is None else calltypes
    for block in func_ir.blocks.values():
        for pos, st in enumerate(block.body):
            if isinstance(st, nir.StaticSetItem) and st.index_var is not None and \
                    not _constant_index(st.index):
                new = nir.SetItem(st.target, st.index_var, st.value, st.loc)
                if st in calltypes:
                    calltypes[new] = calltypes.pop(st)
                block.body[pos] = new
            elif isinstance(st, nir.Assign) and isinstance(st.value, nir.Expr) and \
                    st.value.op == "static_getitem" and st.value.index_var is not None \
                    and not _constant_index(st.value.index):
                old = st.value
                st.value = nir.Expr.getitem(old.value, old.index_var, old.loc)
                if old in calltypes:
                    calltypes[st.value] = calltypes.pop(old)
                # the definitions map is how numba's own rewrite passes keep
                # get_definition() right after replacing an expression
                defs = func_ir._definitions.get(st.target.name, [])
                func_ir._definitions[st.target.name] = [
                    st.value if d is old else d for d in defs]
