"""The helpers through which a CPU adjoint allocates in memory its caller keeps.

:mod:`kadj.kept_memory` writes an adjoint's allocations as calls of these
(``_kept_array``, ``_kept_zeros``, ``_kept_copy``, ``_kept_like``,
``_kept_zeros_like``); :mod:`kadj.call_memory` passes the kept bytes ``keep`` (a
``uint8`` array) and ``need``, which says where each slot's region of them lies
(:func:`kadj.call_memory.layout`).  Each returns a C-ordered array in its slot's region
when the region is large enough, else new memory, as the allocation it replaces would
have made, and then notes the bytes it asked for in ``need[slot]`` and sets
``need[0]`` (the slots start at 1).

Each is a numba builtin (a typing template and a lowering, like
:mod:`kadj.sum_intrinsic`): the allocation is written in place at each call, a
comparison of the bytes asked for with the size of the slot's region, an array that
points into the region, and numba's own allocation when it is too small.  No function is
compiled for it and none is linked into the adjoint: a jitted helper called there
was linked into every adjoint that used it and optimised and compiled to machine code
again in each (a tenth to a quarter of such an adjoint's compile time).  A shape or
dtype these do not know (a dtype given as a string) is allocated by numba's
``np.empty`` / ``np.zeros`` as written.  Called from Python (an adjoint's source run
as plain Python) they do the same with NumPy.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.imputils import impl_ret_new_ref, lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature
from numba.np.arrayobj import _parse_shape

from .lean_lowering import ArrayFields

__all__ = ["_kept_array", "_kept_zeros", "_kept_copy", "_kept_like", "_kept_zeros_like"]


# ---- as Python -----------------------------------------------------------------------
def _region(keep, need, slot):
    """Slot ``slot``'s region of the kept bytes (:func:`kadj.call_memory.layout`): a
    1-D ``uint8`` view, empty when the layout gives it none."""
    from .call_memory import layout
    nslots = (need.shape[0] - 1) // 3
    if not 1 <= slot <= nslots:
        return keep[:0]
    _, offset, size_at = layout(nslots)
    at, size = int(need[offset(slot)]), int(need[size_at(slot)])
    if at < 0 or size < 0 or at + size > keep.shape[0]:
        return keep[:0]
    return keep[at:at + size]


def _array(keep, shape, dtype, need, slot):
    """An array of ``shape`` and ``dtype``: a view of slot ``slot``'s region of the
    kept bytes ``keep`` when it holds enough bytes, else new memory (``need[slot]``
    noted)."""
    shape = tuple(int(d) for d in np.atleast_1d(np.asarray(shape, dtype=np.int64)))
    dt = np.dtype(dtype)
    nbytes = dt.itemsize
    for d in shape:
        if d < 0:
            return np.empty(shape, dt)      # raises, as np.empty would
        nbytes *= d
    region = _region(keep, need, slot)
    if nbytes <= region.shape[0]:
        return region[:nbytes].view(dt).reshape(shape)
    if nbytes >= 2 ** 63:
        return np.empty(shape, dt)          # raises: too big
    if not 1 <= slot <= (need.shape[0] - 1) // 3:
        return np.empty(shape, dt)          # (a slot the layout does not have)
    if nbytes > need[slot]:
        need[slot] = nbytes        # what the caller's pool grows this slot to
    need[0] = 1                    # (slot 0: some slot asked for more than it keeps)
    return np.empty(shape, dt)


def _kept_array(keep, shape, dtype, need, slot):
    """``np.empty(shape, dtype)`` in kept memory."""
    return _array(keep, shape, dtype, need, slot)


def _kept_zeros(keep, shape, dtype, need, slot):
    """``np.zeros(shape, dtype)`` in kept memory."""
    a = _array(keep, shape, dtype, need, slot)
    a.fill(0)
    return a


def _kept_copy(keep, x, need, slot):
    """``x.copy()`` (C order) in kept memory."""
    a = _array(keep, x.shape, x.dtype, need, slot)
    a[...] = x
    return a


def _kept_like(keep, x, need, slot):
    """``np.empty_like(x)`` of a C-ordered ``x`` in kept memory."""
    return _array(keep, x.shape, x.dtype, need, slot)


def _kept_zeros_like(keep, x, need, slot):
    """``np.zeros_like(x)`` of a C-ordered ``x`` in kept memory."""
    return _kept_zeros(keep, x.shape, x.dtype, need, slot)


# ---- typing ---------------------------------------------------------------------------
def _dtype_of(ty):
    """The numba type of the elements a dtype argument names, or None."""
    if isinstance(ty, types.DType):
        return ty.dtype
    if isinstance(ty, types.NumberClass):
        return ty.instance_type
    return None


def _shape_rank(ty):
    """The rank of a shape argument (an integer, or a tuple of integers), or None."""
    if isinstance(ty, types.Integer):
        return 1
    if isinstance(ty, types.BaseTuple) and all(isinstance(t, types.Integer) for t in ty):
        return len(ty)
    return None


def _kept_args(keep, need, slot):
    return (isinstance(keep, types.Array) and keep.ndim == 1 and keep.dtype == types.uint8
            and isinstance(need, types.Array) and need.ndim == 1
            and isinstance(need.dtype, types.Integer) and isinstance(slot, types.Integer))


class _NewTemplate(AbstractTemplate):
    """``(keep, shape, dtype, need, slot)`` -> a C-ordered array; other shapes and
    dtypes: what numba's ``np.empty`` / ``np.zeros`` gives for ``(shape, dtype)``."""
    fallback = None

    def generic(self, args, kws):
        if kws or len(args) != 5 or not _kept_args(args[0], args[3], args[4]):
            return None
        keep, shape, dtype, need, slot = args
        rank, dt = _shape_rank(shape), _dtype_of(dtype)
        if rank is not None and dt is not None:
            return signature(types.Array(dt, rank, "C"), *args)
        found = self.context.resolve_function_type(self.fallback, (shape, dtype), {})
        return None if found is None else signature(found.return_type, *args)


