"""Parallel loops with loops inside: each iteration's body as a jitted function of its own.

numba compiles the body of a ``prange`` loop into a function of its own (a gufunc),
from numba's IR of the loop body.  When that body holds loops (the rows of a 2-D or
3-D stencil's gather form, each row's edge and interior passes), LLVM optimises it far
less well than the same statements written as a function: a 2-D diffusion step's
parallel gather adjoint took 12 ms on one thread, the same source with serial loops
8 ms, and with the body called as a function 6.5 ms.  So such a body is printed as a
module-level function, compiled with the adjoint's own compiler options and called by
the loop::

    @numba.njit(error_model='numpy', no_cfunc_wrapper=True)
    def _row1(_p0_1, t5, t6, u, kappa, dt, adj_u_new, adj_kappa, adj_u):
        ...

    for _p0_1 in numba.prange(0, t5 + 1):
        _row1(_p0_1, t5, t6, u, kappa, dt, adj_u_new, adj_kappa, adj_u)

The function receives the loop's counter and every name its body reads that the
adjoint defines outside the loop (arguments, shapes, loop-invariant values; arrays by
reference, so its element writes are the loop's).  It computes exactly what the body
computed.  A body that sums scalars over the threads (reductions, which the body only
adds into) sums them from zero in the function, which returns them; the loop adds them
(``adj_dt += _row1(...)``, or from the returned tuple), and numba adds the threads'
partial sums as before.  Such a scalar whose zero the adjoint's declarations do not
show, or that the body also reads, keeps the body in the loop.

A parallel loop with no loop inside whose body sums scalars over the threads (a 1-D
gather adjoint's ``adj_alpha``) is first split into blocks of
:data:`kadj.parallel.BLOCK` iterations (:func:`kadj.parallel.in_blocks`), and the
block becomes the function: numba adds a reduction of a ``prange`` body one addition
after the other, which keeps LLVM from vectorising the loop, while the function's
serial loop sums with ``_sum_add`` (:mod:`kadj.vector_sums`).  A 1-D stencil's
parallel gather adjoint with a scalar coefficient (10^6 elements, one thread) went
from 1.8 ms to 1.1 ms, the serial form's time.  The forward sweep's own loops (the
kernel's sums, whose rounding the forward decides) are not split.
"""
from __future__ import annotations

import builtins
import keyword
import re

from . import adj_ir as A
from .adj_refs import free_name, index, lists, roles_of
from .parallel import BLOCK, PRANGE, in_blocks

__all__ = ["outline_rows"]

_LOOPS = (A.For, A.While)


def outline_rows(fn, ns, jit_options):
    """Move the body of every ``prange`` loop of ``fn`` that holds a loop into a
    function of its own (kept in ``fn.helpers``), compiled with ``jit_options``.
    Returns the number of bodies moved."""
    moved = 0
    for loop in [x for x in A.walk(fn.prologue + fn.body) if _is_parallel(x)]:
        names = index(fn)[0]            # (of the function as it is now)
        found = _parameters(fn, ns, loop, names)
        if found is None:
            continue
        params, sums = found
        zeros = _zeros(fn, sums)
        if zeros is None:
            continue
        what = f"One iteration of the parallel loop over {loop.var}"
        if not any(isinstance(y, _LOOPS) for y in A.walk(loop.body)):
            if not sums or loop.primal:
                continue
            counter = loop.var
            loop = _blocked(fn, loop)
            what = f"Block {loop.var} of {BLOCK} iterations of the parallel loop over {counter}"
            found = _parameters(fn, ns, loop, index(fn)[0])
            if found is None:
                continue
            params, sums = found
        moved += 1
        name = free_name(fn, f"_row{moved}", ns)
        body = loop.body
        if sums:
            body = [A.Assign(v, zeros[v]) for v in sums] + body + \
                [A.Return(", ".join(sums))]
        helper = A.Function(name, (loop.var, *params),
                            what + (f"; returns its sums of {', '.join(sums)}." if sums
                                    else "."),
                            body=body)
        fn.helpers.append((_decorator(jit_options), helper))
        call = f"{name}({', '.join((loop.var, *params))})"
        if not sums:
            loop.body = [A.Call(call)]
        elif len(sums) == 1:
            loop.body = [A.Assign(sums[0], call, op="+=")]
        else:
            part = free_name(fn, "_sums", ns)
            loop.body = [A.Assign(part, call)] + [
                A.Assign(v, f"{part}[{k}]", op="+=") for k, v in enumerate(sums)]
    return moved


def _blocked(fn, loop):
    """Put the loop over blocks of ``loop``'s iterations (:func:`kadj.parallel.in_blocks`)
    in its place in ``fn``, and return it."""
    for seq in lists(fn):
        for k, x in enumerate(seq):
            if x is loop:
                seq[k:k + 1] = [A.Comment(f"# in blocks of {BLOCK} iterations, each block's "
                                          "sums added serially"), in_blocks(fn, loop)]
                return seq[k + 1]
    raise AssertionError("a parallel loop outside the adjoint's statements")


