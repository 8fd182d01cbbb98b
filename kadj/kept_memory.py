"""A host adjoint's arrays taken from memory its caller keeps (:mod:`kadj.call_memory`).

:func:`keep_memory` is the last rewrite of a CPU adjoint before it is printed.  Every
array the adjoint allocates where it runs once and unconditionally (its prologue, or
the straight-line part of its body: what :mod:`kadj.tape_alloc` and
:mod:`kadj.lane_jam` make) gets a slot, a region of the kept bytes ``_keep_bytes`` (one
``uint8`` parameter for all of them, whose layout ``_keep_need`` gives), and the
allocation takes its memory from there (the docstring names the slots in order):

===============================================  ========================================
allocation                                       kept
===============================================  ========================================
``_tape_f64 = np.empty((n,), np.float64)``       ``_kept_array(_keep_bytes, n, ...)``
growable tape's first (prologue) allocation      all of its region when more
``x_work = x.copy()``                            ``_kept_copy(_keep_bytes, x, ...)``
``x_work = np.empty_like(x)``                    ``_kept_like(_keep_bytes, x, ...)``
``adj_t = np.zeros_like(t)``                     ``_kept_zeros_like(_keep_bytes, t, ...)``
``t = np.empty(shape[, dtype])``, ``np.zeros``   ``_kept_array`` / ``_kept_zeros``
===============================================  ========================================

A helper returns a view of its region when it is large enough, else new memory (so an
adjoint called without kept memory allocates exactly what it did before, and a
bounds-checked run still catches a write past a tape's reservation); each notes the
bytes it asked for in ``_keep_need`` when they were more than it keeps (and sets its
entry 0), from which the pool lays the regions out anew after the call.  Each growth of a
kept tape (a reservation or capacity check calling ``_reserve``) notes the grown tape's
size too.

Only names allocated once are kept (a tape, referred to only by its own name, may be
allocated again at a later straight-line point: its earlier memory is dead then); the
array the ``_like`` and ``copy`` forms start from must be C-ordered or any-ordered
(their copies are C-ordered, as numba makes them; an F-ordered one keeps its own).
Allocations anywhere else (in a loop, under a condition, in an outlined helper) are left
as they were.
"""
from __future__ import annotations

import ast
import re

from numba.core import types as nbtypes

from . import adj_ir as A
from . import expr_text
from .call_memory import BYTES, NEED, SLOTS_LINE, layout
from .lowering import GROWABLE_START, TAPE_DTYPES
from .tape_alloc import straight_line

_TAPE = re.compile(r"np\.empty\(\((.+),\), np\.(\w+)\)")
_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8}
_LIKE = {"empty_like": "_kept_like", "zeros_like": "_kept_zeros_like"}
_NEW = {"empty": "_kept_array", "zeros": "_kept_zeros"}
_HELPERS = ("_kept_array", "_kept_zeros", "_kept_copy", "_kept_like", "_kept_zeros_like")


def _call(text):
    """(function text, [argument texts], {keyword: text}) of a call expression, or None."""
    e = expr_text.parse(text)
    if not isinstance(e, ast.Call) or any(k.arg is None for k in e.keywords) or \
            any(isinstance(a, ast.Starred) for a in e.args):
        return None
    return (ast.unparse(e.func), [ast.unparse(a) for a in e.args],
            {k.arg: ast.unparse(k.value) for k in e.keywords})


def _c_ordered(name, layouts):
    t = layouts.get(name)
    return isinstance(t, nbtypes.Array) and t.layout in "CA"


