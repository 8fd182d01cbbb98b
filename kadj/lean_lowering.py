"""numba's lowering of a serial adjoint with less LLVM IR for the same machine code.

numba lowers each statement through helpers written for every case, which build more
LLVM IR than the case at hand needs; LLVM removes it again (SROA, dead code
elimination), after numba's Python has built it, printed it as text and LLVM has
parsed it.  An adjoint has two to three times its forward's statements, so this IR is
about a fifth of its compile.  :class:`LeanLower` is numba's lowering with four
things lowered as values instead, by numba's own functions where it has them:

* an element's read or write (``x[i]``, ``x[i, j]``: one integer per dimension of a
  plain array, a scalar read or written): numba stores the array's struct to a stack
  slot and loads back each field it reads (shape and strides twice), about thirty
  instructions; here the fields are read with ``extractvalue`` and numba's
  ``normalize_indices``, ``basic_indexing`` (the same wraparound of negative indices,
  bounds checks where numba checks bounds, address per layout), ``load_item`` and
  ``store_item`` do the rest;
* a ``range`` loop: numba builds the range, its iterator and each step's (value,
  valid) pair in stack slots and checks at every loop that the step is not zero; here
  they are values, with numba's arithmetic and branches (the trip count, the step's
  update), the check left out where the step is a nonzero constant, and the trip count
  of a loop whose step is the constant 1 computed as ``max(stop - start, 0)`` by a
  ``select`` instead of numba's branches (LLVM's loop vectoriser then sees it: a
  stencil adjoint's loops vectorise; with a select for other steps too, some reversed
  loops stopped vectorising, so those keep numba's branches);
* reference counts: numba's ``incref``/``decref`` of a value reads every field of its
  struct, of a value that holds no counted reference too, and a variable assigned more
  than once is loaded before each store (to release its old value) and zeroed when it
  dies; here a value without a counted reference gets none of that, and an array's
  count is its meminfo's alone;
* a pair's member (the loop step's value or flag) is read from the pair's value.

Everything else goes to numba's implementation as before.  The Python wrapper it
creates is named to the code library to be compiled without optimisation
(:meth:`kadj.lean_library.LeanCodeLibrary.leave_unoptimised`).  :class:`LeanNativeLowering`,
numba's lowering pass with this lowering class, replaces numba's in both of
:class:`kadj.ssa_free.AdjointCompiler`'s pipelines (``KADJ_LEAN_LOWERING=0`` keeps
numba's lowering, to compare).  What the adjoint computes is bit for bit the same, and
the optimised machine code runs as fast (tests/test_lean_lowering.py; README,
"Leaner LLVM IR").
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading

from llvmlite import ir as llir
from numba.core import cgutils, errors, types
from numba.core.compiler_machinery import register_pass
from numba.core.datamodel.models import ArrayModel
from numba.core.lowering import Lower
from numba.core.runtime.context import NRTContext
from numba.core.typed_passes import NativeLowering
from numba.np.arrayobj import basic_indexing, load_item, normalize_indices, store_item

from .lean_library import LeanCodeLibrary, wrapper_left_unoptimised

__all__ = ["ArrayFields", "LeanLower", "LeanNativeLowering", "enabled"]

_NUMBA_PATH = errors._numba_path    # (numba's own source: its locations are not kept)


def enabled():
    """Whether adjoints are lowered by :class:`LeanLower` (``KADJ_LEAN_LOWERING``,
    default on)."""
    return os.environ.get("KADJ_LEAN_LOWERING", "1") != "0"


class ArrayFields:
    """The named fields of an array's struct value, read with ``extractvalue`` where
    this is made (numba's ``make_array`` helper stores the value to a stack slot and
    loads each field from it): any of ``data``, ``shape``, ``strides``, ``nitems``,
    ``itemsize``, ``meminfo``, ``parent`` as attributes; with data, shape and
    strides, enough of numba's helper for its indexing functions (``basic_indexing``,
    ``cgutils.get_item_pointer``)."""

    def __init__(self, context, builder, aryty, value, names=("data", "shape", "strides")):
        model = context.data_model_manager[aryty]
        for name in names:
            setattr(self, name, builder.extract_value(value, model.get_field_position(name)))


def _element_index(context, aryty, idxty):
    """The index types of ``aryty[idxty]`` when it names one element (one integer per
    dimension of a plain array), else None."""
    if not isinstance(aryty, types.Array) or aryty.ndim < 1 or not isinstance(
            context.data_model_manager[aryty], ArrayModel):
        return None
    if isinstance(idxty, types.Integer):
        index_types = (idxty,)
    elif isinstance(idxty, types.BaseTuple) and all(
            isinstance(t, types.Integer) for t in idxty.types):
        index_types = tuple(idxty.types)
    else:
        return None
    if len(index_types) != aryty.ndim or not isinstance(
            aryty.dtype, (types.Float, types.Integer, types.Boolean)):
        return None
    return index_types


_lowering = threading.local()


def _lean_meminfos(context, builder, ty, val):
    """The (type, meminfo) pairs numba's reference counting finds in ``val`` (numba's
    ``NRTContext.get_meminfos``): none in a value whose type holds no counted
    reference, an array's meminfo field alone (its one counted member), without
    reading every member of the value on the way as numba does; else None (numba's
    answer)."""
    model = context.data_model_manager[ty]
    if not model.contains_nrt_meminfo():
        return []
    if isinstance(model, ArrayModel):
        return [(ty, builder.extract_value(val, model.get_field_position("meminfo")))]
    return None


@contextlib.contextmanager
def _lean_counts():
    outer = getattr(_lowering, "lean", False)
    _lowering.lean = True
    try:
        yield
    finally:
        _lowering.lean = outer


def _install():
    """Wrap numba's ``NRTContext.get_meminfos`` once: :func:`_lean_meminfos` on a
    thread inside :meth:`LeanLower.lower`, numba's own everywhere else."""
    if getattr(NRTContext.get_meminfos, "_kadj_lean", False):
        return
    numbas = NRTContext.get_meminfos

    def get_meminfos(self, builder, ty, val):
        if getattr(_lowering, "lean", False):
            found = _lean_meminfos(self._context, builder, ty, val)
            if found is not None:
                return found
        return numbas(self, builder, ty, val)

    get_meminfos._kadj_lean = True
    NRTContext.get_meminfos = get_meminfos