def _is_parallel(x):
    return isinstance(x, A.For) and x.iter.startswith(f"{PRANGE}(")


def _parameters(fn, ns, loop, names):
    """(the names the body of ``loop`` reads and does not assign that occur outside it,
    in order of first use; the scalars it sums over the threads, in order); None when
    the body also reads such a scalar."""
    inside = {id(y) for y in A.walk(loop.body)}
    outside = set(fn.params)
    for name, rows in names.items():
        if any(id(node) not in inside for _, node in rows):
            outside.add(name)
    body = list(A.walk(loop.body))
    private = _privates(loop)
    sums = []
    for y in body:
        if _reduces(y, outside) and _target_name(y.target) not in sums + private:
            sums.append(_target_name(y.target))
    for y in body:              # a sum is only added into
        mentioned = {name for name, _role in roles_of(y)} & set(sums)
        if mentioned and not (_reduces(y, outside) and
                              mentioned == {_target_name(y.target)} and
                              not re.search(rf"\b{re.escape(_target_name(y.target))}\b",
                                            y.value)):
            return None
    # a scalar the body assigns is the iteration's own (kadj.parallel.race_free: assigned
    # before it is read in every iteration, not read after the loop): not passed
    assigned = {name for y in body for name in _assigned(y)}
    params = []
    for y in body:
        for name, _role in roles_of(y):
            if name == loop.var or name in params or name in assigned or \
                    name not in outside:
                continue
            if name in ns or hasattr(builtins, name) or keyword.iskeyword(name):
                continue        # a module-level name (math, np, _sum_add), a builtin, or
                                # a word of the text (x if c else y)
            params.append(name)
    return params, sums


def _privates(loop):
    """The scalars that one iteration of ``loop``, or of a loop inside it, assigns
    first (a plain ``=`` not reading them, such as the zero :mod:`kadj.parallel` sets
    at the top of each iteration, or a first contribution, :mod:`kadj.simplify_zero`)
    and that nothing in ``loop`` outside that loop mentions: the iteration's own, even
    where the adjoint also declares them."""
    found = []
    for inner in [loop] + [y for y in A.walk(loop.body) if isinstance(y, A.For)]:
        within = {id(y) for y in A.walk(inner.body)}
        elsewhere = {n for y in A.walk(loop.body) if id(y) not in within
                     for n, _role in roles_of(y)}
        seen = set()
        for st in inner.body:
            name = _target_name(st.target) if isinstance(st, (A.Assign, A.Accumulate)) \
                and st.op in ("=", "= -") else None
            if name and name not in seen | elsewhere and name not in found and \
                    not re.search(rf"\b{re.escape(name)}\b", st.value):
                found.append(name)
            seen.update(n for y in A.walk([st]) for n, _role in roles_of(y))
    return found


_ZERO = re.compile(r"^(?:np\.\w+\()?0(?:\.0)?j?\)?$")


def _zeros(fn, sums):
    """{sum: its zero}, from the adjoint's first assignment of each at its top level
    (its declaration, ``adj_dt = 0.0``); None when one is missing or not a zero."""
    zeros = {}
    for x in fn.prologue + fn.body:
        if isinstance(x, (A.Assign, A.Accumulate)) and x.op == "=":
            v = _target_name(x.target)
            if v in sums and v not in zeros:
                zeros[v] = x.value
    if set(zeros) != set(sums) or not all(_ZERO.match(z.strip()) for z in zeros.values()):
        return None
    return zeros


def _assigned(y):
    """The scalars statement ``y`` assigns (its own target or loop counter)."""
    if isinstance(y, A.For):
        return (y.var,)
    if isinstance(y, (A.Assign, A.Accumulate, A.Consume, A.Pop)):
        name = _target_name(y.target)
        return (name,) if name else ()
    return ()


def _reduces(y, outside):
    """Does ``y`` add into a scalar defined outside the loop (a reduction)?"""
    if isinstance(y, A.Accumulate):
        t = y.target
        return not isinstance(t, A.AdjElem) and _target_name(t) in outside
    if isinstance(y, A.Assign) and y.op not in ("=", "= -"):
        t = y.target
        return not isinstance(t, A.AdjElem) and _target_name(t) in outside
    return False


def _target_name(t):
    """The scalar a target names (None for an element: ``a[i]`` is the array's)."""
    if isinstance(t, str):
        return None if "[" in t else t.strip()
    return getattr(t, "name", None)


def _decorator(jit_options):
    """``@numba.njit(...)`` with the adjoint's options, spelled the same in every run,
    and without the wrapper that calls it through a C pointer.  (It keeps the one that
    calls it from Python: the adjoint's source runs as Python too, and a function
    without it crashes the interpreter when Python calls it.)"""
    parts = []
    options = dict(jit_options, no_cfunc_wrapper=True)
    for key, value in sorted(options.items()):
        if value is None:       # numba's default
            continue
        if isinstance(value, (set, frozenset)):
            value = "{" + ", ".join(repr(v) for v in sorted(value)) + "}"
        else:
            value = repr(value)
        parts.append(f"{key}={value}")
    return f"@numba.njit({', '.join(parts)})"
