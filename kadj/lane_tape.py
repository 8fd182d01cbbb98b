"""Tape addresses of jammed iterations computed from loop counters (kadj.lane_jam).

In a jammed iteration the lanes' tape values of one iteration lie in
``[_sp, _sp + lanes * P)`` (``P``: the values one iteration records), and the
iteration pops what it pushes, so the stack pointer need not move at all: a push's
address follows from its place.  :func:`layout` gives each push and pop of the
iteration an address text ``_sp_<kind> + offset + m * stride + slot + lane``, with ``m``
the forward iteration of its inner loop (for a pop in the mirrored reversed loop:
``trips - 1 - m'``).  Addresses that depend only on loop counters let the compiler see
the tape as plain strided arrays (no pointer carried from one push to the next).

Layouts handled: pushes at the top of the replayed iteration or directly in a loop of
step +-1 at its top level (not nested deeper, not in a branch), each mirrored by a pop
at the same place of the reverse part.  Anything else: None (the stack pointer moves).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from . import adj_ir as A
from . import lane_check


@dataclass
class Layout:
    """``index[id(push or pop)](lane)``: its address text; ``before[id(loop)]``: the
    statements to write before that loop of the replay (its trip count)."""
    index: dict = field(default_factory=dict)
    before: dict = field(default_factory=dict)


def layout(replay, reverse, lanes, taken):
    """The :class:`Layout` of one jammed iteration (``replay``: the replayed forward
    part's statements, ``reverse``: the reverse part's), or None."""
    fwd, rev = _units(replay, A.Push), _units(reverse, A.Pop)
    if fwd is None or rev is None or len(fwd) != len(rev):
        return None
    out = Layout()
    offset = {}                      # kind -> terms so far
    for u, v in zip(fwd, reversed(rev)):
        if u[0] != v[0]:
            return None
        if u[0] == "one":
            (_, push), (_, pop) = u, v
            if push.kind != pop.kind:
                return None
            base = _base(push.kind, offset)
            out.index[id(push)] = out.index[id(pop)] = _addr(base, "", 0)
            offset.setdefault(push.kind, []).append(str(lanes))
            continue
        (_, loop, pushes), (_, back, pops) = u, v
        if [x.kind for x in pushes] != [x.kind for x in reversed(pops)]:
            return None
        rf, rb = _range(loop), _range(back)
        if rf is None or rb is None:
            return None
        trips = _fresh("_trips", taken)
        a, b, s = rf
        out.before[id(loop)] = [A.Assign(trips, f"max(0, {_sub(b, a) if s > 0 else _sub(a, b)})")]
        m_fwd = _step_index(loop.var, a, s)
        m_back = f"{trips} - 1 - {_paren(_step_index(back.var, rb[0], rb[2]))}"
        per = {}
        for x in pushes:
            per[x.kind] = per.get(x.kind, 0) + 1
        slot = {}
        for x in pushes:
            k = slot.get(x.kind, 0)
            slot[x.kind] = k + 1
            stride = lanes * per[x.kind]
            out.index[id(x)] = _addr(_base(x.kind, offset), f"{_paren(m_fwd)} * {stride}",
                                     k * lanes)
        slot = {}
        for x in pops:
            k = slot.get(x.kind, 0)
            slot[x.kind] = k + 1
            stride = lanes * per[x.kind]
            out.index[id(x)] = _addr(_base(x.kind, offset), f"({m_back}) * {stride}",
                                     (per[x.kind] - 1 - k) * lanes)
        for kind, n in per.items():
            offset.setdefault(kind, []).append(f"{trips} * {lanes * n}")
    return out


def _units(seq, node_type):
    """The tape units of ``seq`` in order: ("one", push/pop) or ("loop", For, [its
    pushes/pops]); None when a push or pop is elsewhere (nested deeper, in a branch)."""
    out = []
    for x in seq:
        if isinstance(x, node_type):
            out.append(("one", x))
        elif isinstance(x, (A.Push, A.Pop)):
            return None
        elif isinstance(x, A.For):
            direct = [y for y in x.body if isinstance(y, (A.Push, A.Pop))]
            deeper = [y for z in x.body if not isinstance(z, (A.Push, A.Pop))
                      for y in A.walk([z]) if isinstance(y, (A.Push, A.Pop))]
            if deeper or any(not isinstance(y, node_type) for y in direct):
                return None
            if direct:
                out.append(("loop", x, direct))
        elif isinstance(x, (A.ReverseLoop, A.Block)):
            inner = _units(x.body, node_type)
            if inner is None:
                return None
            out.extend(inner)
        elif any(isinstance(y, (A.Push, A.Pop)) for c in x.children() for y in A.walk(c)):
            return None
    return out


def _range(loop):
    """(start, stop, step) texts of the ``for`` loop's ``range``, step +-1, or None."""
    return lane_check._range(loop.iter, simple=False)


def _paren(text):
    node = ast.parse(text, mode="eval").body
    return text if isinstance(node, (ast.Name, ast.Constant, ast.Call, ast.Subscript)) \
        else f"({text})"


def _sub(a, b):
    return a if b == "0" else f"{_paren(a)} - {_paren(b)}"


def _step_index(var, start, step):
    """The iteration number of ``var`` in a loop from ``start`` by ``step``."""
    return _sub(var, start) if step > 0 else _sub(start, var)


def _base(kind, offset):
    return " + ".join([f"_sp_{kind}"] + offset.get(kind, []))


def _addr(base, term, const):
    def at(lane):
        parts = [base] + ([term] if term else [])
        if const + lane:
            parts.append(str(const + lane))
        return " + ".join(parts)
    return at


def _fresh(name, taken):
    k, out = 1, name + "1"
    while out in taken:
        k += 1
        out = f"{name}{k}"
    taken.add(out)
    return out
