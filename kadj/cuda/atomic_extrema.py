"""``cuda.atomic.max`` / ``cuda.atomic.min`` in differentiated kernels.

After a launch, ``arr[idx] = max(arr_before[idx], max over the contributions v)``.  The
cotangent ``adj_arr[idx]`` flows to exactly one contributor, the *winner*:

- the pre-call value when it equals the result (then ``adj_arr[idx]`` stays, and flows
  on to whatever produced ``arr`` before the launch);
- else the contribution equal to the result made by the thread of lowest linear index
  (``(block linear index) * (threads per block) + (thread linear index in its block)``)
  and, within that thread, its first (lowest loop iteration); its ``v`` takes
  ``adj_arr[idx]``, which becomes zero.

Ties are thus assigned deterministically: the pre-call value first, then the lowest
(thread, contribution number).  No thread knows whether it won before every thread
contributed, so the adjoint runs three launches (:func:`winners`, called by the adjoint
launch):

1. the forward kernel itself, on copies of the arguments: the final values;
2. a *claim* kernel, the forward's Python source with the atomic replaced by "if my
   value equals the final one and differs from the pre-call one, ``atomic.min`` my
   key into the element of an int64 winner array", on fresh copies;
3. the adjoint kernel, which takes the winner arrays as extra parameters (after the
   forward's arguments): in its region tree the atomic is ``if win[idx] == key:
   arr[idx] = v`` (a store with ``accumulate="claim"``), whose adjoint is a plain
   store's: ``adj_v += adj_arr[idx]; adj_arr[idx] = 0`` in the winning thread only.

The key of a contribution is the thread's linear index, except for an array with a
call in a loop or with several calls (*numbered*, :func:`attach`): there each thread
counts its contributions to the array (``kadj_n_<arr>``, from 0 at the kernel's start,
one more at every call), and the key is ``thread * 2**32 + count``; the claim kernel
and the adjoint count in the same program order, so they agree (the adjoint replays
its loops from checkpoints with the count among the carried values).  A numbered
launch must have fewer than 2**31 threads.

Supported: ``atomic.max``/``min`` on global array arguments, whose result is unused,
on arrays the kernel does not otherwise read or write.  Refused with the location: the
other cases, ``atomic.nanmax``/``nanmin``, and forward mode.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import operator
import textwrap

import numpy as np
from numba.core import types

from .. import ir
from ..errors import DifferentiationError
from .intrinsics import CudaIntrinsic

PATHS = ("atomic.max", "atomic.min", "atomic.nanmax", "atomic.nanmin")
CLAIM = "claim"
_PREFIX = "kadj_win_"
_TID = "kadj.linear_thread_index"     # placeholder, replaced in attach()
_COUNT = "kadj_n_"
_SLOT = 1 << 32                       # key = thread index * _SLOT + contribution number
_INT64_MAX = np.iinfo(np.int64).max


def _components(block, grid):
    """(index path, extent path) of the thread components the kernel reads, in the
    order of the linear index: threadIdx x, y, z, then blockIdx x, y, z.  A launch
    extends only along those (kadj.cuda.threads.check_launch_dims), so the others
    are 0 and the index is unique per thread."""
    return [(f"threadIdx.{'xyz'[d]}", f"blockDim.{'xyz'[d]}") for d in block] + \
        [(f"blockIdx.{'xyz'[d]}", f"gridDim.{'xyz'[d]}") for d in grid]


def tid_text(block, grid, module="cuda"):
    """The linear thread index c0 + e0 * (c1 + e1 * (...)) as Python source."""
    comps = _components(block, grid)
    if not comps:
        return "0"
    text = f"{module}.{comps[-1][0]}"
    for idx, ext in reversed(comps[:-1]):
        text = f"{module}.{idx} + {module}.{ext} * ({text})"
    return text


def _expand_tid(stmt, block, grid, tys):
    """The placeholder assignment -> the ops computing the linear thread index."""
    name, loc, out = stmt.target, stmt.loc, []
    comps = _components(block, grid)

    def op(fn, args, typ):
        t = f"{name}_{len(out)}"
        tys[t] = typ
        out.append(ir.Assign(t, ir.Op(fn, tuple(args)), loc=loc))
        return ir.Var(t)

    if not comps:
        return [ir.Assign(name, ir.Copy(ir.Const(0)), loc=loc)]
    acc = op(CudaIntrinsic(comps[-1][0]), (), types.int32)
    for idx, ext in reversed(comps[:-1]):
        prod = op(operator.mul, (op(CudaIntrinsic(ext), (), types.int32), acc),
                  types.int64)
        acc = op(operator.add, (op(CudaIntrinsic(idx), (), types.int32), prod),
                 types.int64)
    last = out.pop()                   # the index itself: named as the placeholder
    tys.pop(last.target, None)
    return out + [ir.Assign(name, last.expr, loc=loc)]


def _replace_tid(seq, block, grid, tys):
    out = []
    for s in seq:
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Op) and isinstance(
                s.expr.fn, CudaIntrinsic) and s.expr.fn.path == _TID:
            out.extend(_expand_tid(s, block, grid, tys))
        elif isinstance(s, ir.If):
            out.append(dataclasses.replace(s, then=_replace_tid(s.then, block, grid, tys),
                                           orelse=_replace_tid(s.orelse, block, grid,
                                                               tys)))
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            out.append(dataclasses.replace(s, body=_replace_tid(s.body, block, grid, tys)))
        else:
            out.append(s)
    return tuple(out)


def win_name(arr):
    """The adjoint's parameter holding the winners of ``arr``'s elements."""
    return _PREFIX + arr


# ---- structure: the call becomes a guarded store ------------------------------------
def convert(st, tgt, e, loc, path):
    """``cuda.atomic.max(arr, idx, v)`` -> ``if kadj_win_arr[idx] == tid: arr[idx] = v``
    (a Store with ``accumulate="claim"``); ``st`` is the CUDA structurizer."""
    construct = f"cuda.{path}"
    if path in ("atomic.nanmax", "atomic.nanmin"):
        st.error(f"cuda.{path}() in a differentiated kernel is not supported", loc=loc,
                 construct=construct,
                 remedy=f"use cuda.{path.replace('nan', '')} (its adjoint goes to the "
                        "element that won) when the values hold no NaN")
    arr, index, val = st.atomic_operands(tgt, e, loc, path)
    if not _in_kernel_body(st.fir.func_id.func, loc):
        st.error(f"cuda.{path}() stands in a device function; kadj's adjoint finds the "
                 "winner of each element by running the kernel's own source again, "
                 "where the atomic must stand", loc=loc,
                 construct=f"cuda.{path} in a device function",
                 remedy=f"call cuda.{path} in the kernel's own body, on the kernel's "
                        "argument by its name (the device function can return the "
                        "value to contribute)")
    a = st.avar(arr)
    out = []

    def op(fn, args, typ, base="aw"):
        name = st.fresh(base, typ)
        out.append(ir.Assign(name, ir.Op(fn, tuple(args)), loc=loc))
        return ir.Var(name)

    tid = op(CudaIntrinsic(_TID), (), types.int64, "tid")   # expanded by attach()
    win = st.fresh("won_by", types.int64)
    out.append(ir.Assign(win, ir.Load(ir.Var(win_name(a.name)), index), loc=loc))
    won = op(operator.eq, (ir.Var(win), tid), types.boolean, "won")
    store = ir.Store(a, index, st.operand(val), loc=loc, accumulate=CLAIM)
    out.append(ir.If(won, (store,), (), loc=loc))
    return out


def _in_kernel_body(py_func, loc):
    """Is ``loc`` within the kernel's own source lines (not an inlined device
    function's)?  True when that cannot be told."""
    try:
        lines, first = inspect.getsourcelines(py_func)
    except (OSError, TypeError):
        return True
    line = getattr(loc, "line", None)
    if line is None or getattr(loc, "filename", None) != py_func.__code__.co_filename:
        return line is None
    return first <= line < first + len(lines)


