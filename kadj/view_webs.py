"""One name per view: an array view name that the kernel assigns in several places
(``fk = f[k]`` in one loop, ``fk = f[k]`` again in a later one) gets a name of its own
for each assignment, where every read of the name can see only one of them.

A view is resolved statically (:mod:`kadj.array_views`: each of its elements is read
from its base array at a mapped index), so a name must denote one view.  numba's IR
(typed without SSA) keeps the kernel's names; :func:`split` computes, over the blocks of
the function, which assignments of each such name reach each read (reaching
definitions), and where every read is reached by exactly one, renames the second and
later assignments and their reads (``fk.w2``; messages show ``fk``).  A read that two
assignments may reach (``fk = f[0]``, then ``if c: fk = f[1]``, then a read) keeps the
name, and the view lowering refuses it by name, as before.
"""
from __future__ import annotations

from numba.core import ir as nir
from numba.core import ir_utils, types

_UNDEFINED = ("undefined",)


def split(st):
    """Rename, in ``st``'s numba IR (a :class:`kadj.structurize.Structurizer`), the
    assignments of view names assigned more than once whose reads each see one; the
    new names get the old name's type and definition."""
    defs = {}
    for label, blk in st.blocks.items():
        for k, s in enumerate(blk.body):
            if isinstance(s, nir.Assign):
                defs.setdefault(s.target.name, []).append((label, k))
    for name, sites in defs.items():
        if len(sites) < 2 or name in st.fir.arg_names or name.startswith("$") or \
                not isinstance(st.types.get(name), types.Array):
            continue
        if not all(_is_view(st, st.blocks[b].body[k]) for b, k in sites):
            continue
        reads = _reaching(st, name)
        if reads is None:
            continue
        _rename(st, name, sites, reads)


def _is_view(st, stmt):
    v = stmt.value
    return isinstance(v, nir.Expr) and v.op in ("getitem", "static_getitem") and \
        stmt.target.name not in {x.name for x in v.list_vars()}


def _uses(stmt, name):
    """Does ``stmt`` read ``name`` (an assignment's target is not read)?"""
    if isinstance(stmt, nir.Assign):
        value = stmt.value
        if isinstance(value, nir.Var):
            return value.name == name
        return isinstance(value, nir.Expr) and any(v.name == name
                                                   for v in value.list_vars())
    if isinstance(stmt, nir.Del):
        return stmt.value == name
    return any(v.name == name for v in stmt.list_vars())


def _reaching(st, name):
    """{(label, index) of each statement reading ``name``: the one assignment (label,
    index) that reaches it}, or None where a read may see two (or none)."""
    labels = sorted(st.blocks)
    last = {}
    for label in labels:
        for k, s in enumerate(st.blocks[label].body):
            if isinstance(s, nir.Assign) and s.target.name == name:
                last[label] = (label, k)
    entry = st.cfg.entry_point()
    into = {label: frozenset() for label in labels}
    into[entry] = frozenset([_UNDEFINED])
    out = {label: (frozenset([last[label]]) if label in last else into[label])
           for label in labels}
    changed = True
    while changed:
        changed = False
        for label in labels:
            preds = [p for p, _ in st.cfg.predecessors(label)]
            seen = frozenset().union(*(out[p] for p in preds)) if preds else frozenset()
            if label == entry:
                seen |= {_UNDEFINED}
            if seen != into[label]:
                into[label] = seen
                changed = True
                if label not in last:
                    out[label] = seen
    reads = {}
    for label in labels:
        current = into[label]
        for k, s in enumerate(st.blocks[label].body):
            if _uses(s, name):
                if len(current) != 1 or _UNDEFINED in current:
                    return None
                reads[(label, k)] = next(iter(current))
            if isinstance(s, nir.Assign) and s.target.name == name:
                current = frozenset([(label, k)])
    return reads


def _rename(st, name, sites, reads):
    new = {site: (name if n == 0 else f"{name}.w{n + 1}") for n, site in enumerate(sites)}
    for site, fresh in new.items():
        if fresh == name:
            continue
        label, k = site
        stmt = st.blocks[label].body[k]
        var = nir.Var(stmt.target.scope, fresh, stmt.target.loc)
        st.blocks[label].body[k] = nir.Assign(stmt.value, var, stmt.loc)
        st.types[fresh] = st.types[name]
        st.fir._definitions[fresh] = [stmt.value]
    if name in st.fir._definitions:
        st.fir._definitions[name] = [st.blocks[b].body[k].value for b, k in sites
                                     if new[(b, k)] == name]
    for (label, k), site in reads.items():
        fresh = new[site]
        if fresh == name:
            continue
        stmt = st.blocks[label].body[k]
        if isinstance(stmt, nir.Del):
            st.blocks[label].body[k] = nir.Del(fresh, stmt.loc)
        else:   # (an assignment's target is another name: only its value changes)
            var = next(v for v in stmt.list_vars() if v.name == name)
            ir_utils.replace_vars_stmt(stmt, {name: nir.Var(var.scope, fresh, var.loc)})
