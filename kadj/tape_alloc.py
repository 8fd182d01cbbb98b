"""Cheaper tape code for a growable (host) tape, decided after :mod:`kadj.tape_plan`.

Rewrites that leave what the adjoint computes, and every push's coverage, unchanged
but give numba less to compile:

* :func:`unit_step_trips`: a reservation's trip count ``_trips(lo, hi, 1)`` (or step
  ``-1``) is written as the arithmetic it amounts to, ``max(0, hi - lo)`` (or
  ``max(0, lo - hi)``), instead of a call of the inlined helper.
* :func:`kadj.tape_merge.merge_later_reserves` (run first): later straight-line
  reservations whose amounts are known at an earlier one join it.
* :func:`allocate_at_first_reserve`: when the first thing the adjoint does with a
  tape is an unconditional reservation (the tape pointer is still 0 there), the tape
  is allocated there with exactly that size instead of being allocated in the
  prologue (:data:`kadj.lowering.GROWABLE_START` entries) and grown: an adjoint
  whose pushes are all covered by such reservations never calls ``_reserve``.
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from .lowering import TAPE_DTYPES

_TRIPS = "_trips("


def _call_args(text, start):
    """(arguments, end) of the call whose ``(`` ends at ``start``; None if unbalanced."""
    depth, args, k, begin = 1, [], start, start
    while k < len(text):
        c = text[k]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                args.append(text[begin:k].strip())
                return args, k + 1
        elif c == "," and depth == 1:
            args.append(text[begin:k].strip())
            begin = k + 1
        k += 1
    return None


def _atom(text):
    """``text`` as an operand of ``-``: itself when a name, number, call, item,
    attribute or group (kept as written), else parenthesized."""
    try:
        e = ast.parse(text, mode="eval").body
    except SyntaxError:
        return f"({text})"
    grouped = text.startswith("(") and text.endswith(")") and \
        _call_args(text, 1) == ([text[1:-1].strip()], len(text))
    if grouped or isinstance(e, (ast.Name, ast.Call, ast.Subscript, ast.Attribute)) or \
            (isinstance(e, ast.Constant) and not text.startswith("-")):
        return text
    return f"({text})"


def _int(text):
    try:
        return int(text)
    except ValueError:
        return None


def _unit_trip(lo, hi, step):
    """``range(lo, hi, step)``'s length as arithmetic for a step of 1 or -1, else None."""
    if step in ("1", "-1") and _int(lo) is not None and _int(hi) is not None:
        return str(max(0, (_int(hi) - _int(lo)) * int(step)))
    if step == "1":
        return f"max(0, {_atom(hi)})" if lo == "0" else f"max(0, {_atom(hi)} - {_atom(lo)})"
    if step == "-1":
        return f"max(0, {_atom(lo)} + 1)" if hi == "-1" else \
            f"max(0, {_atom(lo)} - {_atom(hi)})"
    return None


def unit_step_trips(text):
    """``text`` with each ``_trips(lo, hi, 1)`` / ``_trips(lo, hi, -1)`` spelled as
    arithmetic (innermost calls included); other calls are kept."""
    out, i = [], 0
    while True:
        j = text.find(_TRIPS, i)
        if j < 0 or (j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_.")):
            if j < 0:
                out.append(text[i:])
                return "".join(out)
            out.append(text[i:j + len(_TRIPS)])
            i = j + len(_TRIPS)
            continue
        found = _call_args(text, j + len(_TRIPS))
        if found is None or len(found[0]) != 3:
            out.append(text[i:j + len(_TRIPS)])
            i = j + len(_TRIPS)
            continue
        args, end = found
        lo, hi, step = (unit_step_trips(a) for a in args)
        arith = _unit_trip(lo, hi, step)
        out.append(text[i:j])
        out.append(arith if arith is not None else f"_trips({lo}, {hi}, {step})")
        i = end


# ---- allocation at the first reservation ---------------------------------------------
_ONCE = (A.Block, A.ReverseLoop)   # containers whose body runs once, unconditionally


def _first_uses(fn):
    """{kind: node}: the first node, in program order, that uses each tape kind (a
    push, pop, needed capacity check or reservation of that kind)."""
    first = {}
    for x in A.walk([fn]):
        if isinstance(x, (A.Push, A.Pop, A.PushArray, A.PopArray)):
            kinds = (x.kind,)
        elif isinstance(x, A.CapacityCheck):
            kinds = (x.kind,) if x.needed else ()
        elif isinstance(x, A.Reserve):
            kinds = tuple(x.amounts or ())
        else:
            continue
        for kind in kinds:
            first.setdefault(kind, x)
    return first


def straight_line(seq):
    """The nodes of ``seq`` that run exactly once, unconditionally, with the list each
    is in (bodies of :data:`_ONCE` containers included)."""
    for x in seq:
        yield x, seq
        if isinstance(x, _ONCE):
            yield from straight_line(x.body)


def allocate_at_first_reserve(fn):
    """Allocate each growable tape at its first use when that is an unconditional
    reservation at the function's top level (its pointer is still 0 there); its
    prologue declaration then only sets the pointer (see the module's doc)."""
    first = _first_uses(fn)
    chosen = {}
    for x, seq in straight_line(fn.body):
        if isinstance(x, A.Reserve):
            kinds = [k for k in sorted(x.amounts) if first.get(k) is x]
            if kinds:
                chosen[id(x)] = (x, seq, kinds)
    if not chosen:
        return
    done = set()
    for x, seq, kinds in chosen.values():
        at = next(i for i, y in enumerate(seq) if y is x)
        allocs = [A.Assign(f"_tape_{k}", f"np.empty({_size(x.amounts[k])}, "
                                         f"np.{TAPE_DTYPES[k]})") for k in kinds]
        x.amounts = {k: v for k, v in x.amounts.items() if k not in kinds}
        seq[at:at + 1] = allocs + ([x] if x.amounts else [])
        done.update(kinds)
    fn.prologue[:] = [y for x in fn.prologue for y in _declare(x, done)]


def _size(amount):
    """The tape's shape for exactly ``amount`` entries (what the reservation asked:
    later reservations and capacity checks grow it as they would have), written as a
    tuple so that it reads apart from the prologue's fixed starting size."""
    return f"({amount},)"


def _declare(x, allocated):
    """The prologue node ``x``; a growable tape allocated later only sets its pointer."""
    if isinstance(x, A.TapeDecl) and x.kind in allocated:
        return [A.Assign(f"_sp_{x.kind}", "0")]
    return [x]
