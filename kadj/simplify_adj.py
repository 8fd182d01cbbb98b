"""Readability passes over the adjoint IR that reorder adjoint statements (run first
by :func:`kadj.simplify.simplify`, before copy propagation).

* :func:`sink_resets`: ``adj_v = 0.0`` followed, with nothing between reading or
  assigning ``adj_v``, by ``adj_v += e`` becomes ``adj_v = e`` at the accumulation.
  The accumulation that defines ``adj_v`` anew then moves down past the later reads of
  the copies ``adj_t = adj_v`` taken before it (when nothing it passes reads or
  assigns ``adj_v`` or assigns what ``e`` reads), so that copy propagation can replace
  those copies by ``adj_v`` itself.  The reversed ``p = p * x + c[k]`` then reads
  ``adj_c[k] += adj_p; ...; adj_p = adj_p * x``, as written by hand.  A reset
  followed by ``adj_v += adj_t``, a copy of ``adj_v``'s value, is dropped with it.
* :func:`keep_readded_elements`: an element's adjoint read, consumed and added back
  whole (the adjoint of ``y[j] += v``: ``adj_t = adj_y[j]; adj_y[j] = 0.0; ...;
  adj_y[j] += adj_t``), with nothing between mentioning ``adj_y`` or assigning
  ``adj_t`` or what ``j`` reads, keeps its value: the reset and the addition go.

Each pass keeps the adjoint's meaning exactly; where it cannot be sure, it leaves the
code as built.
"""
from __future__ import annotations

import bisect

from . import adj_ir as A
from .adj_refs import DEF, FIXED, USE, lists, names, pure, roles_of
from .printer import target_text

_ZERO = "0.0"     # a float64 adjoint's reset (other precisions are left alone)


def sink_resets(fn):
    """``adj_v = 0.0 ... adj_v += e`` -> ``... adj_v = e`` (see the module docstring);
    then the new definitions move past the reads of ``adj_v``'s copies."""
    for seq in lists(fn):
        # what a compound statement of ``seq`` mentions, kept while ``seq`` is worked
        # on: only its own statements change then (moved, or an operator replaced)
        memo = {}
        where = None        # where each name is mentioned, until ``seq`` changes
        pos = 0
        while pos < len(seq):
            x = seq[pos]
            j = None
            if _is_reset(x):
                if where is None:
                    where = _Mentions(seq, memo)
                j = where.reset_use(pos)
            if j is None:
                pos += 1
                continue
            where = None
            acc = seq[j]
            acc.op = "="
            del seq[pos]
            if acc.value in _copies_of(seq, j - 1, acc.target.name, memo):
                del seq[j - 1]      # adj_v = adj_t, a copy of adj_v: nothing changes
            else:
                _sink_past_copies(seq, j - 1, memo)
    return fn


def _is_reset(x):
    return (isinstance(x, A.Assign) and isinstance(x.target, A.AdjVar) and x.op == "="
            and x.value == _ZERO)


def _mentions(x, memo=None):
    """{name: set of roles} over ``x`` and everything nested in it (read it, never
    change it: a compound statement's is kept in ``memo``)."""
    return _summary(x, memo)[0]


def _jumps(x, memo=None):
    return _summary(x, memo)[1]


def _summary(x, memo):
    """(:func:`_mentions`, whether a break, continue or return is in ``x``)."""
    if not x.children():    # (a plain statement: its own names, kept in ``memo``
        # while its target, operator and value are the same objects)
        key = (x, getattr(x, "target", None), getattr(x, "op", None),
               getattr(x, "value", None))
        got = memo.get(("plain", id(x))) if memo is not None else None
        if got is not None and all(a is b for a, b in zip(got[0], key)):
            return got[1]
        out = {}
        for n, role in roles_of(x):
            out.setdefault(n, set()).add(role)
        found = out, isinstance(x, (A.Break, A.Continue, A.Return))
        if memo is not None:
            memo[("plain", id(x))] = (key, found)
        return found
    compound = memo is not None
    if compound:
        got = memo.get(id(x))
        if got is not None and got[0] is x:
            return got[1]
    out, jumps = {}, False
    for y in A.walk([x]):
        jumps = jumps or isinstance(y, (A.Break, A.Continue, A.Return))
        for n, role in roles_of(y):
            out.setdefault(n, set()).add(role)
    if compound:
        memo[id(x)] = (x, (out, jumps))
    return out, jumps


