"""Readability passes over the adjoint IR, run between building it and printing it.

Each pass keeps the adjoint's meaning exactly; where it cannot be sure, it leaves the
code as built (where names occur: :mod:`kadj.adj_refs`).

* :func:`propagate_copies`: ``adj_a = adj_b`` (the adjoint of a single-use variable) is
  dropped and later reads of ``adj_a`` read ``adj_b``, when ``adj_a`` is assigned only
  there, every read of it follows the copy in the same statement list, and nothing
  assigns ``adj_b`` in between.
* :func:`kadj.simplify_zero.assign_first_contributions`: ``adj_v += e`` where
  ``adj_v`` is known to be zero becomes ``adj_v = e``.
* :func:`remove_dead`: assignments to an adjoint variable that nothing ever reads.
* :func:`drop_empty_ifs`: an ``if`` on a pure condition whose branches are empty.
* :func:`source_loop_headers`: ``# reversed: for i in range(1, t3, 1)`` spelled as the
  kernel's own loop header, when the header's source line is at hand.
* the passes of :mod:`kadj.simplify_expr`: ``bool()`` of a comparison dropped,
  single-use temporaries folded into their use, index offsets spelled out, repeated accumulations into one
  element merged.
* :func:`kadj.simplify_joins.coalesce_joins`: a branch value or a loop counter computed
  under a temporary's name and copied into the kernel's name is computed under that
  name.
"""
from __future__ import annotations

import re

from . import adj_ir as A
from .adj_refs import DEF, FIXED, IDENT, USE, Index, names, pure, rewrite
from .simplify_adj import keep_readded_elements, sink_resets
from .simplify_zero import assign_first_contributions, float64_only
from .simplify_joins import coalesce_joins
from .simplify_names import drop_free_suffixes
from .simplify_primal import remove_unused_primal
from .simplify_scopes import join_scopes, split_scopes
from .simplify_expr import (drop_bool_casts, drop_orphan_comments, fold_single_uses,
                            inline_index_offsets, merge_accumulations,
                            unwrap_bool_of_compare)


def simplify(fn, types=None, joins=True):
    """``fn`` (an :class:`adj_ir.Function`) made easier to read; returns it.
    ``types``: the kernel's typemap; given, a contribution of the adjoint's own type to
    an adjoint known to be zero assigns it (:mod:`kadj.simplify_zero`).  ``joins``:
    coalesce branch values and loop counters (:mod:`kadj.simplify_joins`), and tell a
    block's names apart also where a later ``if`` on the same condition reads them
    (:func:`kadj.simplify_scopes.exposed`): the target's ``join_names`` policy
    (:class:`kadj.lowering.Context`; CUDA adjoints keep numba's shape of guard chains
    and their names, which :mod:`kadj.cuda.guard_hoist` reads)."""
    scopes = split_scopes(fn, correlate=joins)
    sink_resets(fn)
    if types is not None:
        assign_first_contributions(fn, float64_only(types))
    idx = Index(fn)     # one index, passed on and told of every change
    propagate_copies(fn, idx)
    remove_dead(fn, idx)
    remove_unused_primal(fn, idx)
    drop_bool_casts(fn, idx)
    fold_single_uses(fn, idx=idx)
    if joins:
        coalesce_joins(fn, idx)
    inline_index_offsets(fn, idx=idx)
    fold_single_uses(fn, idx=idx)
    unwrap_bool_of_compare(fn, idx)
    remove_unused_primal(fn, idx)   # (again: a store's value folded, y[e] = y[e] + v)
    merge_accumulations(fn, idx=idx)
    keep_readded_elements(fn)
    drop_orphan_comments(fn)
    source_loop_headers(fn)
    join_scopes(fn, scopes)
    drop_free_suffixes(fn)
    drop_empty_ifs(fn)
    _fill_empty_bodies([fn])
    return fn


def _prints_code(seq):
    return any(_prints_code(x.body) if isinstance(x, (A.ReverseLoop, A.Block))
               else not isinstance(x, A.Comment) for x in seq)


def _only_pass(seq):
    return not _prints_code([x for x in seq if not isinstance(x, A.Pass)])


def drop_empty_ifs(fn):
    """An ``if`` on a pure condition whose branches lost every statement (a replayed
    iteration's branches of skipped stores) is dropped, innermost first."""
    def visit(seq):
        for x in seq:
            for child in x.children():
                visit(child)
        seq[:] = [x for x in seq if not (
            isinstance(x, A.If) and pure(x.cond) and
            _only_pass(x.then) and _only_pass(x.orelse))]
    visit(fn.prologue)
    visit(fn.body)


