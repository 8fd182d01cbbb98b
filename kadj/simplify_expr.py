"""Readability passes that rebuild expressions (run by :func:`kadj.simplify.simplify`).

* :func:`drop_bool_casts`: ``t2 = bool(t1)`` after the comparison ``t1 = a < b`` is
  dropped and ``t2`` read as ``t1``.
* :func:`unwrap_bool_of_compare`: ``t = bool(a < b)``, left by folding a comparison
  into its cast, becomes ``t = a < b``.
* :func:`fold_single_uses`: a temporary defined once and read once, later in the same
  statement list, is replaced by its expression (``t5 = i - 1; t6 = u[t5]`` becomes
  ``t6 = u[i - 1]``), parenthesised by precedence (:mod:`kadj.expr_text`), within
  :data:`WIDTH` characters.  Primal temporaries (Numba's, printed ``t<n>``) fold into
  primal statements only; adjoint temporaries (``adj_t7 = -adj_t11``) into adjoint
  statements only.  Never into a tape push or pop, a loop header or a condition, never
  across a loop or branch, never past a statement that may change what the expression
  reads (an assignment to one of its names, a store to memory when it reads memory, a
  tape operation, a barrier, a call).
* :func:`inline_index_offsets`: ``t4 = i - 1`` spelled out in every statement after it
  that reads it (a value or an element's index), in its own statement list.
* :func:`merge_accumulations`: ``adj_u[i] += a`` ... ``adj_u[i] += b`` in one statement
  list becomes one ``adj_u[i] += a + b`` (plain accumulations), when nothing between
  reads ``adj_u`` or changes ``i``, ``a`` or ``b``.
* :func:`drop_orphan_comments`: a source-line comment whose statements all went.

Each pass keeps the adjoint's meaning; where it cannot be sure, it leaves the code.
"""
from __future__ import annotations

import functools
import re

from . import adj_ir as A
from . import expr_text as E
from .adj_refs import DEF, FIXED, USE, Index, lists, names, pure, rewrite

WIDTH = 70
_TEMP = re.compile(r"t\d+(_\d+)?\Z")
_ADJ_TEMP = re.compile(r"adj_\w+\Z")
_TAPE = "<tape>"
_MEMORY = "<memory>"
_ALL = "<all>"


# ---- what a statement may change ----------------------------------------------------------
def _target_writes(t):
    if isinstance(t, (A.AdjVar, A.Local)):
        return {t.name}
    if isinstance(t, A.AdjElem):
        return {t.base, _MEMORY}
    if isinstance(t, str):
        return set(names(t)) | ({_MEMORY} if "[" in t else set())
    return {_ALL}


def _writes(x):
    """What ``x`` and the statements inside it may change: names, memory, the tape."""
    out = set()
    for y in A.walk([x]):
        if isinstance(y, (A.Assign, A.Accumulate)):
            out |= _target_writes(y.target)
            if getattr(y, "how", None) == "atomic":
                out.add(_MEMORY)
        elif isinstance(y, A.Consume):
            out |= _target_writes(y.target)
        elif isinstance(y, A.For):
            out |= _target_writes(y.var)
        elif isinstance(y, A.Pop):
            out |= _target_writes(y.target) | {_TAPE}
        elif isinstance(y, (A.Push, A.Reserve, A.CapacityCheck)):
            out.add(_TAPE)
        elif isinstance(y, (A.PushArray, A.PopArray)):
            out |= set(names(y.var)) | set(names(y.elem)) | {_TAPE, _MEMORY}
        elif isinstance(y, A.Barrier):
            out.add(_MEMORY)
        elif isinstance(y, (A.Comment, A.If, A.While, A.Return, A.Break, A.Continue,
                            A.Pass, A.ReverseLoop, A.Block)):
            pass
        else:
            out.add(_ALL)
        for text in _texts(y):
            if not pure(text):
                out.add(_ALL)
    return out


def _texts(y):
    for f in ("value", "cond", "iter", "zero", "elem"):
        v = getattr(y, f, None)
        if isinstance(v, str):
            yield v


def _reads_memory(text):
    """Whether ``text`` may read an array element or an attribute (a number's point and
    a math function's name are neither)."""
    text = re.sub(r"(?<![\w.])(math|np)\.\w+\s*\(", "(", text)
    return "[" in text or "." in re.sub(r"\d\.\d|\d\.(?!\w)", "", text)