def attach(kernel):
    """Check where the atomics stand and add the winner arrays to the kernel's
    arguments (after the forward's); the contributions to an array with a call in a
    loop, or with several calls, are numbered (:func:`counted`)."""
    found = [(s.array.name, "max/min", s.loc) for s in ir.walk(kernel.body)
             if isinstance(s, ir.Store) and s.accumulate == CLAIM]
    if not found:
        return kernel
    name = kernel.name
    for arr, what, loc in found:
        if arr not in kernel.args:
            raise DifferentiationError(
                f"cuda.atomic.{what} on '{arr}', which is not an argument of the kernel "
                "(a shared or local array); kadj differentiates it on global arrays "
                "only", kernel=name, loc=loc,
                construct=f"cuda.atomic.{what} on a shared or local array",
                remedy="reduce in shared memory with plain max() and a tree reduction "
                       "(sm[tid] = max(sm[tid], sm[tid + s])), or apply the atomic to a "
                       "global array")
    arrays_ = list(dict.fromkeys(a for a, _, _ in found))
    _check_places(kernel.body, set(arrays_), name)
    from .threads import thread_dims
    block, grid = thread_dims(kernel)
    args = tuple(kernel.args) + tuple(win_name(a) for a in arrays_)
    tys = dict(kernel.types)
    body = _replace_tid(kernel.body, block, grid, tys)
    numbered = _counted_arrays(kernel.body, arrays_)
    if numbered:
        body = _number(body, numbered, tys)
        where = {}
        for a, _, loc in found:
            where.setdefault(a, loc)
        first = tuple(ir.Assign(count_name(a), ir.Copy(ir.Const(0)), loc=where[a])
                      for a in arrays_ if a in numbered)
        for a in numbered:
            tys[count_name(a)] = types.int64
        body = first + body
    for a in arrays_:
        tys[win_name(a)] = types.Array(types.int64, kernel.types[a].ndim, "C")
    return ir.Kernel(kernel.name, args, body, tys, kernel.return_type, kernel.loc)


