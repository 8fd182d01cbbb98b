"""Readability pass over the adjoint IR: values computed under a temporary's name only to
be copied into the kernel's own name are computed under that name.

numba names the value an ``if``/``else`` expression leaves, and the counter of a loop,
with temporaries; an inlined helper's ``left = x[i - 1] if i > 0 else 0.0`` and ``for i
in range(n)`` then print as::

    if t5:                               for t3 in range(0, n_chain_rhs, 1):
        t9 = x_work[i_chain_rhs - 1]         i_chain_rhs = t3
    else:                                    ...
        t9 = 0.0
    left_chain_rhs = t9

:func:`coalesce_joins` writes them as ``left_chain_rhs = ...`` in each branch and ``for
i_chain_rhs in range(...)``:

* a branch value: an ``if`` whose two branches each end by assigning temporary ``t``,
  followed at once by ``v = t``, where ``t`` occurs nowhere else and ``v`` (a plain
  name) is not mentioned in the ``if``: each branch assigns ``v`` instead, and the copy
  goes.  Nothing runs between the branches' assignments and the copy, so ``v`` gets the
  same value at the same point.
* a loop counter: ``for t in ...:`` whose body begins with ``v = t`` (after comments), where ``t``
  occurs nowhere else and the body assigns ``v`` nowhere else: the loop counts in
  ``v``.  A ``for`` loop assigns its counter at the top of each iteration, as the copy
  did; after the loop ``v`` holds the last value either way, and a loop that runs no
  iteration leaves ``v`` as it was either way.

Temporaries only (``t<n>`` and the kernel's temporaries): the kernel's own names stay.
Run inside :func:`kadj.simplify.simplify`, where each top-level block's own names are
told apart (:mod:`kadj.simplify_scopes`), so that a forward sweep and the reverse
sweep's recomputation, which reuse the temporaries, are each rewritten on their own.
"""
from __future__ import annotations

from . import adj_ir as A
from .adj_refs import IDENT, USE, mentioned, names
from .simplify_expr import is_temporary

__all__ = ["coalesce_joins"]


def coalesce_joins(fn, idx):
    """Both rewrites of the module docstring, everywhere in ``fn``; ``idx``: its
    :class:`~kadj.adj_refs.Index`, told of every change."""
    def is_temp(name):
        return is_temporary(name, fn.temps)

    for seq in list(idx.lists()):
        pos = 0
        while pos < len(seq):
            x = seq[pos]
            if isinstance(x, A.If) and pos + 1 < len(seq) and \
                    _branch_value(x, seq[pos + 1], idx, is_temp):
                idx.delete(seq, pos + 1)
            elif isinstance(x, A.For):
                _loop_counter(x, idx, is_temp)
            pos += 1


def _copy_of(x):
    """(target, source) of a plain copy ``v = t`` between names, or None."""
    if isinstance(x, A.Assign) and x.op == "=" and isinstance(x.target, str) and \
            IDENT.fullmatch(x.target) and isinstance(x.value, str) and \
            IDENT.fullmatch(x.value) and x.target != x.value:
        return x.target, x.value
    return None


def _plain_def(x, name):
    return isinstance(x, A.Assign) and x.op == "=" and x.target == name


def _branch_value(branch, after, idx, is_temp):
    copy = _copy_of(after)
    if copy is None or not branch.then or not branch.orelse:
        return False
    v, t = copy
    last = (branch.then[-1], branch.orelse[-1])
    if not is_temp(t) or not all(_plain_def(x, t) and t not in names(x.value)
                                 for x in last) or v in mentioned(branch):
        return False
    if {id(node) for _, node in idx.occ().get(t, ())} != {id(after), *map(id, last)}:
        return False
    for x in last:
        x.target = v
    idx.touch(list(last))
    return True


def _may_assign(node, role, v):
    """May statement ``node``, which mentions ``v`` in ``role``, assign ``v``?  (A
    plain-text target, ``k1x[i] = ...``, mentions its index as fixed; only a target
    that is ``v`` itself assigns it.)"""
    if role == USE:
        return False
    if isinstance(node, (A.Assign, A.Accumulate, A.Pop, A.Consume)) and \
            isinstance(node.target, str):
        return node.target == v
    if isinstance(node, A.For):
        return node.var == v
    return True


def _loop_counter(loop, idx, is_temp):
    t = loop.var
    at = next((k for k, x in enumerate(loop.body) if not isinstance(x, A.Comment)), None)
    if at is None or not is_temp(t):
        return
    copy = _copy_of(loop.body[at])
    if copy is None or copy[1] != t:
        return
    v = copy[0]
    first = loop.body[at]
    occ = idx.occ()
    if {id(node) for _, node in occ.get(t, ())} != {id(loop), id(first)}:
        return
    inside = {id(y) for y in A.walk(loop.body)}
    if any(id(node) in inside and node is not first and _may_assign(node, role, v)
           for role, node in occ.get(v, ())):
        return
    loop.var = v
    idx.touch([loop])
    idx.delete(loop.body, at)