def _stable(seq, start, stop, text):
    """Nothing in ``seq[start:stop]`` may change the value of the expression ``text``."""
    reads = set(names(text))
    for x in seq[start:stop]:
        w = _writes(x)
        if _ALL in w or reads & w or (_MEMORY in w and _reads_memory(text)):
            return False
        if _TAPE in w and any(n.startswith(("_tape", "_sp")) for n in reads):
            return False
    return True


# ---- t2 = bool(t1) ---------------------------------------------------------------------------
_BOOL = re.compile(r"bool\((\w+)\)\Z")


def drop_bool_casts(fn, idx=None):
    """``idx``: the function's :class:`~kadj.adj_refs.Index`, when the caller keeps one."""
    _repeat(_drop_one_bool_cast, fn, idx or Index(fn))


def _drop_one_bool_cast(fn, idx):
    temps = fn.temps
    params = set(fn.params)
    for seq in idx.lists():
        for pos in range(1, len(seq)):
            x, prev = seq[pos], seq[pos - 1]
            if not (_is_temp_def(x, temps) and _is_temp_def(prev, temps)):
                continue
            m = _BOOL.match(x.value)
            if not m or m.group(1) != prev.target or not isinstance(
                    E.parse(prev.value), E.ast.Compare):
                continue
            occ = idx.occ()
            t1, t2 = prev.target, x.target
            if t1 in params or t2 in params or _defs(occ, t1, temps) != [prev] or \
                    _defs(occ, t2, temps) != [x]:
                continue
            others = [(r, n) for r, n in occ.get(t2, ()) if n is not x]
            if any(r != USE for r, _ in others):
                continue
            for _, node in others:
                rewrite(node, t2, t1)
            idx.touch([node for _, node in others])
            idx.delete(seq, pos)
            return True
    return False


def unwrap_bool_of_compare(fn, idx=None):
    """``t = bool(a < b)`` (a comparison folded into the cast after the cast's own pass
    ran) becomes ``t = a < b``: the comparison of two numbers is a boolean already.
    ``idx``: the function's :class:`~kadj.adj_refs.Index`, told of each change."""
    for x in A.walk(fn.prologue + fn.body):
        if isinstance(x, A.Assign) and x.op == "=" and isinstance(x.value, str) and \
                x.value.startswith("bool(") and x.value.endswith(")"):
            tree = E.parse(x.value)
            if isinstance(tree, E.ast.Call) and isinstance(tree.func, E.ast.Name) and \
                    tree.func.id == "bool" and len(tree.args) == 1 and \
                    not tree.keywords and isinstance(tree.args[0], E.ast.Compare):
                inner = x.value[len("bool("):-1].strip()
                if E.parse(inner) is not None:
                    x.value = inner
                    if idx is not None:
                        idx.touch([x])


def _repeat(step, fn, idx, *args):
    """Run ``step(fn, idx, *args)`` (one rewrite, True when it made one) until it makes
    none: each rewrite tells the index (``idx``: a :class:`~kadj.adj_refs.Index`) what
    it changed, so positions and occurrences stay valid."""
    while step(fn, idx, *args):
        pass


def _is_temp_def(x, temps):
    """``x`` defines a temporary: a ``t<n>`` or a name in ``temps`` (the kernel's
    temporaries, :attr:`kadj.adj_naming.Naming.temp_names`)."""
    return (isinstance(x, A.Assign) and x.op == "=" and isinstance(x.target, str)
            and is_temporary(x.target, temps)
            and isinstance(x.value, str))


def is_temporary(name, temps):
    """Is ``name`` a temporary: ``t<n>`` or one of ``temps`` (the kernel's temporaries,
    :attr:`kadj.adj_naming.Naming.temp_names`)?"""
    return _temp_name(name) or name in temps


@functools.lru_cache(maxsize=1 << 14)
def _temp_name(name):
    return _TEMP.match(name) is not None


def _defs(occ, name, temps):
    """The statements that assign ``name`` (or None when some occurrence is of a kind
    that is neither a plain read nor a plain definition)."""
    out = []
    for role, node in occ.get(name, ()):
        if role == USE:
            continue
        if role == DEF or (role == FIXED and _is_temp_def(node, temps) and node.target == name):
            if node not in out:
                out.append(node)
        else:
            return None
    return out