# ---- copy propagation ---------------------------------------------------------------------
def _is_copy(x):
    return (isinstance(x, A.Accumulate) and x.op == "=" and isinstance(x.target, A.AdjVar)
            and isinstance(x.value, str) and IDENT.match(x.value) is not None
            and x.value != x.target.name)


def propagate_copies(fn, idx=None):
    """``idx``: the function's :class:`~kadj.adj_refs.Index`, when the caller keeps one."""
    idx = idx or Index(fn)
    params = set(fn.params)
    while True:
        # copies dropped in one round are removed after it (positions stay valid, and
        # the index is told of the round's changes at its end); a copy naming a name
        # an earlier one of the round changed waits for the next
        touched, dropped, rewritten = set(), set(), []
        occ = idx.occ()
        for seq in idx.lists():
            for pos, x in enumerate(seq):
                if (_is_copy(x) and x.target.name not in touched and x.value not in touched
                        and _propagate(seq, pos, x, occ, idx, params, rewritten)):
                    touched.update((x.target.name, x.value))
                    dropped.add(id(x))
        if not dropped:
            return
        idx.touch(rewritten)
        idx.drop(dropped)


def _propagate(seq, pos, copy, occ, idx, params, rewritten):
    a, b = copy.target.name, copy.value
    if a in params:
        return False
    uses, last = [], None
    for role, node in occ.get(a, ()):
        if node is copy:
            continue
        if role != USE:
            return False
        at = idx.at(node, seq)
        if at is None or at <= pos:
            return False    # read outside the statements after the copy
        uses.append(node)
        last = at if last is None else max(last, at)
    if last is None:
        return False        # never read: left to dead-code removal
    # ``b`` keeps its value from the copy to the last read: nothing between assigns it
    # (the statement of the last read may assign it after reading, if it is simple)
    for role, node in occ.get(b, ()):
        if role == USE:
            continue
        at = idx.at(node, seq)
        if at is not None and pos < at < last:
            return False
        if at is not None and at == last and (seq[last] is not node or
                                              seq[last].children()):
            return False
    for node in uses:
        rewrite(node, a, b)
    rewritten.extend(uses)
    return True


# ---- dead code ----------------------------------------------------------------------------
def remove_dead(fn, idx=None):
    idx = idx or Index(fn)
    params = set(fn.params)
    while True:
        occ = idx.occ()
        dead = set()
        for name, rows in occ.items():
            if name in params:
                continue
            defs = [node for role, node in rows if role == DEF]
            if not defs or any(role == USE for role, _ in rows):
                continue
            # read nowhere: only ``name += ...`` into itself reads it
            if all(isinstance(n, (A.Assign, A.Accumulate)) and
                   isinstance(n.target, (A.AdjVar, A.Local)) and
                   n.target.name == name and getattr(n, "how", None) != "atomic"
                   and pure(n.value) and name not in names(n.value)
                   for n in defs):
                fixed = [node for role, node in rows if role == FIXED]
                if all(node in defs for node in fixed):
                    dead.update(id(n) for n in defs)
        if not dead:
            return
        idx.drop(dead)


def _fill_empty_bodies(nodes):
    """A compound statement whose body lost every statement gets ``pass``."""
    for x in A.walk(nodes):
        if isinstance(x, A.If):
            if not _prints_code(x.then):
                x.then.append(A.Pass())
            if x.orelse and not _prints_code(x.orelse):
                x.orelse.append(A.Pass())
        elif isinstance(x, (A.For, A.While)) and not _prints_code(x.body):
            x.body.append(A.Pass())


# ---- loop headers from the source -------------------------------------------------------
_REVERSED = re.compile(r"# reversed: for (\w+) in range\(.*\)\Z")
_SOURCE_FOR = re.compile(r"# [^\s:]+:\d+: for (\w+) in (range\(.*\)):\Z")


def source_loop_headers(fn):
    for x in A.walk(fn.prologue + fn.body):
        if not isinstance(x, A.ReverseLoop):
            continue
        body = x.body
        for pos in range(1, len(body)):
            c, prev = body[pos], body[pos - 1]
            if not (isinstance(c, A.Comment) and isinstance(prev, A.Comment)):
                continue
            m, src = _REVERSED.match(c.text), _SOURCE_FOR.match(prev.text)
            if m and src and m.group(1) == src.group(1) and _balanced(src.group(2)):
                c.text = f"# reversed: for {m.group(1)} in {src.group(2)}"
            break


def _balanced(text):
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0 and text.endswith(")")