class _LikeTemplate(AbstractTemplate):
    """``(keep, x, need, slot)`` -> a C-ordered array of ``x``'s shape and dtype."""

    def generic(self, args, kws):
        if kws or len(args) != 4 or not _kept_args(args[0], args[2], args[3]):
            return None
        x = args[1]
        if not isinstance(x, types.Array):
            return None
        return signature(types.Array(x.dtype, x.ndim, "C"), *args)


@infer_global(_kept_array)
class _KeptArrayTyping(_NewTemplate):
    fallback = np.empty


@infer_global(_kept_zeros)
class _KeptZerosTyping(_NewTemplate):
    fallback = np.zeros


for _fn in (_kept_copy, _kept_like, _kept_zeros_like):
    infer_global(_fn)(type(f"{_fn.__name__}_typing", (_LikeTemplate,), {}))


# ---- lowering -------------------------------------------------------------------------
def _allocate(context, builder, keepty, keep_v, retty, shapes, needty, need_v, slotty,
              slot_v):
    """The array of ``retty`` and ``shapes`` (intp values, checked non-negative): in its
    slot's region of the kept bytes when the region is large enough, else new
    (``need[slot]`` and ``need[0]`` noted), allocated as numba's ``np.empty`` allocates
    (its size computed in its order, its ``ValueError`` when the size overflows, its
    alignment, its ``MemoryError``).  A new reference either way.  The array is built
    as a value, its fields chosen by branch."""
    intp = types.intp
    dt = retty.dtype
    itemsize = context.get_constant(intp, context.get_abi_sizeof(context.get_data_type(dt)))
    count, overflow = context.get_constant(intp, 1), cgutils.false_bit
    for s in shapes:
        prod = builder.smul_with_overflow(count, s)
        count = builder.extract_value(prod, 0)
        overflow = builder.or_(overflow, builder.extract_value(prod, 1))
    prod = builder.smul_with_overflow(count, itemsize)
    nbytes = builder.extract_value(prod, 0)
    overflow = builder.or_(overflow, builder.extract_value(prod, 1))
    keep = ArrayFields(context, builder, keepty, keep_v, ("data", "meminfo", "nitems"))
    need = ArrayFields(context, builder, needty, need_v,
                       ("data", "shape", "strides", "nitems"))
    idx = context.cast(builder, slot_v, slotty, intp)
    at, size, known = _slot_region(context, builder, needty, need, idx, keep.nitems)
    fits = builder.and_(known, builder.and_(builder.not_(overflow),
                                            builder.icmp_signed("<=", nbytes, size)))
    with builder.if_else(fits, likely=True) as (kept, new):
        with kept:
            kept_data = builder.gep(keep.data, [at])
            # the view's own reference
            context.nrt.incref(builder, types.MemInfoPointer(types.voidptr), keep.meminfo)
            kept_block = builder.block
        with new:
            with builder.if_then(builder.and_(known, builder.not_(overflow))):
                ptr = cgutils.get_item_pointer(context, builder, needty, need, [idx])
                asked = context.cast(builder, nbytes, intp, needty.dtype)
                old = builder.load(ptr)
                builder.store(builder.select(builder.icmp_signed(">", asked, old), asked, old),
                              ptr)
                first = cgutils.get_item_pointer(context, builder, needty, need,
                                                 [context.get_constant(intp, 0)])
                builder.store(context.get_constant(needty.dtype, 1), first)
            with builder.if_then(overflow, likely=False):     # numba's np.empty's error
                context.call_conv.return_user_exc(builder, ValueError, (_TOO_BIG,))
            align = context.get_preferred_array_alignment(dt)
            new_meminfo = context.nrt.meminfo_alloc_aligned(builder, nbytes, align)
            new_data = context.nrt.meminfo_data(builder, new_meminfo)
            new_block = builder.block
    meminfo = builder.phi(keep.meminfo.type)
    meminfo.add_incoming(keep.meminfo, kept_block)
    meminfo.add_incoming(builder.bitcast(new_meminfo, keep.meminfo.type)
                         if new_meminfo.type != keep.meminfo.type else new_meminfo, new_block)
    data = builder.phi(keep.data.type)
    data.add_incoming(kept_data, kept_block)
    data.add_incoming(new_data, new_block)
    strides, acc = [None] * len(shapes), itemsize
    for k in range(len(shapes) - 1, -1, -1):
        strides[k] = acc
        acc = builder.mul(acc, shapes[k])
    model = context.data_model_manager[retty]
    ity = context.get_value_type(intp)
    fields = {"meminfo": meminfo, "parent": ir.Constant(context.get_value_type(types.pyobject), None),
              "nitems": count, "itemsize": itemsize,
              "data": builder.bitcast(data, context.get_data_type(dt).as_pointer()),
              "shape": cgutils.pack_array(builder, shapes, ty=ity),
              "strides": cgutils.pack_array(builder, strides, ty=ity)}
    value = ir.Constant(context.get_value_type(retty), ir.Undefined)
    for name, v in fields.items():
        value = builder.insert_value(value, v, model.get_field_position(name))
    return value


