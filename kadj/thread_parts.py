"""Parallel reversed loops whose iterations add into shared elements: one copy per part.

A reversed ``prange`` loop whose iterations add into elements of an array that other
iterations add into too (a gather through an index array, ``y[i] = x[idx[i]]``, whose
adjoint is ``adj_x[idx[i]] += ...``; a row loop reading a shared vector, whose adjoint
adds ``adj_x[j] += ...`` for every row) would race if its iterations simply ran on all
threads.  When the body only adds into such an array (``+=``, never reading it), the
loop's iterations are split into as many parts as there are threads, in order; each
part runs serially and adds into an array of its own: the first part into the adjoint
array itself, every other part into a copy of it that starts at zero.  After the loop
the copies are added into the array, element by element, in parallel::

    _nparts = _thread_parts(_trips, adj_x.nbytes)
    _copies_adj_x = np.empty((_nparts - 1,) + adj_x.shape, adj_x.dtype)
    for _part in numba.prange(0, _nparts):
        if _part > 0:
            _copies_adj_x[_part - 1].fill(0)
        adj_x_part = adj_x if _part == 0 else _copies_adj_x[_part - 1]
        for i in range(_trips * _part // _nparts, _trips * (_part + 1) // _nparts):
            ...                                 # the iteration, adding into adj_x_part
    if _nparts > 1:
        for _q0 in numba.prange(0, adj_x.shape[0]):
            _acc = adj_x[_q0]
            for _c in range(_nparts - 1):
                _acc += _copies_adj_x[_c, _q0]
            adj_x[_q0] = _acc

Each element then holds the same contributions as after the serial loop, added in
another order (the parts' sums, in part order): equal to rounding, and the same from
run to run for a given number of threads.  On one thread there is one part and no
copy: the serial loop.  The copies take at most :data:`PART_BYTES` together (fewer
parts when the arrays are large); which loops qualify: :func:`kadj.parallel.race_free`.
"""
from __future__ import annotations

import numba
from llvmlite import ir as llvm_ir
from numba.core import cgutils, types
from numba.core.typing.templates import signature
from numba.extending import intrinsic, overload, register_jitable

from . import adj_ir as A
from .adj_refs import free_name, rewrite

__all__ = ["PART_BYTES", "split_into_parts"]

PART_BYTES = 1 << 30        # the most the copies of one loop's arrays take together


def _thread_parts(trips, nbytes):
    """How many parts a loop of ``trips`` iterations runs in: one per thread, at most
    one per iteration, at least one, and few enough that the copies of arrays of
    ``nbytes`` bytes (one fewer than the parts) take at most :data:`PART_BYTES`."""
    return _parts(numba.get_num_threads(), trips, nbytes)


@register_jitable
def _parts(threads, trips, nbytes):
    most = threads
    if nbytes > 0:
        most = min(most, 1 + PART_BYTES // nbytes)
    return max(1, min(most, trips))


@intrinsic
def _threads(typingctx):
    """numba's ``get_num_threads()`` as a call of the threading layer's own function:
    numba's overload calls it through a ctypes pointer, which keeps the adjoint out of
    numba's disk cache ("uses dynamic globals")."""
    launch_threads()

    def codegen(context, builder, sig, args):
        fnty = llvm_ir.FunctionType(cgutils.intp_t, [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "get_num_threads")
        return builder.call(fn, [])
    return signature(types.intp), codegen


@overload(_thread_parts)
def _thread_parts_jitted(trips, nbytes):
    def impl(trips, nbytes):
        return _parts(_threads(), trips, nbytes)
    return impl


def launch_threads():
    """Start numba's threading layer, which defines the ``get_num_threads`` symbol
    that :func:`_threads` calls (before a parallel adjoint is compiled or loaded from
    numba's cache)."""
    from numba.np.ufunc.parallel import _launch_threads
    _launch_threads()


def split_into_parts(fn, ns, seq, loop, bounds, arrays, prefix):
    """Replace ``loop`` (a ``for`` over ``range(lo, hi)`` in the statement list
    ``seq`` of ``fn``, its body race-free but for the additions into ``arrays``:
    {array name: rank}) by the loop over parts of its iterations and the sums of the
    parts' copies (see the module's doc).  ``prefix``: statements for the top of each
    iteration (the counter's bound, the zeros of its own adjoints).  Binds the helper
    in ``ns``; returns the loop over the parts."""
    lo, hi = bounds
    taken = set(ns)         # (not a module-level name the source uses: _trips)

    def fresh(base):
        name = free_name(fn, base, taken=taken)
        taken.add(name)
        return name
    trips, nparts, part = fresh("_trips"), fresh("_nparts"), fresh("_part")
    copies = {a: fresh(f"_copies_{a}") for a in arrays}
    own = {a: fresh(f"{a}_part") for a in arrays}
    for x in A.walk(loop.body):      # (never read there: only the targets change)
        for a in arrays:
            rewrite(x, a, own[a])
    first = f"{trips} * {part} // {nparts}"
    last = f"{trips} * ({part} + 1) // {nparts}"
    if lo != "0":
        first, last = f"{lo} + {first}", f"{lo} + {last}"
    loop.iter = f"range({first}, {last})"
    loop.body[:0] = prefix
    nbytes = " + ".join(f"{a}.nbytes" for a in arrays)
    head = [A.Assign(trips, f"max(0, {hi} - {lo})" if lo != "0" else f"max(0, {hi})"),
            A.Assign(nparts, f"_thread_parts({trips}, {nbytes})")]
    head += [A.Assign(copies[a], f"np.empty(({nparts} - 1,) + {a}.shape, {a}.dtype)")
             for a in arrays]
    body = [A.If(f"{part} > 0", [A.Call(f"{copies[a]}[{part} - 1].fill(0)")
                                 for a in arrays])]
    body += [A.Assign(own[a], f"{a} if {part} == 0 else {copies[a]}[{part} - 1]")
             for a in arrays]
    parts = A.For(part, f"numba.prange(0, {nparts})", body + [loop])
    sums = [_added_up(a, rank, copies[a], nparts, fresh) for a, rank in arrays.items()]
    at = next(k for k, x in enumerate(seq) if x is loop)
    names = ", ".join(arrays)
    seq[at:at + 1] = [
        A.Comment(f"# iterations in parts run in parallel (numba.prange), one part per "
                  f"thread; each part adds into its own copy of {names} (the first into "
                  f"{names} itself), the copies added up after the loop"),
        *head, parts, A.If(f"{nparts} > 1", sums)]
    ns["_thread_parts"] = _thread_parts
    return parts


def _added_up(array, rank, copies, nparts, fresh):
    """The parallel loop adding the parts' copies ``copies`` into ``array``."""
    counters = [fresh(f"_q{d}") for d in range(rank)]
    acc, c = fresh("_acc"), fresh("_c")
    at = ", ".join(counters)
    inner = [A.Assign(acc, f"{array}[{at}]"),
             A.For(c, f"range({nparts} - 1)",
                   [A.Assign(acc, f"{copies}[{c}, {at}]", op="+=")]),
             A.Assign(f"{array}[{at}]", acc)]
    for d in reversed(range(rank)):
        over = "numba.prange" if d == 0 else "range"
        inner = [A.For(counters[d], f"{over}(0, {array}.shape[{d}])", inner)]
    return inner[0]