def count_name(arr):
    """The adjoint's count of the contributions this thread made to ``arr`` so far."""
    return _COUNT + arr


def _counted_arrays(body, arrays_):
    """The arrays whose contributions are numbered: a call in a loop, or several."""
    sites, looped = {}, set()

    def visit(seq, loops):
        for s in seq:
            if isinstance(s, ir.Store) and s.accumulate == CLAIM:
                sites[s.array.name] = sites.get(s.array.name, 0) + 1
                if loops:
                    looped.add(s.array.name)
            elif isinstance(s, ir.If):
                visit(s.then, loops)
                visit(s.orelse, loops)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                visit(s.body, loops + 1)
    visit(body, 0)
    return {a for a in arrays_ if a in looped or sites.get(a, 0) > 1}


def _number(seq, numbered, tys):
    """``won = won_by == tid`` of a numbered array's call -> ``key = tid * 2**32 +
    count; count = count + 1; won = won_by == key`` (the claim kernel computes the same
    key: :func:`_claim_function`)."""
    guards = {}
    for s in seq:
        if isinstance(s, ir.If) and len(s.then) == 1 and isinstance(
                s.then[0], ir.Store) and s.then[0].accumulate == CLAIM and \
                s.then[0].array.name in numbered and isinstance(s.cond, ir.Var):
            guards[s.cond.name] = s.then[0].array.name
    out = []
    for s in seq:
        if isinstance(s, ir.Assign) and s.target in guards:
            won_by, tid = s.expr.args
            cnt = ir.Var(count_name(guards[s.target]))
            high, key = s.target + "_tid", s.target + "_key"
            tys[high] = tys[key] = types.int64
            out += [ir.Assign(high, ir.Op(operator.mul, (tid, ir.Const(_SLOT))),
                              loc=s.loc),
                    ir.Assign(key, ir.Op(operator.add, (ir.Var(high), cnt)), loc=s.loc),
                    ir.Assign(cnt.name, ir.Op(operator.add, (cnt, ir.Const(1))),
                              loc=s.loc),
                    ir.Assign(s.target, ir.Op(operator.eq, (won_by, ir.Var(key))),
                              loc=s.loc)]
        elif isinstance(s, ir.If):
            out.append(dataclasses.replace(s, then=_number(s.then, numbered, tys),
                                           orelse=_number(s.orelse, numbered, tys)))
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            out.append(dataclasses.replace(s, body=_number(s.body, numbered, tys)))
        else:
            out.append(s)
    return tuple(out)


def _check_places(seq, arrays, name):
    """Refuse another read or write of an atomic max/min's target."""
    for s in ir.walk(seq):
        if isinstance(s, ir.Store) and s.array.name in arrays:
            if s.accumulate != CLAIM:
                _refuse_other(s.array.name, s.loc, name, "written")
        elif isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                s.expr.array.name in arrays:
            _refuse_other(s.expr.array.name, s.loc, name, "read")


