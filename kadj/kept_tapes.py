"""A host adjoint's tapes taken from memory its caller keeps (:mod:`kadj.tape_pool`).

:func:`keep_tapes` is the last rewrite of a CPU adjoint before it is printed.  For each
tape kind allocated only where the function runs once and unconditionally (its prologue,
or the straight-line part of its body: what :mod:`kadj.tape_alloc` and
:mod:`kadj.lane_jam` produce), it adds a parameter ``_keep_<kind>``, and one
``_keep_need`` for all of them, and rewrites

* an allocation of exactly ``n`` entries, ``_tape_f64 = np.empty((n,), np.float64)``,
  as ``_tape_f64 = _kept(_keep_f64, n, _keep_need, 0)``: the first ``n`` entries of the
  kept array when it holds them, else new memory of ``n`` entries, as before (so a
  bounds-checked run still catches a push past its reservation);
* the growable tape's first allocation (prologue, :data:`kadj.lowering.GROWABLE_START`
  entries) as ``_kept(_keep_f64, max(1024, _keep_f64.shape[0]), _keep_need, 0)``: all of
  the kept array when it is larger (a growable tape's pushes are all checked against its
  capacity), so that a call like the last one does not grow it again;
* each growth of a kept tape (a reservation or capacity check that calls ``_reserve``)
  to note its new size in ``_keep_need``.

``_kept`` notes in ``_keep_need[slot]`` the entries each allocation asked for; the pool
grows the kept array to it after the call.  Tapes allocated anywhere else (in a loop,
under a condition, in a parallel loop or an outlined helper) are left as they were.
"""
from __future__ import annotations

import re

from . import adj_ir as A
from .lowering import GROWABLE_START, TAPE_DTYPES
from .tape_alloc import straight_line
from .tape_pool import NEED, PREFIX

_ALLOC = re.compile(r"np\.empty\(\((.+),\), np\.(\w+)\)")


def _tape_kind(x):
    """The kind of tape the node ``x`` allocates (``_tape_<kind> = np.empty(...)``)."""
    if isinstance(x, A.Assign) and x.op == "=" and isinstance(x.target, str) and \
            x.target.startswith("_tape_") and _ALLOC.fullmatch(x.value):
        kind = x.target[len("_tape_"):]
        if TAPE_DTYPES.get(kind) == _ALLOC.fullmatch(x.value).group(2):
            return kind
    return None


def keep_tapes(fn, ns):
    """Rewrite ``fn`` (see the module's doc); ``ns`` gets the ``_kept`` helper.
    Returns the kinds kept, in parameter order."""
    once = {id(x) for x in fn.prologue} | {id(x) for x, _ in straight_line(fn.body)}
    allocs = [x for x in A.walk(fn.prologue + fn.body) if _tape_kind(x)]
    kinds = sorted({_tape_kind(x) for x in allocs})
    refused = {_tape_kind(x) for x in allocs if id(x) not in once}
    kinds = [k for k in kinds if k not in refused]
    if not kinds:
        return ()
    slot = {k: j for j, k in enumerate(kinds)}
    prologue_ids = {id(x) for x in fn.prologue}
    for x in allocs:
        kind = _tape_kind(x)
        if kind not in slot:
            continue
        n = _ALLOC.fullmatch(x.value).group(1)
        keep = f"{PREFIX}{kind}"
        if id(x) in prologue_ids and n == str(GROWABLE_START):
            n = f"max({n}, {keep}.shape[0])"
        x.value = f"_kept({keep}, {n}, {NEED}, {slot[kind]})"
    fn.prologue[:] = _grown(fn.prologue, slot)
    fn.body[:] = _grown(fn.body, slot)
    fn.params = tuple(fn.params) + tuple(f"{PREFIX}{k}" for k in kinds) + (NEED,)
    from .runtime_helpers import _kept
    ns["_kept"] = _kept
    return tuple(kinds)


def _grown(seq, slot):
    """``seq`` with each reservation or needed capacity check of a kept kind written
    out, noting the grown tape's size in ``_keep_need``."""
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
        grow.append(A.Assign(f"{NEED}[{slot[kind]}]",
                             f"max({NEED}[{slot[kind]}], {tape}.shape[0])"))
    return A.If(f"{sp} + {amount} > {tape}.shape[0]", grow)