class _Mentions:
    """The positions of ``seq``'s statements that mention each name, and how many
    statements before each position may leave the list (a break, continue or return
    in them); valid while ``seq`` does not change."""

    def __init__(self, seq, memo):
        self.seq = seq
        self.at = {}
        self.jumps = [0]
        for k, y in enumerate(seq):
            for name in _mentions(y, memo):
                self.at.setdefault(name, []).append(k)
            self.jumps.append(self.jumps[-1] + bool(_jumps(y, memo)))

    def reset_use(self, pos):
        """The position of the ``adj_v += e`` that the reset at ``pos`` can become: the
        next statement that mentions ``adj_v``, when it is such an accumulation and no
        statement up to it may leave the list; else None."""
        seq = self.seq
        v = seq[pos].target.name
        rows = self.at.get(v, ())
        k = bisect.bisect_right(rows, pos)
        if k == len(rows):
            return None
        j = rows[k]
        if self.jumps[j + 1] - self.jumps[pos + 1]:
            return None
        y = seq[j]
        if (isinstance(y, A.Accumulate) and y.op == "+=" and
                isinstance(y.target, A.AdjVar) and y.target.name == v and
                isinstance(y.value, str) and v not in names(y.value) and
                not y.children()):
            return j
        return None


def _copies_of(seq, j, v, memo):
    """Names ``c`` of the copies ``c = v`` (or copies of those) before position ``j``
    whose value is still ``v``'s at ``j`` (nothing between assigns ``v`` or ``c``)."""
    start = j
    while start > 0:
        m = _mentions(seq[start - 1], memo)
        if DEF in m.get(v, ()) or FIXED in m.get(v, ()) or _jumps(seq[start - 1], memo):
            break
        start -= 1
    out = set()
    for y in seq[start:j]:
        if _is_copy(y) and (y.value == v or y.value in out):
            out.add(y.target.name)
            continue
        out -= {n for n, roles in _mentions(y, memo).items() if roles & {DEF, FIXED}}
    return out


def _is_copy(y):
    return (isinstance(y, A.Accumulate) and y.op == "=" and
            isinstance(y.target, A.AdjVar) and isinstance(y.value, str) and
            not y.children())


def _sink_past_copies(seq, j, memo):
    """Move the definition ``adj_v = e`` at ``j`` below the last later read of a copy
    of ``adj_v``, if every statement it passes leaves it and ``e`` alone; and further
    down past the statements that use what those reads computed (``_acc_x +=
    adj_x_i`` after ``adj_x_i = adj_t * p``), as long as they too leave it alone, so
    that such single-use values can be folded into their use."""
    x = seq[j]
    v = x.target.name
    if not pure(x.value):
        return
    copies = _copies_of(seq, j, v, memo)
    if not copies:
        return
    reads = set(names(x.value))
    last = further = None
    tainted = set(copies)
    for k in range(j + 1, len(seq)):
        m = _mentions(seq[k], memo)
        used = {n for n, roles in m.items() if USE in roles}
        if copies & used:
            last = k
        if tainted & used:
            further = k
            tainted |= {n for n, roles in m.items() if roles & {DEF, FIXED}}
    if last is None:
        return

    def passes(y):
        m = _mentions(y, memo)
        return not (isinstance(y, A.Comment) or _jumps(y, memo) or v in m or any(
            m.get(n, set()) & {DEF, FIXED} for n in reads))

    if not all(passes(seq[k]) for k in range(j + 1, last + 1)):
        return
    while further is not None and last < further and passes(seq[last + 1]):
        last += 1
    # (popping it moves the statements after it up by one: it goes right after the
    # last statement it passes, now at ``last - 1``)
    seq.insert(last, seq.pop(j))


def keep_readded_elements(fn):
    """Drop the consumption and the re-addition of an element's adjoint that is added
    back whole (see the module docstring); returns the number of pairs dropped.  (The
    element ends as it began, bit for bit but for the sign of a zero.)"""
    dropped = 0
    for seq in lists(fn):
        pos = 0
        while pos < len(seq):
            pair = _readded(seq, pos)
            if pair is None:
                pos += 1
                continue
            seq[:] = [x for x in seq if x is not pair[0] and x is not pair[1]]
            dropped += 1
    return dropped


def _readded(seq, pos):
    """(the consumption, the re-addition) when ``seq[pos]`` reads an element's
    adjoint whole into a scalar (``adj_t = adj_y[j]``) that is later added back."""
    x = seq[pos]
    if not (isinstance(x, A.Accumulate) and x.op == "=" and
            isinstance(x.target, (A.AdjVar, A.Local))):
        return None
    v = x.target.name
    consume = None
    for y in seq[pos + 1:]:
        if consume is None:
            if isinstance(y, A.Consume) and x.value.strip() == target_text(y.target):
                consume, base = y, y.target.base
                fixed = set(names(" ".join(y.target.index_texts))) | {v}
                continue
            if isinstance(y, A.Comment):
                continue
            return None     # (the consumption follows the read)
        if isinstance(y, A.Accumulate) and y.op == "+=" and y.how in (None, "plain") \
                and isinstance(y.target, A.AdjElem) and y.value.strip() == v and \
                target_text(y.target) == target_text(consume.target):
            return consume, y
        mentioned = {n for z in A.walk([y]) for n, _role in roles_of(z)}
        assigned = {n for z in A.walk([y]) for n, role in roles_of(z) if role != USE}
        if base in mentioned or assigned & fixed or isinstance(y, (A.Break, A.Continue,
                                                                   A.Return)):
            return None
    return None