def _refuse_other(arr, loc, name, how):
    raise DifferentiationError(
        f"the array '{arr}', target of cuda.atomic.max/min, is also {how} elsewhere in "
        "the kernel; kadj differentiates an atomic max/min on an array used by nothing "
        "else", kernel=name, loc=loc, construct=f"atomic.max/min target {how} elsewhere",
        remedy="give the atomic max/min its own output array")


def report(kernel, arg_names):
    """[{array, arg (its position), param, block, grid}] for the adjoint launch
    (JSON-able); block/grid: the thread dimensions the linear index is made of;
    ``numbered``: True when the contributions are numbered (:func:`attach`)."""
    from .threads import thread_dims
    block, grid = thread_dims(kernel)
    out = []
    for a in kernel.args:
        if a.startswith(_PREFIX):
            arr = a[len(_PREFIX):]
            e = {"array": arr, "arg": arg_names.index(arr), "param": a,
                 "block": list(block), "grid": list(grid)}
            if count_name(arr) in kernel.types:
                e["numbered"] = True
            out.append(e)
    return out


def extrema_of(comp):
    return comp.report.get("atomic_extrema") or []


def signature_extra(comp, fwd_types):
    """numba types of the adjoint's winner parameters."""
    return tuple(types.Array(types.int64, fwd_types[e["arg"]].ndim, "C")
                 for e in extrema_of(comp))


# ---- the launches before the adjoint -------------------------------------------------
def winners(k, comp, config, fwd):
    """The winner arrays of the adjoint launch ``config`` (passes 1 and 2 of the module
    doc), or () when the kernel has no atomic max/min."""
    from .. import arrays
    info = extrema_of(comp)
    if not info:
        return ()

    def copies():
        return [arrays.copy(a) if arrays.is_array(a) else a for a in fwd]

    final = copies()
    numbered = [e["array"] for e in info if e.get("numbered")]
    if numbered:
        _check_thread_count(k, config)
    k.dispatcher[config](*final)              # 1: the final values
    wins = [arrays.like(fwd[e["arg"]], np.full(fwd[e["arg"]].shape, _INT64_MAX,
                                               np.int64)) for e in info]
    claim = claim_kernel(k, [e["array"] for e in info], info[0]["block"],
                         info[0]["grid"], numbered)
    claim[config](*copies(), *[final[e["arg"]] for e in info], *wins)   # 2: winners
    return tuple(wins)


def _check_thread_count(k, config):
    """A numbered contribution's key is ``thread * 2**32 + number``: at most 2**31
    threads."""
    def size(d):
        d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
        return int(np.prod([int(x) for x in d]))
    griddim, blockdim = config[0], config[1]
    if size(griddim) * size(blockdim) >= 1 << 31:
        raise DifferentiationError(
            f"the adjoint launch [{griddim}, {blockdim}] has 2**31 threads or more; "
            "the winners of a cuda.atomic.max/min in a loop are numbered by thread "
            "below 2**31", kernel=k.__name__, construct="cuda.atomic.max/min in a loop",
            remedy="launch fewer threads (a grid-stride loop covers any size)")


def claim_kernel(k, arrays_, block, grid, numbered=()):
    """The claim kernel (module doc) of the differentiated kernel ``k``, compiled once."""
    cached = getattr(k, "_kadj_claim_kernel", None)
    if cached is not None:
        return cached
    from numba import cuda
    fn = _claim_function(k.py_func, arrays_, tid_text(block, grid, "_kadj_cuda"),
                         numbered)
    kern = cuda.jit(fn)
    k._kadj_claim_kernel = kern
    return kern


def claim_ptx(k, args, cc=(9, 0)):
    """PTX text of the claim kernel of ``k`` for the forward arguments ``args``
    (``numba.cuda.compile_ptx``; no GPU needed)."""
    from numba import cuda
    from .ptx_cc import for_cc
    comp = k.compiled(*args)
    info = extrema_of(comp)
    if not info:
        raise ValueError(f"{k.__name__} has no cuda.atomic.max/min")
    fn = _claim_function(k.py_func, [e["array"] for e in info],
                         tid_text(info[0]["block"], info[0]["grid"], "_kadj_cuda"),
                         [e["array"] for e in info if e.get("numbered")])
    fwd = tuple(k._arg_types(args))
    sig = fwd + tuple(fwd[e["arg"]] for e in info) + signature_extra(comp, fwd)
    with for_cc(cc):
        return cuda.compile_ptx(fn, sig, cc=cc)[0]