# ---- single-use temporaries --------------------------------------------------------------------
def _is_adj_def(x):
    return (isinstance(x, A.Accumulate) and x.op == "=" and isinstance(x.target, A.AdjVar)
            and x.how in (None, "plain") and isinstance(x.value, str)
            and _ADJ_TEMP.match(x.target.name) is not None)


def _primal_use(x):
    return isinstance(x, A.Assign) and isinstance(x.target, str)


def _adjoint_use(x):
    return isinstance(x, A.Accumulate) or (
        isinstance(x, A.Assign) and isinstance(x.target, (A.AdjVar, A.Local)))


def fold_single_uses(fn, width=WIDTH, idx=None):
    """``idx``: the function's :class:`~kadj.adj_refs.Index`, when the caller keeps one."""
    idx = idx or Index(fn)
    temps = fn.temps
    params = set(fn.params)
    while True:
        # folds of one round are removed after it (positions stay valid); statements are
        # visited in order, so a definition has taken in its own operands' folds (its
        # current text) before it is folded into its use
        occ = idx.occ()
        dropped, folded = set(), []
        for seq in idx.lists():
            for pos, x in enumerate(seq):
                if _is_temp_def(x, temps):
                    name, accepts = x.target, _primal_use
                elif _is_adj_def(x):
                    name, accepts = x.target.name, _adjoint_use
                else:
                    continue
                if name in params or name in names(x.value) or _defs(occ, name, temps) != [x] \
                        or not pure(x.value):
                    continue
                uses = [n for r, n in occ.get(name, ()) if r == USE]
                if len(uses) != 1 or not accepts(uses[0]):
                    continue
                use = uses[0]
                at = idx.where(use, seq)
                if at is None or at <= pos or isinstance(getattr(use, "target", None),
                                                         A.AdjElem) and name in " ".join(
                        use.target.index_texts):
                    continue
                if not pure(use.value) and _reads_memory(x.value):
                    continue    # (the call in the use might change what it reads)
                new = E.substitute(use.value, name, x.value)
                if new is None or len(new) > width or not _stable(seq, pos + 1, at, x.value):
                    continue
                use.value = new
                folded.append(use)
                dropped.add(id(x))
        if not dropped:
            return
        idx.touch(folded)
        idx.drop(dropped)


# ---- index offsets ----------------------------------------------------------------------------
def _offset(text):
    """Whether ``text`` is a name plus or minus an integer (``i - 1``)."""
    tree = E.parse(text)
    if not (isinstance(tree, E.ast.BinOp) and isinstance(tree.op, (E.ast.Add, E.ast.Sub))):
        return False
    sides = (tree.left, tree.right)
    def num(x):
        return isinstance(x, E.ast.Constant) and type(x.value) is int
    return (isinstance(sides[0], E.ast.Name) and num(sides[1])) or (
        isinstance(tree.op, E.ast.Add) and num(sides[0]) and isinstance(sides[1], E.ast.Name))


def _put_everywhere(node, name, text, width):
    """The rewrites that put ``text`` for ``name`` in ``node``'s value and element
    index, as a function to apply; None where one is not possible."""
    def put(old):
        if name not in names(old):
            return old
        new = E.substitute(old, name, text)
        return None if new is None or len(new) > width else new
    value = put(node.value) if isinstance(node, (A.Assign, A.Accumulate)) else None
    if isinstance(node, (A.Assign, A.Accumulate)) and value is None:
        return None
    t = node.target
    index = None
    if isinstance(t, A.AdjElem):
        index = tuple(put(s) for s in t.index_texts)
        if None in index:
            return None

    def apply():
        if value is not None:
            node.value = value
        if index is not None:
            node.target = A.AdjElem(t.array, t.index, t.base, index)
    return apply


def inline_index_offsets(fn, width=WIDTH, idx=None):
    """A temporary holding a name plus or minus an integer (``t4 = i - 1``), read only
    by later statements of its own statement list (primal or adjoint, as a value or an
    element's index), is spelled out in each: ``u[i - 1]``, ``adj_u[i - 1]``.
    ``idx``: the function's :class:`~kadj.adj_refs.Index`, when the caller keeps one."""
    _repeat(_inline_one_offset, fn, idx or Index(fn), width)