_install()


#: the range objects numba implements (numba.cpython.rangeobj), by their state types
_RANGES = (types.range_state32_type, types.range_state64_type,
           types.unsigned_range_state64_type)


def _constant_member(value, k):
    """Member ``k`` of a struct value built by ``insertvalue`` in this lowering, when it
    is a constant, else None."""
    while isinstance(value, llir.InsertValue):
        if value.indices == [k]:
            found = value.value
            return found if isinstance(found, llir.Constant) else None
        value = value.aggregate
    return None


class LeanLower(Lower):
    """numba's lowering with elements, range loops, reference counts and pairs lowered
    as values (the module's docstring)."""

    def _counted(self, ty):
        """Whether values of ``ty`` hold a reference numba counts (an array, a tuple of
        arrays...); numba's ``incref``/``decref`` of any other value emits nothing but
        unused reads of its fields."""
        known = self.__dict__.setdefault("_counted_types", {})
        found = known.get(ty)
        if found is None:
            found = known[ty] = self.context.data_model_manager[ty].contains_nrt_meminfo()
        return found

    def incref(self, typ, val):
        if self._counted(typ):
            super().incref(typ, val)

    def decref(self, typ, val):
        if self._counted(typ):
            super().decref(typ, val)

    # numba's reference counts in this function and its wrappers through
    # _lean_meminfos (the flag is this thread's, for as long as each runs)
    def lower(self):
        with _lean_counts():
            return super().lower()

    def lower_block(self, block):
        """numba's, without the error context numba enters (a generator's context
        manager) around each statement's lowering: it is entered only when one raises,
        to give the error numba's message; the location numba's implementations read
        (``errors.loc_info``) is kept as numba keeps it."""
        self.pre_block(block)
        for inst in block.body:
            self.loc = inst.loc
            if not inst.loc.filename.startswith(_NUMBA_PATH):
                errors.loc_info.update(inst=inst, loc=inst.loc)
            try:
                self.lower_inst(inst)
            except Exception:
                with errors.new_error_context(
                        'lowering "{inst}" at {loc}', inst=inst, loc=self.loc,
                        errcls_=functools.partial(errors.LoweringError, loc=self.loc)):
                    raise
        self.post_block(block)

    def create_cpython_wrapper(self, release_gil=False):
        with _lean_counts():
            super().create_cpython_wrapper(release_gil)
        if isinstance(self.library, LeanCodeLibrary) and wrapper_left_unoptimised():
            self.library.leave_unoptimised(self.fndesc.llvm_cpython_wrapper_name)

    def create_cfunc_wrapper(self):
        with _lean_counts():
            return super().create_cfunc_wrapper()

    def storevar(self, value, name, argidx=None):
        fetype = self.typeof(name)
        if argidx is not None or self._counted(fetype) or (
                name in self._singly_assigned_vars and not self._disable_sroa_like_opt):
            return super().storevar(value, name, argidx)
        # numba loads the old value to release it; this one holds nothing to release
        self._alloca_var(name, fetype)
        ptr = self.getvar(name)
        if value.type != ptr.type.pointee:
            return super().storevar(value, name, argidx)    # (numba's error)
        self.builder.store(value, ptr)

    def delvar(self, name):
        fetype = self.typeof(name)
        if self._counted(fetype):
            return super().delvar(name)
        # numba's bookkeeping, without the load, the release and the store of a zero
        # (which guards against releasing twice) of a value that holds nothing
        if name not in self._blk_local_varmap and not self._disable_sroa_like_opt:
            self._singly_assigned_vars.discard(name)
        self._alloca_var(name, fetype)

    def _element_pointer(self, aryty, ary, idxty, idx, index_types):
        builder, context = self.builder, self.context
        if len(index_types) == 1 and not isinstance(idxty, types.BaseTuple):
            indices = (idx,)
        else:
            indices = tuple(builder.extract_value(idx, k) for k in range(len(index_types)))
        index_types, indices = normalize_indices(context, builder, index_types, indices)
        fields = ArrayFields(context, builder, aryty, ary)
        ptr, shapes, _strides = basic_indexing(
            context, builder, aryty, fields, index_types, indices,
            boundscheck=context.enable_boundscheck)
        assert not shapes
        return ptr

    # ---- range loops ------------------------------------------------------------------
    def _lower_call_normal(self, fnty, expr, signature):
        if not (isinstance(fnty, types.Function) and fnty.typing_key is range
                and signature.return_type in _RANGES and not signature.recvr
                and expr.target is None):
            return super()._lower_call_normal(fnty, expr, signature)
        # numba's range object as a value ({start, stop, step}), not through a stack slot
        args = self.fold_call_args(fnty, signature, expr.args, expr.vararg, expr.kws)
        rty = signature.return_type
        int_type = rty.iterator_type.yield_type
        if len(args) == 1:
            args = [self.context.get_constant(int_type, 0), args[0]]
        if len(args) == 2:
            args = list(args) + [self.context.get_constant(int_type, 1)]
        value = llir.Constant(self.context.get_value_type(rty), llir.Undefined)
        for k, arg in enumerate(args):
            value = self.builder.insert_value(value, arg, k)
        return value

    def _range_iterator(self, rty, state):
        """numba's ``range.__iter__`` (``RangeIter.from_range_state``), the struct built
        as a value, the check of a zero step left out where the step is a nonzero
        constant, and a unit step's trip count computed by a select."""
        builder, context = self.builder, self.context
        int_type = rty.iterator_type.yield_type
        start, stop, step = (builder.extract_value(state, k) for k in range(3))
        startptr = cgutils.alloca_once(builder, start.type)
        builder.store(start, startptr)
        countptr = cgutils.alloca_once(builder, start.type)
        diff = builder.sub(stop, start)
        zero = context.get_constant(int_type, 0)
        one = context.get_constant(int_type, 1)
        pos_diff = builder.icmp_signed(">", diff, zero)
        pos_step = builder.icmp_signed(">", step, zero)
        sign_differs = builder.xor(pos_diff, pos_step)
        known = _constant_member(state, 2)
        if known is None or not known.constant:
            zero_step = builder.icmp_unsigned("==", step, zero)
            with cgutils.if_unlikely(builder, zero_step):
                context.call_conv.return_user_exc(builder, ValueError,
                                                  ("range() arg 3 must not be zero",))
        if known is not None and known.constant == 1:
            # a unit step: the trip count is max(stop - start, 0), as a select (numba's
            # branches hide it from LLVM's loop vectoriser: stencil loops stay scalar)
            builder.store(builder.select(sign_differs, zero, diff), countptr)
            return self._iterator_value(rty, startptr, stop, step, countptr)
        with builder.if_else(sign_differs) as (then, orelse):
            with then:
                builder.store(zero, countptr)
            with orelse:
                rem = builder.srem(diff, step)
                rem = builder.select(pos_diff, rem, builder.neg(rem))
                uneven = builder.icmp_signed(">", rem, zero)
                count = builder.add(builder.sdiv(diff, step), builder.select(uneven, one, zero))
                builder.store(count, countptr)
        return self._iterator_value(rty, startptr, stop, step, countptr)

    def _iterator_value(self, rty, startptr, stop, step, countptr):
        value = llir.Constant(self.context.get_value_type(rty.iterator_type), llir.Undefined)
        for k, member in enumerate((startptr, stop, step, countptr)):
            value = self.builder.insert_value(value, member, k)
        return value

    def _range_next(self, pairty, it):
        """numba's ``iternext`` of a range iterator, the iterator and the pair read and
        built as values."""
        builder = self.builder
        iterptr, step, countptr = (builder.extract_value(it, k) for k in (0, 2, 3))
        count = builder.load(countptr)
        valid = builder.icmp_signed(">", count, llir.Constant(count.type, 0))
        before = builder.block
        with builder.if_then(valid):
            current = builder.load(iterptr)
            builder.store(builder.sub(count, llir.Constant(count.type, 1), flags=["nsw"]),
                          countptr)
            builder.store(builder.add(current, step), iterptr)
            inside = builder.block
        value = builder.phi(current.type)
        value.add_incoming(current, inside)
        value.add_incoming(llir.Constant(current.type, 0), before)
        pair = llir.Constant(self.context.get_value_type(pairty), llir.Undefined)
        return builder.insert_value(builder.insert_value(pair, value, 0), valid, 1)

    def lower_expr(self, resty, expr):
        op = expr.op
        if op in ("getiter", "iternext"):
            sig = self.fndesc.calltypes[expr]
            [fty] = sig.args
            if (fty in _RANGES) if op == "getiter" else (
                    isinstance(fty, types.RangeIteratorType)
                    and any(fty == r.iterator_type for r in _RANGES)):
                cast = self.context.cast
                val = cast(self.builder, self.loadvar(expr.value.name),
                           self.typeof(expr.value.name), fty)
                res = (self._range_iterator(fty, val) if op == "getiter"
                       else self._range_next(sig.return_type, val))
                return cast(self.builder, res, sig.return_type, resty)
        elif op in ("pair_first", "pair_second") and isinstance(
                self.typeof(expr.value.name), types.Pair):
            # numba copies the pair to a stack slot to read one member
            res = self.builder.extract_value(self.loadvar(expr.value.name),
                                             0 if op == "pair_first" else 1)
            self.incref(resty, res)
            return res
        return super().lower_expr(resty, expr)

    # ---- elements -----------------------------------------------------------------------
    def lower_getitem(self, resty, expr, value, index, signature):
        aryty, idxty = signature.args
        index_types = _element_index(self.context, aryty, idxty)
        if index_types is None or signature.return_type != aryty.dtype:
            return super().lower_getitem(resty, expr, value, index, signature)
        cast = self.context.cast
        ary = cast(self.builder, self.loadvar(value.name), self.typeof(value.name), aryty)
        idx = cast(self.builder, self.loadvar(index.name), self.typeof(index.name), idxty)
        ptr = self._element_pointer(aryty, ary, idxty, idx, index_types)
        res = load_item(self.context, self.builder, aryty, ptr)
        return cast(self.builder, res, signature.return_type, resty)

    def lower_setitem(self, target_var, index_var, value_var, signature):
        aryty, idxty, valty = signature.args
        index_types = _element_index(self.context, aryty, idxty)
        targetty = self.typeof(target_var.name)
        if index_types is None or isinstance(targetty, types.Optional) or not isinstance(
                valty, (types.Number, types.Boolean)):
            return super().lower_setitem(target_var, index_var, value_var, signature)
        cast, builder = self.context.cast, self.builder
        ary = self.loadvar(target_var.name)
        idx = cast(builder, self.loadvar(index_var.name), self.typeof(index_var.name), idxty)
        val = cast(builder, self.loadvar(value_var.name), self.typeof(value_var.name), valty)
        ptr = self._element_pointer(aryty, ary, idxty, idx, index_types)
        store_item(self.context, builder, aryty, cast(builder, val, valty, aryty.dtype), ptr)


@register_pass(mutates_CFG=True, analysis_only=False)
class LeanNativeLowering(NativeLowering):
    """numba's lowering pass with :class:`LeanLower` (numba's own with
    ``KADJ_LEAN_LOWERING=0``)."""
    _name = "kadj_native_lowering"

    @property
    def lowering_class(self):
        return LeanLower if enabled() else Lower