def _claim_function(py_func, arrays_, tid, numbered=()):
    try:
        src = textwrap.dedent(inspect.getsource(py_func))
    except (OSError, TypeError) as exc:
        raise DifferentiationError(
            f"the adjoint of cuda.atomic.max/min recomputes the kernel from its source, "
            f"which is not available ({exc})", kernel=py_func.__name__,
            construct="cuda.atomic.max/min in a kernel without source",
            remedy="define the kernel in a module file") from exc
    tree = ast.parse(src)
    fdef = tree.body[0]
    fdef.decorator_list = []
    for a in arrays_:
        fdef.args.args.append(ast.arg(arg=f"_kadj_final_{a}"))
    for a in arrays_:
        fdef.args.args.append(ast.arg(arg=f"_kadj_win_{a}"))
    claim = _Claim(set(arrays_), tid, set(numbered))
    claim.visit(fdef)
    fdef.body[:0] = [ast.parse(f"_kadj_n_{a} = 0").body[0] for a in sorted(numbered)]
    if sorted(set(claim.done)) != sorted(arrays_):
        # e.g. the atomic stands in a device function: no winner would be found
        raise DifferentiationError(
            "cuda.atomic.max/min must be called in the kernel's own body, on an argument "
            f"by its name (found for {sorted(claim.done)} of {sorted(arrays_)})",
            kernel=py_func.__name__, construct="cuda.atomic.max/min outside the kernel",
            remedy="call the atomic in the kernel, not in a device function")
    ast.fix_missing_locations(tree)
    from numba import cuda
    glb = dict(py_func.__globals__)
    glb["_kadj_cuda"] = cuda
    glb["_kadj_INT64"] = np.int64
    code = compile(tree, inspect.getsourcefile(py_func) or "<kadj claim>", "exec")
    exec(code, glb)
    return glb[fdef.name]


class _Claim(ast.NodeTransformer):
    """``cuda.atomic.max(arr, idx, v)`` -> claim the element when ``v`` won; the
    contributions to a numbered array are keyed ``thread * 2**32 + number`` as in the
    adjoint (:func:`_number`)."""

    def __init__(self, arrays_, tid, numbered=frozenset()):
        self.arrays, self.tid, self.numbered, self.done = arrays_, tid, numbered, []

    def visit_Expr(self, node):
        c = node.value
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                c.func.attr in ("max", "min") and isinstance(c.func.value, ast.Attribute) \
                and c.func.value.attr == "atomic" and len(c.args) == 3 and \
                isinstance(c.args[0], ast.Name) and c.args[0].id in self.arrays:
            a = c.args[0].id
            self.done.append(a)
            idx, val = ast.unparse(c.args[1]), ast.unparse(c.args[2])
            key = f"_kadj_INT64({self.tid})"
            text = f"_kadj_i = {idx}\n_kadj_v = {val}\n"
            if a in self.numbered:
                text += (f"_kadj_k = {key} * {_SLOT} + _kadj_n_{a}\n"
                         f"_kadj_n_{a} += 1\n")
                key = "_kadj_k"
            text += (f"if _kadj_v == _kadj_final_{a}[_kadj_i] and _kadj_v != {a}[_kadj_i]:\n"
                     f"    _kadj_cuda.atomic.min(_kadj_win_{a}, _kadj_i, {key})\n")
            return [ast.copy_location(s, node) for s in ast.parse(text).body]
        return node


def refuse_tangent(kernel_name, store):
    raise DifferentiationError(
        f"forward mode (jvp) of cuda.atomic.max/min on '{store.array.name}' is not "
        "supported: the tangent of the result is the winner's, which needs the "
        "winners found before the launch", kernel=kernel_name, loc=store.loc,
        construct="cuda.atomic.max/min in jvp",
        remedy="use reverse mode (k.adjoint) for this kernel")