def _inline_one_offset(fn, idx, width):
    temps = fn.temps
    params = set(fn.params)
    for seq in idx.lists():
        for pos, x in enumerate(seq):
            if not (_is_temp_def(x, temps) and _offset(x.value)):
                continue
            occ = idx.occ()
            name = x.target
            if name in params or name in names(x.value) or _defs(occ, name, temps) != [x]:
                continue
            uses = {id(n): n for r, n in occ.get(name, ()) if r == USE}.values()
            at = [idx.where(n, seq) for n in uses]
            if not uses or None in at or min(at) <= pos or not all(
                    isinstance(n, (A.Assign, A.Accumulate, A.Consume)) for n in uses):
                continue
            if not _stable(seq, pos + 1, max(at), x.value):
                continue
            applies = [_put_everywhere(n, name, x.value, width) for n in uses]
            if None in applies:
                continue
            for apply in applies:
                apply()
            idx.touch(uses)
            idx.delete(seq, pos)
            return True
    return False


# ---- repeated accumulations into one element ------------------------------------------------
def _plain_acc(x):
    return (isinstance(x, A.Accumulate) and x.op == "+=" and x.how == "plain"
            and isinstance(x.target, A.AdjElem) and isinstance(x.value, str))


def _between_ok(seq, start, stop, first, second):
    t = first.target
    index_names = set()
    for text in t.index_texts:
        index_names |= set(names(text))
    for x in seq[start:stop]:
        for y in A.walk([x]):
            # the array may only be added to (plainly, not reading it) in between
            mentions = t.base in _mentioned(y)
            if mentions and not (_plain_acc(y) and y.target.base == t.base and
                                 t.base not in names(y.value) and
                                 all(t.base not in names(s) for s in y.target.index_texts)):
                return False
        w = _writes(x)
        if _ALL in w or w & index_names:
            return False
    return _stable(seq, start, stop, first.value)


def _mentioned(y):
    out = set()
    for f in ("target", "var"):
        t = getattr(y, f, None)
        if isinstance(t, A.AdjElem):
            out.add(t.base)
            for s in t.index_texts:
                out |= set(names(s))
        elif isinstance(t, (A.AdjVar, A.Local)):
            out.add(t.name)
        elif isinstance(t, str):
            out |= set(names(t))
    for text in _texts(y):
        out |= set(names(text))
    return out


def merge_accumulations(fn, width=WIDTH, idx=None):
    """The first accumulation moves into the later one (its value is read there).
    (It reads no index; a kept one, ``idx``, is told of each change.)"""
    _repeat(_merge_one_accumulation, fn, idx or Index(fn), width)


def _merge_one_accumulation(fn, idx, width):
    for seq in idx.lists():
        for pos, x in enumerate(seq):
            if not _plain_acc(x):
                continue
            for at in range(pos + 1, len(seq)):
                y = seq[at]
                if _plain_acc(y) and y.target.base == x.target.base and \
                        y.target.index_texts == x.target.index_texts and \
                        x.target.base not in names(x.value) + names(y.value) and \
                        pure(x.value) and pure(y.value):
                    new = E.add(x.value, y.value)
                    if new is not None and len(new) <= width and \
                            _between_ok(seq, pos + 1, at, x, y):
                        y.value = new
                        idx.touch([y])
                        idx.delete(seq, pos)
                        return True
                    break
    return False


# ---- comments left without their statements ---------------------------------------------------
_SOURCE_LINE = re.compile(r"# [^\s:]+:\d+: ")


def drop_orphan_comments(fn):
    """A source-line comment directly followed by another one or by a sweep's heading
    (``# ---- reverse sweep ----``), or ending a statement list after other statements,
    lost its statements."""
    for seq in lists(fn):
        shown = [x for x in seq if not A.reserves_nothing(x)]
        last = len(shown) - 1
        gone = {id(x) for k, x in enumerate(shown)
                if _is_source_comment(x) and (
                    k < last and (_is_source_comment(shown[k + 1]) or
                                  _is_heading(shown[k + 1])) or
                    k == last and any(not isinstance(y, A.Comment) for y in shown))}
        if gone:
            seq[:] = [x for x in seq if id(x) not in gone]


def _is_heading(x):
    return isinstance(x, A.Comment) and x.text.startswith("# ---- ")


def _is_source_comment(x):
    return isinstance(x, A.Comment) and _SOURCE_LINE.match(x.text) is not None