#: numba's message when an array's size overflows (``np.empty``)
_TOO_BIG = ("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum "
            "possible size.")


def _slot_region(context, builder, needty, need, idx, kept_bytes):
    """(offset, size, known) of slot ``idx``'s region (the entries
    :func:`kadj.call_memory.layout` gives, computed here in LLVM IR):
    ``known`` is false, and the region empty, when the layout has no such slot or gives
    it a region outside the kept bytes."""
    intp = types.intp
    ity = context.get_value_type(intp)
    zero, one, three = (ir.Constant(ity, v) for v in (0, 1, 3))
    nslots = builder.sdiv(builder.sub(need.nitems, one), three)
    known = builder.and_(builder.icmp_signed(">=", idx, one),
                         builder.icmp_signed("<=", idx, nslots))
    before = builder.block
    with builder.if_then(known, likely=True):
        def entry(k):
            ptr = cgutils.get_item_pointer(context, builder, needty, need, [k])
            return context.cast(builder, builder.load(ptr), needty.dtype, intp)
        at = entry(builder.add(nslots, idx))
        size = entry(builder.add(builder.add(nslots, nslots), idx))
        inside = builder.and_(
            builder.and_(builder.icmp_signed(">=", at, zero),
                         builder.icmp_signed(">=", size, zero)),
            builder.icmp_signed("<=", builder.add(at, size), kept_bytes))
        at, size = builder.select(inside, at, zero), builder.select(inside, size, zero)
        inside_block = builder.block
    out = []
    for v in (at, size):
        phi = builder.phi(ity)
        phi.add_incoming(v, inside_block)
        phi.add_incoming(zero, before)
        out.append(phi)
    return out[0], out[1], known