def _rewrite(x, slot, nslots, in_prologue, layouts):
    """The kept form of allocation ``x`` (its value text) in slot ``slot`` (0-based) of
    ``nslots``, or None when ``x`` is not an allocation kept memory can serve."""
    if not (isinstance(x, A.Assign) and x.op == "=" and isinstance(x.target, str)):
        return None
    keep = BYTES
    tail = f"{NEED}, {slot + 1}"     # (need[0] says that some slot needs more)
    m = _TAPE.fullmatch(x.value)
    if x.target.startswith("_tape_"):
        kind = x.target[len("_tape_"):]
        if m is None or TAPE_DTYPES.get(kind) != m.group(2):
            return None
        n = m.group(1)
        if in_prologue and n == str(GROWABLE_START):     # growable: all its region
            size = layout(nslots)[2](slot + 1)
            n = f"max({n}, {NEED}[{size}] // {_ITEMSIZE[m.group(2)]})"
        return f"_kept_array({keep}, {n}, np.{m.group(2)}, {tail})"
    call = _call(x.value)
    if call is None:
        return None
    func, args, kw = call
    if func.endswith(".copy") and not args and not kw and \
            _c_ordered(func[:-len(".copy")], layouts):
        return f"_kept_copy({keep}, {func[:-len('.copy')]}, {tail})"
    if func.startswith("np.") and func[3:] in _LIKE and len(args) == 1 and not kw and \
            _c_ordered(args[0], layouts):
        return f"{_LIKE[func[3:]]}({keep}, {args[0]}, {tail})"
    if func.startswith("np.") and func[3:] in _NEW and 1 <= len(args) + len(kw) <= 2 and \
            set(kw) <= {"shape", "dtype"} and "shape" not in kw:
        dtype = args[1] if len(args) == 2 else kw.get("dtype", "np.float64")
        return f"{_NEW[func[3:]]}({keep}, {args[0]}, {dtype}, {tail})"
    return None


def keep_memory(fn, ns, layouts):
    """Rewrite ``fn`` (see the module's doc); ``layouts`` maps the source's array names
    to their numba types, ``ns`` gets the helpers.  The two parameters' names are
    reserved (:data:`kadj.adj_naming.RESERVED_NAMES`): a kernel's own names never take
    them.  Returns the kept names, in slot order."""
    once = {id(x) for x in fn.prologue} | {id(x) for x, _ in straight_line(fn.body)}
    prologue = {id(x) for x in fn.prologue}
    found = {}          # target -> [allocation nodes]
    everywhere = {}     # target -> number of assignments anywhere
    for x in A.walk(fn.prologue + fn.body):
        if isinstance(x, A.Assign) and isinstance(x.target, str):
            everywhere[x.target] = everywhere.get(x.target, 0) + 1
            if id(x) in once and _rewrite(x, 0, 1, id(x) in prologue, layouts):
                found.setdefault(x.target, []).append(x)
    kept = [t for t in found if everywhere[t] == len(found[t]) and
            (len(found[t]) == 1 or t.startswith("_tape_"))]
    if not kept:
        return ()
    slot = {t: j for j, t in enumerate(kept)}
    for t in kept:
        for x in found[t]:
            x.value = _rewrite(x, slot[t], len(kept), id(x) in prologue, layouts)
    tapes = {t[len("_tape_"):]: slot[t] for t in kept if t.startswith("_tape_")}
    if tapes:
        fn.prologue[:] = _grown(fn.prologue, tapes)
        fn.body[:] = _grown(fn.body, tapes)
    fn.params = tuple(fn.params) + (BYTES, NEED)
    names = [t.lstrip("_") for t in kept]
    fn.doc = f"{fn.doc}\n\n    {SLOTS_LINE}{', '.join(names)}."
    from . import kept_helpers
    ns.update({h: getattr(kept_helpers, h) for h in _HELPERS})
    return tuple(kept)


def _grown(seq, slot):
    """``seq`` with each reservation or needed capacity check of a kept tape written
    out, noting the grown tape's bytes in ``_keep_need``."""
    out = []
    for x in seq:
        if isinstance(x, A.Reserve) and x.amounts and set(x.amounts) & set(slot):
            out += [_growth(kind, amount, slot) for kind, amount in sorted(x.amounts.items())]
            continue
        if isinstance(x, A.CapacityCheck) and x.needed and x.kind in slot:
            out.append(_growth(x.kind, "1", slot))
            continue
        for body in x.children():
            body[:] = _grown(body, slot)
        out.append(x)
    return out


def _growth(kind, amount, slot):
    tape, sp = f"_tape_{kind}", f"_sp_{kind}"
    grow = [A.Assign(tape, f"_reserve({tape}, {sp} + {amount})")]
    if kind in slot:
        j = slot[kind] + 1
        grow += [A.Assign(f"{NEED}[{j}]", f"max({NEED}[{j}], {tape}.nbytes)"),
                 A.Assign(f"{NEED}[0]", "1")]
    return A.If(f"{sp} + {amount} > {tape}.shape[0]", grow)