def _zero(context, builder, retty, value):
    ary = ArrayFields(context, builder, retty, value, ("data", "nitems", "itemsize"))
    size = builder.mul(ary.nitems, ary.itemsize)
    cgutils.memset(builder, ary.data, size, 0)


def _lower_new(zeros):
    def lower(context, builder, sig, args):
        retty = sig.return_type
        keepty, shapety, dtypety, needty, slotty = sig.args
        if _shape_rank(shapety) is None or _dtype_of(dtypety) is None:
            fn = np.zeros if zeros else np.empty
            fnty = context.typing_context.resolve_value_type(fn)
            fsig = fnty.get_call_type(context.typing_context, (shapety, dtypety), {})
            value = context.get_function(fnty, fsig)(builder, args[1:3])
            return impl_ret_new_ref(context, builder, retty, value)
        shapes = _parse_shape(context, builder, shapety, args[1])   # raises if negative
        value = _allocate(context, builder, keepty, args[0], retty, shapes, needty,
                          args[3], slotty, args[4])
        if zeros:
            _zero(context, builder, retty, value)
        return impl_ret_new_ref(context, builder, retty, value)
    return lower


def _lower_like(zeros, copy):
    def lower(context, builder, sig, args):
        retty = sig.return_type
        keepty, xty, needty, slotty = sig.args
        x = ArrayFields(context, builder, xty, args[1],
                        ("data", "shape", "strides", "nitems"))
        shapes = cgutils.unpack_tuple(builder, x.shape, xty.ndim)
        value = _allocate(context, builder, keepty, args[0], retty, shapes, needty,
                          args[2], slotty, args[3])
        if zeros:
            _zero(context, builder, retty, value)
        if copy:
            _copy_into(context, builder, xty, x, retty, value, shapes)
        return impl_ret_new_ref(context, builder, retty, value)
    return lower


def _copy_into(context, builder, xty, x, retty, value, shapes):
    """Copy ``x``'s elements into the new C-ordered array ``value``."""
    dst = ArrayFields(context, builder, retty, value, ("data", "strides"))
    if xty.layout == "C":
        itemsize = context.get_abi_sizeof(context.get_data_type(xty.dtype))
        cgutils.raw_memcpy(builder, dst.data, x.data, x.nitems, itemsize)
        return
    src_strides = cgutils.unpack_tuple(builder, x.strides, xty.ndim)
    dst_strides = cgutils.unpack_tuple(builder, dst.strides, retty.ndim)
    with cgutils.loop_nest(builder, shapes, context.get_value_type(types.intp)) as idx:
        src = cgutils.get_item_pointer2(context, builder, x.data, shapes, src_strides,
                                        xty.layout, idx)
        out = cgutils.get_item_pointer2(context, builder, dst.data, shapes, dst_strides,
                                        "C", idx)
        builder.store(builder.load(src), out)


lower_builtin(_kept_array, types.Array, types.Any, types.Any, types.Array,
              types.Integer)(_lower_new(False))
lower_builtin(_kept_zeros, types.Array, types.Any, types.Any, types.Array,
              types.Integer)(_lower_new(True))
lower_builtin(_kept_like, types.Array, types.Array, types.Array,
              types.Integer)(_lower_like(False, False))
lower_builtin(_kept_zeros_like, types.Array, types.Array, types.Array,
              types.Integer)(_lower_like(True, False))
lower_builtin(_kept_copy, types.Array, types.Array, types.Array,
              types.Integer)(_lower_like(False, True))
